#pragma once
// DecodeChunk: one chunk of the KV cache attended for G query heads (the split-K partials),
// with its CPU row-major hook (Note [row-major decode]).

#include <type_traits>

#include "lockstep/kernels/decode/merge.hpp"
#include "lockstep/kernels/decode/params.hpp"

namespace lockstep::kernels {

// Note [row-major decode]
// The CPU device runs a block statement by statement over its 128 lanes, each lane value an
// array in memory. The chunk kernel's phases (each lane's fma chain over its slice of a K row and
// the 8-lane butterfly; the softmax, which every warp computes and warp 0 stores; each lane's fma
// chain over its V rows and the reductions across lane groups and warps) spent most of their
// time storing and reloading lane arrays, and the softmax ran four times (docs/performance.md).
// With an execution context that offers it (X::kRowMajorDecode: the CPU's avx2 and avx3
// variants), the chunk kernel computes these phases row by row instead (x.decode_scores,
// x.decode_softmax, x.decode_values: DecodeRowForm in decode/rows.hpp), reading K and V where they
// are (no ring), with every stored value computed by the same operations in the same order as the
// lane that stores it on the GPU: the lane's fma chain, the butterflies with each lane's own
// value first, the project's exp, the fixed reductions (the lane path's reduce-scatter after
// P x V adds some pairs with the other operand first, Note [epilogue reduce-scatter]: the same
// bits, IEEE addition being commutative, NaN payloads aside). So the bits are the lane path's (tested
// against it on the CPU with LOCKSTEP_CPU_DECODE_LANES=1, and CUDA == CPU on the GPU). The
// kernel's arithmetic is written a second time, beside it, over the CPU backend's SIMD vocabulary
// (Note [row forms] in row_form.hpp): the price of a CPU decode that reads its cache at a useful
// fraction of the DRAM's bandwidth.
LOCKSTEP_FLAG_TRAIT(has_row_major_decode, kRowMajorDecode)  // hd.hpp
template <class X>
inline constexpr bool row_major_decode_v = has_row_major_decode<X>::value;
template <class X>
LOCKSTEP_HD bool row_major_decode(const X& x) {
  if constexpr (row_major_decode_v<X>) return x.row_major_decode();
  else return false;
}

// Note [fused append]
// flash_decoding appends each row's new K/V at its position p and attends p + 1 tokens. With
// async tiles (NS >= 2) the chunk kernel does both, one launch instead of a scatter and the
// attention: in the block whose chunk holds token p (the row's last), the ring tile that holds
// row p is filled by two copies with disjoint lanes, that row from k_new / v_new and the rows
// before it from the cache (Note [async tiles]); the block of the kv head's first subgroup also
// stores the new rows into the cache. No block reads cache row p in that launch, so the store
// races with nothing; the arithmetic reads the values the scatter would have written, so the
// bits are those of a scatter followed by the attention (tested), and the loops that read the
// tiles are unchanged. A variant without async tiles (a test reference) gets a separate
// KvScatter launch first.

// Note [softmax per warp]
// The chunk kernel's softmax (phase 2: each head's chunk max m_c, the weights exp(s - m_c) and
// their sum l_c) with G >= 4 heads per block is computed for head g by warp g % 4 alone: lane l
// takes scores 8 l .. 8 l + 7, its max and its sum in order, and the 32-lane butterflies reduce
// them. Against every warp computing every head and warp 0 storing (as the kernels with 1 and 2
// heads per block still do): the same operations in the same order per head, so the same bits
// (tested: CUDA == CPU, and the CPU's row-major path against its lane path), for a quarter of
// the exps and shuffles per warp between the K and the V tiles. Measured (three alternating
// rounds): flash_decoding B=1 L=32768 0.0708-0.0712 ms against 0.0712-0.0715, B=128
// L=2048 0.5078-0.5082 against 0.5091-0.5098, incremental B=1 and B=32 unchanged.

// Grid: x = chunk, y = kv head * (H / Hkv / G) + subgroup, z = row (rows beyond 65535 loop).
// Each block reads its chunk of K and V once for the G query heads it serves.
// Note [row batches]: RB 16-row groups of K (or V) rows are loaded before any is used. With the
// ring of async tiles (Note [async tiles]) the loads in flight are the ring's, and the registered
// kernels take RB = 1 (16-row tiles in a ring of 4), or RB = 2 with one query head per block at
// head_dim 128 (32-row tiles in a ring of 3), whose shared memory allows no deeper ring.

// Note [one grid]: blocks per SM of the default chunk kernels alone on sm_90 (the lesser of what
// their registers, from ptxas, and their shared memory allow), which their one-grid kernels are
// held to with a second launch bound: unbounded, ptxas gave the chunk and merge code together
// 113-168 registers where the chunk kernel alone has 96-128 (3 blocks per SM instead of 4 at
// head_dim 128 with 4 heads per block). Shared memory is what limits one head per block at head_dim
// 128 (53 KB: 4 blocks) and head_dim 256 (70 and 78 KB: 3 and 2). Held to the bound, three rarely
// used variants spill 8-24 bytes per thread (ptxas: head_dim 64 with 8 and 2 heads per block, 96
// with 1; before Note [softmax per warp], 32 with 4 and 8 instead of 64 with 8); the
// head_dim-128 ones and the rest spill nothing.
constexpr int decode_chunk_blocks_per_sm(int D, int G) {
  switch (D) {
    case 32: return G == 8 ? 5 : G == 4 ? 6 : 7;
    case 64: return G == 8 ? 4 : G == 4 ? 6 : G == 2 ? 7 : 8;
    case 96: return G == 4 ? 5 : G == 2 ? 6 : 7;
    case 128: return G == 2 ? 5 : 4;
    default: return G == 2 ? 2 : 3;
  }
}

// Note [softmax per warp]: with the softmax split across warps ptxas gave the chunk kernels of
// 4 and 8 heads per block more registers (168 instead of 128 at head_dim 128 with 4 heads: 3
// blocks per SM instead of 4); they are held to the blocks per SM they had before
// (decode_chunk_blocks_per_sm) by a launch bound, except at head_dim 96, where the bound of 5
// blocks spilled 8 bytes per thread (ptxas) and the kernel keeps its 123 registers (4 blocks).
template <bool Bound, int N>
struct DecodeChunkBound {};
template <int N>
struct DecodeChunkBound<true, N> {
  static constexpr int kMinBlocks = N;
};

// Note [async tiles]
// With NS >= 2 stages, a block streams its chunk's K and then V tiles of 16 * RB rows through a
// ring of NS tiles in shared memory, filled by asynchronous copies (cp.async on the GPU) that run
// NS - 1 tiles ahead of the arithmetic: the first V tiles are in flight while the chunk's softmax
// is computed, and no registers hold loads in flight. The arithmetic reads the same values in the
// same order as loads straight into registers would, so the bits do not depend on NS or the tile
// rows (tested over the registered variants); rows past the length are zero-filled, never read.
//
// Note [streamed tiles]
// The ring's copies of the cache carry an L2 eviction policy (x.l2_policy, x.copy4_async_stream),
// p.kv_l2_policy: evict-first when the K and V that the call may read are more than the device's
// L2 holds (launch_decode's kv_l2_policy), else evict-unchanged. Read once and larger than the
// L2, they can be there for no later call; marked evict-first they leave the rest of the L2 alone.
// Measured (three rounds each against the same library without a policy): incremental B=1
// L=32768 0.0669-0.0683 ms instead of 0.0691-0.0700 (86.0-86.5% of the read ceiling), flash B=1
// -2%, B=32 L=4096 -2%, B=128 L=2048 +1%, MHA B=32 unchanged; the chunk kernel's blocks stream
// faster (per-block timestamps: median 26.8 us, 28.7 without), not the merge. The read pattern alone (ReadTiles) is as fast under evict-first,
// evict-unchanged or no policy as the read ceiling's kernel, so the policy does not raise the
// ceiling; under evict-normal it is 12-14% slower, and the decode 5-8%. Below the
// L2's size the cache can stay in the L2 between calls: evict-first cost whisper-tiny (1.4 MB)
// 16-19%, hence evict-unchanged there. A hint changes where lines live in the L2,
// never the bytes read (Attention.DecodeL2PoliciesGiveTheSameBytes, on cuda:0).
// ptxas 13.0 broke hinted copies in DecodeOneGrid's chunk blocks: the unrolled loop that issues
// the ring's first NS tiles came out as LDGSTS through a descriptor register that nothing set
// (an illegal instruction; ReadTiles' copies likewise until its ring slots were made
// constants), and again in the float chunk kernel with launch bounds once the format branches
// (Note [decode formats]) changed its code. Those blocks (DecodeOneGrid's, and the chunk
// kernel's for a float cache) issue the first tiles by a loop that is not unrolled
// (chunk_block<RolledFirstTiles = true>), and every copy then names a descriptor that the kernel
// computes; for the other formats the rolled loop is what ptxas 13.0 broke (16 kernels), so
// theirs stays unrolled. tools/gpu/check_descriptors.py checks a build's SASS for such copies
// (docs/kernels.md rule 7b).
// Prefetching the rest of the chunk into the L2 (cp.async.bulk.prefetch.L2) in the grid's last
// wave, so that its reads queue while other blocks still stream, measured slower on an H100
// (B = 1 L = 32768: 0.0948 ms with the last block prefetching, 0.117 with all, 0.0941 with
// none): the ring of NS tiles in flight per block is what the kernel keeps.
// Note [wide tiles]
// A tile of 16 RB rows of 1- or 2-byte codes holds a quarter or half of a float tile's bytes, so
// a block has that much less in flight. At head_dim 128, the Tuning decode.wide_tiles multiplies
// the rows per tile by 4 / bytes (RB 2 or 4, 4 or 8 for one head per block), the float tiles'
// bytes and the same shared memory. RB is a schedule choice (the same bits, tested:
// Attention.DecodeWideTilesGiveTheSameBytes).
// C: the cache's format (Note [decode formats] in params.hpp); the ring holds its codes.
template <int D, int G, int RB, int NS, class C = float>
struct DecodeChunk
    : DecodeChunkBound<(NS == 4 && G >= 4 && D != 96 && std::is_same_v<C, float>), decode_chunk_blocks_per_sm(D, G)> {
  static_assert(D % 32 == 0 && D <= 256, "head_dim: a multiple of 32, at most 256");
  static_assert(G * D <= 512, "accumulators per thread: G * D / 8 <= 64");
  static constexpr const char* kName = "decode_chunk";
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kHeads = G;       // query heads per block
  static constexpr int kQuads = D / 32;  // 16-byte vectors per lane per row (8 lanes per row)
  // Row batches: a loop that uses each load before issuing the next waits one memory round
  // trip per 16 rows and leaves the DRAM idle at low occupancy (B = 1, GQA). Each row's
  // arithmetic and the order of every sum are those of the one-group loop whatever RB is: RB is
  // a schedule choice and gives the same bits (tested).
  static constexpr int kRowBatch = RB;
  static_assert(16 % RB == 0, "row batches: a divisor of the 16 row groups of a chunk");
  static constexpr bool kOverlapsPrior = true;  // Note [overlapped launches] (kernels/launch.hpp)
  static constexpr int kStages = NS;
  static_assert(NS >= 2, "async stages: at least 2 (Note [async tiles])");
  static constexpr int kTileRows = 16 * RB;
  static constexpr int kTiles = kDecodeChunk / kTileRows;  // K tiles, then as many V tiles
  using Cache = C;
  static_assert(std::is_same_v<C, float> || is_format_v<C>, "a cache format");
  static constexpr int kRowWords = D * int(sizeof(C)) / 4;  // 4-byte words per cache row
  static constexpr int kTileWords = kTileRows * kRowWords;
  static constexpr int kPieces = kTileWords / 4;  // 16-byte copies per tile
  static constexpr bool kWholeCopies = kPieces % kThreads == 0;
  using Params = DecodeParams;

  // Starts the copy of tile j (K tiles 0 .. kTiles - 1, then V) into ring slot j % NS; rows at or
  // past `live` are zero-filled. Past the last tile: an empty group, so that every thread
  // commits one group per step and async_wait<NS - 1> always means "tile j has landed".
  // Note [fused append]: the tile that holds row nrow (>= 0) takes that row from kn (K) or vn
  // (V), the others from the cache, by two copies with disjoint lanes; its rows past nrow are
  // past the length (nrow is the row's last token) and left unwritten, never read. Where the new
  // token's format is not the cache's (Note [decode formats]), its row is quantized and stored
  // into the slot by plain stores instead (ks, vs: K's and V's scales, or 0 for none); they are
  // visible with the copies after the same async_wait and sync.
  template <class X>
  LOCKSTEP_HD static void issue_tile(X& x, float* ring, const C* kb, const C* vb, int j, int live, int nrow,
                                     const void* kn, const void* vn, int act_format, float ks, float vs,
                                     std::uint64_t policy) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    if (j < 2 * kTiles) {
      const float* src = reinterpret_cast<const float*>(j < kTiles ? kb : vb);
      const int row0 = (j % kTiles) * kTileRows;
      float* dst = ring + (j % NS) * kTileWords;
      if (nrow >= row0 && nrow < row0 + kTileRows) {  // block-uniform
        const void* fresh = j < kTiles ? kn : vn;
        constexpr int kRowPieces = kRowWords / 4;
        const int a = (nrow - row0) * kRowPieces;  // the new row's first 16-byte piece
        const bool direct = std::is_same_v<C, float> && act_format == kActF32;
        LOCKSTEP_UNROLL
        for (int v0 = 0; v0 < kPieces; v0 += kThreads) {
          const I v = x.thread() + v0;
          const B in = v < kPieces;
          x.copy4_async_some(dst, v * 4, src, v * 4 + row0 * kRowWords, in & (v < a));
          if (direct)
            x.copy4_async_some(dst, v * 4, static_cast<const float*>(fresh), (v - a) * 4,
                               in & (v >= a) & (v < a + kRowPieces));
        }
        if (!direct) {
          const float s = j < kTiles ? ks : vs;
          C* row = reinterpret_cast<C*>(dst) + (nrow - row0) * D;
          for (int d0 = 0; d0 < D; d0 += kThreads) {
            const I d = x.thread() + d0;
            const B ok = d < D;
            F val = load_act(x, fresh, act_format, d, ok);
            if (s != 0.0f) val = val / s;
            x.store(row, d, val, ok);
          }
        }
      } else {
        const int lim = (live - row0) * (kRowWords / 4);  // 16-byte pieces of the tile's live rows
        LOCKSTEP_UNROLL
        for (int v0 = 0; v0 < kPieces; v0 += kThreads) {
          const I v = x.thread() + v0;
          if constexpr (kWholeCopies) {
            x.copy4_async_stream(dst, v * 4, src, v * 4 + row0 * kRowWords, v < lim, policy);  // Note [streamed tiles]
          } else {
            x.copy4_async_some(dst, v * 4, src, v * 4 + row0 * kRowWords, (v < kPieces) & (v < lim));
          }
        }
      }
    }
    x.async_commit();
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    x.wait_prior_grids();
    x.allow_dependent_grids();
    const BlockAt c{x.block_x(), x.block_y(), x.block_z(), x.grid_y(), x.grid_z()};
    // Note [streamed tiles]: a float cache's first tiles by a rolled loop on the GPU.
    chunk_block<!X::kIsCpu && std::is_same_v<C, float>>(x, p, c);
  }

  // Note [row-major decode]: the chunk's phases on the CPU device, row by row
  // (decode/rows.hpp). q of another format than float is widened first, and the new token's row
  // (t == nrow) is given as the floats of the codes the cache holds (Note [decode formats]).
  template <class X>
  static void chunk_rows(X& x, const Params& p, float* S, float* P, int r, int h0, int chunk,
                         const C* kb, const C* vb, int live, int nrow, const void* kn,
                         const void* vn, float scale, float ks, float vs) {
    const float* q[G];
    float* po[G];
    float* ml[G];
    alignas(64) float qw[G][D];
    alignas(64) float fresh[2][D];
    for (int g = 0; g < G; ++g) {
      const std::int64_t head = std::int64_t{r} * p.H + h0 + g;
      if (p.act_format == kActF32) {
        q[g] = static_cast<const float*>(p.q) + head * D;
      } else {
        for (int d = 0; d < D; ++d) qw[g][d] = act_value(p.q, p.act_format, head * D + d);
        q[g] = qw[g];
      }
      po[g] = p.part_o + (head * p.max_chunks + chunk) * D;
      ml[g] = p.part_ml + (head * p.max_chunks + chunk) * 2;
    }
    const float* fk = nullptr;
    const float* fv = nullptr;
    if (nrow >= 0) {
      if (std::is_same_v<C, float> && p.act_format == kActF32) {
        fk = static_cast<const float*>(kn);
        fv = static_cast<const float*>(vn);
      } else {
        for (int d = 0; d < D; ++d) {
          fresh[0][d] = stored_value(act_value(kn, p.act_format, d), ks);
          fresh[1][d] = stored_value(act_value(vn, p.act_format, d), vs);
        }
        fk = fresh[0];
        fv = fresh[1];
      }
    }
    x.template decode_scores<G, D, kDecodeChunk>(S, kb, nrow, fk, live, q, scale, vb);
    x.template decode_softmax<G, kDecodeChunk>(S, P, ml);
    x.template decode_values<G, D, kDecodeChunk>(P, vb, nrow, fv, live, po, kb + kDecodeChunk * D);
  }
  // One activation value as float (host code of the CPU device).
  static float act_value(const void* base, int fmt, std::int64_t i) {
    if (fmt == kActF16) return to_float(static_cast<const half*>(base)[i]);
    if (fmt == kActBF16) return to_float(static_cast<const bfloat16*>(base)[i]);
    return static_cast<const float*>(base)[i];
  }
  // The value the cache holds for x (its code, widened), scale s or 0 for none.
  static float stored_value(float v, float s) {
    if constexpr (std::is_same_v<C, float>) {
      return v;
    } else {
      return to_float(from_float<C>(s != 0.0f ? v / s : v));
    }
  }

  // The work of chunk block c (Note [one grid]: also a block of DecodeOneGrid). Out of line on
  // the CPU, so that the chunk kernel and its one-grid kernels share one copy per SIMD variant.
  // The K and V copies take p's L2 policy (Note [streamed tiles]); RolledFirstTiles: the
  // ring's first tiles are issued by a loop that is not unrolled (DecodeOneGrid's and the float
  // cache's chunk blocks on the GPU, Note [streamed tiles]: ptxas 13.0's broken encodings).
  template <bool RolledFirstTiles = false, class X>
  LOCKSTEP_HD_OUTLINED_ON_CPU static void chunk_block(X& x, const Params& p, const BlockAt c) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    using Q4 = decltype(x.load4(static_cast<const C*>(p.k), x.lane(), x.lane() < 0));
    float* S = x.template shared<float>(G * kDecodeChunk);   // scores
    float* P = x.template shared<float>(G * kDecodeChunk);   // exp(score - chunk max)
    float* O = x.template shared<float>(kWarps * G * D);     // per-warp partial outputs
    float* ring = x.template shared<float>(ring_words());  // Note [async tiles]
    const std::uint64_t policy = x.l2_policy(p.kv_l2_policy);  // Note [streamed tiles]
    const int by = c.y;
    const int group = p.H / p.Hkv;
    const int subgroups = group / G;
    const int hk = by / subgroups;
    const int h0 = hk * group + (by % subgroups) * G;  // first query head served
    const int chunk = c.x;
    const I lane = x.lane();
    const I l8 = lane & 7;                 // lane within the 8 lanes that share a row
    const I row_in_iter = x.warp() * 4 + (lane >> 3);  // 16 rows per block iteration
    // Note [decode formats]: an fp8 cache's scales of this kv head (0: none), K's in the scores.
    const float ks = p.kv_scales != nullptr ? x.load_uniform(p.kv_scales + hk) : 0.0f;
    const float vs = p.kv_scales != nullptr ? x.load_uniform(p.kv_scales + p.Hkv + hk) : 0.0f;
    const float scale = p.kv_scales != nullptr ? p.scale * ks : p.scale;

    int merge_r = -1;  // Note [folded merge]: the row this block merges, if any
    for (int r = c.z; r < p.rows; r += c.gz) {
      const int len = row_length(x, p, r);
      const int t0 = chunk * kDecodeChunk;
      // Note [block signals]: every chunk block signals its (row, block y) counter once.
      std::int32_t* const counter =
          p.counters != nullptr ? p.counters + (std::int64_t{r} * c.gy + by) * 2 : nullptr;
      // Note [device positions], with the append (Note [fused append]).
      if (p.status != nullptr && chunk == 0 && by == 0) {
        const int raw = raw_length(x, p, r);
        if (raw < 0 || raw > p.max_len) x.status_max(p.status, r + 1);
      }
      if (t0 >= len) {  // block-uniform: this chunk is past the sequence
        if (counter != nullptr && finish_row(x, p, counter)) merge_r = r;
        continue;
      }
      const int slot = p.slots != nullptr ? x.load_uniform(p.slots + r) : r;
      const std::int64_t kv_off = slot * p.slot_stride + hk * p.head_stride + std::int64_t{t0} * D;
      const C* kb = static_cast<const C*>(p.k) + kv_off;
      const C* vb = static_cast<const C*>(p.v) + kv_off;
      const int live = static_cast<int>(imin(len - t0, kDecodeChunk));
      // Note [fused append]: this chunk ends the row, so it holds the new token, row live - 1,
      // which its tiles take from k_new / v_new.
      const bool appends = p.k_new != nullptr && t0 + live == len;
      [[maybe_unused]] const int nrow = appends ? live - 1 : -1;
      const std::int64_t new_off = (std::int64_t{r} * p.Hkv + hk) * D;
      [[maybe_unused]] const void* kn = appends ? act_at(p.k_new, p.act_format, new_off) : nullptr;
      [[maybe_unused]] const void* vn = appends ? act_at(p.v_new, p.act_format, new_off) : nullptr;
      // Note [row-major decode]: the CPU's path reads the rows where they are, without the ring.
      const bool row_major = row_major_decode<X>(x);
      if (!row_major) {
        if constexpr (RolledFirstTiles) {  // Note [streamed tiles]: DecodeOneGrid's blocks
          LOCKSTEP_NO_UNROLL
          for (int j = 0; j < NS; ++j) issue_tile(x, ring, kb, vb, j, live, nrow, kn, vn, p.act_format, ks, vs, policy);
        } else {
          LOCKSTEP_UNROLL
          for (int j = 0; j < NS; ++j) issue_tile(x, ring, kb, vb, j, live, nrow, kn, vn, p.act_format, ks, vs, policy);
        }
      }
      if (appends && by % subgroups == 0) {  // one block per kv head writes the cache
        const std::int64_t dst = kv_off + std::int64_t{nrow} * D;
        for (int d0 = 0; d0 < D; d0 += kThreads) {
          const I d = x.thread() + d0;
          const B ok = d < D;
          F kv = load_act(x, kn, p.act_format, d, ok);
          F vv = load_act(x, vn, p.act_format, d, ok);
          if (ks != 0.0f) kv = kv / ks;
          if (vs != 0.0f) vv = vv / vs;
          x.store(static_cast<C*>(p.k_append) + dst, d, kv, ok);
          x.store(static_cast<C*>(p.v_append) + dst, d, vv, ok);
        }
      }

      if constexpr (row_major_decode_v<X>) {
        if (row_major) {
          chunk_rows(x, p, S, P, r, h0, chunk, kb, vb, live, nrow, kn, vn, scale, ks, vs);
          if (counter != nullptr && finish_row(x, p, counter)) merge_r = r;
          continue;
        }
      }

      // q of the G heads, in the lane layout of the K rows: lane l8 holds floats
      // (qd * 8 + l8) * 4 .. +3 of each row.
      typename X::template Lanes<float> qv[G][kQuads][4];
      LOCKSTEP_UNROLL
      for (int g = 0; g < G; ++g) {
        const std::int64_t q0 = (std::int64_t{r} * p.H + h0 + g) * D;
        const auto put = [&](int qd, const auto& t) {
          qv[g][qd][0] = t.x;
          qv[g][qd][1] = t.y;
          qv[g][qd][2] = t.z;
          qv[g][qd][3] = t.w;
        };
        LOCKSTEP_UNROLL
        for (int qd = 0; qd < kQuads; ++qd) {  // Note [decode formats]: a block-uniform branch
          const I off = (l8 + qd * 8) * 4;
          if (p.act_format == kActF16) put(qd, x.load4(static_cast<const half*>(p.q) + q0, off));
          else if (p.act_format == kActBF16) put(qd, x.load4(static_cast<const bfloat16*>(p.q) + q0, off));
          else put(qd, x.load4(static_cast<const float*>(p.q) + q0, off));
        }
      }

      // Phase 1: scores. Each group of 8 lanes takes one row; a warp 4 rows; the block 16. The
      // loads of kRowBatch such 16-row groups are issued before any is used (Note [row batches]).
      for (int it = 0; it < kDecodeChunk; it += 16 * kRowBatch) {
        // K rows from the ring slot of tile it / kTileRows (rows numbered from the tile's
        // first).
        x.template async_wait<NS - 1>();
        x.sync();
        const C* kt = reinterpret_cast<const C*>(ring + (it / kTileRows % NS) * kTileWords);
        const int kt_row0 = it;
        Q4 kq[kRowBatch][kQuads];
        LOCKSTEP_UNROLL
        for (int b = 0; b < kRowBatch; ++b) {
          const I tl = row_in_iter + (it + 16 * b);
          const B ok = tl < live;
          LOCKSTEP_UNROLL
          for (int qd = 0; qd < kQuads; ++qd)
            kq[b][qd] = x.load4(kt, (tl - kt_row0) * D + (l8 + qd * 8) * 4, ok);
        }
        LOCKSTEP_UNROLL
        for (int b = 0; b < kRowBatch; ++b) {
          const I tl = row_in_iter + (it + 16 * b);
          const B ok = tl < live;
          F dot[G];
          LOCKSTEP_UNROLL
          for (int g = 0; g < G; ++g) dot[g] = 0.0f;
          LOCKSTEP_UNROLL
          for (int qd = 0; qd < kQuads; ++qd) {
            LOCKSTEP_UNROLL
            for (int g = 0; g < G; ++g)  // one expression: one pass over the lanes on the CPU
              dot[g] = x.fma(qv[g][qd][3], kq[b][qd].w,
                             x.fma(qv[g][qd][2], kq[b][qd].z,
                                   x.fma(qv[g][qd][1], kq[b][qd].y,
                                         x.fma(qv[g][qd][0], kq[b][qd].x, dot[g]))));
          }
          LOCKSTEP_UNROLL
          for (int g = 0; g < G; ++g) {
            const F s = x.template warp_sum<8>(dot[g]) * scale;
            x.store(S, tl + g * kDecodeChunk, x.select(ok, s, -kInf), l8 == 0);
          }
        }
        x.sync();  // every warp is done with the slot before it is refilled
        issue_tile(x, ring, kb, vb, it / kTileRows + NS, live, nrow, kn, vn, p.act_format, ks, vs, policy);
      }
      x.sync();

      // Phase 2: chunk max and sum per head. Note [softmax per warp]: with at least as many heads
      // as warps, warp w computes heads w, w + kWarps, ...; with fewer, every warp computes every
      // head and warp 0 stores.
      constexpr bool kSplit = G >= kWarps;
      LOCKSTEP_UNROLL
      for (int k = 0; k < (kSplit ? G / kWarps : G); ++k) {
        const I g = x.warp() * (kSplit ? 1 : 0) + k * (kSplit ? kWarps : 1);
        const B writes = x.warp() < (kSplit ? kWarps : 1);
        const I sg = g * kDecodeChunk + lane * 8;  // this lane's 8 scores of head g
        F m = -kInf;
        for (int i = 0; i < kDecodeChunk / kWarpSize; ++i) m = x.max(m, x.load(S, sg + i));
        m = x.warp_max(m);
        const B empty = m == -kInf;
        F l = 0.0f;
        for (int i = 0; i < kDecodeChunk / kWarpSize; ++i) {
          const F e = x.select(empty, 0.0f, x.exp(x.load(S, sg + i) - m));
          x.store(P, sg + i, e, writes);
          l = l + e;
        }
        l = x.warp_sum(l);
        float* ml = p.part_ml + ((std::int64_t{r} * p.H + h0) * p.max_chunks + chunk) * 2;
        x.store(ml, g * (p.max_chunks * 2) + lane, x.select(lane == 0, m, l), writes & (lane < 2));
      }
      x.sync();

      // Phase 3: P x V. Lane layout as in phase 1; each lane accumulates its 16 rows.
      F acc[G][kQuads][4];
      LOCKSTEP_UNROLL
      for (int g = 0; g < G; ++g)
        LOCKSTEP_UNROLL
        for (int qd = 0; qd < kQuads; ++qd)
          LOCKSTEP_UNROLL
          for (int j = 0; j < 4; ++j) acc[g][qd][j] = 0.0f;
      for (int it = 0; it < kDecodeChunk; it += 16 * kRowBatch) {
        x.template async_wait<NS - 1>();
        x.sync();
        const C* vt = reinterpret_cast<const C*>(ring + ((kTiles + it / kTileRows) % NS) * kTileWords);
        const int vt_row0 = it;
        Q4 vq[kRowBatch][kQuads];
        F pg[kRowBatch][G];
        LOCKSTEP_UNROLL
        for (int b = 0; b < kRowBatch; ++b) {
          const I tl = row_in_iter + (it + 16 * b);
          const B ok = tl < live;
          LOCKSTEP_UNROLL
          for (int g = 0; g < G; ++g) pg[b][g] = x.load(P, tl + g * kDecodeChunk);
          LOCKSTEP_UNROLL
          for (int qd = 0; qd < kQuads; ++qd)
            vq[b][qd] = x.load4(vt, (tl - vt_row0) * D + (l8 + qd * 8) * 4, ok);
        }
        LOCKSTEP_UNROLL
        for (int b = 0; b < kRowBatch; ++b)  // rows in increasing order, as one group at a time
          LOCKSTEP_UNROLL
          for (int qd = 0; qd < kQuads; ++qd)
            LOCKSTEP_UNROLL
            for (int g = 0; g < G; ++g) {
              acc[g][qd][0] = x.fma(pg[b][g], vq[b][qd].x, acc[g][qd][0]);
              acc[g][qd][1] = x.fma(pg[b][g], vq[b][qd].y, acc[g][qd][1]);
              acc[g][qd][2] = x.fma(pg[b][g], vq[b][qd].z, acc[g][qd][2]);
              acc[g][qd][3] = x.fma(pg[b][g], vq[b][qd].w, acc[g][qd][3]);
            }
        x.sync();
        issue_tile(x, ring, kb, vb, kTiles + it / kTileRows + NS, live, nrow, kn, vn, p.act_format, ks, vs, policy);
      }
      // The 4 row groups of a warp (lanes l8, l8 + 8, l8 + 16, l8 + 24), then the 4 warps.
      // Note [epilogue reduce-scatter]: element (g, qd, j) of the warp's sum is
      // (a0 + a8) + (a16 + a24), the accumulators of lanes l8, l8 + 8, l8 + 16 and l8 + 24, as
      // the butterflies a + shfl_xor(a, 8), then a + shfl_xor(a, 16) give it on lane l8. Those
      // butterflies took two shuffles per accumulator (128 per lane at head_dim 128 with 4
      // heads), and a block's four warps shuffled for about 1 us at the end of every chunk
      // (measured by per-block timestamps; the shuffle pipe does one warp per clock). Here the four row groups
      // split the work by j: over lane bit 3, row groups 0 and 2 keep j = 0, 1 and send j = 2, 3
      // (1 and 3 the reverse), adding what they receive; over lane bit 4, they keep one j of
      // their two. Row group r ends with j = 2 (r & 1) + (r >> 1) of every (g, qd): each element
      // is the same two additions of the same pairs (IEEE addition is commutative, so which
      // operand comes first does not change the bits: NaN payloads aside, as everywhere,
      // docs/numerics.md), for a quarter of the shuffles' results and 48 shuffles per lane
      // instead of 128. Every lane stores its quarter: G * kQuads stores instead of 4 G kQuads on
      // a quarter of the lanes.
      {
        const B hi1 = ((lane >> 3) & 1) == 1;  // keeps j = 2, 3 (else 0, 1)
        const B hi2 = ((lane >> 4) & 1) == 1;  // keeps the second of its two
        const I jj = x.select(hi1, lane * 0 + 2, lane * 0) + x.select(hi2, lane * 0 + 1, lane * 0);
        LOCKSTEP_UNROLL
        for (int g = 0; g < G; ++g)
          LOCKSTEP_UNROLL
          for (int qd = 0; qd < kQuads; ++qd) {
            F s1[2];
            LOCKSTEP_UNROLL
            for (int jl = 0; jl < 2; ++jl) {
              const F lo = acc[g][qd][jl], hi = acc[g][qd][jl + 2];
              s1[jl] = x.select(hi1, hi, lo) + x.shfl_xor(x.select(hi1, lo, hi), 8);
            }
            const F s2 = x.select(hi2, s1[1], s1[0]) + x.shfl_xor(x.select(hi2, s1[0], s1[1]), 16);
            x.store(O, (x.warp() * G + g) * D + (l8 + qd * 8) * 4 + jj, s2);
          }
      }
      x.sync();
      LOCKSTEP_UNROLL
      for (int g = 0; g < G; ++g) {
        float* po = p.part_o + ((std::int64_t{r} * p.H + h0 + g) * p.max_chunks + chunk) * D;
        for (int d0 = 0; d0 < D; d0 += kThreads) {
          const I d = x.thread() + d0;
          const B ok = d < D;
          F o = x.load(O, g * D + d, ok, 0.0f);
          LOCKSTEP_UNROLL
          for (int w = 1; w < kWarps; ++w) o = o + x.load(O, (w * G + g) * D + d, ok, 0.0f);
          x.store(po, d, o, ok);
        }
      }
      x.sync();  // S, P and O are reused by the next row
      if (counter != nullptr && finish_row(x, p, counter)) merge_r = r;
    }
    // Note [folded merge]: after the loop, whose invariants (addresses, lane indices) then no
    // longer hold registers: inside it, the merge raised the kernel from 128 to 168 registers at
    // head_dim 128 with 4 heads per block (3 blocks per SM instead of 4), or spilled under a
    // bound of 128; here ptxas keeps 128 with no spills. The host folds only when every block
    // has one row (rows <= 65535), so at most one row is left to merge.
    if (merge_r >= 0) {  // block-uniform
      const auto sm = FoldMerge::carve(ring);
      FoldMerge::template merge_heads<G>(x, p, merge_r, h0, 0, sm);
    }
  }

  // The ring, in floats: NS tiles, and room for the folded merge's arrays (Note [folded merge]).
  static constexpr std::size_t ring_words() {
    const std::size_t tiles = std::size_t{NS} * kTileWords;
    return tiles > DecodeMerge<D, (D / 16 / G > 1 ? D / 16 / G : 1)>::kCarvedFloats
               ? tiles
               : DecodeMerge<D, (D / 16 / G > 1 ? D / 16 / G : 1)>::kCarvedFloats;
  }
  static constexpr std::size_t kSharedBytes =
      (2 * G * kDecodeChunk + kWarps * G * D + ring_words()) * sizeof(float) + 96;

  // Note [folded merge]: the merge that the last chunk block of a (row, block y) runs.
  // Its batch: the G heads' partials of a one-batch row are loaded together (G * MB * 4 = D / 4
  // floats per thread), so the merge waits for one round trip, not G. (A batch of 16 / G, 64
  // floats, made the head_dim-64 kernel 96 registers instead of 64 and whisper-tiny 6% slower.)
  using FoldMerge = DecodeMerge<D, (D / 16 / G > 1 ? D / 16 / G : 1)>;
  static_assert(FoldMerge::kThreads == kThreads && FoldMerge::kSlices == 1, "a merge block is a chunk block");


  // Signals the row's counter (Note [block signals]); with p.fold (Note [folded merge]), returns
  // whether this block brought it to max_chunks and so merges the row.
  template <class X>
  LOCKSTEP_HD static bool finish_row(X& x, const Params& p, std::int32_t* counter) {
    if (p.fold != 0) return x.signal_last(counter, p.max_chunks);
    x.signal(counter);
    return false;
  }
};

}  // namespace lockstep::kernels
