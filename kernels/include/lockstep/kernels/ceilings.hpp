#pragma once
// Kernels that measure a device's ceilings in the benchmark run: read bandwidth (a sum of a large
// buffer) and the fp32 fma rate. Written like every other kernel, so that every device can run
// them. The GPU's ceilings are these kernels; the CPU device's are native loops of the SIMD width
// its variant runs (bench/cpu_fma_peak.cpp), which its kernels, run through the lanes, cannot
// beat; lockstep-bench reports read_sum through the lanes beside them.

#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

// out[block] = the sum of in[block * 8192 .. +8192) (fixed order: per-thread chains, then warp
// butterflies, then warp partials in order). n must be a multiple of 8192.
struct ReadSumParams {
  const float* in;
  float* out;
};

struct ReadSum {
  static constexpr const char* kName = "read_sum";
  static constexpr int kThreads = 256;
  static constexpr int kPerBlock = kThreads * 4 * 8;
  using Params = ReadSumParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    float* partial = x.template shared<float>(kThreads / kWarpSize);
    const float* in = p.in + std::int64_t{x.block_x()} * kPerBlock;
    const I off = x.thread() * 4;
    F s = 0.0f;
    for (int j = 0; j < kPerBlock; j += kThreads * 4) {
      auto q = x.load4(in + j, off);
      s = s + ((q.x + q.y) + (q.z + q.w));
    }
    s = x.warp_sum(s);
    x.store(partial, x.warp(), s, x.lane() == 0);
    x.sync();
    F t = x.load(partial, x.lane() & (kThreads / kWarpSize - 1));
    t = x.template warp_sum<kThreads / kWarpSize>(t);
    x.store(p.out + x.block_x(), x.thread() * 0, t, x.thread() == 0);
  }
};

// The reads of the decode chunk kernel at head_dim 128 with 4 query heads per block
// (DecodeChunk<128, 4, 1, 4>) without its arithmetic, to measure what the DRAM gives for that
// access pattern (docs/performance.md): block (x, y) reads rows [256 x, 256 x + 256) of head y of
// K and then of V ([heads, rows, 128] floats each) in 16-row tiles through a ring of 4 in shared
// memory, filled by asynchronous copies three tiles ahead, and sums them; out[block * 4 + warp]
// = the sum of what the warp's lanes read (fixed order). Launched with the chunk kernel's shared
// memory, it also has its blocks per SM.
struct ReadTilesParams {
  const float* k;
  const float* v;
  float* out;
  std::int64_t head_stride;  // floats between heads
  // The copies' L2 policy (Note [streamed tiles]): 0 none, 1 evict-first (the decode's past the
  // L2's size), 2 evict-normal (measurement only), 3 evict-unchanged (the decode's below it).
  std::int32_t l2_mode;
};

struct ReadTiles {
  static constexpr const char* kName = "read_tiles";
  static constexpr int kThreads = 128;
  static constexpr int kRows = 256;      // rows per block, of K and of V
  static constexpr int kTileRows = 16;
  static constexpr int kD = 128;
  static constexpr int kStages = 4;
  static constexpr int kTiles = kRows / kTileRows;  // per tensor
  static constexpr std::size_t kSharedBytes = std::size_t(kStages) * kTileRows * kD * sizeof(float) + 64;
  using Params = ReadTilesParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    float* ring = x.template shared<float>(kStages * kTileRows * kD);
    const std::int64_t off = x.block_y() * p.head_stride + std::int64_t{x.block_x()} * kRows * kD;
    const float* kb = p.k + off;
    const float* vb = p.v + off;
    const std::uint64_t policy = x.l2_policy(p.l2_mode == 1 ? kL2EvictFirst : p.l2_mode == 2 ? kL2EvictNormal : kL2Unchanged);
    auto issue = [&](int j) {
      if (j < 2 * kTiles) {
        const float* src = (j < kTiles ? kb : vb) + (j % kTiles) * kTileRows * kD;
        float* dst = ring + (j % kStages) * kTileRows * kD;
        LOCKSTEP_UNROLL
        for (int v0 = 0; v0 < kTileRows * kD / 4; v0 += kThreads) {
          const auto v = x.thread() + v0;
          if (p.l2_mode == 0)
            x.copy4_async(dst, v * 4, src, v * 4, v < kTileRows * kD / 4);
          else
            x.copy4_async_stream(dst, v * 4, src, v * 4, v < kTileRows * kD / 4, policy);
        }
      }
      x.async_commit();
    };
    LOCKSTEP_UNROLL
    for (int j = 0; j < kStages; ++j) issue(j);
    F s = 0.0f;
    // Unrolled by the ring's size, so that each tile's slot is a constant: with a slot computed at
    // run time, ptxas 13.0 addressed the shared memory through a uniform register and gave the
    // hinted copies a descriptor register that nothing set (Note [streamed tiles]).
    static_assert(2 * kTiles % kStages == 0, "whole turns of the ring");
    for (int j0 = 0; j0 < 2 * kTiles; j0 += kStages) {
      LOCKSTEP_UNROLL
      for (int jj = 0; jj < kStages; ++jj) {
        const int j = j0 + jj;
        x.template async_wait<kStages - 1>();
        x.sync();
        const float* t = ring + jj * kTileRows * kD;
        LOCKSTEP_UNROLL
        for (int v0 = 0; v0 < kTileRows * kD / 4; v0 += kThreads) {
          const auto q = x.load4(t, (x.thread() + v0) * 4);
          s = s + ((q.x + q.y) + (q.z + q.w));
        }
        x.sync();  // every warp is done with the slot before it is refilled
        issue(j + kStages);
      }
    }
    s = x.warp_sum(s);
    const std::int64_t block = std::int64_t{x.block_y()} * x.grid_x() + x.block_x();
    x.store(p.out + block * (kThreads / kWarpSize), x.warp(), s, x.lane() == 0);
  }
};

// Each thread runs 8 independent fma chains of `iters` steps and stores their sum.
struct FmaPeakParams {
  float* out;
  int iters;
  float a, b;
};

struct FmaPeak {
  static constexpr const char* kName = "fma_peak";
  static constexpr int kThreads = 256;
  static constexpr int kChains = 8;
  using Params = FmaPeakParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    F acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = x.to_float(x.thread() + c);
    for (int i = 0; i < p.iters; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = x.fma(acc[c], p.a, p.b);
    F s = acc[0];
    for (int c = 1; c < kChains; ++c) s = s + acc[c];
    x.store(p.out + std::int64_t{x.block_x()} * kThreads, x.thread(), s);
  }
};

}  // namespace lockstep::kernels
