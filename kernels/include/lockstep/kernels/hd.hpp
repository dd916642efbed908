#pragma once
// Host/device qualifiers and the few definitions every kernel header needs.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__ __forceinline__
#define LOCKSTEP_DEVICE_FN __device__ __forceinline__
#define LOCKSTEP_HD_OUTLINED_ON_CPU LOCKSTEP_HD
#else
// always_inline: a helper compiled into several CPU SIMD variants must never be called out of
// line from a variant it was not compiled for (docs/architecture.md, "SIMD variants").
#define LOCKSTEP_HD inline __attribute__((always_inline))
#define LOCKSTEP_DEVICE_FN inline __attribute__((always_inline))
// A large helper that every instantiation would otherwise inline (compile time): out of line on
// the CPU. Only for templates over the execution context X, whose instantiations are distinct per
// SIMD variant (CpuExec is a different type in each), so no call crosses variants.
#define LOCKSTEP_HD_OUTLINED_ON_CPU __attribute__((noinline))
#endif

// Component i (0 x, 1 y, 2 z, 3 w; a constant once the loop over it is unrolled) of a quad, as
// x.load4 returns it on either backend.
template <class Q>
LOCKSTEP_HD const auto& quad_part(const Q& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// Unroll a loop with a compile-time trip count (register arrays must not be indexed at run time).
#if defined(__CUDACC__)
#define LOCKSTEP_UNROLL _Pragma("unroll")
#define LOCKSTEP_UNROLL_4 _Pragma("unroll 4")
#define LOCKSTEP_NO_UNROLL _Pragma("unroll 1")
#else
#define LOCKSTEP_UNROLL_4
#define LOCKSTEP_NO_UNROLL
#define LOCKSTEP_UNROLL  // the CPU's lanes live in memory: unrolling only costs compile time
#endif

#if defined(__CUDA_ARCH__)
#define LOCKSTEP_ON_DEVICE 1
#else
#define LOCKSTEP_ON_DEVICE 0
#endif

namespace lockstep::kernels {

inline constexpr int kWarpSize = 32;
// L2 eviction policies of x.copy4_async_stream (x.l2_policy; Note [streamed tiles] in decode.hpp).
inline constexpr int kL2Unchanged = 0, kL2EvictFirst = 1, kL2EvictNormal = 2;
inline constexpr float kInf = __builtin_huge_valf();

// The per-thread size/offset type. Per-lane offsets are 32-bit relative to a block-uniform 64-bit
// base pointer (docs/kernels.md, "Indexing"); hosts check sizes against kMaxLaneOffset.
using lane_int = std::int32_t;

// A kernel declares `static constexpr bool kWarpIndependent = true` when its warps never meet:
// no sync(), no shared memory, no block-wide operation, and no global memory that one warp of
// a block writes and another reads. Only the CPU uses it: it may then run the block one warp at a
// time (Note [warp passes] in backends/cpu/lanes/cpu_exec.hpp), the same bits.
// LOCKSTEP_FLAG_TRAIT(name, kMember): name<T>::value is T::kMember where T declares it, else false.
#define LOCKSTEP_FLAG_TRAIT(name, member)                                   \
  template <class T, class = void>                                          \
  struct name : std::false_type {};                                         \
  template <class T>                                                        \
  struct name<T, std::void_t<decltype(T::member)>> : std::bool_constant<T::member> {};
LOCKSTEP_FLAG_TRAIT(warp_independent, kWarpIndependent)
template <class K>
inline constexpr bool warp_independent_v = warp_independent<K>::value;

LOCKSTEP_HD constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
LOCKSTEP_HD constexpr std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
LOCKSTEP_HD constexpr std::int64_t imax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

}  // namespace lockstep::kernels
