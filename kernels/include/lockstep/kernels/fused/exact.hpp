#pragma once
// FusedAttentionExact: fused attention for prefill in strict fp32 (SIMT), the FlashAttention-2
// schedule. A block owns 64 query rows of one (batch, head) and streams K/V tiles of 64 tokens (32
// at head_dim 256) through shared memory (Note [exact register tiles]),
// keeping a running max and sum per row (online softmax) and rescaling its output accumulator.
// Every sum has a fixed order (tiles in order, tokens in order within a tile), so the CPU and
// CUDA backends return the same bits.

#include <type_traits>

#include "lockstep/kernels/fused/common.hpp"

namespace lockstep::kernels {

// Note [exact register tiles]
// Grid: x = ceil(Sq / kRows) query tiles, y = H, z = B; 16 * KG threads. Thread t owns the 4
// query rows 4 rg .. 4 rg + 3 of the block (rg = t / KG, a row group; the KG threads of a row
// group are consecutive lanes of one warp) and, per K/V tile, the keys kg * 4 + e + 4 KG u of
// the tile (kg = t % KG, e < 4, u < kTile / (4 KG)) and the output columns kg * 4 + e + 4 KG u
// (u < D / (4 KG)). Q is transposed into shared memory; K, V and P keep one row per key. Four
// d steps of the scores read four 16-byte quads of Q (4 rows at each d) and one quad of K per
// key (4 d), and one key of P x V reads one quad of P (4 rows) and D / (4 KG) quads of V: 5 to
// 21 fmas per shared load, where a kernel of 32 rows per block does one and is bound by issue
// and shared-memory wavefronts together.
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
// 0.255 ms, while 16x16x1024 causal, 4096 blocks, took 1.34-1.36 instead of 1.31-1.34).
// Only when loads happen changes: not the bits.

// Note [exact formats]
// q, k, v and out are float, half or bfloat16 (p.act_format, one for all four; the log-sum-exp
// and the split partials stay float). A load widens exactly and a store rounds once, so the
// bytes in a 16-bit format are the float kernel's on the widened inputs, rounded: every sum,
// weight and accumulator is the same float. 16-bit tiles arrive by plain loads that widen into
// the same float tiles in shared memory (the asynchronous copies move floats only); on the CPU
// the row form reads widened copies of the block's rows (backends/cpu/rows/exact.hpp).

// Note [row-major exact]
// The CPU device runs FusedAttentionExact's blocks statement by statement over their lanes,
// each lane value an array in memory: 22 GFLOP/s at 1 x 4 x 256 x 64 on the 2-core machine,
// 10% of its fma rate. With an execution context that
// offers it (X::kRowMajorExact: the CPU's avx2 and avx3 variants, unless
// LOCKSTEP_CPU_EXACT_LANES=1), the block is computed row by row instead (x.exact_rows:
// ExactRowForm in fused/exact_rows.hpp): K and V read where they are, every score, weight, sum and
// accumulator computed by the operations, in the order, of the lane that stores it here (the
// comment there lists them), so the bits are the lane path's (tested against it on the CPU, by
// Attention.FusedExactRowMajorGivesTheLaneBytes and by every fused property, which also runs
// the generic variant's lane path; CUDA against it on the GPU by the fused properties). Like Note
// [row-major decode], a kernel's arithmetic written a second time, beside it (Note [row forms]
// in row_form.hpp): the price of
// 5-7x (51-69% of the fma rate at the CPU's prefill shapes on an AVX-512 machine; 53-61%,
// 38-58% and 47-70% on the AVX2 machine with six-row register blocks, docs/performance.md).
LOCKSTEP_FLAG_TRAIT(has_row_major_exact, kRowMajorExact)  // hd.hpp
template <class X>
inline constexpr bool row_major_exact_v = has_row_major_exact<X>::value;

// KG = 16 threads per row group at head_dim 128 (42.7 vs 47.6 ms at B4 H32 L4096), 8
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
  LOCKSTEP_HD static void transpose_q(X& x, float* dst, const void* src, int fmt, int ss, int valid) {
    constexpr int kPer = kRows * D / kThreads;
    static_assert(kPer * kThreads == kRows * D, "whole rows per block pass");
    LOCKSTEP_UNROLL
    for (int i = 0; i < kPer; ++i) {
      const typename X::template Lanes<lane_int> row = x.idiv(x.thread() + i * kThreads, D);
      const typename X::template Lanes<lane_int> c = x.thread() + i * kThreads - row * D;
      x.store(dst, c * kQPitch + row, load_act(x, src, fmt, c + row * ss, row < valid));
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
  // A K tile (swizzled) or V tile (not) of `keys` rows from src (in format fmt, at element
  // elem0) into dst, zeros up to kTile rows: 16-byte asynchronous copies (float only), or plain
  // loads that widen. Commits a group (empty when keys <= 0).
  template <bool kSwizzle, class X>
  LOCKSTEP_HD static void issue_tile(X& x, float* dst, const void* src0, int fmt, std::int64_t elem0, int ss, int keys,
                                     bool async) {
    using I = typename X::template Lanes<lane_int>;
    if (keys > 0) {
      const void* src = act_at(src0, fmt, elem0);
      if (async) {
        const float* srcf = static_cast<const float*>(src);
        LOCKSTEP_UNROLL_4
        for (int i = 0; i < kLoads / 4; ++i) {
          const I key = x.idiv(x.thread() + i * kThreads, D / 4);
          const I c = x.thread() + i * kThreads - key * (D / 4);  // quad in the row
          x.copy4_async(dst, tile_quad<kSwizzle>(key, c), srcf, c * 4 + key * ss, key < keys);
        }
      } else {
        LOCKSTEP_UNROLL_4
        for (int i = 0; i < kLoads; ++i) {
          const I key = x.idiv(x.thread() + i * kThreads, D);
          const I c = x.thread() + i * kThreads - key * D;
          const auto v = load_act(x, src, fmt, c + key * ss, key < keys);
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
        const auto rows_in = [&](auto* tag) {  // Note [exact formats]: in the operands' format
          using T = std::remove_pointer_t<decltype(tag)>;
          x.template exact_rows<D, KG, kTile>(static_cast<const T*>(fb.qa), fb.q_ss, static_cast<const T*>(fb.ka),
                                              fb.k_ss, static_cast<const T*>(fb.va), fb.v_ss, static_cast<T*>(fb.oa),
                                              fb.o_ss, lse, fb.rows, fb.s0, fb.shift, key_begin, key_end,
                                              p.causal != 0, p.scale, po, pml, kMlPitch);
        };
        if (p.act_format == kActF16) {
          rows_in(static_cast<half*>(nullptr));
        } else if (p.act_format == kActBF16) {
          rows_in(static_cast<bfloat16*>(nullptr));
        } else {
          rows_in(static_cast<float*>(nullptr));
        }
        if (fb.splits > 1) merge_splits(x, p, fb);
        return;
      }
    }
    const int s0 = fb.s0, rows = fb.rows, shift = fb.shift;
    const int fmt = p.act_format;  // Note [exact formats]
    const int q_ss = fb.q_ss, k_ss = fb.k_ss, v_ss = fb.v_ss, o_ss = fb.o_ss;

    using Q4 = decltype(x.load4(Qt, x.thread()));
    const I t = x.thread();
    const I kg = t & (KG - 1);               // key group (scores) and column group (output)
    const I pq = t >> (KG == 8 ? 3 : 4);     // the thread's row group: its row quad in P
    const I r4 = pq * 4;                     // the thread's first row in the block
    const I ksw = kg & 7;                    // the swizzle of each of the thread's keys: (key / 4) & 7

    // Note [exact tile pipeline]: K_0 and V_0 are copied while Q is loaded.
    const bool k_async = fmt == kActF32 && (reinterpret_cast<std::uintptr_t>(fb.ka) & 15) == 0 && k_ss % 4 == 0;
    const bool v_async = fmt == kActF32 && (reinterpret_cast<std::uintptr_t>(fb.va) & 15) == 0 && v_ss % 4 == 0;
    const int last_key = key_end;  // the loop's last key + 1; its first is key_begin
    if (last_key > key_begin) {
      const int keys0 = static_cast<int>(imin(last_key - key_begin, kTile));
      issue_tile<true>(x, Ks, fb.ka, fmt, std::int64_t{key_begin} * p.k_ss, k_ss, keys0, k_async);
      issue_tile<false>(x, Vs, fb.va, fmt, std::int64_t{key_begin} * p.v_ss, v_ss, keys0, v_async);
    }

    // The block's query rows, transposed (rows past Sq are zeros, never stored). At head_dim 128
    // all of a thread's loads at once (2% faster than the row loop); elsewhere the row loop
    // (whisper-tiny at head_dim 64 was 7% slower with the batched loads).
    if constexpr (D == 128) {
      transpose_q(x, Qt, fb.qa, fmt, q_ss, rows);
    } else {
      for (int r = 0; r < kRows; ++r)
        for (int c0 = 0; c0 < D; c0 += kThreads) {
          const I c = t + c0;
          x.store(Qt, c * kQPitch + r, load_act(x, fb.qa, fmt, c + r * q_ss, (c < D) & (r < rows)), c < D);
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
      if (j0 > key_begin) issue_tile<false>(x, Vs, fb.va, fmt, std::int64_t{j0} * p.v_ss, v_ss, keys, v_async);

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
      if constexpr (kSeparateP)
        issue_tile<true>(x, Ks, fb.ka, fmt, std::int64_t{j0 + kTile} * p.k_ss, k_ss, next_keys, k_async);

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
          issue_tile<true>(x, Ks, fb.ka, fmt, std::int64_t{j0 + kTile} * p.k_ss, k_ss, next_keys, k_async);
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
          store_act(x, fb.oa, fmt, 0, row * o_ss + kg * 4 + (4 * KG * u + e),
                    x.select(empty, 0.0f, acc[i][u][e] / l[i]), live);
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
          store_act(x, fb.oa, p.act_format, 0, row * fb.o_ss + kg * 4 + (4 * KG * u + e),
                    x.select(empty, 0.0f, acc[u][e] / lt), live);
      fb.store_lse(x, p, row, live & (kg == 0), mx, lt);
    }
  }
};

}  // namespace lockstep::kernels
