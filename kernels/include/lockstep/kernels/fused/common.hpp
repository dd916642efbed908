#pragma once
// What the fused attention kernels share: their parameters, FusedAttentionParams, and the query
// tile a block owns, FusedBlock (with Note [split keys]).
//
// Layouts are given by strides (elements) for batch, sequence and head; head_dim is contiguous.
// GQA: query head h reads kv head h / (H / Hkv). Causal masking is bottom-right aligned: query i
// sees keys j <= i + (Skv - Sq). A fully masked row gives zeros and log-sum-exp -inf.

#include <type_traits>

#include "lockstep/kernels/act.hpp"

namespace lockstep::kernels {

struct FusedAttentionParams {
  // In act_format (kernels/act.hpp): float, or half or bfloat16 for FusedAttentionExact (Note
  // [exact formats]); float or half for the tensor-core kernels (Note [tensor-core formats]).
  const void* q;
  const void* k;
  const void* v;
  void* out;
  std::int32_t act_format;
  float* lse;  // [B, H, Sq] natural log-sum-exp of the scaled scores, or null
  std::int64_t q_sb, q_ss, q_sh;  // strides: batch, sequence, head
  std::int64_t k_sb, k_ss, k_sh;
  std::int64_t v_sb, v_ss, v_sh;
  std::int64_t o_sb, o_ss, o_sh;
  std::int32_t B, H, Hkv, Sq, Skv;
  std::int32_t causal;
  float scale;
  float scale_log2;  // scale * log2(e), rounded to fp32 (TensorCore's base-2 softmax)
  // TensorCore: K and V rounded to fp16, [B, Hkv, Skv, D] contiguous (FusedHalfPack writes them).
  void* k_half;
  void* v_half;
  // Always 0: FusedAttentionWgmma's zero that the compiler cannot see (Note [wgmma products]).
  std::int32_t zero;
  // Note [packing blocks] (FusedAttentionWgmma with PK): a zero that the blocks take their
  // tickets from, then a zero pair per kv head of every batch ([B * Hkv][2]). Null otherwise.
  std::int32_t* ticket;
  std::int32_t* pack_counters;
  // Note [packing blocks]: the blocks of flattened kv head i pack kv head i + pack_ahead (>= 1);
  // kv heads 0 .. pack_ahead - 1 (of batch 0) are packed by the launch before.
  std::int32_t pack_ahead;
  // Note [split keys] (TensorCore): 0 or 1, or the S > 1 ranges that a query tile's key tiles
  // are split into, one block each; part: the blocks' unnormalized outputs, [B, H, S, Sq, D];
  // part_ml: their rows' running max and sum, [B, H, S, Sq, 2]; split_counters: a zero per
  // (batch, head, query tile) that the last of a tile's S blocks resets. Unused when S <= 1.
  std::int32_t kv_splits;
  float* part;
  float* part_ml;
  std::int32_t* split_counters;
};

// What a block of either fused kernel owns: query rows [s0, s0 + rows) of head h in batch b, kv
// head hk (GQA), and the base pointers and 32-bit row strides of its operands. Grid: x = query
// tile of kRows rows, y = head, z = batch. With reverse_causal and a causal mask, block x takes
// tile gx - 1 - x: within each (batch, head) the tiles that see the most keys start first, and
// the grid ends with short blocks (blocks start roughly in the order of their index). Which
// block computes a tile changes, not how: the same bits. Exact takes it (16x16x1024x64 causal:
// 1.305-1.311 instead of 1.353 ms on an H100); TensorCore does not (at head_dim 128 its kernels
// were 1.3-1.7% slower with it, causal or not: a change of register allocation; the wgmma
// kernel 1-1.3%).
// The tensor cores' element format for inputs of type S (Note [tensor-core formats]): bfloat16
// for bfloat16, fp16 for float and half.
template <class S>
using tc_elem_t = std::conditional_t<std::is_same_v<S, bfloat16>, bfloat16, half>;

struct FusedBlock {
  int b, h, hk, s0, rows;
  int shift;  // causal: row i sees keys j <= i + shift (bottom-right alignment)
  // The block's operands in p.act_format (q and out at its first row).
  const void* qa;
  const void* ka;
  const void* va;
  void* oa;
  int q_ss, k_ss, v_ss, o_ss;
  int fmt;         // p.act_format (kernels/act.hpp)
  int split = 0;   // Note [split keys]: which of the tile's key ranges the block takes
  int splits = 1;  // ... of how many

  // With p.kv_splits = S > 1, block x takes key range x % S of query tile x / S (Note [split keys]).
  template <class X>
  LOCKSTEP_HD FusedBlock(X& x, const FusedAttentionParams& p, int kRows, bool reverse_causal = false)
      : FusedBlock(p, x.block_z(), x.block_y(),
                   reverse_causal && p.causal ? x.grid_x() - 1 - x.block_x() : x.block_x(), kRows, true) {}
  // Query tile `tile` of head h in batch b (Note [packing blocks]: the tile a ticket gives).
  LOCKSTEP_HD FusedBlock(const FusedAttentionParams& p, int b_, int h_, int tile, int kRows)
      : FusedBlock(p, b_, h_, tile, kRows, false) {}
  LOCKSTEP_HD FusedBlock(const FusedAttentionParams& p, int b_, int h_, int x, int kRows, bool split_x)
      : FusedBlock(p, b_, h_, split_x && p.kv_splits > 1 ? x / p.kv_splits : x, kRows, 0) {
    if (split_x && p.kv_splits > 1) {
      splits = p.kv_splits;
      split = x - (x / p.kv_splits) * p.kv_splits;
    }
  }
  LOCKSTEP_HD FusedBlock(const FusedAttentionParams& p, int b_, int h_, int tile, int kRows, int /*tag*/)
      : b(b_), h(h_), hk(h / (p.H / p.Hkv)), s0(tile * kRows),
        rows(static_cast<int>(imin(p.Sq - s0, kRows))), shift(p.Skv - p.Sq),
        qa(act_at(p.q, p.act_format, b * p.q_sb + h * p.q_sh + std::int64_t{s0} * p.q_ss)),
        ka(act_at(p.k, p.act_format, b * p.k_sb + hk * p.k_sh)),
        va(act_at(p.v, p.act_format, b * p.v_sb + hk * p.v_sh)),
        oa(act_at(p.out, p.act_format, b * p.o_sb + h * p.o_sh + std::int64_t{s0} * p.o_ss)),
        q_ss(static_cast<int>(p.q_ss)), k_ss(static_cast<int>(p.k_ss)),
        v_ss(static_cast<int>(p.v_ss)), o_ss(static_cast<int>(p.o_ss)), fmt(p.act_format) {}

  // Keys visible to the block's last row: causal tiles past it are skipped.
  LOCKSTEP_HD int last_key(const FusedAttentionParams& p) const {
    return p.causal ? static_cast<int>(imin(p.Skv, s0 + rows + shift)) : p.Skv;
  }
  // The block's key tiles of `tile` keys, [t0, t1): those its rows see, and of them, with splits,
  // range `split` of the S ranges that cut the ceil(Skv / tile) tiles of the sequence (Note [split
  // keys]: the cuts do not depend on the block's rows, so neither does a row's result).
  LOCKSTEP_HD void key_tiles(const FusedAttentionParams& p, int tile, int& t0, int& t1) const {
    const int lk = last_key(p);
    const int n = lk > 0 ? static_cast<int>((lk + tile - 1) / tile) : 0;
    t0 = 0;
    t1 = n;
    if (splits > 1) {  // 32-bit: all <= 2^26 tiles of 32 keys, splits <= 16 (no 64-bit division)
      const int all = static_cast<int>((std::int64_t{p.Skv} + tile - 1) / tile);
      t0 = static_cast<int>(imin(all * split / splits, n));
      t1 = static_cast<int>(imin(all * (split + 1) / splits, n));
    }
  }

  // The log-sum-exp of row `row` of the block (a lane value) finished with running max m and
  // sum l: -inf for a fully masked row (l == 0); stored by the lanes where `writer` holds.
  template <class X, class F, class Row, class W>
  LOCKSTEP_HD void store_lse(X& x, const FusedAttentionParams& p, const Row& row, const W& writer,
                             const F& m, const F& l) const {
    if (p.lse == nullptr) return;
    const F lse = x.select(l == 0.0f, -kInf, m + x.log(l));
    float* lrow = p.lse + (std::int64_t{b} * p.H + h) * p.Sq + s0;
    x.store(lrow, row, lse, writer);
  }
};

// Note [split keys]
// A grid of few blocks leaves SMs idle and each block a long serial walk over the keys:
// whisper-tiny's 1x6x1500x64 is 144 query tiles of 64 rows (FusedAttentionExact: 4 warps each,
// about one block per SM; FusedAttentionWgmma: 144 blocks of one warpgroup), 24 key tiles each.
// With p.kv_splits = S > 1 (attention/src/fused.cpp picks S from the shape alone, so the CPU
// device splits where CUDA does; Exact only when AttentionOptions::batch_invariant is false: S
// depends on the grid's size; TensorCore only when a knob forces S, since it measured slower
// than no split) the ceil(Skv / kTile) key tiles of the sequence are cut into S
// ranges, [s T / S, (s + 1) T / S), and block x of the grid (S times as wide) runs range x % S of
// query tile x / S: the same online softmax over its range only (FusedBlock::key_tiles; causal
// tiles past the block's last row skipped as before, so a range may be empty). Its rows end in
// partials -- o not divided, the row's running max m and its sum l (TensorCore: the quad's;
// Exact: each lane's, since a lane's own sum divides its columns) -- and an arrival on the query
// tile's counter (x.signal_last: a release, then an atomic add); the block that brings it to S
// (the last, whichever range it ran) sees every partial (an acquire), resets the counter for the
// next call, and merges the rows in split order: M = max_s m_s, w_s = 2^((m_s - M) c) (exp2_tc;
// Exact: exp(m_s - M), the strict exp, on its scaled scores), 0 for a range that saw nothing of
// the row (m_s = -inf: a select, whatever -inf - -inf gives), out = sum_s w_s o_s / sum_s w_s l_s and
// log-sum-exp M scale + log(sum_s w_s l_s), zeros and -inf where that sum is 0. Nothing waits,
// so no deadlock whatever order the blocks run in. The cuts do not depend on the rows per block,
// so the 64- and 128-row kernels and the wgmma kernel give the same bytes, and Exact's row-major
// CPU path writes the lane path's partials (tested on the CPU device). Against the unsplit
// schedule the bytes differ (the per-range maxima and the merge's roundings), within the bound;
// Exact stays byte-identical across backends. Measured on an H100: Exact at whisper-tiny 0.17 ms
// against 0.24 (causal 0.11 against 0.20, six ranges); TensorCore with one-warpgroup blocks and
// no split 3-6% faster than with two ranges; which shapes split: attention/src/fused.cpp.

}  // namespace lockstep::kernels
