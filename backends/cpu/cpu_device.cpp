// The simulated CPU device: 64-byte aligned (poisoned) memory with an optional capacity, truly
// asynchronous in-order streams drained by oneTBB tasks, events, and the launcher that runs a
// kernel's blocks in parallel on oneTBB with each block's threads in lockstep (lanes.hpp).

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "kernel_table.hpp"
#include "lockstep/device.hpp"

namespace lockstep::cpu {
namespace {

// Shared memory per block: the H100/H200 opt-in limit, so that a launch valid on the CPU device
// is valid on the GPU.
constexpr std::size_t kMaxSharedBytes = 227 * 1024;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// Process-wide oneTBB setup. Streams are drained by tasks enqueued into one arena whose slots are
// all open to workers (a host thread blocked in synchronize() must not take a slot away), and the
// global worker limit is raised by one so that every hardware thread runs blocks.
struct Runtime {
  int threads;
  tbb::global_control parallelism;
  tbb::task_arena arena;
  Runtime()
      : threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
        parallelism(tbb::global_control::max_allowed_parallelism,
                    static_cast<std::size_t>(threads) + 1),
        arena(threads, 0) {}
  static Runtime& get() {
    static Runtime rt;
    return rt;
  }
};

const KernelTable& select_table(const std::string& want) {
  const std::int64_t have = hwy::SupportedTargets();
  const bool has_avx3 = (have & HWY_AVX3) != 0, has_avx2 = (have & HWY_AVX2) != 0;
  if (want == "auto" || want.empty()) {
    if (has_avx3) return avx3::kernel_table();
    if (has_avx2) return avx2::kernel_table();
    return generic::kernel_table();
  }
  if (want == "avx3") {
    if (!has_avx3) throw Unsupported("open cpu device", "simd", want, "a target this CPU has (it lacks AVX-512)");
    return avx3::kernel_table();
  }
  if (want == "avx2") {
    if (!has_avx2) throw Unsupported("open cpu device", "simd", want, "a target this CPU has (it lacks AVX2+FMA)");
    return avx2::kernel_table();
  }
  if (want == "generic") return generic::kernel_table();
  throw InvalidArgument("open cpu device", "simd", want, "one of auto, avx3, avx2, generic");
}

// --- events -------------------------------------------------------------------------------------
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0, completed = 0;
  std::chrono::steady_clock::time_point when{};
  std::vector<std::pair<std::uint64_t, std::function<void()>>> waiters;

  void complete(std::uint64_t g) {
    std::vector<std::function<void()>> ready;
    {
      std::lock_guard<std::mutex> lk(mu);
      completed = std::max(completed, g);
      when = std::chrono::steady_clock::now();
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->first <= completed) {
          ready.push_back(std::move(it->second));
          it = waiters.erase(it);
        } else {
          ++it;
        }
      }
      cv.notify_all();
    }
    for (auto& f : ready) f();
  }
  // True if generation g already completed; otherwise `fn` runs once it does.
  bool ready_or_register(std::uint64_t g, std::function<void()> fn) {
    std::lock_guard<std::mutex> lk(mu);
    if (completed >= g) return true;
    waiters.emplace_back(g, std::move(fn));
    return false;
  }
};

class CpuDevice;

class CpuStream final : public Stream {
 public:
  explicit CpuStream(CpuDevice& dev);
  ~CpuStream() override;

  Device& device() const override;
  void synchronize() override {
    std::unique_lock<std::mutex> lk(mu_);
    const std::uint64_t target = submitted_;
    cv_.wait(lk, [&] { return completed_ >= target; });
  }
  bool query() override {
    std::lock_guard<std::mutex> lk(mu_);
    return completed_ == submitted_;
  }
  void wait(const Event& event) override;
  void* native_handle() const override { return nullptr; }

  void enqueue_op(std::function<void()> run) { enqueue(Op{std::move(run), nullptr, 0}); }
  void enqueue_wait(std::shared_ptr<EventState> ev, std::uint64_t g) {
    enqueue(Op{{}, std::move(ev), g});
  }

 protected:
  void copy_h2d(void* dst, const void* src, std::size_t bytes) override {
    // The source may be reused once this returns: stage it now (as CUDA does for pageable memory).
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    enqueue_op([dst, staged] { parallel_copy(dst, staged->data(), staged->size()); });
  }
  void copy_d2h(void* dst, const void* src, std::size_t bytes) override {
    enqueue_op([=] { parallel_copy(dst, src, bytes); });
  }
  void copy_d2d(void* dst, const void* src, std::size_t bytes) override {
    enqueue_op([=] { parallel_copy(dst, src, bytes); });
  }
  void fill32(void* dst, std::uint32_t pattern, std::size_t count) override {
    enqueue_op([=] {
      auto* p = static_cast<std::uint32_t*>(dst);
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, 1 << 18), [&](const auto& r) {
        std::fill(p + r.begin(), p + r.end(), pattern);
      });
    });
  }
  void launch(const lockstep::detail::KernelLaunch& l) override;

 private:
  struct Op {
    std::function<void()> run;
    std::shared_ptr<EventState> wait;
    std::uint64_t wait_gen;
  };
  static void parallel_copy(void* dst, const void* src, std::size_t bytes) {
    constexpr std::size_t kChunk = 1 << 20;
    if (bytes <= kChunk) {
      std::memcpy(dst, src, bytes);
      return;
    }
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (bytes + kChunk - 1) / kChunk, 1),
                      [&](const auto& r) {
                        for (std::size_t c = r.begin(); c < r.end(); ++c) {
                          const std::size_t off = c * kChunk;
                          std::memcpy(static_cast<char*>(dst) + off,
                                      static_cast<const char*>(src) + off,
                                      std::min(kChunk, bytes - off));
                        }
                      });
  }
  void enqueue(Op op) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(op));
      ++submitted_;
      if (!active_) active_ = start = true;
    }
    if (start) schedule();
  }
  void schedule() {
    Runtime::get().arena.enqueue([this] { drain(); });
  }
  void mark_done() {
    std::lock_guard<std::mutex> lk(mu_);
    ++completed_;
    cv_.notify_all();
  }
  void drain() {
    for (;;) {
      Op op;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (q_.empty()) {
          active_ = false;
          cv_.notify_all();
          return;  // touches nothing of *this after the lock is released
        }
        op = std::move(q_.front());
        q_.pop_front();
      }
      if (op.wait) {
        // An event wait never blocks a worker: the drain resumes when the event completes.
        if (!op.wait->ready_or_register(op.wait_gen, [this] {
              mark_done();
              schedule();
            }))
          return;
      } else {
        op.run();
      }
      mark_done();
    }
  }

  CpuDevice& dev_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> q_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  bool active_ = false;
  std::condition_variable idle_cv_;
};

class CpuEvent final : public Event {
 public:
  CpuEvent(Device& dev, bool timing) : dev_(dev), timing_(timing) {}
  void record(Stream& stream) override {
    auto* s = dynamic_cast<CpuStream*>(&stream);
    LOCKSTEP_CHECK_ARG(s != nullptr, "Event::record", "stream", stream.device().id().str(),
              "a stream of a CPU device");
    // As on CUDA (cudaEventRecord): an event is recorded on a stream of its own device. (A stream
    // may wait on an event of another device.)
    LOCKSTEP_CHECK_ARG(&stream.device() == &dev_, "Event::record", "stream.device", stream.device().id().str(),
              "the event's device " + dev_.id().str());
    std::uint64_t g;
    {
      std::lock_guard<std::mutex> lk(st_->mu);
      g = ++st_->recorded;
    }
    auto st = st_;
    s->enqueue_op([st, g] { st->complete(g); });
  }
  bool query() override {
    std::lock_guard<std::mutex> lk(st_->mu);
    return st_->completed >= st_->recorded;
  }
  void synchronize() override {
    std::unique_lock<std::mutex> lk(st_->mu);
    const std::uint64_t target = st_->recorded;
    st_->cv.wait(lk, [&] { return st_->completed >= target; });
  }
  double elapsed_ms(const Event& start) const override {
    auto* s = dynamic_cast<const CpuEvent*>(&start);
    LOCKSTEP_CHECK_ARG(s != nullptr && &s->dev_ == &dev_, "Event::elapsed_ms", "start", "an event",
              "an event of the same device");
    LOCKSTEP_CHECK_ARG(timing_ && s->timing_, "Event::elapsed_ms", "timing", "false",
              "true for both events (create_event(true))");
    // Both states locked at once by std::scoped_lock, which orders the two mutexes: two lock_guards
    // in argument order deadlocked a.elapsed_ms(b) on one thread against b.elapsed_ms(a) on
    // another. An event measured against itself locks its one mutex once (locking a std::mutex
    // twice hung) and gives 0, as cudaEventElapsedTime does.
    const auto done = [](const EventState& e) { return e.recorded > 0 && e.completed >= e.recorded; };
    if (s->st_ == st_) {
      std::lock_guard<std::mutex> lk(st_->mu);
      LOCKSTEP_CHECK_ARG(done(*st_), "Event::elapsed_ms", "events", "not completed", "recorded and completed");
      return 0.0;
    }
    std::scoped_lock lk(st_->mu, s->st_->mu);
    LOCKSTEP_CHECK_ARG(done(*st_) && done(*s->st_), "Event::elapsed_ms", "events", "not completed",
                       "recorded and completed");
    return std::chrono::duration<double, std::milli>(st_->when - s->st_->when).count();
  }
  const std::shared_ptr<EventState>& state() const { return st_; }

 private:
  Device& dev_;
  bool timing_;
  std::shared_ptr<EventState> st_ = std::make_shared<EventState>();
};

std::uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? std::uint64_t(pages) * std::uint64_t(size) : 0;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  return "unknown CPU";
}

class CpuDevice final : public Device {
 public:
  CpuDevice(const CpuDeviceOptions& o)
      : opts_(o), table_(select_table(o.simd)), rt_(Runtime::get()) {
    id_ = DeviceId{DeviceKind::kCpu, o.index};
    caps_.multiprocessors = rt_.threads;
    caps_.max_threads_per_block = 1024;
    caps_.warp_size = 32;
    caps_.max_shared_bytes_per_block = kMaxSharedBytes;
    caps_.total_memory = o.memory_capacity != 0 ? o.memory_capacity : physical_memory();
    caps_.tensor_cores = false;
    caps_.bit_faithful = true;
    caps_.simulated = true;
    caps_.simd_target = table_.target;
    name_ = "lockstep simulated GPU on " + cpu_model() + " (" + std::to_string(rt_.threads) +
            " threads, " + table_.target + ")";
    shuffle_ = o.shuffle_blocks;
    paths_ = CpuPaths{o.decode_lanes, o.exact_lanes, o.softmax_lanes, o.block_passes};
    default_stream_ = std::make_unique<CpuStream>(*this);
  }
  ~CpuDevice() override {
    default_stream_.reset();
  }

  DeviceId id() const override { return id_; }
  std::string name() const override { return name_; }
  const DeviceCaps& caps() const override { return caps_; }
  MemoryStats memory_stats() const override {
    std::lock_guard<std::mutex> lk(alloc_mu_);
    return MemoryStats{in_use_, peak_, opts_.memory_capacity};
  }
  Stream& default_stream() override { return *default_stream_; }
  std::unique_ptr<Stream> create_stream() override {
    auto s = std::make_unique<CpuStream>(*this);
    detail::StreamAccess::keep_device_alive(*s, weak_from_this().lock());
    return s;
  }
  std::unique_ptr<Event> create_event(bool timing) override {
    auto e = std::make_unique<CpuEvent>(*this, timing);
    detail::StreamAccess::keep_device_alive(*e, weak_from_this().lock());
    return e;
  }
  void synchronize() override {
    std::lock_guard<std::mutex> lk(streams_mu_);
    for (CpuStream* s : streams_) s->synchronize();
  }

  void register_stream(CpuStream* s) {
    std::lock_guard<std::mutex> lk(streams_mu_);
    streams_.insert(s);
  }
  void unregister_stream(CpuStream* s) {
    std::lock_guard<std::mutex> lk(streams_mu_);
    streams_.erase(s);
  }
  const KernelTable& table() const { return table_; }
  bool shuffle_blocks() const { return shuffle_; }
  const CpuPaths& paths() const { return paths_; }
  // Test support (lockstep/launch_checked.hpp's set_cpu_paths).
  CpuDeviceOptions set_paths(const CpuDeviceOptions& o) {
    CpuDeviceOptions old;
    old.shuffle_blocks = shuffle_;
    old.decode_lanes = paths_.decode_lanes;
    old.exact_lanes = paths_.exact_lanes;
    old.softmax_lanes = paths_.softmax_lanes;
    old.block_passes = paths_.block_passes;
    shuffle_ = o.shuffle_blocks;
    paths_ = CpuPaths{o.decode_lanes, o.exact_lanes, o.softmax_lanes, o.block_passes};
    return old;
  }

 protected:
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    const std::size_t rounded = (bytes + 63) & ~std::size_t{63};
    {
      std::lock_guard<std::mutex> lk(alloc_mu_);
      if (opts_.memory_capacity != 0 && (bytes > opts_.memory_capacity ||
                                         in_use_ > opts_.memory_capacity - bytes))
        throw OutOfMemory(id_.str(), bytes, opts_.memory_capacity - in_use_);
      in_use_ += bytes;
      peak_ = std::max(peak_, in_use_);
    }
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      std::lock_guard<std::mutex> lk(alloc_mu_);
      in_use_ -= bytes;
      // The host's free physical memory: what an uncapped device could still hand out.
      const long avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
      throw OutOfMemory(id_.str(), bytes,
                        avail > 0 && page > 0 ? std::uint64_t(avail) * std::uint64_t(page) : 0,
                        "host memory for an uncapped CPU device");
    }
    if (opts_.poison) {
      auto* w = static_cast<std::uint32_t*>(p);
      const std::size_t n = rounded / 4;
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1 << 18), [&](const auto& r) {
        std::fill(w + r.begin(), w + r.end(), kPoisonPattern);
      });
    }
    return p;
  }
  void release(void* ptr, std::size_t bytes) noexcept override {
    synchronize();  // Note [buffer release]
    std::free(ptr);
    std::lock_guard<std::mutex> lk(alloc_mu_);
    in_use_ -= bytes;
  }

 private:
  CpuDeviceOptions opts_;
  const KernelTable& table_;
  Runtime& rt_;
  DeviceId id_;
  DeviceCaps caps_;
  std::string name_;
  bool shuffle_ = false;
  CpuPaths paths_;
  mutable std::mutex alloc_mu_;
  std::uint64_t in_use_ = 0, peak_ = 0;
  std::mutex streams_mu_;
  std::set<CpuStream*> streams_;
  std::unique_ptr<CpuStream> default_stream_;
};

CpuStream::CpuStream(CpuDevice& dev) : dev_(dev) { dev_.register_stream(this); }
CpuStream::~CpuStream() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return completed_ == submitted_ && !active_; });
  }
  dev_.unregister_stream(this);
}
Device& CpuStream::device() const { return dev_; }

void CpuStream::wait(const Event& event) {
  auto* e = dynamic_cast<const CpuEvent*>(&event);
  LOCKSTEP_CHECK_ARG(e != nullptr, "Stream::wait", "event", "an event of another backend",
            "an event of a CPU device");
  std::uint64_t g;
  {
    std::lock_guard<std::mutex> lk(e->state()->mu);
    g = e->state()->recorded;
  }
  if (g == 0) return;  // never recorded: nothing to wait for (as CUDA)
  enqueue_wait(e->state(), g);
}

// A thread's shared-memory scratch, reused by every block the thread runs.
char* thread_shared_memory() {
  struct Scratch {
    void* p = std::aligned_alloc(64, kMaxSharedBytes + 64);
    ~Scratch() { std::free(p); }
  };
  thread_local Scratch s;
  return static_cast<char*>(s.p);
}

void CpuStream::launch(const lockstep::detail::KernelLaunch& l) {
  const KernelTable& t = dev_.table();
  LOCKSTEP_ASSERT(l.kernel_index >= 0 && l.kernel_index < t.count, "kernel index out of range");
  std::vector<unsigned char> params(static_cast<const unsigned char*>(l.params),
                                    static_cast<const unsigned char*>(l.params) + l.params_size);
  const BlockRangeFn fn = t.fns[l.kernel_index];
  const bool shuffle = dev_.shuffle_blocks();
  const CpuPaths paths = dev_.paths();
  const int threads = Runtime::get().threads;
  enqueue_op([l = lockstep::detail::KernelLaunch(l), params = std::move(params), fn, shuffle, paths, threads]() mutable {
    l.params = params.data();
    const Dim3 g = l.config.grid;
    const std::uint64_t n = std::uint64_t{g.x} * g.y * g.z;
    std::vector<std::uint64_t> order;
    if (shuffle) {  // expose inter-block races: blocks run in a random order
      order.resize(n);
      std::iota(order.begin(), order.end(), std::uint64_t{0});
      std::shuffle(order.begin(), order.end(), std::mt19937_64(std::random_device{}()));
    }
    const std::uint64_t* ord = shuffle ? order.data() : nullptr;
    if (n == 1 || threads == 1) {
      fn(l, 0, n, thread_shared_memory(), ord, paths);
      return;
    }
    const std::uint64_t grain = std::max<std::uint64_t>(1, n / (std::uint64_t(threads) * 8));
    tbb::parallel_for(
        tbb::blocked_range<std::uint64_t>(0, n, grain),
        [&](const tbb::blocked_range<std::uint64_t>& r) {
          fn(l, r.begin(), r.end(), thread_shared_memory(), ord, paths);
        },
        tbb::simple_partitioner());
  });
}

// The simulation checks of the environment (LOCKSTEP_CPU_SHUFFLE_BLOCKS, _DECODE_LANES,
// _EXACT_LANES, _SOFTMAX_LANES, _BLOCK_PASSES) switched on in `o`, for every CPU device, open's and
// make_cpu_device's alike, so that a test suite rerun under one reaches every device. Each takes
// 0 or 1 (the registry refuses other values before a device opens); unset or empty: off.
void with_environment_checks(CpuDeviceOptions& o) {
  const auto on = [](const char* name) {
    const char* v = env(name);  // null when unset or empty
    return v != nullptr && std::string(v) != "0";
  };
  o.shuffle_blocks = o.shuffle_blocks || on("LOCKSTEP_CPU_SHUFFLE_BLOCKS");
  o.decode_lanes = o.decode_lanes || on("LOCKSTEP_CPU_DECODE_LANES");
  o.exact_lanes = o.exact_lanes || on("LOCKSTEP_CPU_EXACT_LANES");
  o.softmax_lanes = o.softmax_lanes || on("LOCKSTEP_CPU_SOFTMAX_LANES");
  o.block_passes = o.block_passes || on("LOCKSTEP_CPU_BLOCK_PASSES");
}

CpuDeviceOptions options_from_env(int index) {
  CpuDeviceOptions o;
  o.index = index;
  if (const char* v = env("LOCKSTEP_CPU_POISON")) o.poison = std::string(v) != "0";
  // The numeric values were checked by the registry before the device opened (kKnobs).
  with_environment_checks(o);
  if (const char* v = env("LOCKSTEP_CPU_MEMORY")) {
    // Decimal digits only (strtoull took "abc" and "-5" as 0 and 2^64-5: no cap, silently).
    const std::string s(v);
    const bool digits = s.size() <= 19 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      throw InvalidArgument("open cpu device", "LOCKSTEP_CPU_MEMORY", s,
                            "a byte count in decimal digits below 10^19 (0: no cap)");
    o.memory_capacity = std::strtoull(v, nullptr, 10);
  }
  if (const char* v = env("LOCKSTEP_CPU_SIMD")) {
    const std::string s(v);
    if (s != "auto" && s != "avx3" && s != "avx2" && s != "generic")
      throw InvalidArgument("open cpu device", "LOCKSTEP_CPU_SIMD", s, "one of auto, avx3, avx2, generic");
    o.simd = s;
  }
  return o;
}

class CpuBackend final : public lockstep::detail::Backend {
 public:
  static constexpr int kMaxDevices = 64;
  CpuBackend() { Runtime::get(); }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  BackendInfo info() override {
    BackendInfo b;
    b.kind = DeviceKind::kCpu;
    b.built = b.usable = true;
    auto dev = open(0);
    b.devices.push_back(DeviceInfo{dev->id(), dev->name(), dev->caps()});
    return b;
  }
  std::shared_ptr<Device> open(int index) override {
    if (index < 0 || index >= kMaxDevices)
      throw DeviceUnavailable("lockstep: cannot open cpu:" + std::to_string(index) +
                              ": index must be in [0, " + std::to_string(kMaxDevices - 1) + "]");
    std::lock_guard<std::mutex> lk(mu_);
    auto& d = devices_[index];
    if (!d) d = std::make_shared<CpuDevice>(options_from_env(index));
    return d;
  }

 private:
  std::mutex mu_;
  std::map<int, std::shared_ptr<Device>> devices_;
};

}  // namespace

std::atomic<std::uint64_t>& warp_pass_ranges() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}
}  // namespace lockstep::cpu

namespace lockstep::detail {
Backend& cpu_backend() {
  static cpu::CpuBackend b;
  return b;
}
std::shared_ptr<Device> make_cpu_device(const CpuDeviceOptions& options) {
  CpuDeviceOptions o = options;
  cpu::with_environment_checks(o);
  return std::make_shared<cpu::CpuDevice>(o);
}
std::optional<CpuDeviceOptions> set_cpu_device_paths(Device& device, const CpuDeviceOptions& paths) {
  auto* cpu = dynamic_cast<cpu::CpuDevice*>(&device);
  if (cpu == nullptr) return std::nullopt;
  return cpu->set_paths(paths);
}
}  // namespace lockstep::detail
