#pragma once
// Batched fp32 GEMM (SIMT): C[b] = alpha * A[b] x B[b], A [m, k], B [k, n], C [m, n], row-major
// with leading dimensions, any m, n, k >= 1.
//
// 64x64 output tiles, 256 threads each owning a 4x4 micro-tile (rows ty + 16i, columns
// tx + 16j), K streamed 16 at a time through shared memory. Each output is one fma chain over
// k = 0, 1, ..., K-1 in order (then one multiply by alpha), so the result is independent of the
// tiling and of the batch it is in. Out-of-range tile elements are loaded as 0 and only ever
// meet other padding or unstored outputs.

#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

struct GemmParams {
  const float* a;
  const float* b;
  float* c;
  std::int64_t m, n, k;
  std::int64_t lda, ldb, ldc;
  std::int64_t stride_a, stride_b, stride_c;  // between batch entries
  float alpha;
};

struct Gemm {
  static constexpr const char* kName = "gemm_f32";
  static constexpr int kThreads = 256;
  static constexpr int kTile = 64;
  static constexpr int kK = 16;
  static constexpr int kAPitch = kTile + 4;  // As[k][m] row pitch: fewer bank conflicts
  static constexpr std::size_t kSharedBytes = (kK * kAPitch + kK * kTile) * sizeof(float);
  using Params = GemmParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    float* As = x.template shared<float>(kK * kAPitch);
    float* Bs = x.template shared<float>(kK * kTile);
    const std::int64_t m0 = std::int64_t{x.block_y()} * kTile;
    const std::int64_t n0 = std::int64_t{x.block_x()} * kTile;
    const std::int64_t batch = x.block_z();
    const float* A = p.a + batch * p.stride_a + m0 * p.lda;
    const float* Bm = p.b + batch * p.stride_b + n0;
    float* C = p.c + batch * p.stride_c + m0 * p.ldc + n0;
    const int M = static_cast<int>(imin(p.m - m0, kTile));  // live rows of this tile
    const int N = static_cast<int>(imin(p.n - n0, kTile));
    const int lda = static_cast<int>(p.lda), ldb = static_cast<int>(p.ldb);

    const I t = x.thread();
    const I tx = t & 15, ty = t >> 4;     // compute mapping
    const I ak = t & 15, ar = t >> 4;     // A tile load: 16 k-columns x 16 rows per pass
    const I bn = t & 63, bk = t >> 6;     // B tile load: 64 columns x 4 k-rows per pass

    F acc[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (std::int64_t k0 = 0; k0 < p.k; k0 += kK) {
      const int kl = static_cast<int>(imin(p.k - k0, kK));
      const float* Ak = A + k0;
      const float* Bk = Bm + k0 * p.ldb;
      for (int q = 0; q < 4; ++q) {
        const I r = ar + 16 * q;
        const B ok = (r < M) & (ak < kl);
        x.store(As, ak * kAPitch + r, x.load(Ak, r * lda + ak, ok, 0.0f));
      }
      for (int q = 0; q < 4; ++q) {
        const I kk = bk + 4 * q;
        const B ok = (kk < kl) & (bn < N);
        x.store(Bs, kk * kTile + bn, x.load(Bk, kk * ldb + bn, ok, 0.0f));
      }
      x.sync();
      for (int kk = 0; kk < kK; ++kk) {
        F av[4], bv[4];
        for (int i = 0; i < 4; ++i) av[i] = x.load(As, ty + (kk * kAPitch + 16 * i));
        for (int j = 0; j < 4; ++j) bv[j] = x.load(Bs, tx + (kk * kTile + 16 * j));
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) acc[i][j] = x.fma(av[i], bv[j], acc[i][j]);
      }
      x.sync();
    }
    const int ldc = static_cast<int>(p.ldc);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const I r = ty + 16 * i, c = tx + 16 * j;
        x.store(C, r * ldc + c, acc[i][j] * p.alpha, (r < M) & (c < N));
      }
  }
};

}  // namespace lockstep::kernels
