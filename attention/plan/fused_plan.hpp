#pragma once
// The fused attention schedule as a pure function (docs/architecture.md, "Plans"): which kernel,
// how K and V are rounded for the tensor cores, how many key ranges, the grid and the workspace,
// from the device's capabilities, the shape and the Tuning. Unit-tested as tables on made-up
// devices (tests/test_plans.cpp).

#include <cstddef>
#include <cstdint>

#include "lockstep/device.hpp"
#include "lockstep/tuning.hpp"

namespace lockstep::plan {

struct FusedProblem {
  std::int64_t batch = 1, heads = 1, kv_heads = 1, seq_q = 0, seq_kv = 0, head_dim = 64;
  bool tensor_core = false;     // AttentionPrecision::kTensorCore
  bool batch_invariant = true;  // AttentionOptions::batch_invariant
};

enum class FusedKernel : std::uint8_t {
  kExact,               // FusedAttentionExact<D>
  kExactSeparateP,      // FusedAttentionExact<64, 8, 1> (Note [exact tile pipeline])
  kTensorCore,          // FusedAttentionTensorCore<D> (mma.sync, 64 rows)
  kTensorCoreTwoTiles,  // FusedAttentionTensorCore<D, 2> (128 rows)
  kWgmma,               // FusedAttentionWgmma<D, warpgroups, packing, serial, deferred>
};
// How K and V reach the tensor-core kernel as fp16 (Note [fused tensor-core rounding points]).
enum class FusedPack : std::uint8_t {
  kNone,         // Exact reads fp32 K and V
  kLaunch,       // a FusedHalfPack launch first
  kTiledLaunch,  // a FusedHalfPackTiled launch first (the wgmma kernel's tiles)
  kInKernel,     // the attention's own blocks pack (Note [packing blocks]); a first launch packs
                 // pack_ahead kv heads of batch 0
};

struct FusedPlan {
  FusedKernel kernel = FusedKernel::kExact;
  FusedPack pack = FusedPack::kNone;
  int rows_per_block = 64;  // query rows per block
  int warpgroups = 1;       // kWgmma
  bool serial = false;      // kWgmma at head_dim 64, one warpgroup (Note [four wgmma blocks per SM])
  bool deferred = false;    // and its Note [deferred P.V wait] order
  int pack_ahead = 0;       // kInKernel
  int kv_splits = 1;        // key ranges per query tile (Note [split keys])
  Dim3 grid;                // the attention kernel's (a one-dimensional grid with packing blocks)
  int launches = 0;
  std::size_t workspace_bytes = 0;  // the stream's scratch: fp16 K and V, then split partials
  std::size_t counter_ints = 0;     // the stream's zeroed counters the call takes
};

// The shape is one the public call accepts (it validates first). seq_q == 0 plans nothing.
FusedPlan plan_fused(const DeviceCaps& caps, const FusedProblem& problem, const Tuning& tuning);

// Note [split keys]: Exact's split rule counts multiprocessors of this reference device, not of
// the device it runs on, so that the CPU device splits where CUDA does and the bytes of a
// batch_invariant = false call do not depend on the device.
inline constexpr int kSplitRuleMultiprocessors = 132;

}  // namespace lockstep::plan
