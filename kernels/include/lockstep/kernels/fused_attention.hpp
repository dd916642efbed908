#pragma once
// Fused attention for prefill in strict fp32 (SIMT): the FlashAttention-2 schedule. A block owns
// 64 query rows of one (batch, head) and streams K/V tiles of 64 tokens (32 at head_dim 256)
// through shared memory (Note [exact register tiles]),
// keeping a running max and sum per row (online softmax) and rescaling its output accumulator.
// Every sum has a fixed order (tiles in order, tokens in order within a tile), so the CPU and
// CUDA backends return the same bits.
//
// Layouts are given by strides (elements) for batch, sequence and head; head_dim is contiguous.
// GQA: query head h reads kv head h / (H / Hkv). Causal masking is bottom-right aligned: query i
// sees keys j <= i + (Skv - Sq). A fully masked row gives zeros and log-sum-exp -inf.

#include <type_traits>

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
// 1.305-1.311 instead of 1.353 ms, run 62); TensorCore does not (at head_dim 128 its kernels
// were 1.3-1.7% slower with it, causal or not, run 62: a change of register allocation; the
// wgmma kernel 1-1.3%, run 87).
struct FusedBlock {
  int b, h, hk, s0, rows;
  int shift;  // causal: row i sees keys j <= i + shift (bottom-right alignment)
  const float* qb;
  const float* kb;
  const float* vb;
  float* ob;
  int q_ss, k_ss, v_ss, o_ss;
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
// depends on the grid's size; TensorCore only when a knob forces S, since run 137 found it slower
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
// Exact stays byte-identical across backends. Measured (run 131, an H100): Exact at whisper-tiny
// 0.17 ms against 0.24 (causal 0.11 against 0.20, six ranges), TensorCore 5% faster with two
// ranges and slower with more; run 137: TensorCore with one-warpgroup blocks and no split 3-6%
// faster than two ranges; which shapes split: attention/src/fused.cpp.

// Note [exact register tiles]
// Grid: x = ceil(Sq / kRows) query tiles, y = H, z = B; 16 * KG threads. Thread t owns the 4
// query rows 4 rg .. 4 rg + 3 of the block (rg = t / KG, a row group; the KG threads of a row
// group are consecutive lanes of one warp) and, per K/V tile, the keys kg * 4 + e + 4 KG u of
// the tile (kg = t % KG, e < 4, u < kTile / (4 KG)) and the output columns kg * 4 + e + 4 KG u
// (u < D / (4 KG)). Q is transposed into shared memory; K, V and P keep one row per key. Four
// d steps of the scores read four 16-byte quads of Q (4 rows at each d) and one quad of K per
// key (4 d), and one key of P x V reads one quad of P (4 rows) and D / (4 KG) quads of V: 5 to
// 21 fmas per shared load where the 32-row kernel before it (up to 27fdb0a) did one (run 29: it
// was bound by issue and shared-memory wavefronts together).
// The order of every sum (the bits, the same on both backends; KG is part of it):
//   score  = fma chain over d = 0 .. D-1, then times scale (masked keys: -inf);
//   per tile and row: the tile max (exact), w_j = exp(score_j - m_new) (0 when m_new = -inf),
//   alpha = exp(m_old - m_new) (1 when m_new = -inf); the thread's kTile / KG weights summed in
//   the order (u, e), then a butterfly over the KG threads of the row group;
//   l = l * alpha + that sum; acc = acc * alpha, then fma over the tile's keys in order;
//   out = acc / l (0 when l = 0), log-sum-exp m + log(l) (-inf when l = 0).
// Tiles of kTile keys in order (64 at head_dim <= 128, 32 at 256, which keeps the accumulators
// at 128 registers); tiles past a causal block's last row are skipped.
//
// Note [exact shared layout]
// K and P rows are stored with their 16-byte quads permuted: quad c of row r sits at quad
// c ^ ((r / 4) & 7) (swizzle). The KG threads of a row group read the same quad of their own keys
// (rows 4 apart), and write P as one quad (4 rows) per key: without the permutation those
// accesses fall on the same banks (rows of 64 or D floats: a multiple of 32 banks), with it on
// eight different bank groups, so every such access takes the fewest wavefronts its bytes need.
// (Before, K was stored transposed, 4-way conflicted, and P as single floats, 8-way.) The
// permutation moves data, never arithmetic: the bits are the same.
//
// Note [exact tile pipeline]
// K and V tiles arrive by 16-byte asynchronous copies (plain loads when an operand is not
// 16-byte aligned: a wrapped buffer, or a row stride not a multiple of 4). Per tile j:
//   wait for K_j; barrier; copy V_j (tile 0: in the prologue, with K_0);
//   scores from K_j; barrier;
//   with a P buffer of its own: copy K_{j+1}, which then lands during the softmax and P x V;
//   softmax (P into shared memory); wait for V_j; barrier; P x V;
//   with P in K's memory instead: barrier; copy K_{j+1}.
// P gets its own buffer where that costs no block per SM (kSeparateP: head_dim 32, 128 and 256;
// at 64 and 96 it would cost one of four or three blocks), and at head_dim 64 also when the grid
// fits in three blocks per SM (the host chooses: whisper-tiny's 144 blocks took 0.241 instead of
// 0.255 ms, while 16x16x1024 causal, 4096 blocks, took 1.34-1.36 instead of 1.31-1.34: run 60).
// Only when loads happen changes: not the bits.

// Note [row-major exact]
// The CPU device runs FusedAttentionExact's blocks statement by statement over their lanes,
// each lane value an array in memory: 22 GFLOP/s at 1 x 4 x 256 x 64 on the 2-core machine,
// 10% of its fma rate (perf-targets.md asks 50% for prefill). With an execution context that
// offers it (X::kRowMajorExact: the CPU's avx2 and avx3 variants, unless
// LOCKSTEP_CPU_EXACT_LANES=1), the block is computed row by row instead (x.exact_rows in
// backends/cpu/lanes.hpp): K and V read where they are, every score, weight, sum and
// accumulator computed by the operations, in the order, of the lane that stores it here (the
// comment there lists them), so the bits are the lane path's (tested against it on the CPU, by
// Attention.FusedExactRowMajorGivesTheLaneBytes and by every fused property, which also runs
// the generic variant's lane path; CUDA against it on the GPU: run 119's fused properties at 1000 cases). Like Note
// [row-major decode], a kernel's arithmetic written a second time, in a backend: the price of
// 5-7x (51-69% of the fma rate at the CPU's prefill shapes on an AVX-512 machine; 53-61%,
// 38-58% and 47-70% on the AVX2 machine with six-row register blocks, docs/performance.md).
LOCKSTEP_FLAG_TRAIT(has_row_major_exact, kRowMajorExact)  // hd.hpp
template <class X>
inline constexpr bool row_major_exact_v = has_row_major_exact<X>::value;

// KG = 16 threads per row group at head_dim 128 (42.7 vs 47.6 ms at B4 H32 L4096, run 54), 8
// elsewhere (head_dim 64: 1.68 vs 1.89 ms at 16x16x1024 causal); part of the bits.
// SP: P in its own buffer (1), in K's memory (0), or where that costs no block per SM (-1;
// Note [exact tile pipeline]); a schedule choice, the same bits.
template <int D, int KG = (D == 128 ? 16 : 8), int SP = -1>
struct FusedAttentionExact {
  static_assert(D % 32 == 0 && D <= 256, "head_dim: a multiple of 32, at most 256");
  static_assert((KG == 8 || KG == 16) && D % (4 * KG) == 0, "threads per row group: 8, or 16 at D % 64 == 0");
  static_assert((D <= 128 ? 64 : 32) % (4 * KG) == 0, "whole key quads per thread in a tile");
  static constexpr const char* kName = "fused_attention_exact";
  static constexpr int kThreads = 16 * KG;
  static constexpr int kRows = 64;                  // query rows per block: 16 groups of 4
  static constexpr int kTile = D <= 128 ? 64 : 32;  // keys per tile
  static constexpr int kKeyQuads = kTile / (4 * KG);  // key quads per thread
  static constexpr int kKeys = 4 * kKeyQuads;         // keys per thread
  static constexpr int kColQuads = D / (4 * KG);      // output column quads per thread
  static constexpr int kQPitch = kRows;       // Qt[d][row] (written once: conflicts are cheap)
  static constexpr int kKFloats = kTile * D;      // K[key][d], swizzled (Note [exact shared layout])
  static constexpr int kPFloats = kTile * kRows;  // P[key][row], swizzled
  static constexpr int kVFloats = kTile * D;      // V[key][d]
  // K's buffer: also P's when P has no buffer of its own.
  static constexpr int k_buffer_floats(bool separate_p) {
    return separate_p || kKFloats >= kPFloats ? kKFloats : kPFloats;
  }
  static constexpr std::size_t shared_bytes(bool separate_p) {
    const int kp = k_buffer_floats(separate_p) + (separate_p ? kPFloats : 0);
    return (std::size_t{D} * kQPitch + kp + kVFloats) * sizeof(float) + 128;
  }
  // Blocks per SM that shared memory allows (228 KB per SM, 1 KB reserved per block), at most 4.
  static constexpr int blocks_for(std::size_t bytes) {
    const int n = static_cast<int>(228 * 1024 / (bytes + 1024));
    return n > 4 ? 4 : n;
  }
  static constexpr bool kSeparateP =
      SP >= 0 ? SP != 0 : blocks_for(shared_bytes(true)) >= blocks_for(shared_bytes(false));
  static constexpr std::size_t kSharedBytes = shared_bytes(kSeparateP);
  // Stated to ptxas so that it keeps the registers within them (without it, head_dim 128 took 232).
  static constexpr int kMinBlocks = blocks_for(kSharedBytes);
  using Params = FusedAttentionParams;
  static constexpr int kLoads = kTile * D / kThreads;  // K or V elements per thread and tile
  static_assert(kLoads * kThreads == kTile * D && kLoads % 4 == 0, "whole quads per thread");
  static_assert(D / 4 % 8 == 0 && kRows / 4 % 8 == 0, "swizzled rows: a multiple of 8 quads");
  // d quads per unrolled step of the scores: 8 (every swizzle an immediate) where the registers
  // allow; with 8 keys per thread at head_dim 64 and 96, 4, and 2 under four blocks per SM (128
  // registers: at head_dim 64, 8 spilled 56 bytes, and 4 spilled 24 once the causal tile order was
  // reversed); head_dim 32 has 8 quads in all, one step (4 spilled 4 bytes there).
  static constexpr int kDqStep = kKeys > 4 && D > 32 ? (kMinBlocks >= 4 ? 2 : 4) : 8;

  // Offset of quad c of row r in a swizzled tile of rows of w floats (Note [exact shared layout]).
  template <class R, class C>
  LOCKSTEP_HD static auto swizzled(const R& r, const C& c, int w) {
    return r * w + ((c ^ ((r >> 2) & 7)) << 2);
  }
  // Rows of D floats from src (row stride ss; zeros for rows at or past `valid`), transposed
  // into dst[d * kQPitch + row]: the block's Q. Thread t takes elements t, t + kThreads, ...
  // (coalesced); all of its loads are in flight at once where the registers allow.
  template <class X>
  LOCKSTEP_HD static void transpose_q(X& x, float* dst, const float* src, int ss, int valid) {
    constexpr int kPer = kRows * D / kThreads;
    static_assert(kPer * kThreads == kRows * D, "whole rows per block pass");
    LOCKSTEP_UNROLL
    for (int i = 0; i < kPer; ++i) {
      const typename X::template Lanes<lane_int> row = x.idiv(x.thread() + i * kThreads, D);
      const typename X::template Lanes<lane_int> c = x.thread() + i * kThreads - row * D;
      x.store(dst, c * kQPitch + row, x.load(src, c + row * ss, row < valid, 0.0f));
    }
  }
  // Key j of the thread's kKeys in the tile (Note [exact register tiles]).
  template <class I>
  LOCKSTEP_HD static auto tile_key_of(const I& kg, int j) {
    return kg * 4 + (4 * KG * (j / 4) + j % 4);
  }
  // Offset of quad c of row `key` in a K tile (swizzled) or a V tile (not): the async copies.
  template <bool kSwizzle, class R, class C>
  LOCKSTEP_HD static auto tile_quad(const R& key, const C& c) {
    if constexpr (kSwizzle) {
      return swizzled(key, c, D);
    } else {
      return c * 4 + key * D;
    }
  }
  // A K tile (swizzled) or V tile (not) of `keys` rows from src into dst, zeros up to kTile rows:
  // 16-byte asynchronous copies, or plain loads. Commits a group (empty when keys <= 0).
  template <bool kSwizzle, class X>
  LOCKSTEP_HD static void issue_tile(X& x, float* dst, const float* src, int ss, int keys, bool async) {
    using I = typename X::template Lanes<lane_int>;
    if (keys > 0) {
      if (async) {
        LOCKSTEP_UNROLL_4
        for (int i = 0; i < kLoads / 4; ++i) {
          const I key = x.idiv(x.thread() + i * kThreads, D / 4);
          const I c = x.thread() + i * kThreads - key * (D / 4);  // quad in the row
          x.copy4_async(dst, tile_quad<kSwizzle>(key, c), src, c * 4 + key * ss, key < keys);
        }
      } else {
        LOCKSTEP_UNROLL_4
        for (int i = 0; i < kLoads; ++i) {
          const I key = x.idiv(x.thread() + i * kThreads, D);
          const I c = x.thread() + i * kThreads - key * D;
          const auto v = x.load(src, c + key * ss, key < keys, 0.0f);
          if constexpr (kSwizzle) {
            x.store(dst, swizzled(key, c >> 2, D) + (c & 3), v);
          } else {
            x.store(dst, c + key * D, v);
          }
        }
      }
    }
    x.async_commit();
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    float* Qt = x.template shared<float>(D * kQPitch);
    float* Ks = x.template shared<float>(k_buffer_floats(kSeparateP));
    float* Ps = kSeparateP ? x.template shared<float>(kPFloats) : Ks;
    float* Vs = x.template shared<float>(kVFloats);

    const FusedBlock fb(x, p, kRows, /*reverse_causal=*/true);
    // The block's keys [key_begin, key_end): all it sees, or its range of them (Note [split keys]).
    int t0 = 0, t1 = 0;
    fb.key_tiles(p, kTile, t0, t1);
    const int key_begin = t0 * kTile;
    const int key_end = static_cast<int>(imin(std::int64_t{t1} * kTile, fb.last_key(p)));
    if constexpr (row_major_exact_v<X>) {
      if (x.row_major_exact()) {  // Note [row-major exact]
        float* lse = p.lse != nullptr ? p.lse + (std::int64_t{fb.b} * p.H + fb.h) * p.Sq + fb.s0 : nullptr;
        // With splits the rows' partials (the lane path's bits) go to part_o and part_ml instead.
        float* po = fb.splits > 1 ? part_o(p, fb, fb.split) : nullptr;
        float* pml = fb.splits > 1 ? part_ml(p, fb, fb.split) : nullptr;
        x.template exact_rows<D, KG, kTile>(fb.qb, fb.q_ss, fb.kb, fb.k_ss, fb.vb, fb.v_ss, fb.ob, fb.o_ss, lse,
                                            fb.rows, fb.s0, fb.shift, key_begin, key_end, p.causal != 0, p.scale,
                                            po, pml, kMlPitch);
        if (fb.splits > 1) merge_splits(x, p, fb);
        return;
      }
    }
    const int s0 = fb.s0, rows = fb.rows, shift = fb.shift;
    const float *qb = fb.qb, *kb = fb.kb, *vb = fb.vb;
    float* ob = fb.ob;
    const int q_ss = fb.q_ss, k_ss = fb.k_ss, v_ss = fb.v_ss, o_ss = fb.o_ss;

    using Q4 = decltype(x.load4(Qt, x.thread()));
    const I t = x.thread();
    const I kg = t & (KG - 1);               // key group (scores) and column group (output)
    const I pq = t >> (KG == 8 ? 3 : 4);     // the thread's row group: its row quad in P
    const I r4 = pq * 4;                     // the thread's first row in the block
    const I ksw = kg & 7;                    // the swizzle of each of the thread's keys: (key / 4) & 7

    // Note [exact tile pipeline]: K_0 and V_0 are copied while Q is loaded.
    const bool k_async = (reinterpret_cast<std::uintptr_t>(kb) & 15) == 0 && k_ss % 4 == 0;
    const bool v_async = (reinterpret_cast<std::uintptr_t>(vb) & 15) == 0 && v_ss % 4 == 0;
    const int last_key = key_end;  // the loop's last key + 1; its first is key_begin
    if (last_key > key_begin) {
      const int keys0 = static_cast<int>(imin(last_key - key_begin, kTile));
      issue_tile<true>(x, Ks, kb + std::int64_t{key_begin} * p.k_ss, k_ss, keys0, k_async);
      issue_tile<false>(x, Vs, vb + std::int64_t{key_begin} * p.v_ss, v_ss, keys0, v_async);
    }

    // The block's query rows, transposed (rows past Sq are zeros, never stored). At head_dim 128
    // all of a thread's loads at once (2% faster than the row loop, run 57); elsewhere the row
    // loop (whisper-tiny at head_dim 64 was 7% slower with the batched loads, run 57).
    if constexpr (D == 128) {
      transpose_q(x, Qt, qb, q_ss, rows);
    } else {
      for (int r = 0; r < kRows; ++r)
        for (int c0 = 0; c0 < D; c0 += kThreads) {
          const I c = t + c0;
          x.store(Qt, c * kQPitch + r, x.load(qb, c + r * q_ss, (c < D) & (r < rows), 0.0f), c < D);
        }
    }

    F m[4], l[4], acc[4][kColQuads][4];
    LOCKSTEP_UNROLL
    for (int i = 0; i < 4; ++i) {
      m[i] = -kInf;
      l[i] = 0.0f;
      LOCKSTEP_UNROLL
      for (int u = 0; u < kColQuads; ++u)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e) acc[i][u][e] = 0.0f;
    }

    for (int j0 = key_begin; j0 < last_key; j0 += kTile) {
      const int keys = static_cast<int>(imin(last_key - j0, kTile));
      const int next_keys = static_cast<int>(imin(last_key - j0 - kTile, kTile));  // <= 0: none
      // K_j: pending after it are V_0 on the first tile and nothing later (V_{j-1} was waited for
      // before P x V).
      if (j0 == key_begin) {
        x.template async_wait<1>();
      } else {
        x.template async_wait<0>();
      }
      x.sync();  // K_j (and Q) visible; every thread is done with tile j - 1's P and V
      if (j0 > key_begin) issue_tile<false>(x, Vs, vb + std::int64_t{j0} * p.v_ss, v_ss, keys, v_async);

      // Scores: each an fma chain over d, four d at a time.
      F s[4][kKeys];
      LOCKSTEP_UNROLL
      for (int i = 0; i < 4; ++i)
        LOCKSTEP_UNROLL
        for (int j = 0; j < kKeys; ++j) s[i][j] = 0.0f;
      // d quads kDqStep a + b, b unrolled, so that each load's address is a register of the thread
      // plus an immediate (the swizzle of quad dq is (dq & ~7) + ((dq & 7) ^ ksw)).
      for (int a = 0; a < D / 4 / kDqStep; ++a) {
        LOCKSTEP_UNROLL
        for (int b = 0; b < kDqStep; ++b) {
          const int dq = kDqStep * a + b;
          Q4 q[4];
          LOCKSTEP_UNROLL
          for (int e = 0; e < 4; ++e) q[e] = x.load4(Qt, r4 + (4 * dq + e) * kQPitch);
          const I kc = ((ksw ^ (dq & 7)) << 2) + kg * (4 * D);  // quad dq of the thread's first key, less its row group of 8
          LOCKSTEP_UNROLL
          for (int j = 0; j < kKeys; ++j) {
            const auto k = x.load4(Ks, kc + (tile_key_of(0, j) * D + 4 * (dq & ~7)));
            LOCKSTEP_UNROLL
            for (int i = 0; i < 4; ++i) {
              s[i][j] = x.fma(quad_part(q[0], i), k.x, s[i][j]);
              s[i][j] = x.fma(quad_part(q[1], i), k.y, s[i][j]);
              s[i][j] = x.fma(quad_part(q[2], i), k.z, s[i][j]);
              s[i][j] = x.fma(quad_part(q[3], i), k.w, s[i][j]);
            }
          }
        }
      }
      x.sync();  // every thread is done with K_j
      if constexpr (kSeparateP) issue_tile<true>(x, Ks, kb + std::int64_t{j0 + kTile} * p.k_ss, k_ss, next_keys, k_async);

      // Online softmax per row; the weights replace the scores, then go to P one key at a time.
      // A tile whose every key is visible to every row of a full block (64 rows) skips the mask.
      const bool masked = keys < kTile || rows < kRows || (p.causal && j0 + kTile - 1 > s0 + shift);
      LOCKSTEP_UNROLL
      for (int i = 0; i < 4; ++i) {
        const I row = r4 + i;  // in the block
        const I qi = row + s0;  // in the sequence
        const B live = row < rows;
        F sc[kKeys];
        F mt = -kInf;
        LOCKSTEP_UNROLL
        for (int j = 0; j < kKeys; ++j) {
          if (masked) {  // block-uniform
            const I key = tile_key_of(kg, j);
            B visible = (key < keys) & live;
            if (p.causal) visible = visible & (key + j0 <= qi + shift);
            sc[j] = x.select(visible, s[i][j] * p.scale, -kInf);
          } else {
            sc[j] = s[i][j] * p.scale;
          }
          mt = x.max(mt, sc[j]);
        }
        const F m_new = x.max(m[i], x.template warp_max<KG>(mt));
        const B none = m_new == -kInf;  // nothing visible yet in this row
        F ps = 0.0f;
        LOCKSTEP_UNROLL
        for (int j = 0; j < kKeys; ++j) {
          s[i][j] = x.select(none, 0.0f, x.exp(sc[j] - m_new));
          ps = ps + s[i][j];
        }
        const F alpha = x.select(none, 1.0f, x.exp(m[i] - m_new));
        l[i] = l[i] * alpha + x.template warp_sum<KG>(ps);
        m[i] = m_new;
        LOCKSTEP_UNROLL
        for (int u = 0; u < kColQuads; ++u)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 4; ++e) acc[i][u][e] = acc[i][u][e] * alpha;
      }
      LOCKSTEP_UNROLL
      for (int j = 0; j < kKeys; ++j)
        x.store4(Ps, swizzled(tile_key_of(kg, j), pq, kRows),
                 Q4{s[0][j], s[1][j], s[2][j], s[3][j]});
      // V_j: pending after it is K_{j+1} where P has its own buffer.
      x.template async_wait<kSeparateP ? 1 : 0>();
      x.sync();  // P is read by the other threads of its row group; V_j has landed

      // P x V: every key of the tile in order; keys 32 a + 4 b + c, b and c unrolled (P's swizzle of
      // key 4 b + c is b).
      for (int a = 0; a < kTile / 32; ++a) {
        LOCKSTEP_UNROLL
        for (int b = 0; b < 8; ++b) {
          const I pc = (pq ^ b) << 2;
          LOCKSTEP_UNROLL
          for (int c = 0; c < 4; ++c) {
            const int j = 32 * a + 4 * b + c;
            const auto pw = x.load4(Ps, pc + j * kRows);
            LOCKSTEP_UNROLL
            for (int u = 0; u < kColQuads; ++u) {
              const auto v = x.load4(Vs, kg * 4 + (4 * KG * u + j * D));
              LOCKSTEP_UNROLL
              for (int i = 0; i < 4; ++i) {
                const auto& pi = quad_part(pw, i);
                acc[i][u][0] = x.fma(pi, v.x, acc[i][u][0]);
                acc[i][u][1] = x.fma(pi, v.y, acc[i][u][1]);
                acc[i][u][2] = x.fma(pi, v.z, acc[i][u][2]);
                acc[i][u][3] = x.fma(pi, v.w, acc[i][u][3]);
              }
            }
          }
        }
      }
      if constexpr (!kSeparateP) {
        if (next_keys > 0) {
          x.sync();  // P (in K's memory) is consumed
          issue_tile<true>(x, Ks, kb + std::int64_t{j0 + kTile} * p.k_ss, k_ss, next_keys, k_async);
        }
      }
    }

    if (fb.splits > 1) {  // Note [split keys]: the partials, then the last block merges
      LOCKSTEP_UNROLL
      for (int i = 0; i < 4; ++i) {
        const I row = r4 + i;
        const B live = row < rows;
        float* po = part_o(p, fb, fb.split);
        float* pml = part_ml(p, fb, fb.split);
        LOCKSTEP_UNROLL
        for (int u = 0; u < kColQuads; ++u)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 4; ++e) x.store(po, row * D + kg * 4 + (4 * KG * u + e), acc[i][u][e], live);
        x.store(pml, row * kMlPitch, m[i], live & (kg == 0));
        x.store(pml, row * kMlPitch + 1 + kg, l[i], live);
      }
      merge_splits(x, p, fb);
      return;
    }
    LOCKSTEP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const I row = r4 + i;
      const B live = row < rows;
      const B empty = l[i] == 0.0f;  // fully masked row
      LOCKSTEP_UNROLL
      for (int u = 0; u < kColQuads; ++u)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e)
          x.store(ob, row * o_ss + kg * 4 + (4 * KG * u + e), x.select(empty, 0.0f, acc[i][u][e] / l[i]),
                  live);
      fb.store_lse(x, p, row, live & (kg == 0), m[i], l[i]);
    }
  }

  // Note [split keys]: split s's partials of the block's rows: o (not divided) at part_o + row D,
  // and at part_ml + row kMlPitch the row's max, then each of its KG lanes' sum (a lane's sum is
  // what divides the lane's output columns, as without splits).
  static constexpr int kMlPitch = 1 + KG;
  LOCKSTEP_HD static float* part_o(const Params& p, const FusedBlock& fb, int s) {
    return p.part + ((std::int64_t{fb.b} * p.H + fb.h) * fb.splits + s) * p.Sq * D + std::int64_t{fb.s0} * D;
  }
  LOCKSTEP_HD static float* part_ml(const Params& p, const FusedBlock& fb, int s) {
    return p.part_ml + (((std::int64_t{fb.b} * p.H + fb.h) * fb.splits + s) * p.Sq + fb.s0) * kMlPitch;
  }
  // The block's arrival on its query tile's counter; the last of the S blocks merges the rows in
  // split order with the strict exp (the same bits on both backends): M = max_s m_s, w_s =
  // exp(m_s - M) (0 where m_s = -inf), out = sum_s w_s o_s / sum_s w_s l_s (each lane's own sums),
  // log-sum-exp M + log of lane 0's; zeros and -inf where the sum is 0.
  template <class X>
  LOCKSTEP_HD static void merge_splits(X& x, const Params& p, const FusedBlock& fb) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t tiles_q = (std::int64_t{p.Sq} + kRows - 1) / kRows;
    if (!x.signal_last(p.split_counters + (std::int64_t{fb.b} * p.H + fb.h) * tiles_q + fb.s0 / kRows, fb.splits))
      return;
    const I t = x.thread();
    const I kg = t & (KG - 1);
    const I r4 = (t >> (KG == 8 ? 3 : 4)) * 4;
    LOCKSTEP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const I row = r4 + i;
      const B live = row < fb.rows;
      F mx = F(-kInf);
      for (int s = 0; s < fb.splits; ++s) mx = x.max(mx, x.load(part_ml(p, fb, s), row * kMlPitch, live, -kInf));
      F lt = F(0.0f);
      F acc[kColQuads][4];
      LOCKSTEP_UNROLL
      for (int u = 0; u < kColQuads; ++u)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e) acc[u][e] = F(0.0f);
      for (int s = 0; s < fb.splits; ++s) {
        const F ms = x.load(part_ml(p, fb, s), row * kMlPitch, live, -kInf);
        const F w = x.select(ms == -kInf, 0.0f, x.exp(ms - mx));
        lt = lt + w * x.load(part_ml(p, fb, s), row * kMlPitch + 1 + kg, live, 0.0f);
        const float* po = part_o(p, fb, s);
        LOCKSTEP_UNROLL
        for (int u = 0; u < kColQuads; ++u)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 4; ++e)
            acc[u][e] = acc[u][e] + w * x.load(po, row * D + kg * 4 + (4 * KG * u + e), live, 0.0f);
      }
      const B empty = lt == 0.0f;
      LOCKSTEP_UNROLL
      for (int u = 0; u < kColQuads; ++u)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e)
          x.store(fb.ob, row * fb.o_ss + kg * 4 + (4 * KG * u + e), x.select(empty, 0.0f, acc[u][e] / lt), live);
      fb.store_lse(x, p, row, live & (kg == 0), mx, lt);
    }
  }
};


// Fused attention on the tensor cores: the FlashAttention-2 schedule with S, P and O in registers.
//
// Note [register fragments]
// The products are PTX mma.sync.m16n8k16 (fp16 inputs, fp32 accumulation) on fragments whose
// lane layout PTX specifies (backends/cuda/cuda_exec.cuh: lane 4g + t holds rows g and g + 8,
// columns 2t and 2t + 1 of each 16x8 accumulator), so the kernel does the softmax on the
// accumulators where they are: a row's max and sum are reductions over the 4 lanes of a quad,
// the rescale of O is a multiply per register, and the S accumulator becomes the A fragment of
// P.V by packing pairs to fp16, without shared memory. Operands come from shared memory with
// ldmatrix (K as is for Q.K^T, V transposed for P.V); the CPU emulates the same layout exactly
// (backends/cpu/lanes.hpp), and each mma as in Note [tensor-core emulation].
//
// Note [fused tensor-core rounding points]
// K and V are rounded to fp16 (nearest even) by FusedHalfPack, Q as it enters shared memory;
// s = Q.K^T is accumulated in fp32 over head_dim in steps of 16 (one mma each). The softmax is in
// base 2 on the raw scores, FlashAttention-2's formulation: with m the row's reference max of s
// (Note [lazy rescale]) and c = scale * log2(e) rounded to fp32, mc = m * c (fp32) and the weight
// p = exp2_tc(fma(s, c, -mc)) (Note [hardware exp2 on the tensor-core path]); alpha = exp2_tc((m_old
// - m) * c) where m moved, else 1. The row sum l accumulates the fp32 p, per lane in key order and
// over the 4 lanes of a quad at the end; the output accumulator is first rescaled, o = o * alpha
// (fp32), then P.V adds into it in steps of 16 keys with p rounded to fp16. out = o / l;
// log-sum-exp = m * scale + log(l).
//
// Note [hardware exp2 on the tensor-core path]
// The weights' 2^y is x.exp2_tc: on CUDA one MUFU.EX2 (ex2.approx.ftz.f32: results below 2^-126
// flush to 0), on the CPU device the strict exp2_weight (math.hpp: 2.04 ulp, 0 below 2^-126.5).
// This is the one place where the two backends run different arithmetic on purpose: the
// tensor-core paths are not bitwise across backends anyway (Note [tensor-core emulation]; they are
// held to the tensor-core bound of the float64 oracle and to each other within it), and each weight
// is rounded to fp16 (2^-11) before P.V, so a weight error of a few 2^-24 moves P's bits for about
// one weight in a thousand. The strict polynomial cost 11 instructions per score on the issue-bound
// softmax (the hardware one 1, on the otherwise idle SFU pipe): 12-20% of the kernel (runs 43-45).
// Exact and the decode kernels keep the strict exp (bitwise across backends). Bound: 3 ulp on the
// weights' domain [-126, 8] (harness math_ulp_bound, DeviceMath.Exp2TcIsWithinItsBoundOnTheWeightsDomain;
// docs/numerics.md has the measured figure); 2^0 = 1 and 2^-inf = 0 exactly, NaN stays NaN.
//
// Note [softmax max tree]
// A row's max over the tile (16 scores per lane at 64-key tiles) is on the path to every weight
// of the tile, and with three blocks of four warps per SM the kernel is latency-bound (run 98:
// 36% of issue slots busy, the most frequent stall a fixed-latency dependency). So the lane's
// max is a tree of max_num (depth 5, where the running max was a chain of 16), and the quad's
// a butterfly of max_num (one instruction per step, where math::max took six). Both give the
// same value as before in any order: max_num is exact and skips NaN (the tree has -inf at one
// leaf, so it is never NaN); only the sign of a zero maximum may differ between lanes or orders,
// and m enters the results only through fma(tmax, c, -m_old c), m c, fma(s, c, -m c),
// (m_old - m) c and m scale + log(l), where +0 and -0 give the same bits. So the outputs' bits
// are unchanged.
//
// Note [softmax output]
// ptxas serializes every product when ordinary instructions write a product's accumulator
// registers while another product is in flight (its C7515 advisory; run 81), so the wgmma
// kernel's softmax never writes S: its softmax_tile reads the scores from one array and writes
// the weights to another (the masked-tile path first writes the masked scores there). Until run
// 101 the wgmma kernel copied S first (32 moves per tile at head_dim 64 and 128) and worked in
// place on the copy: 4-5% slower (run 101). The mma.sync kernel keeps the in-place form, whose
// accumulators are complete when it runs (the two-array form gave it two copies of the weights'
// code and a spill at head_dim 128, run 101's SASS). The same operations in the same order
// either way, so the same bits.
//
// Note [lazy rescale]
// FlashAttention-4's conditional rescaling: a row's reference max m moves to the tile's max only
// when the tile's largest weight against m would exceed 2^kLazyLog2 = 2^8 (fma(tmax, c, -m c) > 8,
// the weights' own argument, so the bound is exact; always from -inf, since c > 0: scale is 1 /
// sqrt(head_dim)). Otherwise the tile's weights are taken against the old m and reach up to 2^8
// (fp16 holds them; m never falls, so l stays below 2^8 times the keys seen), and alpha is exactly
// 1, so o and l keep every bit: on the GPU a warp none of whose rows moved skips the rescale (the
// 128 multiplies of o per thread and the weights of alpha) -- the same bits as multiplying by 1,
// which the CPU device does. Rows stay independent of each other (the decision is per row), so 64
// and 128 rows per block still give the same bytes. After the first tiles of a row, whose scores
// are spread by less than 2^8 in weight, the max rarely moves by that much.
//
// Schedule: a block of 4 warps owns 64 query rows of one (batch, head), warp w rows 16w .. 16w +
// 15; tiles of kTile keys (64; 32 at head_dim 256) of fp16 K and V in double buffers: tile j + 1
// arrives by cp.async while tile j is computed, one barrier per tile. M = 2: each warp owns two
// 16-row m-tiles (128 rows per block), which share every K and V fragment it loads. The rows'
// arithmetic is the same for either M (same bits). Grid: x = ceil(Sq / kRows), y = H, z = B.
// (Two groups of 4 warps per block taking turns on the tensor cores, FlashAttention-3's
// ping-pong on mma.sync, gave the same bytes and was slower: run 71, docs/gpu-results.md.)
template <int D, int M = 1>
struct FusedAttentionTensorCore {
  static_assert(D % 16 == 0 && D <= 256, "head_dim: a multiple of 16, at most 256");
  static_assert(M == 1 || (M == 2 && D <= 128), "two m-tiles per warp up to head_dim 128");
  static constexpr const char* kName = "fused_attention_tensor_core";
  static constexpr int kWarps = 4;
  static constexpr int kM = M;  // 16-row m-tiles per warp (they share each K and V fragment)
  static constexpr int kRows = 16 * kM * kWarps;  // query rows per block
  static constexpr int kThreads = kWarps * kWarpSize;
  // Blocks per SM that the register allocation must allow (CUDA launch bounds): as many as the
  // shared memory takes (ptxas's own choice at head_dim 128 is 229 registers: two blocks).
  static constexpr int kMinBlocks = M == 2 ? 2 : D <= 64 ? 4 : D <= 128 ? 3 : 1;
  static constexpr int kTile = D <= 128 ? 64 : 32;  // keys per tile
  static constexpr float kLazyLog2 = 8.0f;  // Note [lazy rescale]: weights up to 2^8 (fp16: 65504)
  static constexpr int kLd = D + 8;  // fp16 row pitch: rows 16 bytes apart mod 128, so ldmatrix
                                     // phases hit eight different bank groups
  static constexpr bool kQInRegs = D <= 128 && kM == 1;  // Q's fragments stay in registers
  // ... and then Q's shared tile is K's second buffer, free until tile 1 is issued (a smaller
  // block footprint: three blocks per SM at head_dim 128).
  static constexpr bool kQInKBuffer = kQInRegs && kRows <= kTile;
  static constexpr int kChunks = kTile * D / 8 / kThreads;  // 16-byte copies per thread per tile
  static_assert(kChunks * kThreads * 8 == kTile * D, "tile copies: whole chunks per thread");
  static constexpr std::size_t kSharedBytes =
      ((kQInKBuffer ? 0 : std::size_t(kRows) * kLd) + 4 * std::size_t(kTile) * kLd) * 2 + 3 * 32;
  static_assert(!kQInKBuffer || kRows <= kTile, "Q's tile fits in a K buffer");
  using Params = FusedAttentionParams;

  // Rows [0, keys) of a K or V tile from the packed fp16 operand (row pitch D) into shared memory
  // (pitch kLd); rows past `keys` are zeros (a zero row times p = 0 is 0, garbage could be NaN).
  template <class X, class T>
  LOCKSTEP_HD static void issue_tile(X& x, typename X::half_t* dst, const typename X::half_t* src,
                                     int keys, const T& t) {
    LOCKSTEP_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const auto q = t + i * kThreads;
      const auto row = x.idiv(q, D / 8);
      const auto c = q - row * (D / 8);
      x.copy8h_async(dst, row * kLd + c * 8, src, row * D + c * 8, row < keys);
    }
  }

  // S = Q.K^T of one tile: 16 kM rows x kTile keys per warp.
  template <class X, class F, class I>
  LOCKSTEP_HD static void qk_tile(X& x, F (&s)[kM][kTile / 8][4], const I (&qf)[kQInRegs ? D / 16 : 1][4],
                                  const typename X::half_t* Qs, const I (&q_off)[kM],
                                  const typename X::half_t* Kt, const I& k_off) {
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int n = 0; n < kTile / 8; ++n)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
      I qa[kM][4];
      LOCKSTEP_UNROLL
      for (int mt = 0; mt < kM; ++mt) {
        if constexpr (kQInRegs) {
          LOCKSTEP_UNROLL
          for (int e = 0; e < 4; ++e) qa[mt][e] = qf[kk][e];
        } else {
          x.ldmatrix_x4(qa[mt], Qs, q_off[mt] + kk * 16);
        }
      }
      LOCKSTEP_UNROLL
      for (int np = 0; np < kTile / 16; ++np) {
        I kb[4];
        x.ldmatrix_x4(kb, Kt, k_off + np * 16 * kLd + kk * 16);
        LOCKSTEP_UNROLL
        for (int mt = 0; mt < kM; ++mt) {
          x.mma_16816(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          x.mma_16816(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }
  }

  // Online softmax of tile j (keys j0 .. j0 + keys - 1) on the accumulators (Note [register
  // fragments]), in base 2: a weight is 2^(s c - m c) with c = scale log2(e) (Note [fused
  // tensor-core rounding points]). S becomes the tile's weights (the second form reads the scores
  // from sc and writes the weights to s: Note [softmax output]); m, l and o are updated.
  template <class X, class F, class I>
  LOCKSTEP_HD static void softmax_tile(X& x, const Params& p, F (&s)[kM][kTile / 8][4], F (&m)[kM][2],
                                       F (&l)[kM][2], F (&o)[kM][D / 8][4], const I (&row0)[kM],
                                       const I& tq, int j0, int keys, int s0, int shift, float c2) {
    const bool masked = keys < kTile || (p.causal && j0 + kTile - 1 > s0 + shift);
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt) {
      if (masked) mask_tile(x, p, s[mt], s[mt], row0[mt], tq, j0, keys, s0, shift);
      weights(x, s[mt], s[mt], m[mt], l[mt], o[mt], c2);
    }
  }
  template <class X, class F, class I>
  LOCKSTEP_HD static void softmax_tile(X& x, const Params& p, const F (&sc)[kM][kTile / 8][4],
                                       F (&s)[kM][kTile / 8][4], F (&m)[kM][2], F (&l)[kM][2],
                                       F (&o)[kM][D / 8][4], const I (&row0)[kM], const I& tq, int j0,
                                       int keys, int s0, int shift, float c2) {
    const bool masked = keys < kTile || (p.causal && j0 + kTile - 1 > s0 + shift);
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt) {
      if (masked) {  // one block-uniform branch for the tile, not one per score
        mask_tile(x, p, sc[mt], s[mt], row0[mt], tq, j0, keys, s0, shift);
        weights(x, s[mt], s[mt], m[mt], l[mt], o[mt], c2);
      } else {
        weights(x, s[mt], sc[mt], m[mt], l[mt], o[mt], c2);
      }
    }
  }

  // softmax_tile's two-array form without o (one m-tile): true when o must be rescaled by alpha
  // before the tile's P.V (Note [deferred P.V wait]).
  template <class X, class F, class I>
  LOCKSTEP_HD static bool softmax_tile_alpha(X& x, const Params& p, const F (&sc)[1][kTile / 8][4],
                                             F (&s)[1][kTile / 8][4], F (&m)[1][2], F (&l)[1][2], F (&alpha)[2],
                                             const I (&row0)[1], const I& tq, int j0, int keys, int s0, int shift,
                                             float c2) {
    static_assert(kM == 1, "one m-tile");
    const bool masked = keys < kTile || (p.causal && j0 + kTile - 1 > s0 + shift);
    if (masked) {
      mask_tile(x, p, sc[0], s[0], row0[0], tq, j0, keys, s0, shift);
      return weights_alpha(x, s[0], s[0], m[0], l[0], alpha, c2);
    }
    return weights_alpha(x, s[0], sc[0], m[0], l[0], alpha, c2);
  }

  // A partial or causal tile's scores sc with the keys a row does not see set to -inf, into s.
  template <class X, class F, class I>
  LOCKSTEP_HD static void mask_tile(X& x, const Params& p, const F (&sc)[kTile / 8][4], F (&s)[kTile / 8][4],
                                    const I& row0, const I& tq, int j0, int keys, int s0, int shift) {
    // Key 2 tq + c of the tile is visible to row r when 2 tq + c < keys and (causal)
    // 2 tq + c + j0 <= r + s0 + shift: c < lim, one bound per row and thread.
    I lim[2];
    LOCKSTEP_UNROLL
    for (int h = 0; h < 2; ++h) {
      lim[h] = tq * -2 + keys;
      if (p.causal) {
        const I diag = row0 + (h * 8 + s0 + shift - j0 + 1) - tq * 2;
        lim[h] = x.select(diag < lim[h], diag, lim[h]);
      }
    }
    LOCKSTEP_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) s[n][e] = x.select(lim[e >> 1] > 8 * n + (e & 1), sc[n][e], -kInf);
  }

  // The softmax of one m-tile (softmax_tile): scores sc (masked), weights into w; o rescaled.
  template <class X, class F>
  LOCKSTEP_HD static void weights(X& x, F (&w)[kTile / 8][4], const F (&sc)[kTile / 8][4], F (&m)[2],
                                  F (&l)[2], F (&o)[D / 8][4], float c2) {
    weights_then(x, w, sc, m, l, c2, [&](const F (&alpha)[2]) { rescale_o(o, alpha); });
  }
  // o = o * alpha, the rescale that the softmax asked for.
  template <class F>
  LOCKSTEP_HD static void rescale_o(F (&o)[D / 8][4], const F (&alpha)[2]) {
    LOCKSTEP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) o[n][e] = o[n][e] * alpha[e >> 1];
  }
  // weights without o: true when o must be rescaled by alpha (then set) before the tile's P.V
  // adds to it (Note [deferred P.V wait]); false: alpha is 1 for every row of the warp (GPU only).
  template <class X, class F>
  LOCKSTEP_HD static bool weights_alpha(X& x, F (&w)[kTile / 8][4], const F (&sc)[kTile / 8][4], F (&m)[2],
                                        F (&l)[2], F (&alpha)[2], float c2) {
    return weights_then(x, w, sc, m, l, c2, [&](const F (&a)[2]) {
      alpha[0] = a[0];
      alpha[1] = a[1];
    });
  }
  // The softmax of one m-tile: weights into w, m and l updated; rescaled(alpha) where a row of
  // the warp moved its max (every time on the CPU device); returns whether it was called.
  template <class X, class F, class Rescaled>
  LOCKSTEP_HD static bool weights_then(X& x, F (&w)[kTile / 8][4], const F (&sc)[kTile / 8][4], F (&m)[2],
                                       F (&l)[2], float c2, Rescaled&& rescaled) {
    using B = typename X::template Lanes<bool>;
    // A lane's max of the tile by max_num (one instruction; a NaN score is skipped here and
    // reaches the row through its weight, exp2_tc(NaN) = NaN, so the row's output and
    // log-sum-exp are NaN all the same: FusedNanQueryRowGivesNanOutput), as a tree (Note
    // [softmax max tree]): -inf joins one leaf, so the max is never NaN.
    F mx[2];
    LOCKSTEP_UNROLL
    for (int h = 0; h < 2; ++h) {
      constexpr int kN = kTile / 8;  // the row's values in this lane: sc[n][2h], sc[n][2h + 1]
      F t[kN];
      LOCKSTEP_UNROLL
      for (int n = 0; n < kN; ++n) t[n] = x.max_num(sc[n][2 * h], sc[n][2 * h + 1]);
      t[kN - 1] = x.max_num(t[kN - 1], F(-kInf));
      LOCKSTEP_UNROLL
      for (int v = 1; v < kN; v *= 2)
        LOCKSTEP_UNROLL
        for (int n = 0; n + v < kN; n += 2 * v) t[n] = x.max_num(t[n], t[n + v]);
      mx[h] = t[0];
    }
    // Note [lazy rescale]: m moves only when the tile's max exceeds it by more than kLazyLog2.
    F m_old[2], mc[2];
    B moved[2];
    LOCKSTEP_UNROLL
    for (int h = 0; h < 2; ++h) {
      // Over the quad, by max_num too (never NaN: the lanes' maxima are not).
      F tmax = x.max_num(mx[h], x.shfl_xor(mx[h], 2));
      tmax = x.max_num(tmax, x.shfl_xor(tmax, 1));
      m_old[h] = m[h];
      // From m_old = -inf: +inf > 8, moved; a tile this row sees nothing of (tmax = -inf):
      // NaN or -inf, not moved, so a row that has seen nothing keeps m = -inf.
      moved[h] = x.fma(tmax, c2, -(m_old[h] * c2)) > kLazyLog2;
      m[h] = x.select(moved[h], tmax, m_old[h]);
      const B none = m[h] == -kInf;  // nothing visible yet in this row: every weight 0
      mc[h] = x.select(none, 0.0f, m[h] * c2);
    }
    F ls[2] = {F(0.0f), F(0.0f)};
    LOCKSTEP_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) {
        w[n][e] = x.exp2_tc(x.fma(sc[n][e], c2, -mc[e >> 1]));
        ls[e >> 1] = ls[e >> 1] + w[n][e];
      }
    // alpha = 2^((m_old - m) c) where m moved (0 from -inf), else exactly 1, and l * 1 = l,
    // o * 1 = o: a warp none of whose rows moved skips the rescale on the GPU, the same bits.
    bool rescale = true;
    if constexpr (!X::kIsCpu) rescale = x.warp_any(moved[0] | moved[1]);
    if (rescale) {
      F alpha[2];
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        // (m_old - m) c, not fma(m_old, c, -mc): -inf when m_old is, so alpha = 0 then.
        alpha[h] = x.select(moved[h], x.exp2_tc((m_old[h] - m[h]) * c2), 1.0f);
        l[h] = l[h] * alpha[h] + ls[h];
      }
      rescaled(alpha);
    } else {
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) l[h] = l[h] + ls[h];
    }
    return rescale;
  }

  // O += P.V of one tile: P's A fragments are the S accumulators of two n-tiles, packed to fp16.
  template <class X, class F, class I>
  LOCKSTEP_HD static void pv_tile(X& x, const F (&s)[kM][kTile / 8][4], F (&o)[kM][D / 8][4],
                                  const typename X::half_t* Vt, const I& v_off) {
    LOCKSTEP_UNROLL
    for (int kc = 0; kc < kTile / 16; ++kc) {
      I pa[kM][4];
      LOCKSTEP_UNROLL
      for (int mt = 0; mt < kM; ++mt) {
        pa[mt][0] = x.pack_half2(s[mt][2 * kc][0], s[mt][2 * kc][1]);
        pa[mt][1] = x.pack_half2(s[mt][2 * kc][2], s[mt][2 * kc][3]);
        pa[mt][2] = x.pack_half2(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
        pa[mt][3] = x.pack_half2(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
      }
      LOCKSTEP_UNROLL
      for (int dp = 0; dp < D / 16; ++dp) {
        I vb[4];
        x.ldmatrix_x4_trans(vb, Vt, v_off + kc * 16 * kLd + dp * 16);
        LOCKSTEP_UNROLL
        for (int mt = 0; mt < kM; ++mt) {
          x.mma_16816(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          x.mma_16816(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  // out = o / l; a fully masked row (l == 0) gives zeros and log-sum-exp -inf.
  template <class X, class F, class I>
  LOCKSTEP_HD static void store_rows(X& x, const Params& p, const FusedBlock& fb, const F (&o)[kM][D / 8][4],
                                     const F (&m)[kM][2], const F (&l)[kM][2], const I (&row0)[kM],
                                     const I& tq) {
    using B = typename X::template Lanes<bool>;
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        const F lt = x.template warp_sum<4>(l[mt][h]);
        const I row = row0[mt] + h * 8;
        const B live = row < fb.rows;
        const B empty = lt == 0.0f;
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 2; ++e)
            x.store(fb.ob, row * fb.o_ss + (tq * 2 + (8 * n + e)),
                    x.select(empty, 0.0f, o[mt][n][h * 2 + e] / lt), live);
        if (p.lse != nullptr) {
          float* lrow = p.lse + (std::int64_t{fb.b} * p.H + fb.h) * p.Sq + fb.s0;
          x.store(lrow, row, x.select(empty, -kInf, m[mt][h] * p.scale + x.log(lt)), live & (tq == 0));
        }
      }
  }

  // The block's rows finished: store_rows, or with split keys (Note [split keys]) the block's
  // partial rows (o not divided, m, and the quad's l), then, in the last of the tile's S blocks
  // to arrive, the merge of the S partials in split order into out and lse.
  template <class X, class F, class I>
  LOCKSTEP_HD static void finish(X& x, const Params& p, const FusedBlock& fb, const F (&o)[kM][D / 8][4],
                                 const F (&m)[kM][2], const F (&l)[kM][2], const I (&row0)[kM], const I& tq) {
    if (fb.splits <= 1) return store_rows(x, p, fb, o, m, l, row0, tq);
    using B = typename X::template Lanes<bool>;
    const int S = fb.splits;
    const std::int64_t bh = std::int64_t{fb.b} * p.H + fb.h;
    // Split s's rows of this block: o at part_o(s) + row D, (m, l) at part_ml(s) + row 2.
    auto part_o = [&](int s) { return p.part + ((bh * S + s) * p.Sq + fb.s0) * D; };
    auto part_ml = [&](int s) { return p.part_ml + ((bh * S + s) * p.Sq + fb.s0) * 2; };
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        const F lt = x.template warp_sum<4>(l[mt][h]);
        const I row = row0[mt] + h * 8;
        const B live = row < fb.rows;
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 2; ++e) x.store(part_o(fb.split), row * D + (tq * 2 + (8 * n + e)), o[mt][n][h * 2 + e], live);
        x.store(part_ml(fb.split), row * 2, m[mt][h], live & (tq == 0));
        x.store(part_ml(fb.split), row * 2 + 1, lt, live & (tq == 0));
      }
    // A counter per 64 query rows, whatever the kernel's rows per block (s0 is a multiple of 64).
    const std::int64_t tiles_q = (std::int64_t{p.Sq} + 63) / 64;
    if (!x.signal_last(p.split_counters + bh * tiles_q + fb.s0 / 64, S)) return;
    // The last block: every split's partials are visible. Per row, M = the splits' largest max;
    // split s weighs 2^((m_s - M) c) (0 where it saw nothing: m_s = -inf); out = sum_s w_s o_s /
    // sum_s w_s l_s, summed in split order; a row no split saw anything of gives zeros, -inf.
    const float c2 = p.scale_log2;
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        const I row = row0[mt] + h * 8;
        const B live = row < fb.rows;
        F mx = F(-kInf);
        for (int s = 0; s < S; ++s) mx = x.max_num(mx, x.load(part_ml(s), row * 2, live, -kInf));
        F lt = F(0.0f);
        F acc[D / 8][2];
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n) {
          acc[n][0] = F(0.0f);
          acc[n][1] = F(0.0f);
        }
        for (int s = 0; s < S; ++s) {
          const F ms = x.load(part_ml(s), row * 2, live, -kInf);
          const F w = x.select(ms == -kInf, 0.0f, x.exp2_tc((ms - mx) * c2));
          lt = lt + w * x.load(part_ml(s), row * 2 + 1, live, 0.0f);
          LOCKSTEP_UNROLL
          for (int n = 0; n < D / 8; ++n)
            LOCKSTEP_UNROLL
            for (int e = 0; e < 2; ++e)
              acc[n][e] = acc[n][e] + w * x.load(part_o(s), row * D + (tq * 2 + (8 * n + e)), live, 0.0f);
        }
        const B empty = lt == 0.0f;
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 2; ++e)
            x.store(fb.ob, row * fb.o_ss + (tq * 2 + (8 * n + e)), x.select(empty, 0.0f, acc[n][e] / lt), live);
        if (p.lse != nullptr) {
          float* lrow = p.lse + bh * p.Sq + fb.s0;
          x.store(lrow, row, x.select(empty, -kInf, mx * p.scale + x.log(lt)), live & (tq == 0));
        }
      }
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    using H = typename X::half_t;
    H* Ks = x.template shared<H>(2 * kTile * kLd);
    H* Vs = x.template shared<H>(2 * kTile * kLd);
    H* Qs = kQInKBuffer ? Ks + kTile * kLd : x.template shared<H>(kRows * kLd);

    const FusedBlock fb(x, p, kRows);
    const int s0 = fb.s0, rows = fb.rows, shift = fb.shift;
    const std::int64_t kv_base = (std::int64_t{fb.b} * p.Hkv + fb.hk) * p.Skv * D;
    const H* kh = static_cast<const H*>(p.k_half) + kv_base;
    const H* vh = static_cast<const H*>(p.v_half) + kv_base;

    const I t = x.thread();
    const I lane = x.lane();
    const I w = x.warp();
    const I g = lane >> 2, tq = lane & 3;
    // Warp w owns rows w * 16 kM + 16 mt .. + 15 (m-tile mt); lane 4g + t holds row0[mt] + 8h.
    I row0[kM], q_off[kM];
    // ldmatrix row offsets: lane 8i + r addresses row r of matrix i.
    const I lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt) {
      row0[mt] = w * (16 * kM) + (mt * 16 + g);
      q_off[mt] = (w * (16 * kM) + (mt * 16 + lr)) * kLd + lc;         // Q: A fragments
    }
    const I k_off = ((lane & 7) + (lane >> 4) * 8) * kLd + ((lane >> 3) & 1) * 8;  // K: B, two n-tiles
    const I v_off = lr * kLd + lc;                                      // V: B (transposed), two n-tiles

    const int last_key = fb.last_key(p);
    int t0 = 0, t1 = 0;  // the block's key tiles (Note [split keys]); j below counts from t0
    fb.key_tiles(p, kTile, t0, t1);
    const int tiles = t1 - t0;
    // Keys of tile t0 + j (the last may be partial).
    auto tile_keys = [&](int j) { return static_cast<int>(imin(last_key - std::int64_t{t0 + j} * kTile, kTile)); };
    if (tiles > 0) {
      issue_tile(x, Ks, kh + std::int64_t{t0} * kTile * D, tile_keys(0), t);
      issue_tile(x, Vs, vh + std::int64_t{t0} * kTile * D, tile_keys(0), t);
    }
    x.async_commit();

    // The block's query rows, fp32 -> fp16 (rows past Sq are zeros, never stored).
    LOCKSTEP_UNROLL
    for (int i = 0; i < kRows * D / kThreads; ++i) {
      const I e = t + i * kThreads;
      const I r = x.idiv(e, D);
      const I c = e - r * D;
      x.store_half(Qs, r * kLd + c, x.load(fb.qb, r * fb.q_ss + c, r < rows, 0.0f));
    }

    I qf[kQInRegs ? D / 16 : 1][4];
    F o[kM][D / 8][4];
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int n = 0; n < D / 8; ++n)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;
    // Rows row0 and row0 + 8: the running max of the raw scores and the lane's part of the sum.
    F m[kM][2], l[kM][2];
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        m[mt][h] = -kInf;
        l[mt][h] = 0.0f;
      }
    const float c2 = p.scale_log2;  // scale * log2(e)
    F s[kM][kTile / 8][4];          // the scores, then the weights, of the warp's current tile

    for (int j = 0; j < tiles; ++j) {
      const H* Kt = Ks + (j & 1) * (kTile * kLd);
      const H* Vt = Vs + (j & 1) * (kTile * kLd);
      x.template async_wait<0>();  // this tile's K and V (and on the first tile Q's stores)
      x.sync();                    // ... are visible, and every warp is done with tile j - 1
      if (kQInRegs && j == 0) {
        LOCKSTEP_UNROLL
        for (int kk = 0; kk < (kQInRegs ? D / 16 : 0); ++kk) x.ldmatrix_x4(qf[kk], Qs, q_off[0] + kk * 16);
        if (kQInKBuffer) x.sync();  // every warp has its Q before tile 1 overwrites it
      }
      if (j + 1 < tiles) {         // tile j - 1's buffers take tile j + 1, landing during this tile
        issue_tile(x, Ks + ((j + 1) & 1) * (kTile * kLd), kh + std::int64_t{t0 + j + 1} * kTile * D, tile_keys(j + 1), t);
        issue_tile(x, Vs + ((j + 1) & 1) * (kTile * kLd), vh + std::int64_t{t0 + j + 1} * kTile * D, tile_keys(j + 1), t);
      }
      x.async_commit();
      qk_tile(x, s, qf, Qs, q_off, Kt, k_off);
      softmax_tile(x, p, s, m, l, o, row0, tq, (t0 + j) * kTile, tile_keys(j), s0, shift, c2);
      pv_tile(x, s, o, Vt, v_off);
    }

    finish(x, p, fb, o, m, l, row0, tq);
  }
};

// What a block of either packing kernel reads and writes: rows [s0, s0 + rows) of K and V for kv
// head hk of batch b (fp32, by their strides), and the int32 words of their fp16 copies from
// dst_words on (two halves per word).
struct HalfPackRows {
  const float* ks;
  const float* vs;
  std::int32_t* kd;
  std::int32_t* vd;
  int rows;
  LOCKSTEP_HD HalfPackRows(const FusedAttentionParams& p, int b, int hk, int s0, int block_rows, std::int64_t dst_words)
      : ks(p.k + b * p.k_sb + hk * p.k_sh + std::int64_t{s0} * p.k_ss),
        vs(p.v + b * p.v_sb + hk * p.v_sh + std::int64_t{s0} * p.v_ss),
        kd(static_cast<std::int32_t*>(p.k_half) + dst_words),
        vd(static_cast<std::int32_t*>(p.v_half) + dst_words),
        rows(static_cast<int>(imin(p.Skv - s0, block_rows))) {}
};

// K and V rounded to fp16 (nearest even) into FusedAttentionWgmma's tiles (Note [wgmma products]):
// [B, Hkv, ceil(Skv / 64), 64 D] with each tile in the core-matrix layout, zeros past Skv. Grid:
// x = tile, y = Hkv, z = B; thread t writes 16-byte chunks t, t + 256, ... of the tile (16-byte
// chunk q holds key (q / D) 8 + q % 8, columns 8 ((q / 8) % (D / 8)) ..., eight halves), each
// with one 16-byte store.
template <int D>
struct FusedHalfPackTiled {
  static constexpr const char* kName = "fused_attention_half_pack_tiled";
  static constexpr int kThreads = 256;
  static constexpr int kTile = 64;
  static constexpr std::size_t kSharedBytes = 0;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    pack_tile<kThreads>(x, p, x.block_z(), x.block_y(), x.block_x(), x.grid_x());
  }

  // Tile `tile` of the `tiles` of kv head hk in batch b, by a block of NT threads (also the
  // packing blocks of FusedAttentionWgmma: Note [packing blocks]).
  template <int NT, class X>
  LOCKSTEP_HD static void pack_tile(X& x, const Params& p, int b, int hk, int tile, int tiles) {
    using I = typename X::template Lanes<lane_int>;
    constexpr int kChunks = kTile * D / 8 / NT;  // per thread
    static_assert(kChunks * NT * 8 == kTile * D, "whole chunks per thread");
    const std::int64_t dst = ((std::int64_t{b} * p.Hkv + hk) * tiles + tile) * (kTile * D / 2);
    const HalfPackRows pr(p, b, hk, tile * kTile, kTile, dst);
    const int k_ss = static_cast<int>(p.k_ss), v_ss = static_cast<int>(p.v_ss);
    const I t = x.thread();
    // Every chunk's loads are issued before the first store (which the compiler may not move
    // loads past: the buffers could alias), so that the tile takes one round trip, not kChunks.
    using Q4 = decltype(x.load4(pr.ks, t, t < 0));
    Q4 kv[kChunks][4];
    LOCKSTEP_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const I q = t + i * NT;
      const I r = x.idiv(q, D) * 8 + (q & 7);
      const I c = ((q >> 3) - x.idiv(q >> 3, D / 8) * (D / 8)) * 8;
      const auto ok = r < pr.rows;
      kv[i][0] = x.load4(pr.ks, r * k_ss + c, ok);
      kv[i][1] = x.load4(pr.ks, r * k_ss + (c + 4), ok);
      kv[i][2] = x.load4(pr.vs, r * v_ss + c, ok);
      kv[i][3] = x.load4(pr.vs, r * v_ss + (c + 4), ok);
    }
    LOCKSTEP_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const I q = t + i * NT;
      x.store_words4(pr.kd, q * 4, x.pack_half2(kv[i][0].x, kv[i][0].y), x.pack_half2(kv[i][0].z, kv[i][0].w),
                     x.pack_half2(kv[i][1].x, kv[i][1].y), x.pack_half2(kv[i][1].z, kv[i][1].w));
      x.store_words4(pr.vd, q * 4, x.pack_half2(kv[i][2].x, kv[i][2].y), x.pack_half2(kv[i][2].z, kv[i][2].w),
                     x.pack_half2(kv[i][3].x, kv[i][3].y), x.pack_half2(kv[i][3].z, kv[i][3].w));
    }
  }
};

// Note [packing blocks]
// FusedAttentionWgmma<D, WG, true> rounds K and V to fp16 in its own blocks instead of reading
// tiles that FusedHalfPackTiled wrote in a launch of its own before it. Blocks take tickets
// (x.block_ticket) in the order they start; ticket t owns a query tile of flattened kv head
// i = t / A (A: the blocks of one kv head, its query heads' tiles; kv heads of every batch in
// order, then query heads, then tiles), u = t % A. Blocks u < P of kv head i (P = min(A, key
// tiles)) first pack tiles u, u + P, ... of kv head i + N (N = p.pack_ahead >= 1;
// FusedHalfPackTiled::pack_tile: the same rounding and layout, every load in flight before the
// first store) and signal that kv head's counter (x.signal: a release); then every block of kv
// head i >= N waits for its own counter to reach P (x.wait_signals: an acquire) and runs the
// attention. Kv heads 0 .. N - 1 of batch 0 are packed by FusedHalfPackTiled in the launch before
// (N is at most the kv heads per batch). No deadlock whatever the scheduler does: a block waits
// only for blocks with lower tickets, which have started and never wait before they pack. (Packing
// after the wait chained every kv head's packing behind the one before: 1.5-5x slower at head_dim
// 64, run 89.) The packing blocks' stores are generic-proxy writes that the bulk copies (async
// proxy) read: each side fences the proxies (x.proxy_fence_global). The last reader of a counter
// resets it, and the ticket resets itself, so the stream's counters are zeros again for the next
// call (Note [block signals]). Which block rounds a tile, and when, changes; the rounding does not:
// the same bits (tested with the scratch first filled with another call's tiles). On the CPU
// device the waits yield to the threads that run the lower tickets.
// Measured (runs 90-92, H200): 16x16x1024x64 causal 0.267-0.272 ms against the mma.sync kernel's
// 0.280-0.281 (and the wgmma kernel's with its own packing launch, 0.287-0.292 in run 83), so it
// is the default at head_dim 64 for grids of two waves or more; at B4 H32 L4096 D128 it was
// 0.7-1% slower than the packing launch (causal 0.5-1%), and at whisper-tiny (72 blocks) 5%, so
// those keep the launch. Packing inside the attention loop instead (a piece of a tile per key
// tile, cp.async into shared memory, rounded a step later, a few kv heads ahead) was 2.5% slower
// at head_dim 128 with a double-buffered stage and 1.7-11% with a single one (runs 91, 92): the
// loop is at 255 registers and issue-bound, and each piece adds to it.
//
// Note [early query loads]
// With the softmax on the SFU (Note [hardware exp2 on the tensor-core path]), Nsight Compute at
// 16x16x1024x64 causal (run 98) put 38% of the packing kernel's warp samples before the first
// product: the packing loads' round trip (F2FP waiting on them: 11%), the wait for the kv head's
// counter (6%), then Q's loads' round trip (11.5%), one after the other, with three blocks (12
// warps) per SM to hide them. At head_dim 64 the block therefore issues Q's loads (fp32, kept
// in 32 registers) before the packing loads, and rounds them to fp16 after its wait: one round
// trip for both. (At head_dim 128 Q's 64 registers and the packing tile's 128 would not fit.)

// Note [wgmma products]
// FusedAttentionWgmma is FusedAttentionTensorCore's arithmetic with the products as warpgroup
// instructions (PTX wgmma.mma_async, sm_90a): one instruction multiplies a warpgroup's 64 rows by
// a 16 x N operand that the tensor cores read from shared memory themselves, where mma.sync needs
// one instruction per 16 x 8 tile and an ldmatrix per two. Per tile of 64 keys and warp at
// head_dim 128: 12 product instructions instead of 128 mma.sync and 64 ldmatrix; and the products
// run asynchronously to the warps that issue them. What is computed does not change:
//   - the accumulator layout of wgmma is mma_16816's per warp (warp w of a warpgroup holds its
//     rows 16 w .. 16 w + 15, c[n8] being columns 8 n8 .. 8 n8 + 7), and A from registers is each
//     warp's mma_16816 A fragment, so Q's fragments, the softmax on S (softmax_tile), P's packing
//     and the output (store_rows) are FusedAttentionTensorCore<D, 1>'s own;
//   - S accumulates over head_dim in steps of 16 and O over the tile's keys in steps of 16, in the
//     same order; the CPU device emulates each product n-tile by n-tile with mma_16816's
//     emulation, so there this kernel and FusedAttentionTensorCore give the same bytes (tested),
//     and CUDA's differ from the CPU's only as the hardware's products do (Note [tensor-core
//     emulation]; the same documented bound).
// Shared memory: K and V tiles of 64 keys as 8 x 8 core matrices (16-byte rows of 8 halves, no
// swizzle): element (key r, column k) at ((r / 8) (D / 8) + k / 8) 64 + (r % 8) 8 + k % 8 halves.
// K is B of Q.K^T in K-major order (leading byte offset 128 between core matrices along head_dim,
// stride 16 D between groups of 8 keys); V is B of P.V in MN-major order (the same memory: leading
// 16 D between groups of 8 keys, stride 128 between groups of 8 columns). FusedHalfPackTiled
// writes K and V in that layout tile by tile, so a tile is one contiguous 64 D halves in global
// memory too, and one thread moves it with one bulk copy (cp.async.bulk) that completes on the
// slot's transaction barrier. Rows past Skv in the last tile are zeros; rows of a tile past the
// block's last visible key (causal) are the keys' own values, weighted 0 (FusedAttentionTensorCore
// zero-fills those rows instead: a V entry there beyond fp16's range, inf after rounding, would
// make 0 x inf = NaN here only). Q's fragments come straight from global memory into registers
// (rounded to fp16 as FusedAttentionTensorCore rounds them).
// ptxas (CUDA 13.0) does not keep a product's register operand live across the loop's back edge:
// it reused Q's registers inside the loop (run 81: wrong scores from the second tile on). So each
// tile first rewrites Q's fragments with an ordinary instruction (x.wgmma_keep: xor with p.zero,
// a zero ptxas cannot see), whose reads keep them live.
// Schedule (FlashAttention-3's overlap within a warpgroup; no block-wide barrier in the loop):
// WG warpgroups per block (64 WG query rows) share a ring of 3 K/V tiles. Thread 0 issues tile
// j + 2 into slot (j + 2) % 3 once every warp has released tile j - 1 there (the slot's `empty`
// barrier); each warpgroup, per tile j: waits for tile j + 1 (the slot's `full` barrier) and
// issues S' = Q.K^T of it, runs the softmax of tile j on S (already complete) while S' is
// computed, issues O += P.V of tile j, waits for S' and for P.V, and releases tile j. S and S'
// alternate (the loop is unrolled by two). The warpgroups are never more than a tile apart and
// otherwise run freely, so one's softmax overlaps the other's products.
// Built only for sm_90a (the host picks it on compute capability 9.0 when the library was built
// with it: CMAKE_CUDA_ARCHITECTURES containing 90a); elsewhere its products trap.
// OV = false: the schedule of Note [four wgmma blocks per SM] instead.
//
// Note [four wgmma blocks per SM]
// At 16x16x1024x64 causal the head_dim 64 kernel is latency-bound (run 98: 36% of issue slots
// busy) with three blocks (12 warps) per SM, the most its 168 registers allow; under
// __launch_bounds__(128, 4) the schedule above spills inside the loop (twentieth session). Its
// registers in the loop: O (32), S and S' (32 each: S' is written by the next tile's Q.K^T while
// the softmax reads S), the softmax's weights (up to 32, dying into P's 16 as they are packed) and
// Q's fragments (16). FusedAttentionWgmma<D, WG, PK, false> gives up the overlap of tile j + 1's
// Q.K^T with tile j's softmax, which needs S': per tile j, the softmax of S (complete), O += P.V
// of tile j issued, then tile j + 1's Q.K^T issued into S while P.V runs (both products in flight
// together, no ordinary instruction touching an accumulator meanwhile), and one wait for both. At
// head_dim 64 that leaves room for four blocks (16 warps) per SM within 128 registers
// (kMinBlocks 4), the other blocks' softmaxes overlapping a block's products instead; their
// shared memory, 4 x (49,264 + 2,048 reserved and static) bytes, needs the SM's largest carveout,
// which the launch asks for (kMaxSharedCarveout). The same
// products in the same order on the same operands: the same bits as OV = true (tested on the CPU
// device, where both are emulated, and on the GPU, run 124). The default where the one-warpgroup
// head_dim 64 kernel would run (attention/src/fused.cpp) since run 124: at 16x16x1024x64 causal
// on an H100 its four blocks per SM (ncu: 128 registers, no stack; three blocks with the overlap,
// at 168) took 0.2026-0.2075 ms against 0.2089-0.2172 (five rounds each, same call), and the
// kernel alone 194 us against 205. LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0 picks the overlapping kernel.
//
// Note [deferred P.V wait]
// FusedAttentionWgmma<64, 1, PK, false, true>: Note [four wgmma blocks per SM]'s kernel (128
// registers, four blocks per SM) with FlashAttention-3's order inside a warpgroup, where the
// serial schedule waits for tile j - 1's P.V before tile j's softmax. Per tile j >= 1: Q.K^T of
// tile j issued; o rescaled by tile j - 1's alpha (no product on o in flight); P.V of tile j - 1
// issued; a wait for Q.K^T only (committed first: wgmma_wait<1>); tile j's softmax, which writes
// m, l, its weights and its alpha but not o (softmax_tile_alpha), while P.V of tile j - 1 runs on
// the tensor cores; a wait for that P.V (wgmma_wait<0>); tile j - 1 released; tile j's weights
// packed into P. Both products of a step are waited for within the step (no product in flight
// across the loop's back edge, which ptxas does not follow: Note [wgmma products]). The registers
// this adds to the serial kernel are P's 16 of tile j - 1 during tile j's softmax. The K/V ring
// (3 tiles: j - 1 in P.V, j in Q.K^T, j + 1 in flight) issues tile j + 1 at step j, a step ahead
// of its use (the serial kernel: a step and a half). Per element of o the same operations in the
// same order as the serial kernel -- o * alpha_j, then tile j's P.V -- so the same bits (tested on
// the CPU device, where every product completes at once, and on the GPU). ptxas keeps the
// products asynchronous (SASS: one WARPGROUP.DEPBAR.LE gsb0 0x1 and one 0x0 per tile) at 123-124
// registers, no stack. The default where the serial kernel runs since run 126 (H200,
// 16x16x1024x64 causal, four rounds each: 0.1935-0.1958 ms against the serial order's
// 0.1947-0.2025); LOCKSTEP_FUSED_TC_WGMMA_DEFER=0 keeps the serial order.
template <int D, int WG = 2, bool PK = false, bool OV = true, bool DP = false>
struct FusedAttentionWgmma {
  static_assert(D == 64 || D == 128, "wgmma attention: head_dim 64 or 128");
  static_assert(WG == 1 || WG == 2, "one or two warpgroups per block");
  static_assert(OV || (D == 64 && WG == 1), "the serial schedule: head_dim 64, one warpgroup");
  static_assert(!DP || !OV, "the deferred P.V wait is a form of the serial schedule");
  using Tc = FusedAttentionTensorCore<D, 1>;
  static constexpr const char* kName =
      PK ? (OV ? "fused_attention_wgmma_packing"
               : DP ? "fused_attention_wgmma_packing_deferred" : "fused_attention_wgmma_packing_serial")
         : (OV ? "fused_attention_wgmma" : DP ? "fused_attention_wgmma_deferred" : "fused_attention_wgmma_serial");
  static constexpr int kWarps = 4 * WG;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kRows = 64 * WG;          // query rows per block
  static constexpr int kTile = Tc::kTile;        // keys per tile (64)
  static_assert(kTile == 64, "the Q.K^T product is 64 x 64 per warpgroup");
  static constexpr int kStages = 3;              // tiles j (P.V), j + 1 (Q.K^T), j + 2 (loading)
  // Blocks per SM the registers must allow (S twice, O, Q: up to 255 registers at head_dim 128
  // with one warpgroup and two blocks, or two warpgroups and one block).
  static constexpr int kMinBlocks = !OV ? 4 : WG == 1 ? (D == 128 ? 2 : 3) : 1;
  // Four blocks of kSharedBytes (49 KB) need the SM's 228 KB shared-memory configuration, which the
  // driver need not pick unasked (Note [four wgmma blocks per SM]).
  static constexpr bool kMaxSharedCarveout = !OV;
  static constexpr int kTileHalves = kTile * D;  // one K or V tile, no padding
  static constexpr std::size_t kSharedBytes = std::size_t(2) * kStages * kTileHalves * 2 + 2 * kStages * 8 + 64;
  // Core-matrix strides (halves): along head_dim 64 (one core matrix), along keys 8 D.
  static constexpr int kCoreStep = 64;
  static constexpr int kKeyGroupStep = 8 * D;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    if constexpr (PK) {
      // Note [packing blocks]: the ticket gives the block its query tile and kv head (kv heads of
      // every batch in order, then query heads of its group, then tiles).
      const int tiles_q = static_cast<int>(ceil_div(p.Sq, kRows));
      const int group = p.H / p.Hkv;
      const int per_kv = group * tiles_q;  // blocks of one kv head
      const int t = x.block_ticket(p.ticket, p.B * p.H * tiles_q);
      const int kvi = t / per_kv, u = t - kvi * per_kv;
      const int b = kvi / p.Hkv, hk = kvi - b * p.Hkv;
      const int tiles_kv = static_cast<int>(ceil_div(p.Skv, kTile));
      const int parts = static_cast<int>(imin(per_kv, tiles_kv));  // packing blocks per kv head
      // First the tiles of a later kv head (never behind a wait: a chain of waits and packs from
      // kv head to kv head made the kernel 1.5-5x slower at head_dim 64, run 89): pack_ahead kv
      // heads on, so that its blocks, which start pack_ahead x per_kv tickets later, find it done.
      const int ahead = p.pack_ahead > 0 ? p.pack_ahead : 1;
      const int next = kvi + ahead;
      // Note [early query loads]: at head_dim 64, Q's loads are in flight during the packing
      // loads, so the block waits for memory once where it waited twice.
      const FusedBlock fb(p, b, hk * group + u / tiles_q, u % tiles_q, kRows);
      constexpr bool kEarlyQ = D == 64;
      F qv[D / 16][4][2];
      if constexpr (kEarlyQ) load_q(x, fb, qv);
      if (u < parts && next < p.B * p.Hkv) {  // block-uniform
        const int nb = next / p.Hkv, nhk = next - nb * p.Hkv;
        for (int j = u; j < tiles_kv; j += parts)
          FusedHalfPackTiled<D>::template pack_tile<kThreads>(x, p, nb, nhk, j, tiles_kv);
        x.proxy_fence_global();
        x.signal(p.pack_counters + 2 * std::int64_t{next});
      }
      if (kvi >= ahead) {  // kv heads 0 .. ahead - 1 were packed by the kernel before
        std::int32_t* c = p.pack_counters + 2 * std::int64_t{kvi};
        const int reader = x.wait_signals(c, parts, true);
        x.release_signals(c, reader, per_kv);
        x.proxy_fence_global();  // the packing blocks' generic stores, then the bulk copies' reads
      }
      body<kEarlyQ>(x, p, fb, qv);
    } else {
      F qv[D / 16][4][2];
      body<false>(x, p, FusedBlock(x, p, kRows), qv);
    }
  }

  // Q's fp32 values for the block's A fragments (rows past the block's are zeros): pair e of
  // k-step kk is row row0 + (e & 1) 8, columns tq 2 + kk 16 + (e >> 1) 8 and the next.
  template <class X, class F>
  LOCKSTEP_HD static void load_q(X& x, const FusedBlock& fb, F (&qv)[D / 16][4][2]) {
    using I = typename X::template Lanes<lane_int>;
    const I lane = x.lane();
    const I row0 = x.warp() * 16 + (lane >> 2), tq = lane & 3;
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) {
        const I r = row0 + (e & 1) * 8;
        const I c = tq * 2 + (kk * 16 + (e >> 1) * 8);
        const auto live = r < fb.rows;
        qv[kk][e][0] = x.load(fb.qb, r * fb.q_ss + c, live, 0.0f);
        qv[kk][e][1] = x.load(fb.qb, r * fb.q_ss + (c + 1), live, 0.0f);
      }
  }

  // The block's attention; qv holds Q's values already when kQLoaded (else body loads them).
  template <bool kQLoaded, class X, class QF>
  LOCKSTEP_HD static void body(X& x, const Params& p, const FusedBlock& fb, QF (&qv)[D / 16][4][2]) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using H = typename X::half_t;
    H* Ks = x.template shared<H>(kStages * kTileHalves);
    H* Vs = x.template shared<H>(kStages * kTileHalves);
    std::uint64_t* full = x.template shared<std::uint64_t>(kStages);   // tile landed in the slot
    std::uint64_t* empty = x.template shared<std::uint64_t>(kStages);  // every warp done with it

    const int s0 = fb.s0, shift = fb.shift;
    // FusedHalfPackTiled's layout: [B, Hkv, tiles of Skv, 64 D halves].
    const std::int64_t kv_base = (std::int64_t{fb.b} * p.Hkv + fb.hk) * ceil_div(p.Skv, kTile) * kTileHalves;
    const H* kh = static_cast<const H*>(p.k_half) + kv_base;
    const H* vh = static_cast<const H*>(p.v_half) + kv_base;
    LOCKSTEP_UNROLL
    for (int i = 0; i < kStages; ++i) {
      x.mbar_init(full + i, 1);
      x.mbar_init(empty + i, kWarps);
    }
    x.sync();

    const I lane = x.lane();
    const I w = x.warp();
    const I g = lane >> 2, tq = lane & 3;
    I row0[1];
    row0[0] = w * 16 + g;  // lane 4g + t of warp w holds rows row0 and row0 + 8

    const int last_key = fb.last_key(p);
    // The block's key tiles t0 .. t1 - 1 (Note [split keys]); j below is t0 + j's place in the
    // ring's order: slots and phases count from the block's first tile, keys and data from t0.
    int t0 = 0, t1 = 0;
    fb.key_tiles(p, kTile, t0, t1);
    const int tiles = t1 - t0;
    auto tile_keys = [&](int j) { return static_cast<int>(imin(last_key - std::int64_t{t0 + j} * kTile, kTile)); };
    // Tile j into its ring slot (thread 0; from the fourth tile on, once the slot's previous tile,
    // j - 3, has been released by every warp).
    auto issue = [&](int j) {
      if (j < tiles) {
        const int b = j % kStages;
        x.bulk_tiles(full + b, empty + b, (j / kStages + 1) & 1, j >= kStages, Ks + b * kTileHalves,
                     kh + std::int64_t{t0 + j} * kTileHalves, Vs + b * kTileHalves,
                     vh + std::int64_t{t0 + j} * kTileHalves, kTileHalves * 2);
      }
    };
    issue(0);
    issue(1);

    // Q's A fragments, rounded to fp16 (rows past the block's are zeros).
    if constexpr (!kQLoaded) load_q(x, fb, qv);
    I qf[D / 16][4];
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) qf[kk][e] = x.pack_half2(qv[kk][e][0], qv[kk][e][1]);

    F o[1][D / 8][4];
    LOCKSTEP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) o[0][n][e] = 0.0f;
    F m[1][2] = {{F(-kInf), F(-kInf)}}, l[1][2] = {{F(0.0f), F(0.0f)}};
    const float c2 = p.scale_log2;
    // Descriptor strides (Note [wgmma products]; as the PTX canonical layouts give them, verified
    // on the GPU in runs 82 and 83).
    constexpr int k_lbo = kCoreStep, k_sbo = kKeyGroupStep, v_lbo = kKeyGroupStep, v_sbo = kCoreStep;
    // S = Q.K^T of tile j into sj, issued (64 x 64 per warpgroup, head_dim in steps of 16).
    auto issue_qk = [&](int j, F (&sj)[1][kTile / 8][4]) {
      x.wgmma_keep(qf, p.zero);
      x.wgmma_fence();
      LOCKSTEP_UNROLL
      for (int kk = 0; kk < D / 16; ++kk)
        x.template wgmma<kTile, false>(sj[0], qf[kk], Ks, (j % kStages) * kTileHalves + kk * 2 * kCoreStep,
                                       k_lbo, k_sbo, kk > 0);
      x.wgmma_commit();
    };
    // P's A fragments from the weights s, fp16.
    auto pack_p = [&](F (&s)[1][kTile / 8][4], I (&pa)[kTile / 16][4]) {
      LOCKSTEP_UNROLL
      for (int kc = 0; kc < kTile / 16; ++kc) {
        pa[kc][0] = x.pack_half2(s[0][2 * kc][0], s[0][2 * kc][1]);
        pa[kc][1] = x.pack_half2(s[0][2 * kc][2], s[0][2 * kc][3]);
        pa[kc][2] = x.pack_half2(s[0][2 * kc + 1][0], s[0][2 * kc + 1][1]);
        pa[kc][3] = x.pack_half2(s[0][2 * kc + 1][2], s[0][2 * kc + 1][3]);
      }
    };
    // O += P.V of tile j from P's packed fragments pa, issued: the tile's keys in steps of 16,
    // back to back after one fence.
    auto issue_pv_packed = [&](int j, I (&pa)[kTile / 16][4]) {
      x.wgmma_ready(pa);
      x.wgmma_fence();
      LOCKSTEP_UNROLL
      for (int kc = 0; kc < kTile / 16; ++kc)
        x.template wgmma<D, true>(o[0], pa[kc], Vs, (j % kStages) * kTileHalves + kc * 2 * kKeyGroupStep,
                                  v_lbo, v_sbo, true);
      x.wgmma_commit();
    };
    // O += P.V of tile j from its weights s (every A fragment packed into pa first).
    auto issue_pv = [&](int j, F (&s)[1][kTile / 8][4], I (&pa)[kTile / 16][4]) {
      pack_p(s, pa);
      issue_pv_packed(j, pa);
    };
    // Tile 0's scores into s0t, complete.
    auto first_scores = [&](F (&s0t)[1][kTile / 8][4]) {
      if (tiles > 0) {
        x.mbar_wait(full, 0);  // tile 0
        issue_qk(0, s0t);
        x.template wgmma_wait<0>();
        x.wgmma_hold(s0t[0]);
      }
    };
    // Tile j: its scores in s_in (complete); the next tile's products into s_next meanwhile. The
    // softmax reads s_in and writes its weights to s (Note [softmax output]).
    auto step = [&](int j, F (&s_in)[1][kTile / 8][4], F (&s_next)[1][kTile / 8][4]) {
      F s[1][kTile / 8][4];
      issue(j + 2);  // into tile j - 1's slot
      if (j + 1 < tiles) {
        x.mbar_wait(full + (j + 1) % kStages, ((j + 1) / kStages) & 1);  // tile j + 1 has landed
        issue_qk(j + 1, s_next);
      }
      Tc::softmax_tile(x, p, s_in, s, m, l, o, row0, tq, (t0 + j) * kTile, tile_keys(j), s0, shift, c2);
      I pa[kTile / 16][4];
      issue_pv(j, s, pa);
      x.template wgmma_wait<1>();  // S' (committed first) is complete
      x.wgmma_hold(s_next[0]);
      x.template wgmma_wait<0>();  // and P.V
      x.wgmma_hold(o[0]);
      x.mbar_arrive_warp(empty + j % kStages);  // this warp is done with tile j
    };

    if constexpr (DP) {  // Note [deferred P.V wait]
      F sc[1][kTile / 8][4], s[1][kTile / 8][4], alpha[2];
      I pa[kTile / 16][4];
      // P.V of tile j from pa, issued (o's pending rescale first).
      auto rescale_then_pv = [&](int j, bool rescale) {
        if (rescale) Tc::rescale_o(o[0], alpha);
        issue_pv_packed(j, pa);
      };
      bool rescale = false;
      first_scores(sc);
      if (tiles > 0) {
        rescale = Tc::softmax_tile_alpha(x, p, sc, s, m, l, alpha, row0, tq, t0 * kTile, tile_keys(0), s0, shift, c2);
        pack_p(s, pa);
      }
      for (int j = 1; j < tiles; ++j) {
        issue(j + 1);  // into tile j - 2's slot
        x.mbar_wait(full + j % kStages, (j / kStages) & 1);  // tile j has landed
        issue_qk(j, sc);
        rescale_then_pv(j - 1, rescale);
        x.template wgmma_wait<1>();  // Q.K^T of tile j (committed first) is complete
        x.wgmma_hold(sc[0]);
        rescale = Tc::softmax_tile_alpha(x, p, sc, s, m, l, alpha, row0, tq, (t0 + j) * kTile, tile_keys(j), s0,
                                          shift, c2);
        x.template wgmma_wait<0>();  // P.V of tile j - 1
        x.wgmma_hold(o[0]);
        x.wgmma_ready(pa);  // P's registers live up to here (an operand of the P.V in flight)
        x.mbar_arrive_warp(empty + (j - 1) % kStages);  // this warp is done with tile j - 1
        pack_p(s, pa);
      }
      if (tiles > 0) {
        rescale_then_pv(tiles - 1, rescale);
        x.template wgmma_wait<0>();
        x.wgmma_hold(o[0]);
        x.wgmma_ready(pa);
        x.mbar_arrive_warp(empty + (tiles - 1) % kStages);
      }
      Tc::finish(x, p, fb, o, m, l, row0, tq);
      return;
    }
    if constexpr (!OV) {  // Note [four wgmma blocks per SM]
      F sc[1][kTile / 8][4];
      first_scores(sc);
      for (int j = 0; j < tiles; ++j) {
        F s[1][kTile / 8][4];
        issue(j + 2);  // into tile j - 1's slot
        Tc::softmax_tile(x, p, sc, s, m, l, o, row0, tq, (t0 + j) * kTile, tile_keys(j), s0, shift, c2);
        I pa[kTile / 16][4];
        issue_pv(j, s, pa);
        if (j + 1 < tiles) {
          x.mbar_wait(full + (j + 1) % kStages, ((j + 1) / kStages) & 1);  // tile j + 1 has landed
          issue_qk(j + 1, sc);  // while P.V of tile j runs
        }
        x.template wgmma_wait<0>();  // P.V of tile j and S of tile j + 1
        x.wgmma_hold(o[0]);
        x.wgmma_hold(sc[0]);
        // P's registers live up to here (an operand of the P.V in flight: the barrier wait and Q.K^T
        // above must not take them; Note [wgmma products]: ptxas keeps an operand live only up to
        // its product).
        x.wgmma_ready(pa);
        x.mbar_arrive_warp(empty + j % kStages);  // this warp is done with tile j
      }
      Tc::finish(x, p, fb, o, m, l, row0, tq);
      return;
    }
    F sa[1][kTile / 8][4], sb[1][kTile / 8][4];
    first_scores(sa);
    for (int j = 0; j < tiles; j += 2) {
      step(j, sa, sb);
      if (j + 1 < tiles) step(j + 1, sb, sa);
    }
    Tc::finish(x, p, fb, o, m, l, row0, tq);  // every issued tile was waited for
  }
};

// K and V rounded to fp16 (nearest even) into the packed operands of FusedAttentionTensorCore:
// [B, Hkv, Skv, D] contiguous (p.k_half, p.v_half), read from p.k and p.v by their strides.
// Grid: x = ceil(Skv / 32), y = Hkv, z = B; a block converts 32 rows of K and of V.
template <int D>
struct FusedHalfPack {
  static constexpr const char* kName = "fused_attention_half_pack";
  static constexpr int kThreads = 256;
  static constexpr int kRows = 32;
  static constexpr int kQuads = kRows * D / 4 / kThreads;  // per thread
  static_assert(kQuads * kThreads * 4 == kRows * D, "whole quads per thread");
  static constexpr std::size_t kSharedBytes = 0;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    const int b = x.block_z(), hk = x.block_y(), s0 = x.block_x() * kRows;
    const HalfPackRows pr(p, b, hk, s0, kRows, ((std::int64_t{b} * p.Hkv + hk) * p.Skv + s0) * (D / 2));
    const int rows = pr.rows;
    const float *ks = pr.ks, *vs = pr.vs;
    std::int32_t *kd = pr.kd, *vd = pr.vd;
    const I t = x.thread();
    LOCKSTEP_UNROLL
    for (int i = 0; i < kQuads; ++i) {
      const I q = t + i * kThreads;
      const I r = x.idiv(q, D / 4);
      const I c = (q - r * (D / 4)) * 4;
      const auto ok = r < rows;
      const auto kq = x.load4(ks, r * static_cast<int>(p.k_ss) + c, ok);
      const auto vq = x.load4(vs, r * static_cast<int>(p.v_ss) + c, ok);
      const I o = r * (D / 2) + (c >> 1);
      x.store(kd, o, x.pack_half2(kq.x, kq.y), ok);
      x.store(kd, o + 1, x.pack_half2(kq.z, kq.w), ok);
      x.store(vd, o, x.pack_half2(vq.x, vq.y), ok);
      x.store(vd, o + 1, x.pack_half2(vq.z, vq.w), ok);
    }
  }
};

}  // namespace lockstep::kernels
