// Built when the CUDA backend is not: the registry reports why, interop refuses.
#include "backend.hpp"

namespace lockstep::detail {
Backend* cuda_backend() { return nullptr; }
std::unique_ptr<Stream> cuda_wrap_stream(Device&, void*) {
  throw Unsupported("lockstep: cuda_wrap_stream: the CUDA backend is not built into this library");
}
}  // namespace lockstep::detail
