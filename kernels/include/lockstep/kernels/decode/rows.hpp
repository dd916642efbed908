#pragma once
// The decode chunk kernel's CPU row form (Note [row-major decode] in chunk.hpp): its phases
// computed row by row with the lane code's arithmetic and order, over the SIMD vocabulary Simd
// that the CPU backend provides (lockstep/kernels/row_form.hpp).

#include <cstdint>

#include "lockstep/kernels/math.hpp"
#include "lockstep/kernels/row_form.hpp"

namespace lockstep::kernels {

// --- Note [row-major decode] (kernels/decode/chunk.hpp) ------------------------------------------
// The decode chunk kernel's phases, computed row by row with the arithmetic and order of the
// lane that stores each value, instead of statement by statement over the block's lanes.
// On (avx2, avx3) unless LOCKSTEP_CPU_DECODE_LANES=1 (the lane path: a check, tested to give
// the same bytes). Rows: row t is fresh when t == nrow, else rows + t * D; rows at or past
// live are never read.
// kWarps: the warps of the context (DecodeChunk: 4).
template <class Simd, int kWarps>
struct DecodeRowForm {
  using DF = typename Simd::DF;
  using VF = typename Simd::VF;
  using V8 = typename Simd::template Vec<typename Simd::template FixedTag<float, 8>>;
  static constexpr int kL = Simd::kL;

  // Phase 1: S[g * kChunk + t] = the score of row t for head g, as lane l8 == 0 of DecodeChunk's
  // score loop writes it: lane l8 (0..7) chains fma over its elements (qd * 8 + l8) * 4 + j, qd
  // then j ascending, from 0; warp_sum<8> (offsets 4, 2, 1, each lane's own value first) then the
  // scale. Rows at or past live: -inf.
  // Also prefetches rows [0, live) of vrows (the chunk's V) into the L2 cache as it goes, so
  // that decode_values, which visits them 16 rows apart, does not wait on the DRAM (without it
  // the GQA-4 decode at L=16384 took 19.4 ms instead of 9.9; prefetching K 16 KB ahead as well
  // made it 5% slower).
  // Rows of another format than float (R: Note [decode formats]) are widened as they are loaded
  // (Simd::LoadWiden, the formats' conversions); `fresh` is always floats.
  template <int G, int D, int kChunk, class R>
  static void decode_scores(float* S, const R* rows, int nrow, const float* fresh, int live,
                            const float* const (&q)[G], float scale, const R* vrows) {
    static_assert(D % 32 == 0);
    constexpr int kQ = D / 32;
    const typename Simd::template FixedTag<float, 8> d8;
    using V8 = typename Simd::template Vec<decltype(d8)>;
    const typename Simd::template Repartition<double, decltype(d8)> dd;
    // One row's 8-lane quads qd (floats qd * 32 .. + 31; lane l8 holds 4 * l8 .. + 3): k[j] holds
    // element j of every lane, in the slot order 0, 2, 4, 6 | 1, 3, 5, 7, which in-block
    // shuffles reach (a de-interleave into lane order would cross the 128-bit blocks). The
    // butterflies below read the lanes in this order.
    const auto quads = [&](const auto* p, V8 (&k)[4]) {
      const V8 a0 = Simd::LoadWiden(d8, p), a1 = Simd::LoadWiden(d8, p + 8), a2 = Simd::LoadWiden(d8, p + 16),
               a3 = Simd::LoadWiden(d8, p + 24);
      const auto x0 = Simd::BitCast(dd, Simd::InterleaveLower(d8, a0, a1));  // l0 l2 (j0 j1) | l1 l3
      const auto x1 = Simd::BitCast(dd, Simd::InterleaveUpper(d8, a0, a1));  // (j2 j3)
      const auto y0 = Simd::BitCast(dd, Simd::InterleaveLower(d8, a2, a3));  // l4 l6 | l5 l7
      const auto y1 = Simd::BitCast(dd, Simd::InterleaveUpper(d8, a2, a3));
      k[0] = Simd::BitCast(d8, Simd::InterleaveLower(dd, x0, y0));
      k[1] = Simd::BitCast(d8, Simd::InterleaveUpper(dd, x0, y0));
      k[2] = Simd::BitCast(d8, Simd::InterleaveLower(dd, x1, y1));
      k[3] = Simd::BitCast(d8, Simd::InterleaveUpper(dd, x1, y1));
    };
    const auto lo64 = [&](V8 a, V8 b) { return Simd::BitCast(d8, Simd::InterleaveLower(dd, Simd::BitCast(dd, a), Simd::BitCast(dd, b))); };
    const auto hi64 = [&](V8 a, V8 b) { return Simd::BitCast(d8, Simd::InterleaveUpper(dd, Simd::BitCast(dd, a), Simd::BitCast(dd, b))); };
    V8 qt[G][kQ][4];
    for (int g = 0; g < G; ++g)
      for (int qd = 0; qd < kQ; ++qd) quads(q[g] + qd * 32, qt[g][qd]);
    for (int t = 0; t < live; ++t) {
      const R* kr = rows + std::int64_t{t} * D;
      constexpr int kLine = 64 / int(sizeof(R));  // elements per 64-byte line
      for (int b = 0; b < D; b += kLine) __builtin_prefetch(vrows + std::int64_t{t} * D + b, 0, 2);
      V8 dot[G];
      for (int g = 0; g < G; ++g) dot[g] = Simd::Zero(d8);
      for (int qd = 0; qd < kQ; ++qd) {
        V8 k[4];
        if (t == nrow) quads(fresh + qd * 32, k);
        else quads(kr + qd * 32, k);
        for (int g = 0; g < G; ++g)
          dot[g] = Simd::MulAdd(qt[g][qd][3], k[3],
                              Simd::MulAdd(qt[g][qd][2], k[2],
                                         Simd::MulAdd(qt[g][qd][1], k[1], Simd::MulAdd(qt[g][qd][0], k[0], dot[g]))));
      }
      // warp_sum<8> in slot order: slot 0 (lane 0) + slot 2 (lane 4), then + slot 1 (lane 2's
      // sum), then + slot 4 (lane 1's): each step with the lane's own value first.
      if constexpr (G == 1) {
        V8 v = dot[0];
        v = Simd::Add(v, Simd::Shuffle1032(v));         // lane 0: p0 + p4
        v = Simd::Add(v, Simd::Shuffle2301(v));         // (p0 + p4) + (p2 + p6)
        v = Simd::Add(v, Simd::SwapAdjacentBlocks(v));  // ... + ((p1 + p5) + (p3 + p7))
        S[t] = Simd::GetLane(v) * scale;
      } else {
        // Four heads a, b, c, d (two when G == 2) at once, each sum with the same operands in
        // the same order.
        for (int g = 0; g < G; g += 4) {
          const int gb = g + 1, gc = G > 2 ? g + 2 : g, gd = G > 2 ? g + 3 : g + 1;
          // Offset 4: [a0+a4, a2+a6, c0+c4, c2+c6 | a1+a5, a3+a7, c1+c5, c3+c7] (lane numbers).
          const V8 ac = Simd::Add(lo64(dot[g], dot[gc]), hi64(dot[g], dot[gc]));
          const V8 bd = Simd::Add(lo64(dot[gb], dot[gd]), hi64(dot[gb], dot[gd]));
          // Offset 2: lanes 0 and 1 of a, b in slots 0, 1 | 4, 5, of c, d in the second.
          V8 u = Simd::InterleaveLower(d8, ac, bd), w = Simd::InterleaveUpper(d8, ac, bd);
          u = Simd::Add(u, Simd::Shuffle1032(u));
          w = Simd::Add(w, Simd::Shuffle1032(w));
          // Offset 1: lane 0's sum of a, b, c, d in slots 0 .. 3.
          V8 z = lo64(u, w);
          z = Simd::Mul(Simd::Add(z, Simd::SwapAdjacentBlocks(z)), Simd::Set(d8, scale));
          alignas(32) float o[8];
          Simd::Store(z, d8, o);
          S[g * kChunk + t] = o[0];
          S[gb * kChunk + t] = o[1];
          if constexpr (G > 2) {
            S[gc * kChunk + t] = o[2];
            S[gd * kChunk + t] = o[3];
          }
        }
      }
    }
    for (int g = 0; g < G; ++g)
      for (int t = live; t < kChunk; ++t) S[g * kChunk + t] = -__builtin_huge_valf();
  }

  // Phase 2: P[g * kChunk + i] = exp(S - m) (0 when every score is -inf) and ml[g] = {m, l}, as
  // the warp of DecodeChunk that owns head g computes them (Note [softmax per warp]; with fewer
  // heads than warps every warp computes every head and warp 0 stores):
  // lane ln (0..31) takes the max and then the sum of its scores ln * 8 .. ln * 8 + 7 in order,
  // reduced by the 32-lane butterflies; m is lane 0's, l lane 1's (thread 1 stores it), each
  // lane's own value first in every sum.
  template <int G, int kChunk>
  static void decode_softmax(const float* S, float* P, float* const (&ml)[G]) {
    static_assert(kChunk == 256 && kChunk % kL == 0, "32 lanes of 8 scores (kDecodeChunk)");
    const DF d;
    for (int g = 0; g < G; ++g) {
      const float* sg = S + g * kChunk;
      float* pg = P + g * kChunk;
      // math::max is commutative and associative including NaN and signed zeros (Note [max is
      // commutative]): the lanes' maxima and their butterfly give the max of the 256 scores in
      // any order.
      VF mv(-__builtin_huge_valf());
      for (int i = 0; i < kChunk; i += kL) mv = math::max(mv, VF(Simd::LoadU(d, sg + i)));
      alignas(64) float mc[kL];
      Simd::Store(mv.v, d, mc);
      float m = mc[0];
      for (int i = 1; i < kL; ++i) m = math::max(m, mc[i]);
      const bool empty = m == -__builtin_huge_valf();
      for (int i = 0; i < kChunk; i += kL) {
        const VF e = math::exp(VF(Simd::LoadU(d, sg + i)) - VF(m));
        Simd::StoreU(empty ? Simd::Zero(d) : e.v, d, pg + i);
      }
      ml[g][0] = m;
      // Lane ln's sum of its 8 probabilities, 8 lanes at a time: the 8 rows of lanes 8 b ..
      // 8 b + 7 (8 values each) transposed, then the columns added in order, from 0.
      const typename Simd::template FixedTag<float, 8> d8;
      V8 lanes[4];
      for (int b = 0; b < 4; ++b) {
        const float* r = pg + b * 64;
        V8 rows[8], col[8];
        for (int i = 0; i < 8; ++i) rows[i] = Simd::LoadU(d8, r + i * 8);
        transpose8<Simd>(rows, col);
        V8 l = Simd::Zero(d8);
        for (int i = 0; i < 8; ++i) l = Simd::Add(l, col[i]);
        lanes[b] = l;
      }
      // The butterflies on lane 1's path (offsets 16, 8, 4, 2, 1), the lane's own value first
      // in each; only lane 1's result is stored.
      V8 x = Simd::Add(Simd::Add(lanes[0], lanes[2]), Simd::Add(lanes[1], lanes[3]));
      x = Simd::Add(x, Simd::SwapAdjacentBlocks(x));
      x = Simd::Add(x, Simd::Shuffle1032(x));
      x = Simd::Add(x, Simd::Shuffle2301(x));
      alignas(32) float o[8];
      Simd::Store(x, d8, o);
      ml[g][1] = o[1];
    }
  }

  // Phase 3: out[g][e] for e < D, as DecodeChunk's value loop and its reduction compute them:
  // row group rg (0..15: warp rg / 4, lane group rg % 4) chains fma(P[g][t], v[t][e], acc) over
  // rows t = rg, rg + 16, ... < kChunk from 0 (a row at or past live contributes fma(P, 0, acc));
  // a warp's value is (acc[4w] + acc[4w + 1]) + (acc[4w + 2] + acc[4w + 3]) and the output
  // ((O0 + O1) + O2) + O3.
  // Also prefetches `next` (the K of the chunk after this one, which this thread most likely
  // runs next: blocks are taken in order, chunk fastest) into the L2 cache, one 64-byte line per
  // step, so that the DRAM is busy while these products run from the L2 (without it the GQA-4
  // decode at L=16384 took 13-15% longer, alternating in one process).
  template <int G, int D, int kChunk, class R>
  static void decode_values(const float* P, const R* rows, int nrow, const float* fresh, int live,
                            float* const (&out)[G], const R* next) {
    static_assert(kChunk % 16 == 0 && kWarps == 4, "16 row groups: 4 per warp of 4 warps");
    constexpr int kW = kL < D ? kL : D;  // D is a multiple of 32 and kL a power of two <= 16
    constexpr int kV = kW < 16 ? 16 / kW : 1;  // vectors per step: a 64-byte line of each row
    const typename Simd::template CappedTag<float, kW> d;
    using V = typename Simd::template Vec<decltype(d)>;
    for (int e0 = 0; e0 < D; e0 += kW * kV) {
      V a[16][G][kV];
      for (int rg = 0; rg < 16; ++rg) {
        V acc[G][kV];  // in registers: the loops over g and u are unrolled
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
          for (int u = 0; u < kV; ++u) acc[g][u] = Simd::Zero(d);
        for (int t = rg; t < kChunk; t += 16) {
          __builtin_prefetch(next, 0, 2);  // never faults
          next += 64 / int(sizeof(R));
          V v[kV];
          if (t == nrow) {
            for (int u = 0; u < kV; ++u) v[u] = Simd::LoadU(d, fresh + e0 + u * kW);
          } else if (t < live) {
            const R* row = rows + std::int64_t{t} * D + e0;
            for (int u = 0; u < kV; ++u) v[u] = Simd::LoadWiden(d, row + u * kW);
          } else {
            for (int u = 0; u < kV; ++u) v[u] = Simd::Zero(d);
          }
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            const V pg = Simd::Set(d, P[g * kChunk + t]);
#pragma GCC unroll 4
            for (int u = 0; u < kV; ++u) acc[g][u] = Simd::MulAdd(pg, v[u], acc[g][u]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int u = 0; u < kV; ++u) a[rg][g][u] = acc[g][u];
      }
      for (int g = 0; g < G; ++g)
        for (int u = 0; u < kV; ++u) {
          const auto w = [&](int k) {
            return Simd::Add(Simd::Add(a[4 * k][g][u], a[4 * k + 1][g][u]), Simd::Add(a[4 * k + 2][g][u], a[4 * k + 3][g][u]));
          };
          V o = w(0);
          for (int k = 1; k < 4; ++k) o = Simd::Add(o, w(k));
          Simd::StoreU(o, d, out[g] + e0 + u * kW);
        }
    }
  }
};

}  // namespace lockstep::kernels
