#pragma once
// Schedule choices (docs/api.md, "Tuning"). A Tuning says which kernel variant a call runs and
// how its grid is cut; the plans (attention/plan/) turn it, the device's capabilities and the
// shape into a launch. Every field is a schedule choice: the results are the same bits whatever
// its value (each is held to that by a test), except where a field says otherwise.
//
// Which Tuning a call uses, first match wins:
//   1. the call's own options (AttentionOptions::tuning);
//   2. the innermost TuningScope alive on the calling thread;
//   3. the device's default, Device::tuning(): the defaults below, with the overrides of the
//      LOCKSTEP_TUNING environment variable applied once, when the device is opened.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep {

// The L2 policy of the decode chunk kernel's K and V loads (Note [streamed tiles]).
enum class L2Policy : std::int8_t { kUnchanged = 0, kEvictFirst = 1, kEvictNormal = 2 };

struct DecodeTuning {
  // The chunk kernel and the merge as one grid (Note [one grid]). Unset: two launches.
  std::optional<bool> one_grid;
  // The merge inside the chunk kernel (Note [folded merge]). Unset: only small merges.
  std::optional<bool> fold_merge;
  // false: the merge waits for the whole chunk kernel instead of each block's signal (Note
  // [block signals]).
  bool block_signals = true;
  // Unset: evict-first when the call's K and V exceed the L2, else unchanged.
  std::optional<L2Policy> l2_policy;
  // The most query heads x head_dim one chunk block computes (32..512): more reuse of each K/V
  // byte against more registers per thread.
  int max_heads_x_dim = 512;
  // Head_dim 128 with a cache of 1- or 2-byte codes: tiles of as many bytes as a float cache's
  // (Note [wide tiles]). Unset: off.
  std::optional<bool> wide_tiles;
};

struct FusedTuning {
  // Exact at head_dim 64: P in a buffer of its own (Note [exact tile pipeline]). Unset: where
  // the grid fits in three blocks per multiprocessor.
  std::optional<bool> exact_separate_p;
  // Exact's key ranges per query tile (Note [split keys]; 1..16; the bytes then depend on the
  // split). Unset: from the grid's size when options.batch_invariant is false, else none. Set: that
  // many whatever batch_invariant says (a test and measurement setting).
  std::optional<int> exact_splits;
  // TensorCore (mma.sync) rows per block at head_dim 64..128: 64 or 128. Unset: 128 at head_dim
  // 128 for grids of two waves or more.
  std::optional<int> tc_rows;
  // TensorCore key ranges per query tile (1..16; Note [split keys]). Not with packing blocks.
  int tc_splits = 1;
  // The warpgroup-product kernel (Note [wgmma products]). Unset: on sm_90a builds on compute
  // capability 9.0 where it is faster. true on the CPU device runs its emulation.
  std::optional<bool> wgmma;
  // wgmma warpgroups per block, 1 or 2. Unset: 2 at head_dim 128 for grids under two waves.
  std::optional<int> wgmma_warpgroups;
  // K and V rounded to fp16 by the attention's own blocks (Note [packing blocks]) instead of a
  // packing launch. Unset: at head_dim 64 for grids of two waves or more.
  std::optional<bool> pack_in_kernel;
  // With packing blocks: kv heads packed ahead (1..16).
  int pack_ahead = 8;
  // Head_dim 64, one warpgroup: Note [four wgmma blocks per SM]'s kernel, and within it Note
  // [deferred P.V wait]'s order.
  bool wgmma_serial = true;
  bool wgmma_deferred = true;
};

struct Tuning {
  DecodeTuning decode;
  FusedTuning fused;

  // "decode.one_grid=1, fused.wgmma=0, ...": every field by its name above (blanks around items,
  // names and values are ignored), booleans as 0|1,
  // unset optionals as "auto", the L2 policy as unchanged|evict_first|evict_normal|auto. Applies
  // the settings to *this in order; a name or value it does not take is InvalidArgument naming
  // `what`, the setting and the values it takes, and leaves *this unchanged.
  void apply(std::string_view settings, std::string_view what = "tuning");
  // The settings that differ from a default Tuning, in apply()'s syntax ("" for the defaults).
  std::string str() const;
  // Throws InvalidArgument naming the first field outside its range (calls check it too).
  void check(std::string_view where) const;
};

// Sets the Tuning of every call on this thread that passes none of its own, while it lives.
// Scopes nest; each must be destroyed on the thread that created it, innermost first.
class TuningScope {
 public:
  explicit TuningScope(const Tuning& tuning);
  ~TuningScope();
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;

 private:
  Tuning tuning_;
  const Tuning* outer_;
};

namespace detail {
// The innermost scope's Tuning on this thread, or nullptr.
const Tuning* scoped_tuning() noexcept;
// LOCKSTEP_TUNING applied to the defaults (read when a device is opened).
Tuning tuning_from_environment(std::string_view where);
}  // namespace detail

}  // namespace lockstep
