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

// What a block of either fused kernel owns: query rows [s0, s0 + rows) of head h in batch b, kv
// head hk (GQA), and the base pointers and 32-bit row strides of its operands. Grid: x = query
// tile of kRows rows, y = head, z = batch.
struct FusedBlock {
  int b, h, hk, s0, rows;
  int shift;  // causal: row i sees keys j <= i + shift (bottom-right alignment)
  const float* qb;
  const float* kb;
  const float* vb;
  float* ob;
  int q_ss, k_ss, v_ss, o_ss;

  template <class X>
  LOCKSTEP_HD FusedBlock(X& x, const FusedAttentionParams& p, int kRows)
      : b(x.block_z()), h(x.block_y()), hk(h / (p.H / p.Hkv)), s0(x.block_x() * kRows),
        rows(static_cast<int>(imin(p.Sq - s0, kRows))), shift(p.Skv - p.Sq),
        qb(p.q + b * p.q_sb + h * p.q_sh + std::int64_t{s0} * p.q_ss),
        kb(p.k + b * p.k_sb + hk * p.k_sh),
        vb(p.v + b * p.v_sb + hk * p.v_sh),
        ob(p.out + b * p.o_sb + h * p.o_sh + std::int64_t{s0} * p.o_ss),
        q_ss(static_cast<int>(p.q_ss)), k_ss(static_cast<int>(p.k_ss)),
        v_ss(static_cast<int>(p.v_ss)), o_ss(static_cast<int>(p.o_ss)) {}

  // Keys visible to the block's last row: causal tiles past it are skipped.
  LOCKSTEP_HD int last_key(const FusedAttentionParams& p) const {
    return p.causal ? static_cast<int>(imin(p.Skv, s0 + rows + shift)) : p.Skv;
  }

  // The log-sum-exp of row `row` of the block (a lane value) finished with running max m and
  // sum l: -inf for a fully masked row (l == 0).
  template <class X, class F, class Row, class Live>
  LOCKSTEP_HD void store_lse(X& x, const FusedAttentionParams& p, const Row& row, const Live& live,
                             const F& m, const F& l) const {
    if (p.lse == nullptr) return;
    const F lse = x.select(l == 0.0f, -kInf, m + x.log(l));
    float* lrow = p.lse + (std::int64_t{b} * p.H + h) * p.Sq + s0;
    x.store(lrow, row, lse, live & (x.lane() == 0));
  }
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

    const FusedBlock fb(x, p, kRows);
    const int s0 = fb.s0, rows = fb.rows, shift = fb.shift;
    const float *qb = fb.qb, *kb = fb.kb, *vb = fb.vb;
    float* ob = fb.ob;
    const int q_ss = fb.q_ss, k_ss = fb.k_ss, v_ss = fb.v_ss, o_ss = fb.o_ss;

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

    const int last_key = fb.last_key(p);
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
      fb.store_lse(x, p, row, live, m[r], l[r]);
    }
  }
};


// Fused attention on the tensor cores, the same FlashAttention-2 schedule: a block owns kRows
// query rows of one (batch, head), streams tiles of 64 keys through shared memory, keeps a running
// max and sum per row and rescales its output. Q.K^T and P.V are 16x16x16 tile products (WMMA on
// CUDA; emulated on the CPU with the same tiles and rounding points, Note [tensor-core
// emulation]); the softmax is SIMT in strict fp32.
//
// Note [fused tensor-core rounding points]
// Q, K and V are rounded to fp16 (nearest even) as they enter shared memory; S = Q.K^T is
// accumulated in fp32 over head_dim in steps of 16; p = exp(s * scale - m) is computed in fp32, the
// row sum l accumulates the fp32 p, and P.V uses p rounded to fp16; each tile's P.V (fp32
// accumulation over the 64 keys in steps of 16) is added to the output as o = fma(o, alpha, pv).
// The output accumulator lives in shared memory (fp32), so the per-row rescale is SIMT.
// Grid: x = ceil(Sq / kRows), y = H, z = B. Warp w owns rows 16w .. 16w + 15.
template <int D>
struct FusedAttentionTensorCore {
  static_assert(D % 16 == 0 && D <= 256, "head_dim: a multiple of 16, at most 256");
  static constexpr const char* kName = "fused_attention_tensor_core";
  static constexpr int kRows = D <= 128 ? 64 : 32;
  static constexpr int kWarps = kRows / 16;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kTile = 64;        // keys per tile
  static constexpr int kLdQ = D + 8;      // fp16 [kRows][D]
  static constexpr int kLdKT = kTile + 8; // fp16 [D][kTile]: K transposed, the B operand of Q.K^T
  static constexpr int kLdV = D + 8;      // fp16 [kTile][D]
  static constexpr int kLdP = kTile + 8;  // fp16 [kRows][kTile]
  static constexpr int kLdS = kTile + 4;  // fp32 [kRows][kTile] scores
  static constexpr int kLdO = D + 4;      // fp32 [kRows][D] this tile's P.V, and the output
  static constexpr int kStage = (kRows * kLdS > kRows * kLdO) ? kRows * kLdS : kRows * kLdO;
  static constexpr std::size_t kHalves = std::size_t(kRows) * kLdQ + std::size_t(D) * kLdKT +
                                         std::size_t(kTile) * kLdV + std::size_t(kRows) * kLdP;
  static constexpr std::size_t kSharedBytes =
      kHalves * 2 + (std::size_t(kStage) + std::size_t(kRows) * kLdO + kRows) * 4 + 7 * 32;
  using Params = FusedAttentionParams;

  // C = A x B for each warp's 16 rows: A (fp16, the warp's rows from a_row, K columns, leading
  // dimension lda) times B (fp16, K x N, ldb), accumulated in fp32 in 16-deep steps from zero and
  // stored to C (the warp's rows from c_row, ldc). Offsets are lane values uniform per warp.
  template <int N, int K, class X, class Off>
  LOCKSTEP_HD static void warp_rows_product(X& x, const typename X::half_t* A, const Off& a_row,
                                            int lda, const typename X::half_t* Bm, int ldb,
                                            float* C, const Off& c_row, int ldc) {
    LOCKSTEP_UNROLL
    for (int n = 0; n < N / 16; ++n) {
      typename X::AccTile acc;
      x.tile_zero(acc);
      LOCKSTEP_UNROLL
      for (int kk = 0; kk < K / 16; ++kk)
        x.tile_mma(acc, A, a_row + 16 * kk, lda, Bm, (16 * kk) * ldb + 16 * n, ldb);
      x.tile_store(C, c_row + 16 * n, ldc, acc);
    }
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    using H = typename X::half_t;
    H* Qh = x.template shared<H>(kRows * kLdQ);
    H* KT = x.template shared<H>(D * kLdKT);
    H* Vh = x.template shared<H>(kTile * kLdV);
    H* Ph = x.template shared<H>(kRows * kLdP);
    float* St = x.template shared<float>(kStage);   // scores, then this tile's P.V
    float* Os = x.template shared<float>(kRows * kLdO);
    float* Al = x.template shared<float>(kRows);    // per-row rescale of this tile

    const FusedBlock fb(x, p, kRows);
    const int s0 = fb.s0, rows = fb.rows, shift = fb.shift;
    const float *qb = fb.qb, *kb = fb.kb, *vb = fb.vb;
    float* ob = fb.ob;
    const int q_ss = fb.q_ss, k_ss = fb.k_ss, v_ss = fb.v_ss, o_ss = fb.o_ss;

    const I t = x.thread();
    const I lane = x.lane();
    const I w = x.warp();

    for (int r = 0; r < kRows; ++r)
      for (int c0 = 0; c0 < D; c0 += kThreads) {
        const I c = t + c0;
        x.store_half(Qh, r * kLdQ + c, x.load(qb, c + r * q_ss, (c < D) & (r < rows), 0.0f), c < D);
        x.store(Os, r * kLdO + c, 0.0f, c < D);
      }

    F m[16], l[16];
    LOCKSTEP_UNROLL
    for (int r = 0; r < 16; ++r) {
      m[r] = -kInf;
      l[r] = 0.0f;
    }

    const int last_key = fb.last_key(p);
    for (int j0 = 0; j0 < last_key; j0 += kTile) {
      const int keys = static_cast<int>(imin(last_key - j0, kTile));
      x.sync();  // the previous tile's K, V, P and P.V are consumed
      const float* kt = kb + std::int64_t{j0} * p.k_ss;
      const float* vt = vb + std::int64_t{j0} * p.v_ss;
      for (int r = 0; r < kTile; ++r)
        for (int c0 = 0; c0 < D; c0 += kThreads) {
          const I c = t + c0;
          const B ok = (c < D) & (r < keys);
          x.store_half(KT, c * kLdKT + r, x.load(kt, c + r * k_ss, ok, 0.0f), c < D);
          x.store_half(Vh, r * kLdV + c, x.load(vt, c + r * v_ss, ok, 0.0f), c < D);
        }
      x.sync();
      // S = Q.K^T: warp w, its 16 rows by the tile's 64 keys.
      warp_rows_product<kTile, D>(x, Qh, w * (16 * kLdQ), kLdQ, KT, kLdKT, St, w * (16 * kLdS), kLdS);
      x.sync();
      // Online softmax, SIMT: lane j holds keys j and j + 32 of each of the warp's rows.
      LOCKSTEP_UNROLL
      for (int r = 0; r < 16; ++r) {
        const I row = w * 16 + r;
        const I qi = row + s0;
        const I key0 = lane, key1 = lane + 32;
        B vis0 = (key0 < keys) & (row < rows), vis1 = (key1 < keys) & (row < rows);
        if (p.causal) {
          vis0 = vis0 & (key0 + j0 <= qi + shift);
          vis1 = vis1 & (key1 + j0 <= qi + shift);
        }
        const F sc0 = x.select(vis0, x.load(St, row * kLdS + key0) * p.scale, -kInf);
        const F sc1 = x.select(vis1, x.load(St, row * kLdS + key1) * p.scale, -kInf);
        const F m_new = x.max(m[r], x.warp_max(x.max(sc0, sc1)));
        const B none = m_new == -kInf;
        const F p0 = x.select(none, 0.0f, x.exp(sc0 - m_new));
        const F p1 = x.select(none, 0.0f, x.exp(sc1 - m_new));
        const F alpha = x.select(none, 1.0f, x.exp(m[r] - m_new));
        l[r] = l[r] * alpha + x.warp_sum(p0 + p1);
        m[r] = m_new;
        x.store_half(Ph, row * kLdP + key0, p0);
        x.store_half(Ph, row * kLdP + key1, p1);
        x.store(Al, row, alpha, lane == 0);
      }
      x.sync();  // P is read by the warp's tile loads; the scores' stage is reused for P.V
      // This tile's P.V: warp w, its 16 rows by D columns.
      warp_rows_product<D, kTile>(x, Ph, w * (16 * kLdP), kLdP, Vh, kLdV, St, w * (16 * kLdO), kLdO);
      x.sync();
      // o = o * alpha + pv for the warp's rows.
      LOCKSTEP_UNROLL
      for (int r = 0; r < 16; ++r) {
        const I row = w * 16 + r;
        const F a = x.load(Al, row);
        for (int c0 = 0; c0 < D; c0 += kWarpSize) {
          const I c = lane + c0;
          const B ok = c < D;
          x.store(Os, row * kLdO + c,
                  x.fma(x.load(Os, row * kLdO + c, ok, 0.0f), a, x.load(St, row * kLdO + c, ok, 0.0f)), ok);
        }
      }
    }

    x.sync();  // with no key tile at all, Os still holds the zeros other threads wrote
    LOCKSTEP_UNROLL
    for (int r = 0; r < 16; ++r) {
      const I row = w * 16 + r;
      const B live = row < rows;
      const B empty = l[r] == 0.0f;
      for (int c0 = 0; c0 < D; c0 += kWarpSize) {
        const I c = lane + c0;
        const B ok = live & (c < D);
        x.store(ob, row * o_ss + c, x.select(empty, 0.0f, x.load(Os, row * kLdO + c, c < D, 0.0f) / l[r]), ok);
      }
      fb.store_lse(x, p, row, live, m[r], l[r]);
    }
  }
};

}  // namespace lockstep::kernels
