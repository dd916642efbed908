#pragma once
// CUDA interop without CUDA headers: wrap a cudaStream_t (passed as void*) that the caller owns,
// so lockstep work is ordered with the caller's own kernels. Device pointers are wrapped with
// Buffer<T>::wrap. Neither takes ownership. Throws Unsupported when the CUDA backend is not built.

#include <memory>

#include "lockstep/device.hpp"

namespace lockstep {

std::unique_ptr<Stream> cuda_wrap_stream(const std::shared_ptr<Device>& device,
                                         void* cuda_stream);

}  // namespace lockstep
