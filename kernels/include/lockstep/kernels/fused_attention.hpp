#pragma once
// Fused attention for prefill in strict fp32 (SIMT): the FlashAttention-2 schedule. A block owns
// 32 query rows of one (batch, head) and streams K/V tiles of 32 tokens through shared memory,
// keeping a running max and sum per row (online softmax) and rescaling its output accumulator.
// Every sum has a fixed order (tiles in order, tokens in order within a tile), so the CPU and
// CUDA backends return the same bits.
//
// Layouts are given by strides (elements) for batch, sequence and head; head_dim is contiguous.
// GQA: query head h reads kv head h / (H / Hkv). Causal masking is bottom-right aligned: query i
// sees keys j <= i + (Skv - Sq). A fully masked row gives zeros and log-sum-exp -inf.

#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

struct FusedAttentionParams {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  float* lse;  // [B, H, Sq] natural log-sum-exp of the scaled scores, or null
  std::int64_t q_sb, q_ss, q_sh;  // strides: batch, sequence, head
  std::int64_t k_sb, k_ss, k_sh;
  std::int64_t v_sb, v_ss, v_sh;
  std::int64_t o_sb, o_ss, o_sh;
  std::int32_t B, H, Hkv, Sq, Skv;
  std::int32_t causal;
  float scale;
};

// Grid: x = ceil(Sq / 32) query tiles, y = H, z = B. 4 warps; warp w owns rows 8w .. 8w + 7.
template <int D>
struct FusedAttentionExact {
  static_assert(D % 32 == 0 && D <= 256, "head_dim: a multiple of 32, at most 256");
  static constexpr const char* kName = "fused_attention_exact";
  static constexpr int kThreads = 128;
  static constexpr int kRows = 32;      // query rows per block
  static constexpr int kRowsPerWarp = 8;
  static constexpr int kTile = 32;      // keys per tile
  static constexpr int kCols = D / 32;  // output columns per lane
  static constexpr int kKPitch = D + 1; // K tile row pitch: column reads avoid bank conflicts
  static constexpr std::size_t kSharedBytes =
      (kRows * D + kTile * kKPitch + kTile * D + kRows * kTile) * sizeof(float) + 128;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    float* Qs = x.template shared<float>(kRows * D);
    float* Ks = x.template shared<float>(kTile * kKPitch);
    float* Vs = x.template shared<float>(kTile * D);
    float* Ps = x.template shared<float>(kRows * kTile);

    const int b = x.block_z(), h = x.block_y();
    const int hk = h / (p.H / p.Hkv);
    const int s0 = x.block_x() * kRows;
    const int rows = static_cast<int>(imin(p.Sq - s0, kRows));
    const int shift = p.Skv - p.Sq;  // causal: row i sees keys <= i + shift
    const float* qb = p.q + b * p.q_sb + h * p.q_sh + std::int64_t{s0} * p.q_ss;
    const float* kb = p.k + b * p.k_sb + hk * p.k_sh;
    const float* vb = p.v + b * p.v_sb + hk * p.v_sh;
    float* ob = p.out + b * p.o_sb + h * p.o_sh + std::int64_t{s0} * p.o_ss;
    const int q_ss = static_cast<int>(p.q_ss), k_ss = static_cast<int>(p.k_ss),
              v_ss = static_cast<int>(p.v_ss), o_ss = static_cast<int>(p.o_ss);

    const I t = x.thread();
    const I lane = x.lane();
    const I w = x.warp();

    // The block's query rows into shared memory (rows past Sq are zeros, never stored).
    for (int r = 0; r < kRows; ++r)
      for (int c0 = 0; c0 < D; c0 += kThreads) {
        const I c = t + c0;
        x.store(Qs, c + r * D, x.load(qb, c + r * q_ss, (c < D) & (r < rows), 0.0f), c < D);
      }

    // Per row of the warp: running max, running sum, and the lane's D/32 output columns.
    F m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kCols];
    LOCKSTEP_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      m[r] = -kInf;
      l[r] = 0.0f;
      LOCKSTEP_UNROLL
      for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;
    }

    // Keys visible to the block's last row: causal tiles past it are skipped.
    const int last_key = p.causal ? static_cast<int>(imin(p.Skv, s0 + rows + shift)) : p.Skv;
    for (int j0 = 0; j0 < last_key; j0 += kTile) {
      const int keys = static_cast<int>(imin(last_key - j0, kTile));
      x.sync();  // the previous tile's K, V and P are consumed
      const float* kt = kb + std::int64_t{j0} * p.k_ss;
      const float* vt = vb + std::int64_t{j0} * p.v_ss;
      for (int r = 0; r < kTile; ++r)
        for (int c0 = 0; c0 < D; c0 += kThreads) {
          const I c = t + c0;
          const B ok = (c < D) & (r < keys);
          x.store(Ks, c + r * kKPitch, x.load(kt, c + r * k_ss, ok, 0.0f), c < D);
          x.store(Vs, c + r * D, x.load(vt, c + r * v_ss, ok, 0.0f), c < D);
        }
      x.sync();
      // Scores: lane j owns key j0 + j; each of the warp's rows is one fma chain over d.
      F s[kRowsPerWarp];
      LOCKSTEP_UNROLL
      for (int r = 0; r < kRowsPerWarp; ++r) s[r] = 0.0f;
      for (int d = 0; d < D; ++d) {
        const F kv = x.load(Ks, lane * kKPitch + d);
        LOCKSTEP_UNROLL
        for (int r = 0; r < kRowsPerWarp; ++r)
          s[r] = x.fma(x.load(Qs, (w * kRowsPerWarp + r) * D + d), kv, s[r]);
      }
      LOCKSTEP_UNROLL
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const I row = w * kRowsPerWarp + r;  // in the block
        const I qi = row + s0;                // in the sequence
        B visible = (lane < keys) & (row < rows);
        if (p.causal) visible = visible & (lane + j0 <= qi + shift);
        const F sc = x.select(visible, s[r] * p.scale, -kInf);
        const F m_new = x.max(m[r], x.warp_max(sc));
        const B none = m_new == -kInf;  // nothing visible yet in this row
        const F pj = x.select(none, 0.0f, x.exp(sc - m_new));
        const F alpha = x.select(none, 1.0f, x.exp(m[r] - m_new));
        l[r] = l[r] * alpha + x.warp_sum(pj);
        m[r] = m_new;
        x.store(Ps, row * kTile + lane, pj);
        LOCKSTEP_UNROLL
        for (int c = 0; c < kCols; ++c) acc[r][c] = acc[r][c] * alpha;
      }
      x.sync();  // P is read by every lane of its warp (racecheck: a warp barrier is required)
      // P x V: lane owns columns lane + 32 c; every key of the tile in order.
      for (int j = 0; j < kTile; ++j) {
        F vv[kCols];
        LOCKSTEP_UNROLL
        for (int c = 0; c < kCols; ++c) vv[c] = x.load(Vs, j * D + lane + 32 * c);
        LOCKSTEP_UNROLL
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const F pr = x.load(Ps, (w * kRowsPerWarp + r) * kTile + j);
          LOCKSTEP_UNROLL
          for (int c = 0; c < kCols; ++c) acc[r][c] = x.fma(pr, vv[c], acc[r][c]);
        }
      }
    }

    LOCKSTEP_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const I row = w * kRowsPerWarp + r;
      const B live = row < rows;
      const B empty = l[r] == 0.0f;  // fully masked row
      LOCKSTEP_UNROLL
      for (int c = 0; c < kCols; ++c)
        x.store(ob, row * o_ss + lane + 32 * c, x.select(empty, 0.0f, acc[r][c] / l[r]), live);
      if (p.lse != nullptr) {
        const F lse = x.select(empty, -kInf, m[r] + x.log(l[r]));
        float* lrow = p.lse + (std::int64_t{b} * p.H + h) * p.Sq + s0;
        x.store(lrow, row, lse, live & (lane == 0));
      }
    }
  }
};

}  // namespace lockstep::kernels
