#pragma once
// The decode family's parameters (DecodeParams) and what its kernels share: the fixed chunk,
// device positions, block signals. Single-token decode attention, split-K over fixed chunks of
// the KV cache (Flash-Decoding), for any number of sequences and grouped-query attention.
//
// Note [fixed split size]
// A sequence's cache is cut into chunks of kDecodeChunk = 256 tokens, whatever the batch, the
// device or its occupancy. DecodeChunk computes, per chunk and query head, the chunk's max score
// m_c, the sum l_c of exp(score - m_c) and the unnormalized output o_c = sum exp(score - m_c) v;
// DecodeMerge combines the chunks of one sequence in a fixed order (Note [merge order]: strided
// groups of chunks, each in increasing order, then the groups in order). Every sum has a fixed order
// that depends only on the sequence's own length, so a sequence's output is bitwise the same
// alone or in any batch (batch invariance), and incremental_attention and flash_decoding, which
// both run these two kernels, agree bit for bit.
//
// Cache layout (per layer): [slots, kv_heads, max_len, head_dim]; a query row r attends slot
// slots[r] (or r), kv head h / (H / Hkv), tokens [0, length). Tokens at or beyond the length are
// never read.

#include <type_traits>

#include "lockstep/kernels/act.hpp"

namespace lockstep::kernels {

inline constexpr int kDecodeChunk = 256;

// Note [inline positions]
// Up to kInlineRows per-row ints from the host (flash_decoding's and KvCache::append's positions)
// travel in the launch's parameters instead of device memory: no host-to-device copy is enqueued
// before the launch, one call fewer on the host (a pageable copy costs several microseconds
// there). Row r reads v[r] when count > 0; more rows than kInlineRows are staged in device memory.
inline constexpr int kInlineRows = 128;
struct InlineInts {
  std::int32_t count;  // 0: not used
  std::int32_t v[kInlineRows];
};

struct DecodeParams {
  const void* q;                // [rows, H, D] in act_format
  const void* k;                // cache base (a layer's K), in the chunk kernel's cache format
  const void* v;                // cache base (a layer's V)
  const std::int32_t* lengths;  // [rows] tokens to attend (+ length_bias); null: every row uses `length`
  const std::int32_t* slots;    // [rows] cache slot of each row; null: row r uses slot r
  float* part_o;                // [rows, H, max_chunks, D]
  float* part_ml;               // [rows, H, max_chunks, 2]: chunk max, chunk sum
  void* out;                    // [rows, H, D] in act_format
  std::int64_t slot_stride;     // elements between slots
  std::int64_t head_stride;     // elements between kv heads (max_len * D)
  std::int32_t rows, H, Hkv, max_chunks;
  std::int32_t length;          // when lengths is null
  float scale;                  // 1 / sqrt(D); times K's scale per kv head with kv_scales
  // Note [decode formats]: q, out, k_new and v_new are float (0), half (1) or bfloat16 (2)
  // (lockstep::Format); kv_scales: null, or [2, Hkv] floats on the device, K's scales then V's
  // (fp8 caches).
  std::int32_t act_format;
  const float* kv_scales;
  // Device-side positions (Note [device positions]): lengths[r] + length_bias tokens, and a
  // row whose length falls outside [0, max_len] attends nothing (zeros).
  std::int32_t length_bias;
  std::int32_t max_len;
  // Note [block signals]: null, or [rows, H / heads_per_block, 2] zeros that the chunk kernel
  // counts up and the merge resets; heads_per_block is the chunk kernel's G.
  std::int32_t* counters;
  std::int32_t heads_per_block;
  // Note [one grid]: a zero that DecodeOneGrid's blocks take their tickets from (and its last
  // ticket resets); unused by the other kernels.
  std::int32_t* ticket;
  // Note [folded merge]: 1: the last chunk block of each (row, block y) merges its heads (a chunk
  // kernel with async tiles, counters set and one row per block: rows <= 65535); no merge launch.
  std::int32_t fold;
  // Note [fused append]: null, or each row's new token, [rows, Hkv, D] (flash_decoding): the
  // row's last attended token (index length - 1) is taken from here, not from the cache, and
  // written into the cache (k_append, v_append: p.k and p.v, writable). status: null, or raised
  // to 1 + each row whose length falls outside [0, max_len] (as KvScatterParams::status).
  const void* k_new;
  const void* v_new;
  void* k_append;
  void* v_append;
  std::int32_t* status;
  InlineInts inline_lengths;  // when lengths is null and count > 0 (Note [inline positions])
  // Note [streamed tiles]: the L2 policy of the chunk kernel's K and V copies (kL2Unchanged,
  // kL2EvictFirst; kL2EvictNormal for measurements).
  std::int32_t kv_l2_policy;
  // Note [one grid]: 1: DecodeOneGrid's blocks take their ticket after the wait for the prior
  // grid (the stream's counters were just zeroed by a fill); 0: before it.
  std::int32_t ticket_after_wait;
};

// Note [block signals]
// The merge of a row's head needs every chunk of that row and kv head, not the whole chunk
// grid. With counters, each chunk block signals its (row, block y) counter once its partials are
// written, or at once when its chunk is past the row's length (x.signal: a release, then an
// atomic add), and each merge block waits for its counter to reach max_chunks, the chunk grid's
// width (x.wait_signals), instead of waiting for the chunk kernel to finish
// (x.wait_prior_grids, which it calls at its very end instead): with programmatic launch, the
// merges of heads whose chunks are done run while the last chunks are still being read. The
// merge reads the row's length after its wait, so that read is ordered after the chunk blocks'
// (which follow their own wait for the kernels that wrote it). This cannot deadlock: merge blocks are
// scheduled only once every chunk block has started (each chunk block allows dependent grids
// after its own wait, Note [overlapped launches]); without programmatic launch, and on the CPU,
// the merge kernel starts after the chunk kernel and never waits (in DecodeOneGrid, Note [one
// grid], merge blocks do wait, on both, behind tickets). Each waiting block takes a ticket
// (an atomic add on the pair's second word, in flight while it merges); the last of the G * S
// blocks that read a counter resets the pair at the end of its row (x.release_signals), so the
// counters are zeros again for the next call on the stream (the next kernel waits for this
// merge). Only when and where the merge runs changes: never its arithmetic.

// Note [device positions]
// flash_decoding with positions in device memory (a step that a CUDA graph can replay) reads
// each row's position p there: the scatter writes the new token at p and the attention covers
// p + 1 tokens. The host cannot check p, so the kernels do: a p outside [-1, max_len) writes
// nothing and attends nothing (the row's output is zeros), and the kernel that appends records
// the row in a status word: status = max(status, 1 + row), an atomic maximum, so that with several
// such rows the word holds the highest, whichever block runs first (a plain store left the row
// to the blocks' order: ThreadSanitizer reported the two stores on the CPU device). -1 is a done
// slot.
// position + length_bias wraps as the GPU's add does, where a signed overflow would be undefined
// (a device position of INT32_MAX gives INT32_MIN: out of range like any other).
LOCKSTEP_HD int add_wrapping(int a, int b) {
  return static_cast<int>(static_cast<unsigned>(a) + static_cast<unsigned>(b));
}
template <class X>
LOCKSTEP_HD int raw_length(X& x, const DecodeParams& p, int r) {  // before the range check
  if (p.lengths != nullptr) return add_wrapping(x.load_uniform(p.lengths + r), p.length_bias);
  if (p.inline_lengths.count > 0) return add_wrapping(p.inline_lengths.v[r], p.length_bias);
  return p.length;
}
template <class X>
LOCKSTEP_HD int row_length(X& x, const DecodeParams& p, int r) {
  if (p.lengths == nullptr && p.inline_lengths.count == 0) return p.length;
  const int len = raw_length(x, p, r);
  return (len < 0 || len > p.max_len) ? 0 : len;
}

// Note [decode formats]
// The cache holds codes of one format C (float, half, bfloat16, fp8 e4m3 or e5m2: a template
// parameter of the chunk and scatter kernels); q, out and the new tokens are float, half or
// bfloat16 (act_format, read at run time where a row starts: a block-uniform branch outside the
// loops over the cache). Arithmetic is float: a load widens a code exactly, a store rounds once.
// An fp8 cache holds x / s per kv head (s: K's or V's scale, kv_scales): the append stores
// from_float<C>(x / s) (one IEEE division, then the format's rounding), and attention applies s
// where it costs one multiplication per row and head instead of one per element: the scores are
// (q . k_code) * (scale * s_k), the output (sum p v_code / l) * s_v. Equal to dequantizing each
// code (code * s) in exact arithmetic; in float, each product is rounded in another place, the
// same place on both backends. Without scales (float, half and bfloat16 caches) no multiplication
// is made, so those formats' bits are those of widened codes. The activation helpers
// (load_act, store_act, act_at) are in kernels/act.hpp.

// A block's coordinates in its (chunk) grid: its own block index, or the one its ticket gives in
// DecodeOneGrid (Note [one grid]).
struct BlockAt {
  int x, y, z;  // block
  int gy, gz;   // grid extents in y and z
};

}  // namespace lockstep::kernels
