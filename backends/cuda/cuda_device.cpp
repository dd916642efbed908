// The CUDA device: cudaMalloc memory (never managed memory), non-blocking streams, events,
// cudaMemcpyAsync on the given stream (never the legacy default stream), and launches of the
// trampolines in cuda_kernels.cu (Note [driver launches]). Every CUDA return code is checked.

#include <cuda.h>  // the driver's types only: its functions come from cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cuda_entries.hpp"
#include "lockstep/device.hpp"
#include "lockstep/kernels/elementwise.hpp"

namespace lockstep::cuda {
namespace {

// The number of kernels kernel_entry knows (the indices below it are not null).
std::size_t kernel_count() {
  static const std::size_t n = [] {
    std::size_t i = 0;
    while (kernel_entry(static_cast<int>(i)) != nullptr) ++i;
    return i;
  }();
  return n;
}

// An on/off override read when a device is opened (docs/api.md, "Environment"): unset or
// anything but "0" is on (the registry refuses other values before a device opens).
bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

// The DeviceError of a failed CUDA call: CUDA's error name and text, and whether the context is lost.
[[noreturn]] void throw_cuda_error(const char* what, const char* name, const char* text, bool sticky) {
  std::string m = std::string("lockstep: CUDA error in ") + what + ": " + name + " (" + text + ")";
  if (sticky)
    m += " [sticky: the CUDA context is lost; every later call on this device fails, restart "
         "the process]";
  throw DeviceError(m, sticky);
}

[[noreturn]] void fail(cudaError_t e, const char* what) {
  const bool sticky = is_sticky(e);
  // The runtime keeps a failed call's error as its "last error" until it is read, and this
  // library's runtime (static cudart) is not the caller's: unread, a refused launch's error came
  // back from the cudaGetLastError after the next good launch, which then threw it (found by
  // CudaInterop.ARefusedLaunchIsATypedNonStickyError with LOCKSTEP_DRIVER_LAUNCH=0). A sticky
  // error stays whatever is read.
  if (!sticky) (void)cudaGetLastError();
  throw_cuda_error(what, cudaGetErrorName(e), cudaGetErrorString(e), sticky);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(e, what);
}

// Note [driver launches]
// Kernels are launched by the driver's cuLaunchKernelEx on the kernel's CUfunction (looked up
// once per device and kernel by cudaGetFuncBySymbol), not by the runtime's cudaLaunchKernel(ExC),
// which maps the host symbol to the function on every launch. tools/gpu/launch_cost.cu, us per
// launch: on an H200 machine's host cudaLaunchKernelExC 3.84-3.92, cuLaunchKernelEx 3.40-3.50;
// on an H100 machine's host the runtime's launch with PDL 2.70, plain cudaLaunchKernel
// 3.26-4.25, this one 2.56-2.59. The driver's functions come through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda (a build without a driver still runs
// its CPU tests); where the entry point is missing, or with LOCKSTEP_DRIVER_LAUNCH=0, the
// runtime's launch is used. The same kernel, configuration and parameters: only the host path
// changes. A refused launch throws DeviceError with the driver's error name and text; the sticky
// errors have the same numbers in both APIs (the static_assert below), so is_sticky decides.
struct DriverApi {
  using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  using ErrorText = CUresult (*)(CUresult, const char**);
  LaunchEx launch = nullptr;
  ErrorText name = nullptr, text = nullptr;
};
const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    const auto get = [](const char* symbol, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
          q == cudaDriverEntryPointSuccess)
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      else
        (void)cudaGetLastError();
    };
    get("cuLaunchKernelEx", a.launch);
    get("cuGetErrorName", a.name);
    get("cuGetErrorString", a.text);
    if (a.name == nullptr || a.text == nullptr) a.launch = nullptr;
    return a;
  }();
  return api;
}
static_assert(int(CUDA_ERROR_ILLEGAL_ADDRESS) == int(cudaErrorIllegalAddress) &&
              int(CUDA_ERROR_LAUNCH_FAILED) == int(cudaErrorLaunchFailure) &&
              int(CUDA_ERROR_HARDWARE_STACK_ERROR) == int(cudaErrorHardwareStackError) &&
              int(CUDA_ERROR_ILLEGAL_INSTRUCTION) == int(cudaErrorIllegalInstruction) &&
              int(CUDA_ERROR_MISALIGNED_ADDRESS) == int(cudaErrorMisalignedAddress) &&
              int(CUDA_ERROR_INVALID_ADDRESS_SPACE) == int(cudaErrorInvalidAddressSpace) &&
              int(CUDA_ERROR_INVALID_PC) == int(cudaErrorInvalidPc) &&
              int(CUDA_ERROR_ASSERT) == int(cudaErrorAssert) &&
              int(CUDA_ERROR_LAUNCH_TIMEOUT) == int(cudaErrorLaunchTimeout) &&
              int(CUDA_ERROR_ECC_UNCORRECTABLE) == int(cudaErrorECCUncorrectable) &&
              int(CUDA_ERROR_CONTEXT_IS_DESTROYED) == int(cudaErrorContextIsDestroyed),
              "the driver's sticky error codes are the runtime's (is_sticky)");

[[noreturn]] void fail_driver(CUresult r, const char* what) {
  const DriverApi& d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.name(r, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA_ERROR_UNKNOWN_CODE";
  if (d.text(r, &text) != CUDA_SUCCESS || text == nullptr) text = "no description";
  throw_cuda_error(what, name, text, is_sticky(static_cast<cudaError_t>(r)));
}

class CudaDevice;

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice& dev, cudaStream_t s, bool owning) : dev_(dev), s_(s), owning_(owning) {}
  ~CudaStream() override;
  Device& device() const override;
  void synchronize() override;
  bool query() override;
  void wait(const Event& event) override;
  void* native_handle() const override { return s_; }
  cudaStream_t handle() const { return s_; }

 protected:
  void copy_h2d(void* dst, const void* src, std::size_t bytes) override;
  void copy_d2h(void* dst, const void* src, std::size_t bytes) override;
  void copy_d2d(void* dst, const void* src, std::size_t bytes) override;
  void fill32(void* dst, std::uint32_t pattern, std::size_t count) override;
  void launch(const lockstep::detail::KernelLaunch& l) override;

 private:
  CudaDevice& dev_;
  cudaStream_t s_;
  bool owning_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(CudaDevice& dev, bool timing);
  ~CudaEvent() override;
  void record(Stream& stream) override;
  bool query() override;
  void synchronize() override;
  double elapsed_ms(const Event& start) const override;
  cudaEvent_t handle() const { return e_; }

 private:
  CudaDevice& dev_;
  cudaEvent_t e_ = nullptr;
  bool timing_;
};

class CudaDevice final : public Device {
 public:
  // LOCKSTEP_PDL=0: every kernel in plain stream order (Note [overlapped launches]);
  // LOCKSTEP_DRIVER_LAUNCH=0: launches through the runtime instead of the driver (Note [driver
  // launches]). Measurement overrides, read here once.
  explicit CudaDevice(int ordinal)
      : ordinal_(ordinal), pdl_(env_on("LOCKSTEP_PDL")), driver_launch_(env_on("LOCKSTEP_DRIVER_LAUNCH")) {
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, ordinal_), "cudaGetDeviceProperties");
    caps_.multiprocessors = p.multiProcessorCount;
    caps_.max_threads_per_block = p.maxThreadsPerBlock;
    caps_.warp_size = p.warpSize;
    caps_.max_shared_bytes_per_block = p.sharedMemPerBlockOptin;
    caps_.total_memory = p.totalGlobalMem;
    caps_.tensor_cores = p.major >= 7;
    caps_.bit_faithful = true;
    caps_.compute_capability = p.major * 10 + p.minor;
    caps_.l2_bytes = static_cast<std::uint64_t>(p.l2CacheSize);
#if defined(LOCKSTEP_HAVE_WGMMA)
    caps_.warpgroup_mma = caps_.compute_capability == 90;
#endif
    name_ = std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) +
            ", " + std::to_string(p.multiProcessorCount) + " SMs)";
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    default_stream_ = std::make_unique<CudaStream>(*this, s, true);
  }
  ~CudaDevice() override { default_stream_.reset(); }

  DeviceId id() const override { return DeviceId{DeviceKind::kCuda, ordinal_}; }
  std::string name() const override { return name_; }
  const DeviceCaps& caps() const override { return caps_; }
  MemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return MemoryStats{in_use_, peak_, caps_.total_memory};
  }
  Stream& default_stream() override { return *default_stream_; }
  std::unique_ptr<Stream> create_stream() override {
    activate();
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    auto r = std::make_unique<CudaStream>(*this, s, true);
    detail::StreamAccess::keep_device_alive(*r, weak_from_this().lock());
    return r;
  }
  std::unique_ptr<Event> create_event(bool timing) override {
    auto e = std::make_unique<CudaEvent>(*this, timing);
    detail::StreamAccess::keep_device_alive(*e, weak_from_this().lock());
    return e;
  }
  void synchronize() override {
    activate();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void activate() const { check(cudaSetDevice(ordinal_), "cudaSetDevice"); }
  // The kernel's CUfunction in this device's context (the device is current: activate()).
  CUfunction function(int index, const void* fn, const char* name) {
    auto& slot = functions_[static_cast<std::size_t>(index)];
    CUfunction f = slot.load(std::memory_order_acquire);
    if (f == nullptr) {
      cudaFunction_t rf = nullptr;
      check(cudaGetFuncBySymbol(&rf, fn), name);
      f = reinterpret_cast<CUfunction>(rf);
      slot.store(f, std::memory_order_release);
    }
    return f;
  }

  // Raises a kernel's dynamic shared memory limit once, when a launch needs more than 48 KB; and
  // sets its carveout preference to the largest shared memory once, when it asks for that. Every
  // launch of such a kernel passes here, so what was set is read without the lock (an atomic per
  // kernel index: the limit raised to in bits 0-30, the carveout set in bit 31); the attribute
  // calls and the stores are made under it.
  void ensure_shared(int index, const void* fn, std::size_t bytes, bool max_shared_carveout) {
    constexpr std::size_t kDefault = 48 * 1024;
    constexpr std::uint32_t kCarveout = 0x80000000u, kBytes = 0x7fffffffu;
    if (bytes <= kDefault && !max_shared_carveout) return;
    auto& state = shared_state_[static_cast<std::size_t>(index)];
    const auto done = [&](std::uint32_t have) {
      return (bytes <= kDefault || (have & kBytes) >= bytes) && (!max_shared_carveout || (have & kCarveout) != 0);
    };
    if (done(state.load(std::memory_order_acquire))) return;
    std::lock_guard<std::mutex> lk(mu_);
    std::uint32_t have = state.load(std::memory_order_relaxed);
    if (bytes > kDefault && (have & kBytes) < bytes) {
      LOCKSTEP_ASSERT(bytes <= kBytes, "dynamic shared memory fits 31 bits");
      check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
            "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      have = (have & kCarveout) | static_cast<std::uint32_t>(bytes);
    }
    if (max_shared_carveout && (have & kCarveout) == 0) {
      check(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
            "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
      have |= kCarveout;
    }
    state.store(have, std::memory_order_release);
  }

 protected:
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    activate();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it
      std::size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      throw OutOfMemory(id().str(), bytes, free_b);
    }
    check(e, "cudaMalloc");
    std::lock_guard<std::mutex> lk(mu_);
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void release(void* ptr, std::size_t bytes) noexcept override {
    // Note [buffer release]: wait for every stream of the device, then free.
    (void)cudaSetDevice(ordinal_);
    (void)cudaDeviceSynchronize();
    (void)cudaFree(ptr);
    std::lock_guard<std::mutex> lk(mu_);
    in_use_ -= bytes;
  }

 private:
  int ordinal_;
  bool pdl_, driver_launch_;

 public:
  bool pdl() const { return pdl_; }
  bool driver_launch() const { return driver_launch_; }

 private:
  DeviceCaps caps_;
  std::string name_;
  mutable std::mutex mu_;
  std::uint64_t in_use_ = 0, peak_ = 0;
  std::unique_ptr<std::atomic<std::uint32_t>[]> shared_state_{
      new std::atomic<std::uint32_t>[kernel_count()]()};
  // Note [driver launches]: kernel index -> its CUfunction in this device's context, or null until
  // first launched (a race stores the same value twice).
  std::unique_ptr<std::atomic<CUfunction>[]> functions_{new std::atomic<CUfunction>[kernel_count()]()};
  std::unique_ptr<CudaStream> default_stream_;
};

CudaStream::~CudaStream() {
  if (owning_) {
    (void)cudaSetDevice(dev_.id().index);
    (void)cudaStreamSynchronize(s_);
    (void)cudaStreamDestroy(s_);
  }
}
Device& CudaStream::device() const { return dev_; }
void CudaStream::synchronize() {
  dev_.activate();
  check(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
}
bool CudaStream::query() {
  dev_.activate();
  const cudaError_t e = cudaStreamQuery(s_);
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaStreamQuery");
  return true;
}
void CudaStream::wait(const Event& event) {
  auto* e = dynamic_cast<const CudaEvent*>(&event);
  LOCKSTEP_CHECK_ARG(e != nullptr, "Stream::wait", "event", "an event of another backend",
            "an event of a CUDA device");
  dev_.activate();
  check(cudaStreamWaitEvent(s_, e->handle(), 0), "cudaStreamWaitEvent");
}
void CudaStream::copy_h2d(void* dst, const void* src, std::size_t bytes) {
  dev_.activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_), "cudaMemcpyAsync(H2D)");
}
void CudaStream::copy_d2h(void* dst, const void* src, std::size_t bytes) {
  dev_.activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_), "cudaMemcpyAsync(D2H)");
}
void CudaStream::copy_d2d(void* dst, const void* src, std::size_t bytes) {
  dev_.activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s_), "cudaMemcpyAsync(D2D)");
}
void CudaStream::fill32(void* dst, std::uint32_t pattern, std::size_t count) {
  kernels::Fill32Params p{static_cast<std::int32_t*>(dst), static_cast<std::int64_t>(count),
                          static_cast<std::int32_t>(pattern)};
  lockstep::detail::KernelLaunch l;
  l.kernel_index = fill32_kernel_index();
  l.kernel_name = kernels::Fill32::kName;
  l.compiled_threads = kernels::Fill32::kThreads;
  const std::uint64_t blocks =
      (count + kernels::Fill32::kPerBlock - 1) / kernels::Fill32::kPerBlock;
  l.config.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  l.config.block_threads = kernels::Fill32::kThreads;
  l.params = &p;
  l.params_size = sizeof(p);
  launch(l);
}
void CudaStream::launch(const lockstep::detail::KernelLaunch& l) {
  const void* fn = kernel_entry(l.kernel_index);
  LOCKSTEP_ASSERT(fn != nullptr, "kernel index out of range");
  dev_.activate();
  dev_.ensure_shared(l.kernel_index, fn, l.config.shared_bytes, l.max_shared_carveout);
  void* args[] = {const_cast<void*>(l.params)};
  // Note [overlapped launches] (lockstep/kernels/launch.hpp).
  const bool pdl = l.overlaps_prior && dev_.caps().compute_capability >= 90 && dev_.pdl();
  if (const DriverApi& d = driver(); d.launch != nullptr && dev_.driver_launch()) {  // Note [driver launches]
    CUlaunchAttribute attr[1];
    attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr[0].value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = l.config.grid.x;
    cfg.gridDimY = l.config.grid.y;
    cfg.gridDimZ = l.config.grid.z;
    cfg.blockDimX = l.config.block_threads;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.sharedMemBytes = static_cast<unsigned>(l.config.shared_bytes);
    cfg.hStream = reinterpret_cast<CUstream>(s_);
    cfg.attrs = pdl ? attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    const CUresult r = d.launch(&cfg, dev_.function(l.kernel_index, fn, l.kernel_name), args, nullptr);
    if (r != CUDA_SUCCESS) fail_driver(r, l.kernel_name);
    return;
  }
  const dim3 grid(l.config.grid.x, l.config.grid.y, l.config.grid.z);
  const dim3 block(l.config.block_threads, 1, 1);
  if (pdl) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = l.config.shared_bytes;
    cfg.stream = s_;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    check(cudaLaunchKernelExC(&cfg, fn, args), l.kernel_name);
  } else {
    check(cudaLaunchKernel(fn, grid, block, args, l.config.shared_bytes, s_), l.kernel_name);
  }
  // No cudaGetLastError here: the launch returned its own error, and the last error could only
  // add one left unread by an earlier call (a destructor's), thrown at the wrong launch.
}

CudaEvent::CudaEvent(CudaDevice& dev, bool timing) : dev_(dev), timing_(timing) {
  dev_.activate();
  check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
}
CudaEvent::~CudaEvent() {
  if (e_ != nullptr) (void)cudaEventDestroy(e_);
}
void CudaEvent::record(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  LOCKSTEP_CHECK_ARG(s != nullptr && &s->device() == &dev_, "Event::record", "stream",
            stream.device().id().str(), "a stream of the event's device " + dev_.id().str());
  dev_.activate();
  check(cudaEventRecord(e_, s->handle()), "cudaEventRecord");
}
bool CudaEvent::query() {
  const cudaError_t e = cudaEventQuery(e_);
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}
void CudaEvent::synchronize() { check(cudaEventSynchronize(e_), "cudaEventSynchronize"); }
double CudaEvent::elapsed_ms(const Event& start) const {
  auto* s = dynamic_cast<const CudaEvent*>(&start);
  LOCKSTEP_CHECK_ARG(s != nullptr && &s->dev_ == &dev_, "Event::elapsed_ms", "start", "an event",
            "an event of the same device");
  LOCKSTEP_CHECK_ARG(timing_ && s->timing_, "Event::elapsed_ms", "timing", "false",
            "true for both events (create_event(true))");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, s->e_, e_), "cudaEventElapsedTime");
  return ms;
}

class CudaBackend final : public lockstep::detail::Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  // Why no device can be counted, as `lockstep devices` and open() both say it.
  static std::string count_error_reason(cudaError_t e) {
    if (e == cudaErrorNoDevice) return "no device (no CUDA GPU is visible)";
    if (e == cudaErrorInsufficientDriver)
      return "no driver (or the driver is older than this CUDA runtime): " + std::string(cudaGetErrorString(e));
    return std::string("CUDA runtime: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  }

  BackendInfo info() override {
    BackendInfo b;
    b.kind = DeviceKind::kCuda;
    b.built = true;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      b.reason = count_error_reason(e);
      return b;
    }
    if (n == 0) {
      b.reason = "no device (no CUDA GPU is visible)";
      return b;
    }
    b.usable = true;
    for (int i = 0; i < n; ++i) {
      auto d = open(i);
      b.devices.push_back(DeviceInfo{d->id(), d->name(), d->caps()});
    }
    return b;
  }
  std::shared_ptr<Device> open(int index) override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw DeviceUnavailable("lockstep: cannot open cuda:" + std::to_string(index) + ": " +
                              count_error_reason(e) + " [" + cudaGetErrorName(e) + "]");
    }
    if (index < 0 || index >= n)
      throw DeviceUnavailable("lockstep: cannot open cuda:" + std::to_string(index) + ": this "
                              "machine has " + std::to_string(n) + " CUDA device(s)");
    std::lock_guard<std::mutex> lk(mu_);
    auto& d = devices_[index];
    if (!d) d = std::make_shared<CudaDevice>(index);
    return d;
  }

 private:
  std::mutex mu_;
  std::map<int, std::shared_ptr<Device>> devices_;
};

}  // namespace
}  // namespace lockstep::cuda

namespace lockstep::detail {
Backend* cuda_backend() {
  static cuda::CudaBackend b;
  return &b;
}
std::unique_ptr<Stream> cuda_wrap_stream(Device& device, void* cuda_stream) {
  auto* d = dynamic_cast<cuda::CudaDevice*>(&device);
  LOCKSTEP_CHECK_ARG(d != nullptr, "cuda_wrap_stream", "device", device.id().str(), "a CUDA device");
  auto s = std::make_unique<cuda::CudaStream>(*d, static_cast<cudaStream_t>(cuda_stream), false);
  StreamAccess::keep_device_alive(*s, d->weak_from_this().lock());
  return s;
}
}  // namespace lockstep::detail
