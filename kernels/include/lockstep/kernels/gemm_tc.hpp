#pragma once
// Batched GEMM on tensor cores: C[b] = alpha * A[b] x B[b] with A and B rounded to fp16 (nearest
// even) and fp32 accumulation in 16x16x16 steps (WMMA on CUDA; emulated with the same tiles and
// rounding points on the CPU, Note [tensor-core emulation]). Same parameters as Gemm; any m, n, k
// (tiles are zero-padded in shared memory, so the caller needs no multiple of 16).
//
// 64x64 output tile per block, 8 warps each owning two 16x16 accumulators, K in steps of 32.

#include "lockstep/kernels/gemm.hpp"

namespace lockstep::kernels {

struct GemmTensorCore {
  static constexpr const char* kName = "gemm_tensor_core";
  static constexpr int kThreads = 256;
  static constexpr int kTile = 64;
  static constexpr int kK = 32;
  static constexpr int kLdA = kK + 8;      // fp16 elements; multiples of 8 as WMMA requires
  static constexpr int kLdB = kTile + 8;
  static constexpr int kLdC = kTile + 4;   // fp32
  static constexpr std::size_t kSharedBytes =
      (kTile * kLdA + kK * kLdB) * 2 + 32 + kTile * kLdC * 4 + 32;
  using Params = GemmParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    using H = typename X::half_t;
    H* As = x.template shared<H>(kTile * kLdA);
    H* Bs = x.template shared<H>(kK * kLdB);
    float* Cs = x.template shared<float>(kTile * kLdC);
    const std::int64_t m0 = std::int64_t{x.block_y()} * kTile;
    const std::int64_t n0 = std::int64_t{x.block_x()} * kTile;
    const std::int64_t batch = x.block_z();
    const float* A = p.a + batch * p.stride_a + m0 * p.lda;
    const float* Bm = p.b + batch * p.stride_b + n0;
    float* C = p.c + batch * p.stride_c + m0 * p.ldc + n0;
    const int M = static_cast<int>(imin(p.m - m0, kTile));
    const int N = static_cast<int>(imin(p.n - n0, kTile));
    const int lda = static_cast<int>(p.lda), ldb = static_cast<int>(p.ldb);

    const I t = x.thread();
    const I w = x.warp();
    // Warp w owns output subtiles (w / 2, 2 * (w % 2)) and (w / 2, 2 * (w % 2) + 1).
    const I ti = w >> 1, tj = (w & 1) * 2;
    typename X::AccTile acc0, acc1;
    x.tile_zero(acc0);
    x.tile_zero(acc1);
    const I ak = t & 31, ar = t >> 5;   // A tile: 32 k-columns x 8 rows per pass
    const I bn = t & 63, bk = t >> 6;   // B tile: 64 columns x 4 k-rows per pass
    for (std::int64_t k0 = 0; k0 < p.k; k0 += kK) {
      const int kl = static_cast<int>(imin(p.k - k0, kK));
      const float* Ak = A + k0;
      const float* Bk = Bm + k0 * p.ldb;
      for (int q = 0; q < kTile; q += 8) {
        const I r = ar + q;
        const B ok = (r < M) & (ak < kl);
        x.store_half(As, r * kLdA + ak, x.load(Ak, r * lda + ak, ok, 0.0f));
      }
      for (int q = 0; q < kK; q += 4) {
        const I kk = bk + q;
        const B ok = (kk < kl) & (bn < N);
        x.store_half(Bs, kk * kLdB + bn, x.load(Bk, kk * ldb + bn, ok, 0.0f));
      }
      x.sync();
      for (int kk = 0; kk < kK; kk += 16) {
        x.tile_mma(acc0, As, ti * (16 * kLdA) + kk, kLdA, Bs, tj * 16 + kk * kLdB, kLdB);
        x.tile_mma(acc1, As, ti * (16 * kLdA) + kk, kLdA, Bs, tj * 16 + 16 + kk * kLdB, kLdB);
      }
      x.sync();
    }
    x.tile_store(Cs, ti * (16 * kLdC) + tj * 16, kLdC, acc0);
    x.tile_store(Cs, ti * (16 * kLdC) + tj * 16 + 16, kLdC, acc1);
    x.sync();
    const int ldc = static_cast<int>(p.ldc);
    const I col = t & 63, row = t >> 6;
    for (int r = 0; r < kTile; r += 4) {
      const F v = x.load(Cs, (row + r) * kLdC + col);
      x.store(C, (row + r) * ldc + col, v * p.alpha, (row + r < M) & (col < N));
    }
  }
};

}  // namespace lockstep::kernels
