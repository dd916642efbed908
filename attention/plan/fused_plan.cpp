#include "fused_plan.hpp"

#include <algorithm>

namespace lockstep::plan {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Note [split keys] (kernels/fused/common.hpp): with options.batch_invariant = false, Exact's
// small grids split each query tile's key tiles into S ranges, one block each, the last of them
// merging. S depends on the grid's size (batch x heads x query tiles), so the bytes then depend
// on the batch: the design's rule for split-K (a fixed chunk, never a split count from the batch
// or the occupancy) holds only for the default, batch_invariant = true, which never splits. S is
// a function of the shape alone (kSplitRuleMultiprocessors, not the device's), so the CPU device
// splits where CUDA does, with the same bytes. Exact, whose 64-row blocks are 8 warps at
// head_dim 128 and 4 elsewhere, splits where the grid has fewer than 12 warps per multiprocessor,
// into S = min(8, key tiles / 4, 2 x 4 x multiprocessors / blocks) ranges (measured: whisper-tiny's
// 144 blocks, S = 6, 0.171 ms against 0.236-0.239 without; at least 8 key tiles, 4 per range).
int exact_splits(const FusedTuning& t, int D, std::int64_t blocks, std::int64_t skv, bool batch_invariant) {
  if (t.exact_splits) return *t.exact_splits;
  if (batch_invariant) return 1;
  constexpr std::int64_t sms = kSplitRuleMultiprocessors;
  const std::int64_t warps = D == 128 ? 8 : 4;  // FusedAttentionExact<D>::kThreads / 32
  if (blocks * warps >= 12 * sms) return 1;
  const std::int64_t key_tiles = ceil_div(skv, D <= 128 ? 64 : 32);
  const std::int64_t n = std::min<std::int64_t>({8, key_tiles / 4, 2 * 4 * sms / blocks});
  return static_cast<int>(std::max<std::int64_t>(n, 1));
}
}  // namespace

FusedPlan plan_fused(const DeviceCaps& caps, const FusedProblem& pr, const Tuning& tuning) {
  const FusedTuning& t = tuning.fused;
  FusedPlan p;
  if (pr.seq_q == 0) return p;
  const int D = static_cast<int>(pr.head_dim);
  const std::int64_t sms = std::max(1, caps.multiprocessors);
  const std::int64_t B = pr.batch, H = pr.heads, Hkv = pr.kv_heads, Sq = pr.seq_q, Skv = pr.seq_kv;
  const std::int64_t blocks64 = ceil_div(Sq, 64) * H * B;  // at 64 query rows per block
  const auto grid_for = [&](int rows, int splits) {
    return Dim3{static_cast<std::uint32_t>(ceil_div(Sq, rows) * splits), static_cast<std::uint32_t>(H),
                static_cast<std::uint32_t>(B)};
  };

  if (!pr.tensor_core) {
    p.kv_splits = Skv > 0 ? exact_splits(t, D, blocks64, Skv, pr.batch_invariant) : 1;
    if (p.kv_splits > 1) {  // Note [split keys]: [B, H, S, Sq, D] o, then [B, H, S, Sq, 1 + KG] (m, l)
      const std::size_t part_rows = std::size_t(B) * std::size_t(H) * std::size_t(p.kv_splits) * std::size_t(Sq);
      p.workspace_bytes = part_rows * (std::size_t(D) + 17) * sizeof(float);
      p.counter_ints = std::size_t(1 + blocks64);
    }
    // Exact at head_dim 64 keeps P in K's memory (four blocks per SM) or gives it a buffer of its
    // own (three blocks, one barrier fewer per tile: Note [exact tile pipeline]): the latter
    // where the grid fits in three blocks per multiprocessor (whisper-tiny: 0.241 vs 0.255 ms).
    p.kernel = D == 64 && t.exact_separate_p.value_or(blocks64 * p.kv_splits <= 3 * sms) ? FusedKernel::kExactSeparateP
                                                                                           : FusedKernel::kExact;
    p.grid = grid_for(64, p.kv_splits);
    p.launches = 1;
    return p;
  }

  // Note [packing blocks]: K and V rounded by the wgmma kernel's own blocks at head_dim 64 for
  // grids of two waves or more (16x16x1024x64 causal: 0.267-0.272 ms against 0.280-0.281 with
  // the mma.sync kernel; slower at head_dim 128 and on small grids).
  const bool pack_in_kernel = t.pack_in_kernel.value_or(D == 64 && blocks64 >= 2 * sms);
  // Note [wgmma products]: the warpgroup-product kernel at head_dim 64 and 128 where it is built
  // for the device: at head_dim 128 (B4 H32 L4096: 3.43 ms instead of 4.41), and at 64 for grids
  // under two waves or with packing blocks. tuning.fused.wgmma = true runs it wherever it can,
  // the CPU device's emulation included.
  bool wgmma = false;
  if ((D == 64 || D == 128) && t.wgmma.value_or(true)) {
    if (caps.simulated)
      wgmma = t.wgmma.value_or(false);
    else if (caps.warpgroup_mma)
      wgmma = t.wgmma.value_or(false) || D == 128 || blocks64 < 2 * sms || pack_in_kernel;
  }
  // The wgmma kernel's warpgroups per block: two (128 rows sharing each K/V tile) at head_dim 128
  // where the grid at 64 rows is under two waves, else one.
  const auto warpgroups = [&](std::int64_t blocks) {
    return t.wgmma_warpgroups.value_or(D == 128 && blocks < 2 * sms ? 2 : 1);
  };
  const bool packing_blocks = wgmma && pack_in_kernel;
  // Note [split keys]: TensorCore splits only when the tuning asks; not with packing blocks.
  p.kv_splits = Skv > 0 && !packing_blocks ? t.tc_splits : 1;
  if (Skv > 0) {
    const std::int64_t skv_packed = wgmma ? ceil_div(Skv, 64) * 64 : Skv;
    const std::size_t half_bytes = std::size_t(B) * std::size_t(Hkv) * std::size_t(skv_packed) * std::size_t(D) * 2;
    const std::size_t part_rows =
        p.kv_splits > 1 ? std::size_t(B) * std::size_t(H) * std::size_t(p.kv_splits) * std::size_t(Sq) : 0;
    p.workspace_bytes = 2 * half_bytes + part_rows * (std::size_t(D) + 2) * sizeof(float);
    if (p.kv_splits > 1) p.counter_ints = std::size_t(1 + blocks64);
  }
  if (wgmma) {
    p.kernel = FusedKernel::kWgmma;
    const bool serial_ok = D == 64 && t.wgmma_serial;
    if (packing_blocks && Skv > 0) {
      p.warpgroups = warpgroups(blocks64);
      const std::int64_t tiles = ceil_div(Sq, 64 * p.warpgroups) * H * B;
      if (tiles <= 0x7fffffff) {
        p.pack = FusedPack::kInKernel;
        p.serial = serial_ok && p.warpgroups == 1;
        p.deferred = p.serial && t.wgmma_deferred;
        p.rows_per_block = 64 * p.warpgroups;
        p.pack_ahead = static_cast<int>(std::min<std::int64_t>(t.pack_ahead, Hkv));
        p.counter_ints = std::size_t(2 + 2 * B * Hkv);
        p.grid = Dim3{static_cast<std::uint32_t>(tiles), 1, 1};
        p.launches = 2;
        return p;
      }
    }
    if (Skv > 0) p.pack = FusedPack::kTiledLaunch;
    p.warpgroups = warpgroups(blocks64 * p.kv_splits);
    p.serial = serial_ok && p.warpgroups == 1;
    p.deferred = p.serial && t.wgmma_deferred;
    p.rows_per_block = 64 * p.warpgroups;
  } else {
    if (Skv > 0) p.pack = FusedPack::kLaunch;
    // TensorCore at head_dim 64-128 can take 128 query rows per block (two m-tiles per warp
    // sharing each K and V fragment) instead of 64: faster at head_dim 128 when the grid fills
    // two waves of two blocks per multiprocessor (B4 H32 L4096: 4.42 vs 5.12-5.18 ms), slower at
    // head_dim 64.
    const std::int64_t blocks128 = ceil_div(Sq, 128) * H * B * p.kv_splits;
    const bool two_tiles = D >= 64 && D <= 128 && t.tc_rows.value_or(D == 128 && blocks128 >= 2 * 2 * sms ? 128 : 64) == 128;
    p.kernel = two_tiles ? FusedKernel::kTensorCoreTwoTiles : FusedKernel::kTensorCore;
    p.rows_per_block = two_tiles ? 128 : 64;
  }
  p.grid = grid_for(p.rows_per_block, p.kv_splits);
  p.launches = (p.pack == FusedPack::kNone ? 0 : 1) + 1;
  return p;
}

}  // namespace lockstep::plan
