// Out-of-line members of the core interface.
#include "lockstep/device.hpp"

#include <algorithm>

namespace lockstep {

Stream::~Stream() { release_scratch(); }

void Stream::release_scratch() noexcept {
  for (auto& b : scratch_) detail::DeviceAccess::release(*b.device, b.ptr, b.bytes);
  scratch_.clear();
  for (auto& b : counters_) detail::DeviceAccess::release(*b.device, b.ptr, b.bytes);
  counters_.clear();
}

void* Stream::scratch(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (!scratch_.empty() && scratch_.back().bytes >= bytes) return scratch_.back().ptr;
  std::size_t size = std::size_t(1) << 20;
  while (size < bytes) size *= 2;
  Device& dev = device();
  void* p = detail::DeviceAccess::allocate(dev, size);
  scratch_.push_back(ScratchBlock{&dev, p, size});
  return p;
}

std::int32_t* Stream::counters(std::size_t count) {
  const std::size_t bytes = std::max<std::size_t>(count, 1) * sizeof(std::int32_t);
  if (!counters_.empty() && counters_.back().bytes >= bytes)
    return static_cast<std::int32_t*>(counters_.back().ptr);
  std::size_t size = 4096;
  while (size < bytes) size *= 2;
  Device& dev = device();
  void* p = detail::DeviceAccess::allocate(dev, size);
  counters_.push_back(ScratchBlock{&dev, p, size});
  fill32(p, 0, size / sizeof(std::int32_t));
  return static_cast<std::int32_t*>(p);
}

}  // namespace lockstep
