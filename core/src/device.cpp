// Out-of-line members of the core interface.
#include "lockstep/device.hpp"

namespace lockstep {

Stream::~Stream() { release_scratch(); }

void Stream::release_scratch() noexcept {
  for (auto& b : scratch_) detail::DeviceAccess::release(*b.device, b.ptr, b.bytes);
  scratch_.clear();
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

}  // namespace lockstep
