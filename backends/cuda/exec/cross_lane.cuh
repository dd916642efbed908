#pragma once
// CudaExec's cross-lane operations: shuffles, the butterfly reductions and the warp vote.

#include <cuda_runtime.h>

#include "lockstep/kernels/math.hpp"

namespace lockstep::cuda {

struct CudaCrossLane {
  template <class T>
  __device__ __forceinline__ T shfl_xor(T v, int k) const {
    return __shfl_xor_sync(0xffffffffu, v, k);
  }
  template <class T>
  __device__ __forceinline__ T shfl(T v, int src) const {
    return __shfl_sync(0xffffffffu, v, src);
  }
  template <int W = 32>
  __device__ __forceinline__ float warp_sum(float v) const {
#pragma unroll
    for (int k = W / 2; k >= 1; k /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, k);
    return v;
  }
  template <int W = 32>
  __device__ __forceinline__ float warp_max(float v) const {
#pragma unroll
    for (int k = W / 2; k >= 1; k /= 2) v = math::max(v, __shfl_xor_sync(0xffffffffu, v, k));
    return v;
  }
  template <int W = 32>
  __device__ __forceinline__ float warp_min(float v) const {
#pragma unroll
    for (int k = W / 2; k >= 1; k /= 2) v = math::min(v, __shfl_xor_sync(0xffffffffu, v, k));
    return v;
  }
  // Whether m holds in any lane of the warp (every lane calls it); no barrier. Only for choices
  // that cannot change bits (the CPU device, whose warps run in lockstep, has no such vote).
  __device__ __forceinline__ bool warp_any(bool m) const { return __any_sync(0xffffffffu, m) != 0; }
};

}  // namespace lockstep::cuda
