#pragma once
// The decode schedule as a pure function (docs/architecture.md, "Plans"): which chunk kernel,
// which merge, how many launches and how much workspace one decode call takes, from the device's
// capabilities, the call's shape and the Tuning. No GPU, stream or buffer is needed to ask, so
// the choices are unit-tested as tables on made-up devices (tests/test_plans.cpp).

#include <cstddef>
#include <cstdint>

#include "lockstep/device.hpp"
#include "lockstep/formats.hpp"
#include "lockstep/tuning.hpp"

namespace lockstep::plan {

struct DecodeProblem {
  std::int64_t rows = 0;      // query rows (sequences) of the call
  std::int64_t heads = 0;     // query heads
  std::int64_t kv_heads = 0;  // divides heads
  std::int64_t head_dim = 0;  // 32, 64, 96, 128 or 256
  std::int64_t max_len = 0;   // the cache's capacity in tokens: the chunks of a row's partials
  // K/V tokens the call may read, summed over rows (an upper bound where lengths live on the
  // device): with the L2's size, the chunk kernel's L2 policy.
  std::uint64_t kv_tokens = 0;
  // The cache's format (Note [decode formats]): its bytes per token, and one grid is float only.
  Format cache = Format::f32;
};

// The chunk kernel: DecodeChunk<head_dim, heads_per_block, row_batch, stages>.
// The merge: DecodeMerge<head_dim> (kPlain), its 4-slice form for few merge blocks (kSliced), or
// the 2- and 4-chunk merge batches at head_dim 128 (kBatch2, kBatch4). Note [merge schedule].
enum class DecodeMergeKind : std::uint8_t { kPlain, kSliced, kBatch2, kBatch4 };

struct DecodePlan {
  int heads_per_block = 1;  // query heads per chunk block (G)
  int row_batch = 1;        // 16-row groups per tile (RB)
  int stages = 4;           // async tiles in the ring (NS)
  DecodeMergeKind merge = DecodeMergeKind::kPlain;
  bool fold_merge = false;  // the chunk kernel merges: one launch (Note [folded merge])
  bool one_grid = false;    // chunk and merge as one DecodeOneGrid launch (Note [one grid])
  bool block_signals = true;
  L2Policy l2_policy = L2Policy::kUnchanged;
  std::int32_t max_chunks = 1;  // kDecodeChunk-token chunks per row
  Dim3 chunk_grid, merge_grid;  // merge_grid: the merge kernel's own (slices included)
  int launches = 0;             // kernel launches the call enqueues
  std::size_t workspace_floats = 0;  // partial outputs and (max, sum) pairs
  std::size_t counter_ints = 0;      // the stream's zeroed counters: the ticket, then the pairs
};

// Throws nothing for a shape the public calls accept (they validate first).
DecodePlan plan_decode(const DeviceCaps& caps, const DecodeProblem& problem, const Tuning& tuning);

}  // namespace lockstep::plan
