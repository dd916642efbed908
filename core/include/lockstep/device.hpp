#pragma once
// Device / Stream / Event: the run-time chosen backend interface (docs/api.md,
// docs/architecture.md).
//
// A Device owns memory and streams. A Stream is an in-order queue of copies and kernel launches;
// nothing enqueued is guaranteed done until Stream::synchronize(), Event::synchronize() or
// Device::synchronize(). On the CPU device a stream really is asynchronous (a oneTBB task drains
// it), so code that forgets a synchronization fails on the CPU as it would on a GPU.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/device_id.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tuning.hpp"

namespace lockstep {

class Stream;
class Event;
template <class T>
class Buffer;

struct MemoryStats {
  std::uint64_t in_use = 0;    // bytes held by live buffers of this device
  std::uint64_t peak = 0;      // high-water mark of in_use
  std::uint64_t capacity = 0;  // total bytes this device may hand out (0: unlimited)
};

struct DeviceCaps {
  int multiprocessors = 0;          // SMs on CUDA; worker threads on the CPU device
  int max_threads_per_block = 1024;
  int warp_size = 32;
  std::size_t max_shared_bytes_per_block = 0;  // opt-in limit, the same on both backends
  std::uint64_t total_memory = 0;
  bool tensor_cores = false;        // hardware matrix units (CUDA sm_70+)
  bool bit_faithful = false;        // CPU device: SIMT kernels return the CUDA bits
  bool simulated = false;           // the CPU device (a simulated GPU)
  std::string simd_target;          // CPU device: the Highway target running kernels
  int compute_capability = 0;       // CUDA: major*10 + minor
  std::uint64_t l2_bytes = 0;       // CUDA: the L2 cache; 0 on the CPU device (no L2 hints there)
  // CUDA: the library holds warpgroup-product kernels for this device (built for sm_90a, compute
  // capability 9.0; Note [wgmma products]). The CPU device emulates them only when asked.
  bool warpgroup_mma = false;
};

struct Dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  std::uint32_t block_threads = 0;
  std::size_t shared_bytes = 0;
};

namespace detail {
// What the type-erased launch carries (see lockstep/kernels/launch.hpp).
struct KernelLaunch {
  int kernel_index = -1;
  const char* kernel_name = "";
  std::uint32_t compiled_threads = 0;
  LaunchConfig config;
  const void* params = nullptr;
  std::size_t params_size = 0;
  // The kernel waits for the previous kernel on the stream itself (Note [overlapped launches]
  // in lockstep/kernels/launch.hpp), so it may be launched before that kernel has finished.
  bool overlaps_prior = false;
  // The kernel asks for the largest shared-memory carveout of the SM (CUDA: a preference set once
  // per kernel), where the blocks per SM it is built for need more than the driver might pick.
  bool max_shared_carveout = false;
};
struct StreamAccess;
struct DeviceAccess;
struct StreamMemory;
}  // namespace detail

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceId id() const = 0;
  virtual std::string name() const = 0;
  virtual const DeviceCaps& caps() const = 0;
  virtual MemoryStats memory_stats() const = 0;
  // The Tuning of calls that name none and run outside any TuningScope (lockstep/tuning.hpp):
  // the defaults with LOCKSTEP_TUNING's overrides, read once when the device was opened.
  const Tuning& tuning() const noexcept { return tuning_; }

  // The stream used when a call is given none. Never the CUDA legacy default stream.
  virtual Stream& default_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  // timing = true makes the event usable with Event::elapsed_ms.
  virtual std::unique_ptr<Event> create_event(bool timing = false) = 0;
  // Waits for every stream of this device.
  virtual void synchronize() = 0;

 protected:
  // Reads LOCKSTEP_TUNING (InvalidArgument when it holds a setting Tuning::apply refuses).
  Device();
  // Raw device memory for Buffer. allocate throws OutOfMemory, never returns null for bytes > 0.
  virtual void* allocate(std::size_t bytes) = 0;
  // Waits for every stream of the device, then releases (Note [buffer release]).
  virtual void release(void* ptr, std::size_t bytes) noexcept = 0;
  friend struct detail::DeviceAccess;

 private:
  Tuning tuning_;
};

class Stream {
 public:
  virtual ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  virtual Device& device() const = 0;
  // Blocks until everything enqueued so far has completed.
  virtual void synchronize() = 0;
  // True when everything enqueued so far has completed.
  virtual bool query() = 0;
  // Work enqueued after this call starts only after `event`'s latest record completed. An event
  // never recorded is ready (as in CUDA).
  virtual void wait(const Event& event) = 0;
  // cudaStream_t on the CUDA backend, nullptr on the CPU backend.
  virtual void* native_handle() const = 0;
  // Kernel launches enqueued on this stream so far (copies and fills not counted): the
  // difference around a call is that call's launches, on either backend.
  std::uint64_t launches() const { return launches_; }

 protected:
  Stream();
  // Host memory passed to copy_h2d may be reused as soon as the call returns; the destination of
  // copy_d2h is written when the stream reaches the copy.
  virtual void copy_h2d(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_d2h(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_d2d(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill32(void* dst, std::uint32_t pattern, std::size_t count) = 0;
  virtual void launch(const detail::KernelLaunch& launch) = 0;
  // Derived destructors call this after draining the stream.
  void release_scratch() noexcept;
  friend struct detail::StreamAccess;

 private:
  // A stream made by create_stream (or wrapped) keeps its device alive: it may outlive the
  // caller's handle to the device (e.g. a class that declares its stream before its device).
  // Declared first, so released last, after the derived destructor has drained the stream and
  // the scratch has been returned to the device. Null for a device's default stream.
  std::shared_ptr<Device> owner_;
  // Temporaries of the calls enqueued on this stream (Note [stream scratch]) and zeroed counters
  // for kernels that count among their blocks (Note [stream counters]), both in core/src/device.cpp;
  // a call reaches them through detail::StreamAccess.
  void* scratch(std::size_t bytes);
  std::int32_t* counters(std::size_t count, bool* fresh = nullptr);
  std::unique_ptr<detail::StreamMemory> memory_;
  std::uint64_t launches_ = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the current end of `stream`'s queue.
  virtual void record(Stream& stream) = 0;
  // True when the latest record has completed (or the event was never recorded).
  virtual bool query() = 0;
  virtual void synchronize() = 0;
  // Milliseconds between `start`'s completion and this event's; both must be timing events of
  // the same device, recorded and completed.
  virtual double elapsed_ms(const Event& start) const = 0;

 protected:
  Event() = default;
  friend struct detail::StreamAccess;

 private:
  std::shared_ptr<Device> owner_;  // as Stream::owner_: an event keeps its device alive
};

// --- the registry -----------------------------------------------------------------------------

struct DeviceInfo {
  DeviceId id;
  std::string name;
  DeviceCaps caps;
};

struct BackendInfo {
  DeviceKind kind = DeviceKind::kCpu;
  bool built = false;       // compiled into this library
  bool usable = false;      // built and at least one device can be opened
  std::string reason;       // why not usable: "not built", "no driver", "no device", ...
  std::vector<DeviceInfo> devices;
};

// Every backend compiled in (and CUDA when it is not, with the reason), with its devices.
std::vector<BackendInfo> devices();

// Opens (or returns the already open) device for a spec: "cpu", "cpu:N", "cuda", "cuda:N",
// "auto". Unusable or out-of-range devices throw DeviceUnavailable naming the spec and why.
std::shared_ptr<Device> open(std::string_view spec);
std::shared_ptr<Device> open(DeviceId id);
// What "auto" resolves to here (after LOCKSTEP_DEVICE).
DeviceId resolve_auto();

// A separate simulated CPU device with its own memory, not shared with open("cpu:N").
struct CpuDeviceOptions {
  int index = 0;                   // reported in its id ("cpu:<index>")
  std::uint64_t memory_capacity = 0;  // bytes; 0 = unlimited
  bool poison = true;              // fill new allocations with the poison NaN pattern
  std::string simd = "auto";       // SIMD variant running kernels: auto, avx3, avx2, generic
  // Checks of the simulation itself (the same bits either way); the LOCKSTEP_CPU_* check
  // variables switch them on for every CPU device (docs/api.md, "Environment"):
  bool shuffle_blocks = false;  // each launch's blocks in a random order (inter-block races)
  bool decode_lanes = false;    // the decode chunk kernel on the lane code, not the row form
  bool exact_lanes = false;     // fused Exact on the lane code (Note [row-major exact])
  bool softmax_lanes = false;   // softmax_rows on the lane code (Note [row-major softmax])
  bool block_passes = false;    // warp-independent kernels block-wide (Note [warp passes])
};
std::shared_ptr<Device> make_cpu_device(const CpuDeviceOptions& options = {});

// The 32-bit pattern new CPU allocations are filled with: a signalling-NaN payload as float, so
// that memory nothing wrote is visible (docs/architecture.md, "The CPU device", Memory).
inline constexpr std::uint32_t kPoisonPattern = 0x7FBADBADu;

namespace detail {
// The limit text of a "must be <expected> device" check: its id, and why two devices that print
// alike are not the same one.
inline std::string device_limit(const Device& expected, const Device& got) {
  return expected.id().str() +
         (expected.id() == got.id() ? " (another device with the same id, e.g. one made by make_cpu_device)" : "");
}
struct DeviceAccess {
  static void* allocate(Device& d, std::size_t bytes) { return d.allocate(bytes); }
  static void release(Device& d, void* p, std::size_t bytes) noexcept { d.release(p, bytes); }
};
struct StreamAccess {
  // For create_stream: the stream keeps `device` alive (null when it is not shared-owned).
  static void keep_device_alive(Stream& s, std::shared_ptr<Device> device) { s.owner_ = std::move(device); }
  static void keep_device_alive(Event& e, std::shared_ptr<Device> device) { e.owner_ = std::move(device); }
  static void copy_h2d(Stream& s, void* dst, const void* src, std::size_t n) {
    s.copy_h2d(dst, src, n);
  }
  static void copy_d2h(Stream& s, void* dst, const void* src, std::size_t n) {
    s.copy_d2h(dst, src, n);
  }
  static void copy_d2d(Stream& s, void* dst, const void* src, std::size_t n) {
    s.copy_d2d(dst, src, n);
  }
  static void fill32(Stream& s, void* dst, std::uint32_t pattern, std::size_t count) {
    s.fill32(dst, pattern, count);
  }
  static void launch(Stream& s, const KernelLaunch& l) {
    s.launch(l);
    ++s.launches_;
  }
  static void* scratch(Stream& s, std::size_t bytes) { return s.scratch(bytes); }
  static std::int32_t* counters(Stream& s, std::size_t count, bool* fresh = nullptr) {
    return s.counters(count, fresh);
  }
};
}  // namespace detail

}  // namespace lockstep
