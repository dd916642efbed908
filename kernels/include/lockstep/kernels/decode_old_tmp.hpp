#pragma once
#include "lockstep/kernels/decode.hpp"
namespace lockstep::kernels {
template <int D, int MB = 8, int S = 1>
struct DecodeMergeOld {
  static constexpr const char* kName = "decode_merge";
  static constexpr int kGroups = 512 / D;  // part of the fold order (Note [merge order]): fixed
  static constexpr int kSlices = S;        // Note [merge slices]
  static constexpr int kSlice = D / S;     // output elements per block
  static constexpr int kThreads = kGroups * kSlice;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr bool kOverlapsPrior = true;
  static constexpr int kMergeBatch = MB;  // a schedule choice: the fold order, so the bits, do not depend on it
  static constexpr std::size_t kSharedBytes = (kWarps + kGroups * (kSlice + 1)) * sizeof(float) + 64;
  static_assert(D % S == 0 && kThreads % kWarpSize == 0, "whole warps");
  using Params = DecodeParams;

  // Group g's chunks g + c0 + u * kGroups (u < kMergeBatch): chunk max, chunk sum and output
  // element d, with the neutral values (-inf, 0, 0) past the row's last chunk.
  template <class X, class I, class F>
  LOCKSTEP_HD static void load_batch(X& x, const float* ml, const float* po, const I& g, const I& d,
                                     int c0, int chunks, F (&mc)[MB], F (&lc)[MB], F (&oc)[MB]) {
    LOCKSTEP_UNROLL
    for (int u = 0; u < kMergeBatch; ++u) {
      const I c = g + (c0 + u * kGroups);
      const typename X::template Lanes<bool> ok = c < chunks;
      mc[u] = x.load(ml, c * 2, ok, -kInf);
      lc[u] = x.load(ml, c * 2 + 1, ok, 0.0f);
      oc[u] = x.load(po, c * D + d, ok, 0.0f);
    }
  }

  // Note [merge slices]
  // With S > 1 slices, block (h * S + s) computes output elements [s * D / S, (s + 1) * D / S) of
  // head h: the same groups, folds and group sum per element as with S = 1 (every thread folds
  // the chunk sums L itself, so each slice has the same L), hence the same bits (tested). It
  // gives a short row (B = 1) S times more blocks and a quarter of the registers per thread, so
  // that a whole 128-chunk row is loaded in one round trip (MB = 32).
  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    x.wait_prior_grids();
    x.allow_dependent_grids();
    float* red = x.template shared<float>(kWarps);
    float* o_part = x.template shared<float>(kGroups * kSlice);
    float* l_part = x.template shared<float>(kGroups);
    const int h = x.block_x() / kSlices;
    const int d0 = (x.block_x() % kSlices) * kSlice;
    const I t = x.thread();
    const I zero = t * 0;
    I g = zero;  // the thread's group; t = g * kSlice + dl
    LOCKSTEP_UNROLL
    for (int k = 1; k < kGroups; ++k) g = g + x.select(t >= k * kSlice, zero + 1, zero);
    const I dl = t - g * kSlice;
    const I d = dl + d0;
    const B first = t < kSlice;  // the threads that combine the groups and write out
    for (int r = x.block_y(); r < p.rows; r += x.grid_y()) {
      const int len = row_length(x, p, r);
      const int chunks = static_cast<int>(ceil_div(len, kDecodeChunk));
      const std::int64_t base = std::int64_t{r} * p.H + h;
      const float* ml = p.part_ml + base * p.max_chunks * 2;
      const float* po = p.part_o + base * p.max_chunks * D;
      float* out = p.out + base * D;

      // The global max M. A row of at most kGroups * kMergeBatch chunks (the common case) loads
      // everything in one round trip and keeps it in registers; a longer row loads the maxima
      // first, with every thread, then streams the partials in batches.
      const bool one_batch = chunks <= kGroups * kMergeBatch;  // depends on the row only
      F mc[kMergeBatch], lc[kMergeBatch], oc[kMergeBatch];
      int n_red = kWarps;
      if (one_batch) {
        load_batch(x, ml, po, g, d, 0, chunks, mc, lc, oc);
        F m = mc[0];
        LOCKSTEP_UNROLL
        for (int u = 1; u < kMergeBatch; ++u) m = x.max(m, mc[u]);
        x.store(red, g, m, dl == 0);  // the same in every thread of the group
        n_red = kGroups;
      } else {
        F m = -kInf;
        for (int c0 = 0; c0 < chunks; c0 += kThreads) {
          const I c = t + c0;
          m = x.max(m, x.load(ml, c * 2, c < chunks, -kInf));
        }
        m = x.warp_max(m);
        x.store(red, zero + x.warp(), m, x.lane() == 0);
      }
      x.sync();
      F M = x.load(red, zero);
      for (int w = 1; w < n_red; ++w) M = x.max(M, x.load(red, zero + w));

      F L = 0.0f, O = 0.0f;
      for (int c0 = 0; c0 < chunks; c0 += kGroups * kMergeBatch) {
        if (!one_batch) load_batch(x, ml, po, g, d, c0, chunks, mc, lc, oc);
        LOCKSTEP_UNROLL
        for (int u = 0; u < kMergeBatch; ++u) {
          const B ok = g + (c0 + u * kGroups) < chunks;
          const F w = x.select(mc[u] == -kInf, 0.0f, x.exp(mc[u] - M));
          L = x.select(ok, L + lc[u] * w, L);
          O = x.select(ok, O + oc[u] * w, O);
        }
      }
      x.store(o_part, t, O);
      x.store(l_part, g, L, dl == 0);
      x.sync();
      F Ot = x.load(o_part, t, first, 0.0f);
      F Lt = x.load(l_part, zero);
      LOCKSTEP_UNROLL
      for (int k = 1; k < kGroups; ++k) {
        Ot = Ot + x.load(o_part, t + k * kSlice, first, 0.0f);
        Lt = Lt + x.load(l_part, zero + k);
      }
      x.store(out, d, x.select(M == -kInf, 0.0f, Ot / Lt), first);
      x.sync();  // red and the partials are reused by the next row
    }
  }
};

}
