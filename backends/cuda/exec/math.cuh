#pragma once
// CudaExec's lane-wise math: the project's functions (kernels/math.hpp) and IEEE-exact intrinsics.

#include <cuda_runtime.h>

#include "lockstep/kernels/math.hpp"

namespace lockstep::cuda {

struct CudaMath {
  __device__ __forceinline__ float exp(float v) const { return math::exp(v); }
  __device__ __forceinline__ float exp2(float v) const { return math::exp2(v); }
  __device__ __forceinline__ float exp2_weight(float v) const { return math::exp2_weight(v); }
  // Note [hardware exp2 on the tensor-core path] (kernels/fused/mma_sync.hpp): the SFU's
  // ex2.approx (one MUFU.EX2; results below 2^-126 flush to 0, as exp2_weight gives 0 below
  // -126.5). Only the tensor-core softmax calls it; the CPU device evaluates exp2_weight there.
  __device__ __forceinline__ float exp2_tc(float v) const {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
  }
  __device__ __forceinline__ float log(float v) const { return math::log(v); }
  __device__ __forceinline__ float sin(float v) const { return math::sin(v); }
  __device__ __forceinline__ float cos(float v) const { return math::cos(v); }
  __device__ __forceinline__ float sqrt(float v) const { return __fsqrt_rn(v); }
  __device__ __forceinline__ float abs(float v) const { return math::abs(v); }
  __device__ __forceinline__ float to_float(int v) const { return static_cast<float>(v); }
  __device__ __forceinline__ int as_int(float v) const { return __float_as_int(v); }
  __device__ __forceinline__ float as_float(int v) const { return __int_as_float(v); }
  __device__ __forceinline__ float rint(float v) const { return rintf(v); }
  __device__ __forceinline__ float floor(float v) const { return floorf(v); }
  __device__ __forceinline__ bool isnan(float v) const { return v != v; }
  __device__ __forceinline__ float round_to_half(float v) const { return math::round_to_half(v); }
  __device__ __forceinline__ float fma(float a, float b, float c) const { return __fmaf_rn(a, b, c); }
  __device__ __forceinline__ float max(float a, float b) const { return math::max(a, b); }
  __device__ __forceinline__ float max_num(float a, float b) const { return math::max_num(a, b); }
  __device__ __forceinline__ float min(float a, float b) const { return math::min(a, b); }
  template <class T>
  __device__ __forceinline__ T select(bool m, T a, T b) const {
    return m ? a : b;
  }
  __device__ __forceinline__ int idiv(int a, int b) const { return a / b; }
};

}  // namespace lockstep::cuda
