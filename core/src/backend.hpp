#pragma once
// Private: what the registry needs from each backend. Core code includes no backend code; the
// backends implement this interface and the registry reaches them through the functions below.

#include <memory>
#include <optional>

#include "lockstep/device.hpp"

namespace lockstep::detail {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual BackendInfo info() = 0;
  // Throws DeviceUnavailable (not usable, index out of range).
  virtual std::shared_ptr<Device> open(int index) = 0;
};

Backend& cpu_backend();
// nullptr when the library was built without the CUDA backend.
Backend* cuda_backend();

std::shared_ptr<Device> make_cpu_device(const CpuDeviceOptions& options);
// lockstep/launch_checked.hpp's set_cpu_paths; nullopt when `device` is not a CPU device.
std::optional<CpuDeviceOptions> set_cpu_device_paths(Device& device, const CpuDeviceOptions& paths);
// CUDA interop (only reached when the CUDA backend is built).
std::unique_ptr<Stream> cuda_wrap_stream(Device& device, void* cuda_stream);

}  // namespace lockstep::detail
