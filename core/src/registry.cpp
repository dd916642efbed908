#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend.hpp"
#include "lockstep/device.hpp"
#include "lockstep/interop.hpp"
#include "lockstep/launch_checked.hpp"

namespace lockstep {

namespace {
detail::Backend* backend_for(DeviceKind kind) {
  if (kind == DeviceKind::kCpu) return &detail::cpu_backend();
  return detail::cuda_backend();
}

// The environment variables read when a device is opened (docs/api.md, "Environment") that take
// a number, with the values each takes. A value it does not take (LOCKSTEP_PDL=false) would act
// as some other value or as unset, silently, so a set one is checked whenever a device is
// opened. Not here: the ones with text values (LOCKSTEP_DEVICE, LOCKSTEP_TUNING,
// LOCKSTEP_CPU_MEMORY, LOCKSTEP_CPU_SIMD), checked where they are read.
struct Knob {
  const char* name;
  const char* values;  // "a|b|c", or "" for any decimal integer
};
constexpr Knob kKnobs[] = {
    {"LOCKSTEP_CPU_BLOCK_PASSES", "0|1"},   {"LOCKSTEP_CPU_DECODE_LANES", "0|1"},
    {"LOCKSTEP_CPU_EXACT_LANES", "0|1"},    {"LOCKSTEP_CPU_SOFTMAX_LANES", "0|1"},
    {"LOCKSTEP_CPU_POISON", "0|1"},         {"LOCKSTEP_CPU_SHUFFLE_BLOCKS", "0|1"},
    {"LOCKSTEP_PDL", "0|1"},                {"LOCKSTEP_DRIVER_LAUNCH", "0|1"},
};

bool decimal_integer(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  if (s.empty() || s.size() > 9) return false;  // within int, as the knobs are read
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

void check_knobs(std::string_view where) {
  for (const Knob& k : kKnobs) {
    const char* v = std::getenv(k.name);
    if (v == nullptr || *v == '\0') continue;
    const std::string_view value(v), values(k.values);
    bool ok = false;
    if (values.empty()) {
      ok = decimal_integer(value);
    } else {
      for (std::size_t b = 0; b <= values.size() && !ok;) {
        const std::size_t e = std::min(values.find('|', b), values.size());
        ok = values.substr(b, e - b) == value;
        b = e + 1;
      }
    }
    if (!ok) {
      std::string limit = values.empty() ? std::string("a decimal integer of at most 9 digits") : "one of ";
      if (!values.empty())
        for (char c : values) limit += c == '|' ? std::string(", ") : std::string(1, c);
      throw InvalidArgument(where, k.name, "\"" + std::string(value) + "\"", limit + " (or unset)");
    }
  }
}
}  // namespace

std::vector<BackendInfo> devices() {
  check_knobs("devices");
  std::vector<BackendInfo> out;
  out.push_back(detail::cpu_backend().info());
  if (auto* cuda = detail::cuda_backend()) {
    out.push_back(cuda->info());
  } else {
    BackendInfo b;
    b.kind = DeviceKind::kCuda;
    b.built = false;
    b.usable = false;
    b.reason = "not built (this library was configured without the CUDA toolkit or with "
               "LOCKSTEP_CUDA=OFF)";
    out.push_back(std::move(b));
  }
  return out;
}

DeviceId resolve_auto() {
  if (const char* env = std::getenv("LOCKSTEP_DEVICE"); env != nullptr && *env != '\0') {
    std::string_view text(env);
    if (text != "auto") {
      try {
        return DeviceId::parse(text);
      } catch (const InvalidArgument&) {
        throw InvalidArgument("resolve_auto", "LOCKSTEP_DEVICE", "\"" + std::string(text) + "\"",
                              "one of \"auto\", \"cpu\", \"cpu:N\", \"cuda\", \"cuda:N\", N in [0, 2147483647] "
                              "without a sign or leading zeros");
      }
    }
  }
  if (auto* cuda = detail::cuda_backend(); cuda != nullptr && cuda->info().usable)
    return DeviceId{DeviceKind::kCuda, 0};
  return DeviceId{DeviceKind::kCpu, 0};
}

std::shared_ptr<Device> open(DeviceId id) {
  // A kind cast from an integer that names no backend (it used to be reported as CUDA's).
  LOCKSTEP_CHECK_ARG(id.kind == DeviceKind::kCpu || id.kind == DeviceKind::kCuda, "open", "id.kind",
                     static_cast<int>(id.kind), "DeviceKind::kCpu or DeviceKind::kCuda");
  check_knobs("open " + id.str());
  detail::Backend* b = backend_for(id.kind);
  if (b == nullptr)
    throw DeviceUnavailable("lockstep: cannot open " + id.str() +
                            ": the CUDA backend is not built into this library");
  return b->open(id.index);
}

std::shared_ptr<Device> open(std::string_view spec) {
  const DeviceSpec s = DeviceSpec::parse(spec);
  return open(s.is_auto ? resolve_auto() : s.id);
}

std::shared_ptr<Device> make_cpu_device(const CpuDeviceOptions& options) {
  check_knobs("make_cpu_device");
  // The ids open() accepts for CPU devices (cpu:N, N < 64), so that messages name a real id.
  LOCKSTEP_CHECK_ARG(options.index >= 0 && options.index < 64, "make_cpu_device", "options.index",
                     options.index, "in [0, 64)");
  return detail::make_cpu_device(options);
}

std::unique_ptr<Stream> cuda_wrap_stream(const std::shared_ptr<Device>& device,
                                         void* cuda_stream) {
  // Without the backend no argument could be right: say that first (interop.hpp).
  if (detail::cuda_backend() == nullptr)
    throw Unsupported("lockstep: cuda_wrap_stream: the CUDA backend is not built into this library");
  LOCKSTEP_CHECK_ARG(device != nullptr, "cuda_wrap_stream", "device", "null", "an open CUDA device");
  LOCKSTEP_CHECK_ARG(device->id().kind == DeviceKind::kCuda, "cuda_wrap_stream", "device",
            device->id().str(), "a CUDA device");
  LOCKSTEP_CHECK_ARG(cuda_stream != nullptr, "cuda_wrap_stream", "cuda_stream", "null",
            "a cudaStream_t created by the caller (the legacy default stream is not accepted)");
  return detail::cuda_wrap_stream(*device, cuda_stream);
}

namespace detail {

namespace {
thread_local LaunchRecorder* t_recorder = nullptr;
}  // namespace

LaunchRecorder::LaunchRecorder() : outer_(t_recorder) { t_recorder = this; }
LaunchRecorder::~LaunchRecorder() { t_recorder = outer_; }
bool LaunchRecorder::launched(int kernel_index) const {
  for (int k : kernels_)
    if (k == kernel_index) return true;
  return false;
}

CpuDeviceOptions set_cpu_paths(Device& device, const CpuDeviceOptions& paths) {
  auto old = set_cpu_device_paths(device, paths);
  LOCKSTEP_CHECK_ARG(old.has_value(), "set_cpu_paths", "device", device.id().str(), "a CPU device");
  return *old;
}

void launch_checked(Stream& stream, const KernelLaunch& l) {
  const DeviceCaps& caps = stream.device().caps();
  // The location text is built only when a check fails (this runs on every launch).
#define LS_WHERE (std::string("launch ") + l.kernel_name)
  const auto& c = l.config;
  LOCKSTEP_CHECK_ARG(c.block_threads >= 1, LS_WHERE, "block_threads", c.block_threads, ">= 1");
  LOCKSTEP_CHECK_ARG(c.block_threads <= static_cast<std::uint32_t>(caps.max_threads_per_block), LS_WHERE,
            "block_threads", c.block_threads,
            "<= " + std::to_string(caps.max_threads_per_block) + " (the device limit)");
  LOCKSTEP_CHECK_ARG(c.block_threads == l.compiled_threads, LS_WHERE, "block_threads", c.block_threads,
            "the kernel's compiled block size " + std::to_string(l.compiled_threads));
  LOCKSTEP_CHECK_ARG(c.grid.x >= 1 && c.grid.x <= 0x7fffffffu, LS_WHERE, "grid.x", c.grid.x,
            "in [1, 2147483647]");
  LOCKSTEP_CHECK_ARG(c.grid.y >= 1 && c.grid.y <= 65535u, LS_WHERE, "grid.y", c.grid.y, "in [1, 65535]");
  LOCKSTEP_CHECK_ARG(c.grid.z >= 1 && c.grid.z <= 65535u, LS_WHERE, "grid.z", c.grid.z, "in [1, 65535]");
  LOCKSTEP_CHECK_ARG(c.shared_bytes <= caps.max_shared_bytes_per_block, LS_WHERE, "shared_bytes",
            static_cast<std::uint64_t>(c.shared_bytes),
            "<= " + std::to_string(caps.max_shared_bytes_per_block) +
                " (the per-block shared memory limit)");
#undef LS_WHERE
  if (t_recorder != nullptr) t_recorder->record(l.kernel_index);
  StreamAccess::launch(stream, l);
}

}  // namespace detail
}  // namespace lockstep
