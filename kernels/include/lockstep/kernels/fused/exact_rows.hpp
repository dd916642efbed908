#pragma once
// FusedAttentionExact's CPU row form (Note [row-major exact] in exact.hpp): a block's 64 query
// rows computed row by row with the lane code's arithmetic and order, over the SIMD vocabulary
// Simd that the CPU backend provides (lockstep/kernels/row_form.hpp).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "lockstep/kernels/math.hpp"
#include "lockstep/kernels/row_form.hpp"

namespace lockstep::kernels {

// --- Note [row-major exact] (kernels/fused/exact.hpp) --------------------------------------------
// FusedAttentionExact's block of 64 query rows, computed row by row with the arithmetic and
// order of the lanes that store each value (Note [exact register tiles]): per key tile of
// kTile keys, in order,
//   score(r, key) = fma chain over d = 0 .. D-1 from 0, then times scale; -inf where the key
//     is not visible to the row (past the tile's keys, a dead row, causal);
//   m_new = max(m, the tile's max); none = m_new == -inf; w = none ? 0 : exp(score - m_new);
//   the row group's thread kg sums its keys kg * 4 + 4 KG (j / 4) + j % 4, j = 0 .. kTile / KG
//     - 1 in order from 0, then the butterfly over the KG threads (offsets KG / 2 .. 1, each
//     thread's own value first); alpha = none ? 1 : exp(m - m_new); l = l * alpha + that sum
//     (thread kg's own l: the threads' sums differ only in NaN payloads);
//   acc = acc * alpha, then fma(w, v, acc) over the tile's kTile keys in order, V's rows past
//     the tile's keys being zeros (masked keys included: their weight 0 times an inf in V is
//     NaN here as on the GPU);
// out = l == 0 ? 0 : acc / l (column c's l is thread (c / 4) % KG's), log-sum-exp m + log(l)
// (-inf when l == 0, thread 0's l). Q, K and V are read where they are (no shared memory).
// Where NaNs from two sources meet (a NaN input and inf - inf, say), which payload survives an
// x86 operation depends on the instruction form the compiler picked, so the two paths may give
// NaNs with different payloads there (outside the contract: tests/support/backends.hpp).
template <class Simd>
struct ExactRowForm {
  using DF = typename Simd::DF;
  using VF = typename Simd::VF;
  using V8 = typename Simd::template Vec<typename Simd::template FixedTag<float, 8>>;
  static constexpr int kL = Simd::kL;

  // The thread's scratch for exact_rows, 64-byte aligned, grown on demand: on the heap (thread_local
  // arrays of this size would be thread-local storage that every thread of a program linking the
  // library gets, whether it runs lockstep or not).
  static float* exact_scratch(std::size_t floats) {
    struct Scratch {
      float* p = nullptr;
      std::size_t n = 0;
      ~Scratch() { std::free(p); }
    };
    thread_local Scratch s;
    if (s.n < floats) {
      std::free(s.p);
      s.p = static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64));
      s.n = s.p != nullptr ? floats : 0;
      if (s.p == nullptr) throw std::bad_alloc();
    }
    return s.p;
  }
  // Keys [key_begin, last_key); with part_o (Note [split keys] in kernels/fused/common.hpp) the
  // rows' partials instead of out and lse: o not divided at part_o + r D, the row's max and each
  // lane's sum at part_ml + r ml_pitch (FusedAttentionExact::kMlPitch).
  template <int D, int KG, int kTile>
  static void exact_rows(const float* qb, int q_ss, const float* kb, int k_ss, const float* vb, int v_ss, float* ob,
                         int o_ss, float* lse, int rows, int s0, int shift, int key_begin, int last_key, bool causal,
                         float scale, float* part_o, float* part_ml, int ml_pitch) {
    constexpr int kRows = 64;
    constexpr int kKeys = kTile / KG;  // keys per thread and tile
    static_assert(kKeys % 4 == 0, "whole key quads per lane (kTile a multiple of 4 KG)");
    static_assert(kTile % (2 * kL) == 0 && D % (2 * kL) == 0, "whole vector pairs of keys and columns");
    // Vectors of keys (scores) and of columns (P x V) per register block of rows: four with
    // 32 vector registers (avx3) where they divide the tile, else two.
    constexpr int kNK = kL == 16 && (kTile / kL) % 4 == 0 ? 4 : 2;
    constexpr int kNC = kL == 16 && (D / kL) % 4 == 0 ? 4 : 2;
    const DF d;
    using V = typename Simd::template Vec<DF>;
    constexpr float kNegInf = -__builtin_huge_valf();
    // K^T of the tile, the scores (then the weights), the accumulators and a row of zeros, in the
    // thread's scratch (each a multiple of 64 bytes).
    float* const Kt = exact_scratch(std::size_t(D) * kTile + kRows * kTile + kRows * D + D);
    float* const S = Kt + D * kTile;
    float* const acc = S + kRows * kTile;
    float* const zeros = acc + kRows * D;
    static_assert(KG == 8 || KG == 16, "row groups of 8 or 16 lanes");
    const typename Simd::template FixedTag<float, 8> d8;
    // Each lane's sum, 8 lanes at a time: lane kg's keys h 4 KG + 4 kg + e de-interleaved
    // (e = 0 .. 3), added in the order (h, e) from 0; then the butterfly, each lane's own value
    // first (offsets 4, 2, 1: block swap, 64-bit swap, 32-bit swap within 8 lanes).
    const auto lane_sums = [&](const float* w) {  // 8 consecutive lanes whose first key is w[0]
      V8 a = Simd::Zero(d8);
      for (int h = 0; h < kKeys / 4; ++h) {
        V8 e0, e1, e2, e3;
        Simd::LoadInterleaved4(d8, w + h * 4 * KG, e0, e1, e2, e3);
        a = Simd::Add(Simd::Add(Simd::Add(Simd::Add(a, e0), e1), e2), e3);
      }
      return a;
    };
    const auto butterfly8 = [](V8 a) {
      a = Simd::Add(a, Simd::SwapAdjacentBlocks(a));
      a = Simd::Add(a, Simd::Shuffle1032(a));
      return Simd::Add(a, Simd::Shuffle2301(a));
    };
    float m[kRows], alpha[kRows];
    alignas(32) float l[kRows][KG];
    alignas(64) float tile_max[kRows * kL];  // each row's max over the tile, per lane (the scores)
    const V iota = Simd::ConvertTo(d, Simd::Iota());
    static_assert(kL == 8 || kL == 16, "the tile max's lane reduction");
    const int rows4 = (rows + 3) / 4 * 4;  // rows padded to a multiple of four; rows at or past `rows` are dead
    // The products' register blocks of rows: kNR rows at a time (six with avx2's 16 vector
    // registers: 12 accumulators, the fma chains' latency covered with fewer loads per fma; four
    // with avx3's 32), then fours and twos (rows4 is a multiple of 4). Each accumulator's chain is
    // the same whatever the block: the same bytes.
    constexpr int kNR = kL == 8 ? 6 : 4;
    const auto by_row_blocks = [rows4](const auto& f) {
      int r = 0;
      for (; r + kNR <= rows4; r += kNR) f.template operator()<kNR>(r);
      for (; r + 4 <= rows4; r += 4) f.template operator()<4>(r);
      for (; r < rows4; r += 2) f.template operator()<2>(r);
    };
    for (int r = 0; r < rows4; ++r) {
      m[r] = kNegInf;
      for (int g = 0; g < KG; ++g) l[r][g] = 0.0f;
      for (int c = 0; c < D; c += kL) Simd::Store(Simd::Zero(d), d, acc + r * D + c);
    }
    for (int c = 0; c < D; c += kL) Simd::Store(Simd::Zero(d), d, zeros + c);
    for (int j0 = key_begin; j0 < last_key; j0 += kTile) {
      const int keys = std::min(last_key - j0, kTile);
      // K^T: Kt[dd * kTile + key], zeros past the tile's keys, in 8 x 8 blocks (transpose8).
      for (int k8 = 0; k8 < kTile; k8 += 8) {
        const float* kr[8];
        for (int i = 0; i < 8; ++i) kr[i] = k8 + i < keys ? kb + std::int64_t(j0 + k8 + i) * k_ss : zeros;
        for (int c8 = 0; c8 < D; c8 += 8) {
          V8 rows[8], col[8];
          for (int i = 0; i < 8; ++i) rows[i] = Simd::LoadU(d8, kr[i] + c8);
          transpose8<Simd>(rows, col);
          for (int j = 0; j < 8; ++j) Simd::StoreU(col[j], d8, Kt + (c8 + j) * kTile + k8);
        }
      }
      // Scores of NR rows and kNK vectors of keys at a time: each an fma chain over dd in order,
      // then times scale, -inf where the key is not visible to the row, and the row's running
      // max over the tile (math::max: any order gives the same, Note [max is commutative]).
      by_row_blocks([&]<int NR>(int r) {
        const float* qr[NR];
        int vis[NR];  // keys visible to the row: key < keys, and causal: key + j0 <= s0 + r + shift
        for (int i = 0; i < NR; ++i) {
          qr[i] = r + i < rows ? qb + std::int64_t(r + i) * q_ss : zeros;
          vis[i] = causal ? std::min(keys, s0 + r + i + shift - j0 + 1) : keys;
        }
        VF mx[NR];
        for (int i = 0; i < NR; ++i) mx[i] = VF(kNegInf);
        for (int k0 = 0; k0 < kTile; k0 += kNK * kL) {
          V a[NR][kNK];
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNK; ++u) a[i][u] = Simd::Zero(d);
          for (int dd = 0; dd < D; ++dd) {
            V kv[kNK];
            for (int u = 0; u < kNK; ++u) kv[u] = Simd::Load(d, Kt + dd * kTile + k0 + u * kL);
            for (int i = 0; i < NR; ++i) {
              const V qv = Simd::Set(d, qr[i][dd]);
              for (int u = 0; u < kNK; ++u) a[i][u] = Simd::MulAdd(qv, kv[u], a[i][u]);
            }
          }
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNK; ++u) {
              const auto visible = Simd::Lt(iota, Simd::Set(d, float(vis[i] - (k0 + u * kL))));
              const V sc = Simd::IfThenElse(visible, Simd::Mul(a[i][u], Simd::Set(d, scale)), Simd::Set(d, kNegInf));
              Simd::Store(sc, d, S + (r + i) * kTile + k0 + u * kL);
              mx[i] = math::max(mx[i], VF(sc));
            }
        }
        for (int i = 0; i < NR; ++i) Simd::Store(mx[i].v, d, tile_max + (r + i) * kL);
      });
      // The online softmax of each row; the weights replace the scores.
      for (int r = 0; r < rows4; ++r) {
        float* sr = S + r * kTile;
        if (r >= rows) {  // dead: every key invisible, nothing stored
          for (int k0 = 0; k0 < kTile; k0 += kL) Simd::Store(Simd::Zero(d), d, sr + k0);
          alpha[r] = 1.0f;
          continue;
        }
        // The tile's max of the row's scores: its vector from the scores, then across lanes.
        VF mv(Simd::Load(d, tile_max + r * kL));
        if constexpr (kL == 16) mv = math::max(mv, VF(Simd::ConcatLowerUpper(d, mv.v, mv.v)));
        mv = math::max(mv, VF(Simd::SwapAdjacentBlocks(mv.v)));
        mv = math::max(mv, VF(Simd::Shuffle1032(mv.v)));
        mv = math::max(mv, VF(Simd::Shuffle2301(mv.v)));
        const float tmax = Simd::GetLane(mv.v);
        const float m_new = math::max(m[r], tmax);
        const bool none = m_new == kNegInf;
        for (int k0 = 0; k0 < kTile; k0 += kL) {
          const VF e = math::exp(VF(Simd::Load(d, sr + k0)) - VF(m_new));
          Simd::Store(none ? Simd::Zero(d) : e.v, d, sr + k0);
        }
        alpha[r] = none ? 1.0f : math::exp(m[r] - m_new);
        const V8 av = Simd::Set(d8, alpha[r]);
        if constexpr (KG == 8) {
          const V8 ps = butterfly8(lane_sums(sr));
          Simd::Store(Simd::Add(Simd::Mul(Simd::Load(d8, l[r]), av), ps), d8, l[r]);
        } else {  // lanes 0-7 and 8-15: offset 8 first (each lane's own value first), then 4, 2, 1
          const V8 a = lane_sums(sr), b = lane_sums(sr + 32);
          const V8 pa = butterfly8(Simd::Add(a, b)), pb = butterfly8(Simd::Add(b, a));
          Simd::Store(Simd::Add(Simd::Mul(Simd::Load(d8, l[r]), av), pa), d8, l[r]);
          Simd::Store(Simd::Add(Simd::Mul(Simd::Load(d8, l[r] + 8), av), pb), d8, l[r] + 8);
        }
        m[r] = m_new;
      }
      // P x V: NR rows and kNC vectors of columns at a time: acc times the row's alpha, then fma
      // over the tile's keys in order (the keys past the tile's end with V's rows as zeros, as on
      // the GPU).
      by_row_blocks([&]<int NR>(int r) {
        for (int c0 = 0; c0 < D; c0 += kNC * kL) {
          V a[NR][kNC];
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNC; ++u)
              a[i][u] = Simd::Mul(Simd::Load(d, acc + (r + i) * D + c0 + u * kL), Simd::Set(d, alpha[r + i]));
          const auto step = [&](const float* vr, int key) {
            V vv[kNC];
            for (int u = 0; u < kNC; ++u) vv[u] = Simd::LoadU(d, vr + c0 + u * kL);
            for (int i = 0; i < NR; ++i) {
              const V w = Simd::Set(d, S[(r + i) * kTile + key]);
              for (int u = 0; u < kNC; ++u) a[i][u] = Simd::MulAdd(w, vv[u], a[i][u]);
            }
          };
          const float* vr = vb + std::int64_t(j0) * v_ss;
          for (int key = 0; key < keys; ++key, vr += v_ss) step(vr, key);
          for (int key = keys; key < kTile; ++key) step(zeros, key);
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNC; ++u) Simd::Store(a[i][u], d, acc + (r + i) * D + c0 + u * kL);
        }
      });
    }
    if (part_o != nullptr) {
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < D; ++c) part_o[std::int64_t(r) * D + c] = acc[r * D + c];
        part_ml[std::int64_t(r) * ml_pitch] = m[r];
        for (int g = 0; g < KG; ++g) part_ml[std::int64_t(r) * ml_pitch + 1 + g] = l[r][g];
      }
      return;
    }
    for (int r = 0; r < rows; ++r) {
      float* orow = ob + std::int64_t(r) * o_ss;
      for (int c = 0; c < D; ++c) {
        const float lc = l[r][(c / 4) % KG];
        orow[c] = lc == 0.0f ? 0.0f : acc[r * D + c] / lc;
      }
      if (lse != nullptr) lse[r] = l[r][0] == 0.0f ? kNegInf : m[r] + math::log(l[r][0]);
    }
  }
};

}  // namespace lockstep::kernels
