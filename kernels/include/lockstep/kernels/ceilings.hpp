#pragma once
// Kernels that measure a device's ceilings in the benchmark run: read bandwidth (a sum of a large
// buffer) and the fp32 fma rate. Written like every other kernel, so the CUDA and CPU devices
// measure themselves with the same code.

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
