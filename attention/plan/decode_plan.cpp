#include "decode_plan.hpp"

#include <algorithm>

#include "lockstep/kernels/decode/params.hpp"

namespace lockstep::plan {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

DecodePlan plan_decode(const DeviceCaps& caps, const DecodeProblem& pr, const Tuning& tuning) {
  const DecodeTuning& t = tuning.decode;
  DecodePlan p;
  const int D = static_cast<int>(pr.head_dim);
  const std::int64_t group = pr.heads / pr.kv_heads;
  // Query heads per block: more reuse of each K/V byte against more registers per thread. Each
  // head's arithmetic does not depend on this choice (same bits).
  const int limit = std::clamp(t.max_heads_x_dim, 32, 512);
  for (int cand : {8, 4, 2}) {
    if (group % cand == 0 && cand * D <= limit) {
      p.heads_per_block = cand;
      break;
    }
  }
  const int g = p.heads_per_block;
  // The chunk kernels: async tiles of 16 rows in a ring of 4 (Note [async tiles]); one head per
  // block at head_dim 128: 32-row tiles in a ring of 3 (both measured).
  if (D == 128 && g == 1) {
    p.row_batch = 2;
    p.stages = 3;
  }
  // Note [wide tiles] (kernels/decode/chunk.hpp): at head_dim 128, a cache of 1- or 2-byte codes in
  // tiles of the float tiles' bytes, 4 / bytes times the rows.
  const unsigned code_bytes = format_bytes(pr.cache);
  if (D == 128 && code_bytes < 4 && t.wide_tiles.value_or(false)) p.row_batch *= static_cast<int>(4 / code_bytes);
  p.max_chunks = static_cast<std::int32_t>(std::max<std::int64_t>(1, ceil_div(pr.max_len, kernels::kDecodeChunk)));
  const auto rows_grid = static_cast<std::uint32_t>(std::min<std::int64_t>(pr.rows, 65535));
  p.chunk_grid = Dim3{static_cast<std::uint32_t>(p.max_chunks), static_cast<std::uint32_t>(pr.kv_heads * (group / g)),
                      rows_grid};
  p.merge_grid = Dim3{static_cast<std::uint32_t>(pr.heads), rows_grid, 1};
  p.workspace_floats = std::size_t(pr.rows) * std::size_t(pr.heads) * std::size_t(p.max_chunks) * std::size_t(D + 2);
  p.block_signals = t.block_signals;
  p.counter_ints = p.block_signals ? 1 + std::size_t(pr.rows) * std::size_t(pr.heads / g) * 2 : 0;

  // Note [streamed tiles]: evict-first when the call's K and V exceed the L2.
  if (t.l2_policy) {
    p.l2_policy = *t.l2_policy;
  } else if (caps.l2_bytes > 0) {
    const std::uint64_t bytes = pr.kv_tokens * std::uint64_t(pr.kv_heads) * std::uint64_t(D) * 2 * format_bytes(pr.cache);
    p.l2_policy = bytes > caps.l2_bytes ? L2Policy::kEvictFirst : L2Policy::kUnchanged;
  }

  // Note [folded merge]: the chunk kernel merges (one launch). It needs the signals and one row
  // per block; by default only small merges fold (rows of one merge batch with G heads x chunks
  // <= 8 per merging block), since larger folded merges cost device time.
  if (p.block_signals && pr.rows <= 65535) {
    const int fold_batch = (512 / D) * std::max(D / 16 / g, 1);  // the folded DecodeMerge's kBatch
    p.fold_merge = t.fold_merge.value_or(p.max_chunks <= fold_batch && g * p.max_chunks <= 8);
  }
  // Note [merge schedule]: at head_dim 128, fewer merge blocks than multiprocessors (B = 1): 4
  // slices per head, a 128-chunk row in one round trip; otherwise a batch just large enough for
  // the cache's rows, so that few loads are masked off. The same bits for every choice.
  if (D == 128) {
    if (std::int64_t{p.merge_grid.x} * p.merge_grid.y < caps.multiprocessors) {
      p.merge = DecodeMergeKind::kSliced;
      p.merge_grid.x *= 4;
    } else if (p.max_chunks <= 8) {
      p.merge = DecodeMergeKind::kBatch2;
    } else if (p.max_chunks <= 16) {
      p.merge = DecodeMergeKind::kBatch4;
    }
  }
  // Note [one grid]: off by default on every device (it saves host time on an eager call and
  // costs device time on a captured step); registered for float caches only.
  if (!p.fold_merge && p.block_signals && pr.cache == Format::f32 && t.one_grid.value_or(false)) {
    const std::int64_t chunk_blocks =
        std::int64_t{p.chunk_grid.x} * p.chunk_grid.y * std::min<std::int64_t>(pr.rows, 65535);
    const std::int64_t merge_blocks = std::int64_t{p.merge_grid.x} * p.merge_grid.y;
    if (chunk_blocks + merge_blocks <= 0x7fffffff) {
      p.one_grid = true;
      // The merge batches are registered as one grid with 4 heads per block only.
      if (g != 4 && (p.merge == DecodeMergeKind::kBatch2 || p.merge == DecodeMergeKind::kBatch4)) p.merge = DecodeMergeKind::kPlain;
    }
  }
  p.launches = pr.rows == 0 ? 0 : (p.fold_merge || p.one_grid) ? 1 : 2;
  return p;
}

}  // namespace lockstep::plan
