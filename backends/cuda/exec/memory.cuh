#pragma once
// CudaExec's loads, stores and asynchronous copies (cp.async, L2 policies and prefetches).

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "lockstep/formats.hpp"
#include "lockstep/kernels/math.hpp"

namespace lockstep::cuda {

template <class T>
struct Quad {
  T x, y, z, w;
};

struct CudaMemory {
  template <class T>
  __device__ __forceinline__ T load_uniform(const T* p) const {
    return *p;
  }
  template <class T, std::enable_if_t<!is_format_v<T>, int> = 0>
  __device__ __forceinline__ T load(const T* base, int off) const {
    return base[off];
  }
  template <class T>
  __device__ __forceinline__ T load(const T* base, int off, bool m, T fallback) const {
    return m ? base[off] : fallback;
  }
  // Storage formats (lockstep/formats.hpp): a load widens the code to float, a store rounds the
  // float to the format, by the formats' own conversions (the CPU device runs the same code).
  template <class S, std::enable_if_t<is_format_v<S>, int> = 0>
  __device__ __forceinline__ float load(const S* base, int off) const {
    return widen(base[off]);
  }
  template <class S, std::enable_if_t<is_format_v<S>, int> = 0>
  __device__ __forceinline__ float load(const S* base, int off, bool m, float fallback) const {
    return m ? widen(base[off]) : fallback;
  }
  template <class S, std::enable_if_t<is_format_v<S>, int> = 0>
  __device__ __forceinline__ void store(S* base, int off, float v, bool m = true) const {
    if (m) base[off] = from_float<S>(v);
  }
  template <class T, class V>
  __device__ __forceinline__ void store(T* base, int off, V v) const {
    base[off] = static_cast<T>(v);
  }
  template <class T, class V>
  __device__ __forceinline__ void store(T* base, int off, V v, bool m) const {
    if (m) base[off] = static_cast<T>(v);
  }
  __device__ __forceinline__ Quad<float> load4(const float* base, int off, bool m = true) const {
    if (!m) return {0.0f, 0.0f, 0.0f, 0.0f};
    const float4 t = *reinterpret_cast<const float4*>(base + off);
    return {t.x, t.y, t.z, t.w};
  }
  // Four consecutive codes of a storage format (8 or 4 bytes, aligned as their offset, a
  // multiple of 4), each widened to float (widen: CUDA's conversions, which tools/gpu/formats.cu
  // holds equal to lockstep/formats.hpp's over every code).
  template <class S, std::enable_if_t<is_format_v<S>, int> = 0>
  __device__ __forceinline__ Quad<float> load4(const S* base, int off, bool m = true) const {
    if (!m) return {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (sizeof(S) == 2) {
      const uint2 t = *reinterpret_cast<const uint2*>(base + off);
      return {widen(S{static_cast<std::uint16_t>(t.x & 0xffffu)}), widen(S{static_cast<std::uint16_t>(t.x >> 16)}),
              widen(S{static_cast<std::uint16_t>(t.y & 0xffffu)}), widen(S{static_cast<std::uint16_t>(t.y >> 16)})};
    } else {
      const unsigned t = *reinterpret_cast<const unsigned*>(base + off);
      return {widen(S{static_cast<std::uint8_t>(t & 0xffu)}), widen(S{static_cast<std::uint8_t>((t >> 8) & 0xffu)}),
              widen(S{static_cast<std::uint8_t>((t >> 16) & 0xffu)}), widen(S{static_cast<std::uint8_t>(t >> 24)})};
    }
  }
  __device__ __forceinline__ static float widen(half h) { return __half2float(__ushort_as_half(h.bits)); }
  __device__ __forceinline__ static float widen(bfloat16 b) { return __uint_as_float(std::uint32_t(b.bits) << 16); }
  __device__ __forceinline__ static float widen(fp8_e4m3 v) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v.bits), __NV_E4M3);
    return __half2float(__half(h));
  }
  __device__ __forceinline__ static float widen(fp8_e5m2 v) { return widen(half{static_cast<std::uint16_t>(v.bits << 8)}); }
  __device__ __forceinline__ void store4(float* base, int off, const Quad<float>& q,
                                         bool m = true) const {
    if (m) *reinterpret_cast<float4*>(base + off) = make_float4(q.x, q.y, q.z, q.w);
  }

  // Asynchronous copies into shared memory (Note [async tiles] in kernels/decode/chunk.hpp): 16 bytes
  // from src[soff..] to dst[doff..] (dst in shared memory), zeros when m is false (nothing is
  // read then). They land after async_wait<P>() (at most P newer groups still pending) and a
  // sync(); commit closes a group. Before sm_80: an ordinary load and store.
  __device__ __forceinline__ void copy4_async(float* dst, int doff, const float* src, int soff,
                                              bool m) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + doff));
    const float* s = m ? src + soff : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(s), "r"(m ? 16 : 0)
                 : "memory");
#else
    store4(dst, doff, load4(src, soff, m));
#endif
  }
  // L2 eviction policies for copy4_async_stream (Note [streamed tiles] in kernels/decode/chunk.hpp):
  // kL2Unchanged (what a copy without a policy does to the L2, as measured), kL2EvictFirst
  // (data read once, more of it than the L2 holds), kL2EvictNormal (measurement only: 12-14%
  // slower streaming from DRAM than without a policy).
  __device__ __forceinline__ std::uint64_t l2_policy(int which) const {
    std::uint64_t unchanged = 0, first = 0, normal = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;\n" : "=l"(unchanged));
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(first));
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(normal));
#endif
    return which == kernels::kL2EvictFirst ? first : which == kernels::kL2EvictNormal ? normal : unchanged;
  }
  // As copy4_async, under an L2 policy from l2_policy: a cache hint, the same bytes copied.
  __device__ __forceinline__ void copy4_async_stream(float* dst, int doff, const float* src, int soff,
                                                     bool m, std::uint64_t policy) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + doff));
    const float* s = m ? src + soff : src;
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(d), "l"(s),
                 "r"(m ? 16 : 0), "l"(policy)
                 : "memory");
#else
    (void)policy;
    copy4_async(dst, doff, src, soff, m);
#endif
  }
  // As copy4_async, but a lane whose mask is false issues nothing (no zero fill): two such
  // copies with disjoint masks may fill one tile from two sources.
  __device__ __forceinline__ void copy4_async_some(float* dst, int doff, const float* src, int soff,
                                                   bool m) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (m) {
      const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + doff));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src + soff) : "memory");
    }
#else
    if (m) store4(dst, doff, load4(src, soff, true));
#endif
  }
  __device__ __forceinline__ void async_commit() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
  }
  template <int P>
  __device__ __forceinline__ void async_wait() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(P) : "memory");
#endif
  }
};

}  // namespace lockstep::cuda
