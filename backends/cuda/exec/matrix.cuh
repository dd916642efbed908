#pragma once
// CudaExec's tensor-core operations: fp16 storage, WMMA tiles, mma.sync fragments, warpgroup
// products (wgmma) and bulk tiles. The fragment products and packing take the element format as a
// tag (::lockstep::half or ::lockstep::bfloat16; half where none is given).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "lockstep/formats.hpp"

namespace lockstep::cuda {

struct CudaMatrix {
  // fp16 storage and warp-level 16x16x16 tiles on the tensor cores (WMMA).
  using half_t = __half;
  struct AccTile {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f;
  };
  __device__ __forceinline__ void store_half(half_t* base, int off, float v, bool m = true) const {
    if (m) base[off] = __float2half_rn(v);
  }
  __device__ __forceinline__ void tile_zero(AccTile& t) const { nvcuda::wmma::fill_fragment(t.f, 0.0f); }
  __device__ __forceinline__ void tile_mma(AccTile& acc, const half_t* A, int a_off, int lda,
                                           const half_t* B, int b_off, int ldb) const {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::load_matrix_sync(a, A + a_off, lda);
    wmma::load_matrix_sync(b, B + b_off, ldb);
    wmma::mma_sync(acc.f, a, b, acc.f);
  }
  __device__ __forceinline__ void tile_store(float* C, int c_off, int ldc, const AccTile& acc) const {
    nvcuda::wmma::store_matrix_sync(C + c_off, acc.f, ldc, nvcuda::wmma::mem_row_major);
  }
  __device__ __forceinline__ void tile_load(AccTile& acc, const float* C, int c_off, int ldc) const {
    nvcuda::wmma::load_matrix_sync(acc.f, C + c_off, ldc, nvcuda::wmma::mem_row_major);
  }

  // Register fragments of the PTX mma.sync.m16n8k16 (Note [register fragments] in
  // kernels/fused/mma_sync.hpp): a fragment register is a lane_int holding two fp16 values (the
  // lower-indexed one in the low 16 bits); an accumulator is four floats per lane. Lane l = 4g + t
  // holds A[g][2t..2t+1] (a0), A[g+8][..] (a1), A[g][2t+8..] (a2), A[g+8][2t+8..] (a3);
  // B[2t..2t+1][g] (b0), B[2t+8..2t+9][g] (b1); C[g][2t..2t+1] (c0, c1), C[g+8][2t..2t+1] (c2, c3).
  //
  // ldmatrix_x4: four 8x8 fp16 matrices from shared memory; lane 8i + r gives the offset (halves,
  // 16-byte aligned) of row r of matrix i; lane 4g + t receives matrix i's row g, columns 2t and
  // 2t + 1 in r[i] (_trans: column g, rows 2t and 2t + 1).
  __device__ __forceinline__ void ldmatrix_x4(int (&r)[4], const half_t* base, int off) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(base + off));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    __trap();  // sm_80 and newer (this build targets sm_90)
#endif
  }
  __device__ __forceinline__ void ldmatrix_x4_trans(int (&r)[4], const half_t* base, int off) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(base + off));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
    __trap();  // sm_80 and newer (this build targets sm_90)
#endif
  }
  // Two floats rounded to fp16 (nearest even) in one fragment register, lo in the low half.
  __device__ __forceinline__ int pack_half2(float lo, float hi) const {
    const __half2 h = __floats2half2_rn(lo, hi);
    return static_cast<int>(*reinterpret_cast<const unsigned*>(&h));
  }
  // The same in an element format: fp16 (pack_half2) or bfloat16 (nearest even, __floats2bfloat162_rn).
  __device__ __forceinline__ int pack2(float lo, float hi, ::lockstep::half) const { return pack_half2(lo, hi); }
  __device__ __forceinline__ int pack2(float lo, float hi, ::lockstep::bfloat16) const {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return static_cast<int>(*reinterpret_cast<const unsigned*>(&h));
  }
  // One value rounded to the element format into 16-bit storage (store_half for fp16).
  __device__ __forceinline__ void store_elem(::lockstep::half, half_t* base, int off, float v, bool m = true) const {
    store_half(base, off, v, m);
  }
  __device__ __forceinline__ void store_elem(::lockstep::bfloat16, half_t* base, int off, float v,
                                             bool m = true) const {
    if (m) reinterpret_cast<__nv_bfloat16*>(base)[off] = __float2bfloat16_rn(v);
  }
  // c += A (16x16) x B (16x8), fp32 accumulation (mma.sync.m16n8k16.row.col.f32.f16.f16.f32; with
  // the bfloat16 tag .bf16.bf16).
  template <class E = ::lockstep::half>
  __device__ __forceinline__ void mma_16816(float (&c)[4], const int (&a)[4], int b0, int b1, E = {}) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LOCKSTEP_MMA_16816(TY)                                                                         \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
               "{%8, %9}, {%0, %1, %2, %3};\n"                                                        \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
    if constexpr (std::is_same_v<E, ::lockstep::bfloat16>) {
      LOCKSTEP_MMA_16816("bf16");
    } else {
      LOCKSTEP_MMA_16816("f16");
    }
#undef LOCKSTEP_MMA_16816
#else
    __trap();  // sm_80 and newer (this build targets sm_90)
#endif
  }
  // Warpgroup products (wgmma.mma_async, sm_90a; Note [wgmma products] in
  // kernels/fused/wgmma.hpp). wgmma<N, kTransB>: the warpgroup's 64 x N accumulator c (each
  // warp's 16 rows in mma_16816's layout, c[n8] = columns 8 n8 .. 8 n8 + 7) += A (64 x 16, each
  // warp's 16 rows as mma_16816's A fragment) x B (16 x N) from shared memory at base + off, laid
  // out in 8 x 8 core matrices of 16-byte rows, no swizzle: B(k, n) at (n % 8) * 8 + (n / 8) * sbo
  // + k % 8 + (k / 8) * lbo halves (K-major) or, kTransB, n % 8 + (n / 8) * sbo + (k % 8) * 8 +
  // (k / 8) * lbo (MN-major); accumulate = false ignores c. Asynchronous: wgmma_fence() before the
  // first product of a batch (registers written since), wgmma_commit() after its last, and
  // wgmma_wait<P>() (at most P batches still pending) then wgmma_hold(c) before c is read.
  // The element format's tag last (fp16 by default; bfloat16: .bf16.bf16, the same layouts).
  template <int NB, bool kTransB, class E = ::lockstep::half>
  __device__ __forceinline__ void wgmma(float (&c)[NB / 8][4], const int (&a)[4], const half_t* base, int off,
                                        int lbo, int sbo, bool accumulate, E = {}) const {
    constexpr bool kBf = std::is_same_v<E, ::lockstep::bfloat16>;
    static_assert(NB == 64 || NB == 128, "wgmma: N = 64 or 128");
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(base + off));
    const std::uint64_t desc = std::uint64_t((addr & 0x3ffffu) >> 4) |
                               (std::uint64_t((static_cast<unsigned>(lbo) * 2u) >> 4) << 16) |
                               (std::uint64_t((static_cast<unsigned>(sbo) * 2u) >> 4) << 32);
    wgmma_m64n_dispatch<kBf>(c, a, desc, accumulate ? 1 : 0, std::integral_constant<int, kTransB ? 1 : 0>{});
  }
  __device__ __forceinline__ void wgmma_fence() const {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
  }
  __device__ __forceinline__ void wgmma_commit() const {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
  }
  template <int P>
  __device__ __forceinline__ void wgmma_wait() const {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(P) : "memory");
#endif
  }
  // The accumulators as the compiler must see them after a wait: written here, so no read of them
  // moves above it.
  template <int K>
  __device__ __forceinline__ void wgmma_hold(float (&c)[K][4]) const {
#pragma unroll
    for (int i = 0; i < K; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(c[i][e])::"memory");
  }
  // A fragments kept in registers across a loop of products, rewritten by an ordinary instruction
  // (xor with z, a zero the compiler cannot see; volatile, so before the fence that follows)
  // before a batch reads them: ptxas keeps a product's register operands live only up to the
  // product (Note [wgmma products]).
  template <int K>
  __device__ __forceinline__ void wgmma_keep(int (&a)[K][4], int z) const {
#pragma unroll
    for (int i = 0; i < K; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("xor.b32 %0, %0, %1;\n" : "+r"(a[i][e]) : "r"(z));
  }
  // A fragments computed before the fence that precedes their products (volatile: the compiler
  // keeps this, and so their computation, before the fence; ptxas otherwise serializes the batch).
  template <int K>
  __device__ __forceinline__ void wgmma_ready(int (&a)[K][4]) const {
#pragma unroll
    for (int i = 0; i < K; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e]));
  }
  // Bulk tiles (Note [wgmma products]): transaction barriers in shared memory and one-thread bulk
  // copies (cp.async.bulk, sm_90). mbar_init: thread 0 sets up a barrier that completes a phase
  // after `count` arrivals (and every expected byte); a sync() follows before any use.
  // bulk_tiles: thread 0 waits for phase `empty_parity` of `empty` when wait_empty (the slot's
  // previous tile released), expects 2 * bytes on `full` and copies src0 -> dst0 and
  // src1 -> dst1 (bytes each, 16-byte aligned) completing on `full`. mbar_wait: every thread waits
  // for phase `parity` of bar to complete. mbar_arrive_warp: lane 0 of each warp arrives.
  __device__ __forceinline__ void mbar_init(std::uint64_t* bar, int count) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#else
    __trap();
#endif
  }
  __device__ __forceinline__ void mbar_wait(std::uint64_t* bar, int parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile(
        "{\n.reg .pred P1;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(a), "r"(parity) : "memory");
#else
    __trap();
#endif
  }
  __device__ __forceinline__ void mbar_arrive_warp(std::uint64_t* bar) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
      const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
    }
#else
    __trap();
#endif
  }
  __device__ __forceinline__ void bulk_tiles(std::uint64_t* full, std::uint64_t* empty, int empty_parity,
                                             bool wait_empty, half_t* dst0, const half_t* src0, half_t* dst1,
                                             const half_t* src1, int bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      if (wait_empty) mbar_wait(empty, empty_parity);
      const unsigned f = static_cast<unsigned>(__cvta_generic_to_shared(full));
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(f), "r"(2 * bytes) : "memory");
      const unsigned d0 = static_cast<unsigned>(__cvta_generic_to_shared(dst0));
      const unsigned d1 = static_cast<unsigned>(__cvta_generic_to_shared(dst1));
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                   ::"r"(d0), "l"(src0), "r"(bytes), "r"(f) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                   ::"r"(d1), "l"(src1), "r"(bytes), "r"(f) : "memory");
    }
    __syncwarp();
#else
    __trap();
#endif
  }
  template <bool BF, int K, int T>
  __device__ __forceinline__ void wgmma_m64n_dispatch(float (&c)[K][4], const int (&a)[4], std::uint64_t desc,
                                                      int accumulate, std::integral_constant<int, T> t) const {
    if constexpr (K == 8) wgmma_m64n64k16<BF>(c, a, desc, accumulate, t);
    else wgmma_m64n128k16<BF>(c, a, desc, accumulate, t);
  }
  // (Generated: the accumulator registers as operands; T is the transpose of B, an immediate; BF
  // the bfloat16 form of the instruction.)
#define LOCKSTEP_ACC4(i) "+f"(c[i][0]), "+f"(c[i][1]), "+f"(c[i][2]), "+f"(c[i][3])
#define LOCKSTEP_ACC64                                                                                    \
  LOCKSTEP_ACC4(0), LOCKSTEP_ACC4(1), LOCKSTEP_ACC4(2), LOCKSTEP_ACC4(3), LOCKSTEP_ACC4(4), LOCKSTEP_ACC4(5), \
      LOCKSTEP_ACC4(6), LOCKSTEP_ACC4(7)
#define LOCKSTEP_ACC128                                                                                    \
  LOCKSTEP_ACC64, LOCKSTEP_ACC4(8), LOCKSTEP_ACC4(9), LOCKSTEP_ACC4(10), LOCKSTEP_ACC4(11), LOCKSTEP_ACC4(12), \
      LOCKSTEP_ACC4(13), LOCKSTEP_ACC4(14), LOCKSTEP_ACC4(15)
#define LOCKSTEP_WGMMA_N64(TY)                                                                  \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "            \
  "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
#define LOCKSTEP_WGMMA_N128(TY)                                                                 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "            \
  "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
  template <bool BF, int T>
  __device__ __forceinline__ void wgmma_m64n64k16(float (&c)[8][4], const int (&a)[4], std::uint64_t desc,
                                                   int accumulate, std::integral_constant<int, T>) const {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (BF) {
      asm volatile(LOCKSTEP_WGMMA_N64("bf16")
                   : LOCKSTEP_ACC64
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(T));
    } else {
      asm volatile(LOCKSTEP_WGMMA_N64("f16")
                   : LOCKSTEP_ACC64
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(T));
    }
#else
    __trap();  // sm_90a only (Note [wgmma products])
#endif
  }
  template <bool BF, int T>
  __device__ __forceinline__ void wgmma_m64n128k16(float (&c)[16][4], const int (&a)[4], std::uint64_t desc,
                                                   int accumulate, std::integral_constant<int, T>) const {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (BF) {
      asm volatile(LOCKSTEP_WGMMA_N128("bf16")
                   : LOCKSTEP_ACC128
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(T));
    } else {
      asm volatile(LOCKSTEP_WGMMA_N128("f16")
                   : LOCKSTEP_ACC128
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(T));
    }
#else
    __trap();  // sm_90a only (Note [wgmma products])
#endif
  }
#undef LOCKSTEP_WGMMA_N128
#undef LOCKSTEP_WGMMA_N64
#undef LOCKSTEP_ACC128
#undef LOCKSTEP_ACC64
#undef LOCKSTEP_ACC4

  // Four 32-bit words to base[off .. off + 3] (16-byte aligned), one 16-byte store, written in
  // PTX: inlined into FusedAttentionWgmma (Note [packing blocks]), an int4 store came out of the
  // compiler as four 4-byte ones.
  __device__ __forceinline__ void store_words4(std::int32_t* base, int off, int w0, int w1, int w2, int w3) const {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(base + off), "r"(w0), "r"(w1), "r"(w2), "r"(w3)
                 : "memory");
  }
  // 16 bytes (8 halves) into shared memory, as copy4_async (zeros when m is false).
  __device__ __forceinline__ void copy8h_async(half_t* dst, int doff, const half_t* src, int soff,
                                               bool m) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst + doff));
    const half_t* s = m ? src + soff : src;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(s), "r"(m ? 16 : 0)
                 : "memory");
#else
    const uint4 z = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + doff) = m ? *reinterpret_cast<const uint4*>(src + soff) : z;
#endif
  }
};

}  // namespace lockstep::cuda
