// The decode chunk kernel's CPU row form (Note [row-major decode] in kernels/decode/chunk.hpp):
// its phases computed row by row, with the lane code's arithmetic and order.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
// --- Note [row-major decode] (kernels/decode/chunk.hpp) ------------------------------------------
// The decode chunk kernel's phases, computed row by row with the arithmetic and order of the
// lane that stores each value, instead of statement by statement over the block's lanes.
// On (avx2, avx3) unless LOCKSTEP_CPU_DECODE_LANES=1 (the lane path: a check, tested to give
// the same bytes). Rows: row t is fresh when t == nrow, else rows + t * D; rows at or past
// live are never read.
template <int PW>
class DecodeRows {
  static constexpr int kWarps = PW / 32;

 public:
  static constexpr bool kRowMajorDecode = true;

  // Phase 1: S[g * kChunk + t] = the score of row t for head g, as lane l8 == 0 of DecodeChunk's
  // score loop writes it: lane l8 (0..7) chains fma over its elements (qd * 8 + l8) * 4 + j, qd
  // then j ascending, from 0; warp_sum<8> (offsets 4, 2, 1, each lane's own value first) then the
  // scale. Rows at or past live: -inf.
  // Also prefetches rows [0, live) of vrows (the chunk's V) into the L2 cache as it goes, so
  // that decode_values, which visits them 16 rows apart, does not wait on the DRAM (without it
  // the GQA-4 decode at L=16384 took 19.4 ms instead of 9.9; prefetching K 16 KB ahead as well
  // made it 5% slower).
  template <int G, int D, int kChunk>
  void decode_scores(float* S, const float* rows, int nrow, const float* fresh, int live,
                     const float* const (&q)[G], float scale, const float* vrows) const {
    static_assert(D % 32 == 0);
    constexpr int kQ = D / 32;
    const hn::FixedTag<float, 8> d8;
    using V8 = hn::Vec<decltype(d8)>;
    const hn::Repartition<double, decltype(d8)> dd;
    // One row's 8-lane quads qd (floats qd * 32 .. + 31; lane l8 holds 4 * l8 .. + 3): k[j] holds
    // element j of every lane, in the slot order 0, 2, 4, 6 | 1, 3, 5, 7, which in-block
    // shuffles reach (a de-interleave into lane order would cross the 128-bit blocks). The
    // butterflies below read the lanes in this order.
    const auto quads = [&](const float* p, V8 (&k)[4]) {
      const V8 a0 = hn::LoadU(d8, p), a1 = hn::LoadU(d8, p + 8), a2 = hn::LoadU(d8, p + 16),
               a3 = hn::LoadU(d8, p + 24);
      const auto x0 = hn::BitCast(dd, hn::InterleaveLower(d8, a0, a1));  // l0 l2 (j0 j1) | l1 l3
      const auto x1 = hn::BitCast(dd, hn::InterleaveUpper(d8, a0, a1));  // (j2 j3)
      const auto y0 = hn::BitCast(dd, hn::InterleaveLower(d8, a2, a3));  // l4 l6 | l5 l7
      const auto y1 = hn::BitCast(dd, hn::InterleaveUpper(d8, a2, a3));
      k[0] = hn::BitCast(d8, hn::InterleaveLower(dd, x0, y0));
      k[1] = hn::BitCast(d8, hn::InterleaveUpper(dd, x0, y0));
      k[2] = hn::BitCast(d8, hn::InterleaveLower(dd, x1, y1));
      k[3] = hn::BitCast(d8, hn::InterleaveUpper(dd, x1, y1));
    };
    const auto lo64 = [&](V8 a, V8 b) { return hn::BitCast(d8, hn::InterleaveLower(dd, hn::BitCast(dd, a), hn::BitCast(dd, b))); };
    const auto hi64 = [&](V8 a, V8 b) { return hn::BitCast(d8, hn::InterleaveUpper(dd, hn::BitCast(dd, a), hn::BitCast(dd, b))); };
    V8 qt[G][kQ][4];
    for (int g = 0; g < G; ++g)
      for (int qd = 0; qd < kQ; ++qd) quads(q[g] + qd * 32, qt[g][qd]);
    for (int t = 0; t < live; ++t) {
      const float* kr = t == nrow ? fresh : rows + std::int64_t{t} * D;
      for (int b = 0; b < D; b += 16) __builtin_prefetch(vrows + std::int64_t{t} * D + b, 0, 2);
      V8 dot[G];
      for (int g = 0; g < G; ++g) dot[g] = hn::Zero(d8);
      for (int qd = 0; qd < kQ; ++qd) {
        V8 k[4];
        quads(kr + qd * 32, k);
        for (int g = 0; g < G; ++g)
          dot[g] = hn::MulAdd(qt[g][qd][3], k[3],
                              hn::MulAdd(qt[g][qd][2], k[2],
                                         hn::MulAdd(qt[g][qd][1], k[1], hn::MulAdd(qt[g][qd][0], k[0], dot[g]))));
      }
      // warp_sum<8> in slot order: slot 0 (lane 0) + slot 2 (lane 4), then + slot 1 (lane 2's
      // sum), then + slot 4 (lane 1's): each step with the lane's own value first.
      if constexpr (G == 1) {
        V8 v = dot[0];
        v = hn::Add(v, hn::Shuffle1032(v));         // lane 0: p0 + p4
        v = hn::Add(v, hn::Shuffle2301(v));         // (p0 + p4) + (p2 + p6)
        v = hn::Add(v, hn::SwapAdjacentBlocks(v));  // ... + ((p1 + p5) + (p3 + p7))
        S[t] = hn::GetLane(v) * scale;
      } else {
        // Four heads a, b, c, d (two when G == 2) at once, each sum with the same operands in
        // the same order.
        for (int g = 0; g < G; g += 4) {
          const int gb = g + 1, gc = G > 2 ? g + 2 : g, gd = G > 2 ? g + 3 : g + 1;
          // Offset 4: [a0+a4, a2+a6, c0+c4, c2+c6 | a1+a5, a3+a7, c1+c5, c3+c7] (lane numbers).
          const V8 ac = hn::Add(lo64(dot[g], dot[gc]), hi64(dot[g], dot[gc]));
          const V8 bd = hn::Add(lo64(dot[gb], dot[gd]), hi64(dot[gb], dot[gd]));
          // Offset 2: lanes 0 and 1 of a, b in slots 0, 1 | 4, 5, of c, d in the second.
          V8 u = hn::InterleaveLower(d8, ac, bd), w = hn::InterleaveUpper(d8, ac, bd);
          u = hn::Add(u, hn::Shuffle1032(u));
          w = hn::Add(w, hn::Shuffle1032(w));
          // Offset 1: lane 0's sum of a, b, c, d in slots 0 .. 3.
          V8 z = lo64(u, w);
          z = hn::Mul(hn::Add(z, hn::SwapAdjacentBlocks(z)), hn::Set(d8, scale));
          alignas(32) float o[8];
          hn::Store(z, d8, o);
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
  void decode_softmax(const float* S, float* P, float* const (&ml)[G]) const {
    static_assert(kChunk == 256 && kChunk % kL == 0, "32 lanes of 8 scores (kDecodeChunk)");
    const DF d;
    for (int g = 0; g < G; ++g) {
      const float* sg = S + g * kChunk;
      float* pg = P + g * kChunk;
      // math::max is commutative and associative including NaN and signed zeros (Note [max is
      // commutative]): the lanes' maxima and their butterfly give the max of the 256 scores in
      // any order.
      VF mv(-__builtin_huge_valf());
      for (int i = 0; i < kChunk; i += kL) mv = math::max(mv, VF(hn::LoadU(d, sg + i)));
      alignas(64) float mc[kL];
      hn::Store(mv.v, d, mc);
      float m = mc[0];
      for (int i = 1; i < kL; ++i) m = math::max(m, mc[i]);
      const bool empty = m == -__builtin_huge_valf();
      for (int i = 0; i < kChunk; i += kL) {
        const VF e = math::exp(VF(hn::LoadU(d, sg + i)) - VF(m));
        hn::StoreU(empty ? hn::Zero(d) : e.v, d, pg + i);
      }
      ml[g][0] = m;
      // Lane ln's sum of its 8 probabilities, 8 lanes at a time: the 8 rows of lanes 8 b ..
      // 8 b + 7 (8 values each) transposed, then the columns added in order, from 0.
      const hn::FixedTag<float, 8> d8;
      V8 lanes[4];
      for (int b = 0; b < 4; ++b) {
        const float* r = pg + b * 64;
        V8 rows[8], col[8];
        for (int i = 0; i < 8; ++i) rows[i] = hn::LoadU(d8, r + i * 8);
        transpose8(rows, col);
        V8 l = hn::Zero(d8);
        for (int i = 0; i < 8; ++i) l = hn::Add(l, col[i]);
        lanes[b] = l;
      }
      // The butterflies on lane 1's path (offsets 16, 8, 4, 2, 1), the lane's own value first
      // in each; only lane 1's result is stored.
      V8 x = hn::Add(hn::Add(lanes[0], lanes[2]), hn::Add(lanes[1], lanes[3]));
      x = hn::Add(x, hn::SwapAdjacentBlocks(x));
      x = hn::Add(x, hn::Shuffle1032(x));
      x = hn::Add(x, hn::Shuffle2301(x));
      alignas(32) float o[8];
      hn::Store(x, d8, o);
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
  template <int G, int D, int kChunk>
  void decode_values(const float* P, const float* rows, int nrow, const float* fresh, int live,
                     float* const (&out)[G], const float* next) const {
    static_assert(kChunk % 16 == 0 && kWarps == 4, "16 row groups: 4 per warp of 4 warps");
    constexpr int kW = kL < D ? kL : D;  // D is a multiple of 32 and kL a power of two <= 16
    constexpr int kV = kW < 16 ? 16 / kW : 1;  // vectors per step: a 64-byte line of each row
    const hn::CappedTag<float, kW> d;
    using V = hn::Vec<decltype(d)>;
    for (int e0 = 0; e0 < D; e0 += kW * kV) {
      V a[16][G][kV];
      for (int rg = 0; rg < 16; ++rg) {
        V acc[G][kV];  // in registers: the loops over g and u are unrolled
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
          for (int u = 0; u < kV; ++u) acc[g][u] = hn::Zero(d);
        for (int t = rg; t < kChunk; t += 16) {
          __builtin_prefetch(next, 0, 2);  // never faults
          next += 16;
          V v[kV];
          if (t < live) {
            const float* row = (t == nrow ? fresh : rows + std::int64_t{t} * D) + e0;
            for (int u = 0; u < kV; ++u) v[u] = hn::LoadU(d, row + u * kW);
          } else {
            for (int u = 0; u < kV; ++u) v[u] = hn::Zero(d);
          }
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            const V pg = hn::Set(d, P[g * kChunk + t]);
#pragma GCC unroll 4
            for (int u = 0; u < kV; ++u) acc[g][u] = hn::MulAdd(pg, v[u], acc[g][u]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int u = 0; u < kV; ++u) a[rg][g][u] = acc[g][u];
      }
      for (int g = 0; g < G; ++g)
        for (int u = 0; u < kV; ++u) {
          const auto w = [&](int k) {
            return hn::Add(hn::Add(a[4 * k][g][u], a[4 * k + 1][g][u]), hn::Add(a[4 * k + 2][g][u], a[4 * k + 3][g][u]));
          };
          V o = w(0);
          for (int k = 1; k < 4; ++k) o = hn::Add(o, w(k));
          hn::StoreU(o, d, out[g] + e0 + u * kW);
        }
    }
  }
};
#else
template <int PW>
struct DecodeRows {
  static constexpr bool kRowMajorDecode = false;
};
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
