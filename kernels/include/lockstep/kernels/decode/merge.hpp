#pragma once
// DecodeMerge: the chunks of a row merged in a fixed order into its output.

#include "lockstep/kernels/decode/params.hpp"

namespace lockstep::kernels {

// Note [folded merge]
// With p.fold set, the merge is done by the chunk kernel and there is no merge launch: each chunk
// block arrives at its (row, block y) counter once its partials are written (x.signal_last: a
// release, then an atomic add), and the one block that brings the count to max_chunks -- the
// last to finish, whichever chunk it owns -- sees every other block's partials (an acquire),
// resets the counter to zero for the next call, and merges the G heads it served, one after
// another, with DecodeMerge's merge_heads in its shared memory (carved from the ring, which is
// idle by then); for a row of one merge batch every head's partials are loaded first, in one
// round trip. The merge's arithmetic is DecodeMerge's, in the same order, so the bits are
// those of the two-kernel schedule (tested); only which block runs it and when changes. Nothing
// waits, so this cannot deadlock whatever the grid's scheduling order. One launch per call
// instead of two: less host time per eager call (3.6-4.6 us instead of 6.8-9.9 at
// whisper-tiny, 5.3-7.0 instead of 8.2-11.2 at B=32 L=4096). But the merge then runs in one block
// per (row, group of G heads) after the last chunk, where the separate merge's blocks (sliced
// for few rows) wait beside the chunk blocks and split the work: device time was 11% longer per
// layer at B=1 L=4096 (16 chunks x 4 heads per merging block), 1.6% at B=32 L=4096, 14% at B=1
// L=32768 (42% with the smaller batch below), equal at B=128 L=2048 and MHA B=32 L=2048, and
// 3-4.5% shorter at whisper-tiny (2 chunks, 1 head). So launch_decode folds only small merges
// (G * chunks <= 8) by default; the Tuning decode.fold_merge = 1 folds every row (for host-bound
// eager loops), = 0 none.

// out[r, h, :] = the chunks of row r merged. Grid: x = H * S, y = row (loops past 65535). A row of
// length 0 gives zeros.
//
// Note [merge order]
// The global max M over the chunk maxima is order-free (math::max is exact and canonical on NaN).
// Each chunk's weight is w_c = exp(m_c - M) (0 for an empty chunk). The chunks form kGroups
// groups: group gi folds chunks gi, gi + kGroups, gi + 2 kGroups, ... in increasing order into
// L_gi += l_c * w_c and O_gi[d] += o_c[d] * w_c (a product, then a sum; no fma); then the groups
// are added in order 0, 1, ... and out = O / L. Every sum's order depends only on the row's own
// length, never on the batch or the device: batch invariance holds, and CUDA and the CPU run this
// same schedule. kGroups = 512 / D is part of this order, so of the bits.
//
// Note [merge schedule]
// A thread owns VW consecutive output elements of one group (a block: kGroups groups of kSlice
// elements). The weights are computed once per chunk, by one thread each, into shared memory
// (with every thread computing every weight of its group, one exp per chunk and output
// element, the merge was instruction-bound: 13 us of a 268 us step at B = 32, 44 of 545
// at B = 128). The partial outputs of kGroups * MB chunks (a batch) are loaded before they are
// needed; for a row of one batch (the common case) they are in flight together with the chunk
// maxima and sums, so the whole merge waits for one round trip. MB, S and VW move loads and
// threads, never arithmetic: the same bits for every choice (tested).
template <int D, int MB = D / 16, int S = 1, int VW = 4>
struct DecodeMerge {
  static constexpr const char* kName = "decode_merge";
  static constexpr int kGroups = 512 / D;  // part of the fold order (Note [merge order]): fixed
  static constexpr int kSlices = S;        // Note [merge schedule]
  static constexpr int kSlice = D / S;     // output elements per block
  static constexpr int kVec = VW;          // output elements per thread
  static constexpr int kLanes = kSlice / VW;  // threads per group
  static constexpr int kActive = kGroups * kLanes;
  static constexpr int kThreads = (kActive + kWarpSize - 1) / kWarpSize * kWarpSize;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr bool kOverlapsPrior = true;
  static constexpr int kMergeBatch = MB;
  static constexpr int kBatch = kGroups * MB;  // chunks per batch
  static constexpr int kPer = (kBatch + kThreads - 1) / kThreads;  // weights per thread per batch
  static constexpr std::size_t kSharedBytes =  // + 32 per carving: its alignment
      (kWarps + 2 * kBatch + kGroups * (kSlice + 1)) * sizeof(float) + 5 * 32;
  static_assert(D % S == 0 && kSlice % VW == 0 && (VW == 1 || VW == 4), "slices of whole vectors");
  static_assert(VW == 1 || D % 4 == 0, "16-byte partials");
  using Params = DecodeParams;

  // The partial outputs of the thread's group in the batch from chunk c0: chunk g + c0 + u *
  // kGroups, elements e .. e + VW - 1; zeros past the row's last chunk.
  template <class X, class I, class B, class F>
  LOCKSTEP_HD static void load_outputs(X& x, const float* po, const I& g, const I& e, const B& act,
                                       int c0, int chunks, F (&oc)[MB][VW]) {
    LOCKSTEP_UNROLL
    for (int u = 0; u < MB; ++u) {
      const I c = g + (c0 + u * kGroups);
      const B ok = act & (c < chunks);
      if constexpr (VW == 4) {
        const auto q = x.load4(po, c * D + e, ok);
        oc[u][0] = q.x;
        oc[u][1] = q.y;
        oc[u][2] = q.z;
        oc[u][3] = q.w;
      } else {
        oc[u][0] = x.load(po, c * D + e, ok, 0.0f);
      }
    }
  }

  // Shared memory of one merge: from x.shared (the merge kernel) or carved out of a chunk
  // block's ring (Note [folded merge]), each array at a 32-byte boundary.
  struct Smem {
    float* red;     // [kWarps] per-warp maxima
    float* W;       // [kBatch] w_c of the batch's chunks
    float* LW;      // [kBatch] l_c * w_c
    float* o_part;  // [kGroups * kSlice]
    float* l_part;  // [kGroups]
  };
  static constexpr std::size_t round8(std::size_t n) { return (n + 7) / 8 * 8; }
  static constexpr std::size_t kCarvedFloats =
      round8(kWarps) + 2 * round8(kBatch) + round8(kGroups * kSlice) + round8(kGroups);
  template <class X>
  LOCKSTEP_HD static Smem shared_arrays(X& x) {
    Smem m;
    m.red = x.template shared<float>(kWarps);
    m.W = x.template shared<float>(kBatch);
    m.LW = x.template shared<float>(kBatch);
    m.o_part = x.template shared<float>(kGroups * kSlice);
    m.l_part = x.template shared<float>(kGroups);
    return m;
  }
  LOCKSTEP_HD static Smem carve(float* base) {  // base: 32-byte aligned, kCarvedFloats floats
    Smem m;
    m.red = base;
    m.W = m.red + round8(kWarps);
    m.LW = m.W + round8(kBatch);
    m.o_part = m.LW + round8(kBatch);
    m.l_part = m.o_part + round8(kGroups * kSlice);
    return m;
  }

  // Merges row r's chunks of heads h0 .. h0 + NH - 1 into out[r, h, d0 .. d0 + kSlice), one head
  // after another; every thread of the block calls it, after the row's chunk partials are
  // visible. A row of one batch has every head's partial outputs, chunk maxima and sums loaded
  // first, in one round trip (NH > 1: Note [folded merge]). Ends with a barrier (sm is reusable).
  // Out of line on the CPU: inlined into each of the chunk kernel's variants (Note [folded
  // merge]) it made the CPU SIMD variants' translation units compile 1.8x longer.
  template <int NH, class X>
  LOCKSTEP_HD_OUTLINED_ON_CPU static void merge_heads(X& x, const Params& p, int r, int h0, int d0,
                                                      const Smem& sm) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const I t = x.thread();
    const I zero = t * 0;
    const B act = t < kActive;
    I g = zero;  // the thread's group; t = g * kLanes + lane in group
    LOCKSTEP_UNROLL
    for (int k = 1; k < kGroups; ++k) g = g + x.select(t >= k * kLanes, zero + 1, zero);
    const I dl = (t - g * kLanes) * VW;  // first element, within the slice
    const I e = dl + d0;

    const int len = row_length(x, p, r);
    const int chunks = static_cast<int>(ceil_div(len, kDecodeChunk));
    // A row of one batch (depends on the row only) loads its partial outputs, chunk maxima and
    // sums at once; a longer row takes the maxima first, then streams batches.
    const bool one_batch = chunks <= kBatch;
    F oc[NH][MB][VW];
    F mcr[NH][kPer], lcr[NH][kPer];
    if (one_batch) {
      LOCKSTEP_UNROLL
      for (int n = 0; n < NH; ++n) {
        const std::int64_t base = std::int64_t{r} * p.H + h0 + n;
        const float* ml = p.part_ml + base * p.max_chunks * 2;
        load_outputs(x, p.part_o + base * p.max_chunks * D, g, e, act, 0, chunks, oc[n]);
        LOCKSTEP_UNROLL
        for (int k = 0; k < kPer; ++k) {
          const I c = t + k * kThreads;
          const B ok = c < chunks;
          mcr[n][k] = x.load(ml, c * 2, ok, -kInf);
          lcr[n][k] = x.load(ml, c * 2 + 1, ok, 0.0f);
        }
      }
    }
    LOCKSTEP_UNROLL
    for (int n = 0; n < NH; ++n)
      merge_head(x, p, std::int64_t{r} * p.H + h0 + n, chunks, one_batch, g, dl, e, sm, oc[n], mcr[n], lcr[n]);
  }

  // One head of merge_heads: the row's partials from base = r * H + h on.
  template <class X, class F, class I>
  LOCKSTEP_HD_OUTLINED_ON_CPU static void merge_head(X& x, const Params& p, std::int64_t base, int chunks, bool one_batch,
                                     const I& g, const I& dl, const I& e, const Smem& sm,
                                     F (&oc)[MB][VW], const F (&mcr)[kPer], const F (&lcr)[kPer]) {
    using B = typename X::template Lanes<bool>;
    const I t = x.thread();
    const I zero = t * 0;
    const B act = t < kActive;
    const B first = t < kLanes;  // group 0's threads combine the groups and write out
    const float* ml = p.part_ml + base * p.max_chunks * 2;
    const float* po = p.part_o + base * p.max_chunks * D;
    // Note [decode formats]: the output in act_format, times V's scale of an fp8 cache.
    const bool scaled = p.kv_scales != nullptr;
    const float vs = scaled ? x.load_uniform(p.kv_scales + p.Hkv + (base % p.H) / (p.H / p.Hkv)) : 1.0f;
    F m = -kInf;
    if (one_batch) {
      LOCKSTEP_UNROLL
      for (int k = 0; k < kPer; ++k) m = x.max(m, mcr[k]);
    } else {
      for (int c0 = 0; c0 < chunks; c0 += kThreads) {
        const I c = t + c0;
        m = x.max(m, x.load(ml, c * 2, c < chunks, -kInf));
      }
    }
    m = x.warp_max(m);
    x.store(sm.red, zero + x.warp(), m, x.lane() == 0);
    x.sync();
    F M = x.load(sm.red, zero);
    for (int w = 1; w < kWarps; ++w) M = x.max(M, x.load(sm.red, zero + w));

    F L = 0.0f;
    F O[VW];
    LOCKSTEP_UNROLL
    for (int j = 0; j < VW; ++j) O[j] = 0.0f;
    for (int c0 = 0; c0 < chunks; c0 += kBatch) {
      if (!one_batch) load_outputs(x, po, g, e, act, c0, chunks, oc);
      // The batch's weights, one chunk per thread.
      LOCKSTEP_UNROLL
      for (int k = 0; k < kPer; ++k) {
        const I i = t + k * kThreads;
        const I c = i + c0;
        const B ok = (i < kBatch) & (c < chunks);
        F mc = -kInf, lc = 0.0f;
        if (one_batch) {
          mc = mcr[k];
          lc = lcr[k];
        } else {
          mc = x.load(ml, c * 2, ok, -kInf);
          lc = x.load(ml, c * 2 + 1, ok, 0.0f);
        }
        const F w = x.select(mc == -kInf, 0.0f, x.exp(mc - M));
        x.store(sm.W, i, w, i < kBatch);
        x.store(sm.LW, i, lc * w, i < kBatch);
      }
      x.sync();
      LOCKSTEP_UNROLL
      for (int u = 0; u < MB; ++u) {
        const I i = g + u * kGroups;
        const B ok = act & (i + c0 < chunks);
        const F w = x.load(sm.W, i, ok, 0.0f);
        L = x.select(ok, L + x.load(sm.LW, i, ok, 0.0f), L);
        LOCKSTEP_UNROLL
        for (int j = 0; j < VW; ++j) O[j] = x.select(ok, O[j] + oc[u][j] * w, O[j]);
      }
      x.sync();  // W and LW are refilled by the next batch
    }
    LOCKSTEP_UNROLL
    for (int j = 0; j < VW; ++j) x.store(sm.o_part, g * kSlice + dl + j, O[j], act);
    x.store(sm.l_part, g, L, act & (dl == 0));
    x.sync();
    F Lt = x.load(sm.l_part, zero);
    LOCKSTEP_UNROLL
    for (int k = 1; k < kGroups; ++k) Lt = Lt + x.load(sm.l_part, zero + k);
    LOCKSTEP_UNROLL
    for (int j = 0; j < VW; ++j) {
      F Ot = x.load(sm.o_part, dl + j, first, 0.0f);
      LOCKSTEP_UNROLL
      for (int k = 1; k < kGroups; ++k) Ot = Ot + x.load(sm.o_part, dl + (k * kSlice + j), first, 0.0f);
      F o = Ot / Lt;
      if (scaled) o = o * vs;
      store_act(x, p.out, p.act_format, base * D, e + j, x.select(M == -kInf, 0.0f, o), first);
    }
    x.sync();  // red and the partials are reused by the next merge
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    if (p.counters == nullptr) x.wait_prior_grids();  // else Note [block signals]
    x.allow_dependent_grids();
    merge_block(x, p, x.block_x(), x.block_y(), x.grid_y(), false);
    // With signals the chunk kernel may still be retiring; waiting for it here keeps the rule
    // that a kernel completes after the one before it (Note [overlapped launches]).
    if (p.counters != nullptr) x.wait_prior_grids();
  }

  // The work of merge block (bx, by) of a merge grid of gy rows of blocks; same_grid: the chunk
  // blocks run in the same launch (Note [one grid]).
  template <class X>
  LOCKSTEP_HD static void merge_block(X& x, const Params& p, int bx, int by, int gy, bool same_grid) {
    const Smem sm = shared_arrays(x);
    const int h = bx / kSlices;
    const int d0 = (bx % kSlices) * kSlice;
    for (int r = by; r < p.rows; r += gy) {
      // Note [block signals]: all max_chunks chunk blocks of (row, kv head group) signal, so the
      // wait needs no length; the length is read after it (ordered after the chunk blocks' own
      // reads of it).
      std::int32_t* counter = nullptr;
      int ticket = 0;
      if (p.counters != nullptr) {
        counter = p.counters + (std::int64_t{r} * (p.H / p.heads_per_block) + h / p.heads_per_block) * 2;
        ticket = x.wait_signals(counter, p.max_chunks, same_grid);
      }
      merge_heads<1>(x, p, r, h, d0, sm);
      if (counter != nullptr) x.release_signals(counter, ticket, p.heads_per_block * kSlices);
    }
  }
};

}  // namespace lockstep::kernels
