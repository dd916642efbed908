// The plans as tables: plan_decode and plan_fused on made-up devices (no GPU needed), the Tuning
// text form, and which Tuning a call uses (its own, the scope's, the device's).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "decode_plan.hpp"
#include "fused_plan.hpp"
#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/kernels/launch.hpp"
#include "lockstep/lockstep.hpp"
#include "support/backends.hpp"

namespace lockstep {
namespace {

using plan::DecodeMergeKind;
using plan::FusedKernel;
using plan::FusedPack;

DeviceCaps h100() {
  DeviceCaps c;
  c.multiprocessors = 132;
  c.max_shared_bytes_per_block = 227 * 1024;
  c.tensor_cores = true;
  c.compute_capability = 90;
  c.l2_bytes = 50u << 20;
  c.warpgroup_mma = true;
  return c;
}
DeviceCaps h200() {
  DeviceCaps c = h100();
  c.l2_bytes = 60u << 20;
  return c;
}
// An sm_86 part with 16 SMs: no warpgroup products, a 4 MB L2.
DeviceCaps small_gpu() {
  DeviceCaps c;
  c.multiprocessors = 16;
  c.max_shared_bytes_per_block = 99 * 1024;
  c.tensor_cores = true;
  c.compute_capability = 86;
  c.l2_bytes = 4u << 20;
  return c;
}
// The CPU device on a 2-core machine: two workers, no L2 hints, simulated.
DeviceCaps cpu2() {
  DeviceCaps c;
  c.multiprocessors = 2;
  c.max_shared_bytes_per_block = 227 * 1024;
  c.bit_faithful = true;
  c.simulated = true;
  return c;
}

plan::DecodeProblem decode(std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, std::int64_t D,
                           std::int64_t len) {
  return plan::DecodeProblem{rows, heads, kv_heads, D, len, std::uint64_t(rows) * std::uint64_t(len)};
}

struct DecodeRow {
  const char* what;
  DeviceCaps caps;
  plan::DecodeProblem problem;
  int heads_per_block, row_batch, stages;
  DecodeMergeKind merge;
  bool fold;
  int launches;
  L2Policy l2;
  Dim3 chunk_grid, merge_grid;
};

TEST(Plans, DecodeTable) {
  const Tuning t;
  const std::vector<DecodeRow> rows = {
      // GQA 32/8 at head_dim 128: 4 query heads per block (4 x 128 = 512), a 128-chunk row; 32
      // merge blocks < 132 SMs: 4 slices each; 268 MB of K/V > the L2: evict first.
      {"H100 B=1 H32/8 L32768", h100(), decode(1, 32, 8, 128, 32768), 4, 1, 4, DecodeMergeKind::kSliced, false, 2,
       L2Policy::kEvictFirst, {128, 8, 1}, {128, 1, 1}},
      {"H200 B=1 H32/8 L32768", h200(), decode(1, 32, 8, 128, 32768), 4, 1, 4, DecodeMergeKind::kSliced, false, 2,
       L2Policy::kEvictFirst, {128, 8, 1}, {128, 1, 1}},
      // 4096 merge blocks, 8 chunks: the 2-chunk merge batch.
      {"H100 B=128 H32/8 L2048", h100(), decode(128, 32, 8, 128, 2048), 4, 1, 4, DecodeMergeKind::kBatch2, false, 2,
       L2Policy::kEvictFirst, {8, 8, 128}, {32, 128, 1}},
      // 16 chunks: the 4-chunk batch.
      {"H100 B=32 H32/8 L4096 short", h100(), decode(32, 32, 8, 128, 4096), 4, 1, 4, DecodeMergeKind::kBatch4, false,
       2, L2Policy::kEvictFirst, {16, 8, 32}, {32, 32, 1}},
      // MHA at head_dim 128: one head per block, 32-row tiles in a ring of 3; 1 head x 8 chunks
      // per merging block: folded.
      {"H100 MHA B=32 L2048", h100(), decode(32, 32, 32, 128, 2048), 1, 2, 3, DecodeMergeKind::kBatch2, true, 1,
       L2Policy::kEvictFirst, {8, 32, 32}, {32, 32, 1}},
      // whisper-tiny: 6 heads of 64, a 448-token cache: two chunks, folded into one launch.
      {"H100 whisper-tiny", h100(), decode(1, 6, 6, 64, 448), 1, 1, 4, DecodeMergeKind::kPlain, true, 1,
       L2Policy::kUnchanged, {2, 6, 1}, {6, 1, 1}},
      // 16 SMs: 32 merge blocks are two waves, no slices; a 128-chunk row: the plain merge.
      {"small B=1 H32/8 L32768", small_gpu(), decode(1, 32, 8, 128, 32768), 4, 1, 4, DecodeMergeKind::kPlain, false,
       2, L2Policy::kEvictFirst, {128, 8, 1}, {32, 1, 1}},
      // The CPU device: no L2 hints; two workers.
      {"cpu B=1 H32/8 L32768", cpu2(), decode(1, 32, 8, 128, 32768), 4, 1, 4, DecodeMergeKind::kPlain, false, 2,
       L2Policy::kUnchanged, {128, 8, 1}, {32, 1, 1}},
      // GQA 8/1 at head_dim 64: 8 heads per block.
      {"cpu B=2 H8/1 D64 L512", cpu2(), decode(2, 8, 1, 64, 512), 8, 1, 4, DecodeMergeKind::kPlain, false, 2,
       L2Policy::kUnchanged, {2, 1, 2}, {8, 2, 1}},
      // head_dim 256: at most 2 heads per block; 2 heads x 4 chunks: folded.
      {"H100 B=4 H16/4 D256 L1000", h100(), decode(4, 16, 4, 256, 1000), 2, 1, 4, DecodeMergeKind::kPlain, true, 1,
       L2Policy::kUnchanged, {4, 8, 4}, {16, 4, 1}},
  };
  for (const DecodeRow& r : rows) {
    SCOPED_TRACE(r.what);
    const plan::DecodePlan p = plan::plan_decode(r.caps, r.problem, t);
    EXPECT_EQ(p.heads_per_block, r.heads_per_block);
    EXPECT_EQ(p.row_batch, r.row_batch);
    EXPECT_EQ(p.stages, r.stages);
    EXPECT_EQ(p.merge, r.merge);
    EXPECT_EQ(p.fold_merge, r.fold);
    EXPECT_FALSE(p.one_grid);
    EXPECT_EQ(p.launches, r.launches);
    EXPECT_EQ(p.l2_policy, r.l2);
    EXPECT_EQ(p.chunk_grid.x, r.chunk_grid.x);
    EXPECT_EQ(p.chunk_grid.y, r.chunk_grid.y);
    EXPECT_EQ(p.chunk_grid.z, r.chunk_grid.z);
    EXPECT_EQ(p.merge_grid.x, r.merge_grid.x);
    EXPECT_EQ(p.merge_grid.y, r.merge_grid.y);
    const auto& pr = r.problem;
    EXPECT_EQ(p.workspace_floats,
              std::size_t(pr.rows * pr.heads) * std::size_t(p.max_chunks) * std::size_t(pr.head_dim + 2));
    EXPECT_EQ(p.counter_ints, 1 + std::size_t(pr.rows * (pr.heads / p.heads_per_block)) * 2);
  }
}

TEST(Plans, DecodeTuningChangesTheSchedule) {
  const auto pr = decode(128, 32, 8, 128, 2048);
  Tuning t;
  t.decode.one_grid = true;
  plan::DecodePlan p = plan::plan_decode(h100(), pr, t);
  EXPECT_TRUE(p.one_grid);
  EXPECT_EQ(p.launches, 1);
  EXPECT_EQ(p.merge, DecodeMergeKind::kBatch2);  // registered as one grid with 4 heads per block
  // MHA: 1 head per block, whose one-grid pairs are the plain and sliced merges only.
  p = plan::plan_decode(h100(), decode(128, 32, 32, 128, 4096), t);
  EXPECT_TRUE(p.one_grid);
  EXPECT_EQ(p.merge, DecodeMergeKind::kPlain);

  t = Tuning{};
  t.decode.fold_merge = true;
  p = plan::plan_decode(h100(), pr, t);
  EXPECT_TRUE(p.fold_merge);
  EXPECT_EQ(p.launches, 1);
  t.decode.fold_merge = false;
  EXPECT_FALSE(plan::plan_decode(h100(), decode(1, 6, 6, 64, 448), t).fold_merge);

  t = Tuning{};
  t.decode.block_signals = false;  // no counters: neither folded nor one grid, whatever is asked
  t.decode.one_grid = true;
  t.decode.fold_merge = true;
  p = plan::plan_decode(h100(), pr, t);
  EXPECT_EQ(p.counter_ints, 0u);
  EXPECT_FALSE(p.fold_merge);
  EXPECT_FALSE(p.one_grid);
  EXPECT_EQ(p.launches, 2);

  t = Tuning{};
  t.decode.max_heads_x_dim = 256;
  EXPECT_EQ(plan::plan_decode(h100(), pr, t).heads_per_block, 2);
  t.decode.l2_policy = L2Policy::kEvictNormal;
  EXPECT_EQ(plan::plan_decode(cpu2(), pr, t).l2_policy, L2Policy::kEvictNormal);
}

struct FusedRow {
  const char* what;
  DeviceCaps caps;
  plan::FusedProblem problem;
  FusedKernel kernel;
  FusedPack pack;
  int warpgroups;
  bool serial;
  int splits, launches;
  Dim3 grid;
};

plan::FusedProblem fused(std::int64_t b, std::int64_t h, std::int64_t sq, std::int64_t d, bool tc,
                         bool invariant = true) {
  return plan::FusedProblem{b, h, h, sq, sq, d, tc, invariant};
}

TEST(Plans, FusedTable) {
  const Tuning t;
  const std::vector<FusedRow> rows = {
      // head_dim 128 on sm_90a: the wgmma kernel after a tiled packing launch; 8192 blocks: one
      // warpgroup.
      {"H100 TC B4 H32 L4096 D128", h100(), fused(4, 32, 4096, 128, true), FusedKernel::kWgmma,
       FusedPack::kTiledLaunch, 1, false, 1, 2, {64, 32, 4}},
      // A 512-query chunk: 8 x 32 blocks < 2 waves: two warpgroups (128 rows).
      {"H200 TC B1 H32 L512 D128", h200(), fused(1, 32, 512, 128, true), FusedKernel::kWgmma,
       FusedPack::kTiledLaunch, 2, false, 1, 2, {4, 32, 1}},
      // head_dim 64, 4096 blocks: the packing blocks, serial and deferred, one grid dimension.
      {"H100 TC 16x16x1024x64", h100(), fused(16, 16, 1024, 64, true), FusedKernel::kWgmma, FusedPack::kInKernel, 1,
       true, 1, 2, {4096, 1, 1}},
      // whisper-tiny: 144 blocks < 2 waves: the wgmma kernel with a packing launch.
      {"H100 TC whisper-tiny", h100(), fused(1, 6, 1500, 64, true), FusedKernel::kWgmma, FusedPack::kTiledLaunch, 1,
       true, 1, 2, {24, 6, 1}},
      // No warpgroup products: mma.sync; 4096 blocks of 128 rows >= 4 per SM: two m-tiles.
      {"small TC B4 H32 L4096 D128", small_gpu(), fused(4, 32, 4096, 128, true), FusedKernel::kTensorCoreTwoTiles,
       FusedPack::kLaunch, 1, false, 1, 2, {32, 32, 4}},
      {"small TC whisper-tiny", small_gpu(), fused(1, 6, 1500, 64, true), FusedKernel::kTensorCore,
       FusedPack::kLaunch, 1, false, 1, 2, {24, 6, 1}},
      // The CPU device emulates wgmma only when asked.
      {"cpu TC whisper-tiny", cpu2(), fused(1, 6, 1500, 64, true), FusedKernel::kTensorCore, FusedPack::kLaunch, 1,
       false, 1, 2, {24, 6, 1}},
      // Exact at head_dim 64: P in its own buffer where the grid fits three blocks per SM.
      {"H100 Exact whisper-tiny", h100(), fused(1, 6, 1500, 64, false), FusedKernel::kExactSeparateP,
       FusedPack::kNone, 1, false, 1, 1, {24, 6, 1}},
      {"cpu Exact whisper-tiny", cpu2(), fused(1, 6, 1500, 64, false), FusedKernel::kExact, FusedPack::kNone, 1,
       false, 1, 1, {24, 6, 1}},
      // Not batch invariant: whisper-tiny's 144 blocks split into min(8, 24 / 4, 1056 / 144) = 6;
      // 864 blocks are more than three per SM: P shares K's memory.
      {"H100 Exact whisper-tiny split", h100(), fused(1, 6, 1500, 64, false, false), FusedKernel::kExact,
       FusedPack::kNone, 1, false, 6, 1, {144, 6, 1}},
  };
  for (const FusedRow& r : rows) {
    SCOPED_TRACE(r.what);
    const plan::FusedPlan p = plan::plan_fused(r.caps, r.problem, t);
    EXPECT_EQ(p.kernel, r.kernel);
    EXPECT_EQ(p.pack, r.pack);
    EXPECT_EQ(p.warpgroups, r.warpgroups);
    EXPECT_EQ(p.serial, r.serial);
    EXPECT_EQ(p.deferred, r.serial);
    EXPECT_EQ(p.kv_splits, r.splits);
    EXPECT_EQ(p.launches, r.launches);
    EXPECT_EQ(p.grid.x, r.grid.x);
    EXPECT_EQ(p.grid.y, r.grid.y);
    EXPECT_EQ(p.grid.z, r.grid.z);
  }
}

// Note [split keys]: the split count, and so the bytes, of a batch_invariant = false call are
// the same on every device.
TEST(Plans, ExactSplitsDoNotDependOnTheDevice) {
  for (std::int64_t b : {1, 2, 4, 16})
    for (std::int64_t sq : {100, 1500, 4096}) {
      const auto pr = fused(b, 6, sq, 64, false, false);
      const int s = plan::plan_fused(h100(), pr, Tuning{}).kv_splits;
      EXPECT_EQ(plan::plan_fused(cpu2(), pr, Tuning{}).kv_splits, s);
      EXPECT_EQ(plan::plan_fused(small_gpu(), pr, Tuning{}).kv_splits, s);
      EXPECT_EQ(plan::plan_fused(h100(), fused(b, 6, sq, 64, false, true), Tuning{}).kv_splits, 1);
    }
}

TEST(Plans, FusedWorkspace) {
  // TensorCore packs K and V as fp16: 2 x B x Hkv x Skv x D x 2 bytes (Skv rounded up to 64 for
  // the wgmma kernel's tiles).
  const auto pr = fused(1, 6, 1500, 64, true);
  EXPECT_EQ(plan::plan_fused(small_gpu(), pr, Tuning{}).workspace_bytes, 2u * 6 * 1500 * 64 * 2);
  EXPECT_EQ(plan::plan_fused(h100(), pr, Tuning{}).workspace_bytes, 2u * 6 * 1536 * 64 * 2);
  EXPECT_EQ(plan::plan_fused(h100(), fused(1, 6, 0, 64, true), Tuning{}).launches, 0);
  Tuning t;
  t.fused.tc_splits = 3;
  const plan::FusedPlan p = plan::plan_fused(small_gpu(), pr, t);
  EXPECT_EQ(p.kv_splits, 3);
  EXPECT_EQ(p.workspace_bytes, 2u * 6 * 1500 * 64 * 2 + 3u * 6 * 1500 * (64 + 2) * 4);
  EXPECT_EQ(p.grid.x, 24u * 3);
}

TEST(Plans, FusedTuningChangesTheSchedule) {
  Tuning t;
  t.fused.wgmma = true;  // the CPU device's emulation
  EXPECT_EQ(plan::plan_fused(cpu2(), fused(1, 6, 1500, 64, true), t).kernel, FusedKernel::kWgmma);
  EXPECT_EQ(plan::plan_fused(small_gpu(), fused(1, 6, 1500, 64, true), t).kernel, FusedKernel::kTensorCore);
  t.fused.wgmma = false;
  EXPECT_EQ(plan::plan_fused(h100(), fused(4, 32, 4096, 128, true), t).kernel, FusedKernel::kTensorCoreTwoTiles);
  t.fused.tc_rows = 64;
  EXPECT_EQ(plan::plan_fused(h100(), fused(4, 32, 4096, 128, true), t).kernel, FusedKernel::kTensorCore);
  t = Tuning{};
  t.fused.pack_ahead = 3;
  EXPECT_EQ(plan::plan_fused(h100(), fused(16, 16, 1024, 64, true), t).pack_ahead, 3);
  t.fused.wgmma_deferred = false;
  plan::FusedPlan p = plan::plan_fused(h100(), fused(16, 16, 1024, 64, true), t);
  EXPECT_TRUE(p.serial);
  EXPECT_FALSE(p.deferred);
  t.fused.wgmma_warpgroups = 2;
  p = plan::plan_fused(h100(), fused(16, 16, 1024, 64, true), t);
  EXPECT_EQ(p.warpgroups, 2);
  EXPECT_FALSE(p.serial);
  EXPECT_EQ(p.grid.x, 8u * 16 * 16);
  t = Tuning{};
  t.fused.exact_separate_p = false;
  EXPECT_EQ(plan::plan_fused(h100(), fused(1, 6, 1500, 64, false), t).kernel, FusedKernel::kExact);
}

TEST(Tuning, TextFormRoundTrips) {
  Tuning t;
  EXPECT_EQ(t.str(), "");
  t.apply("decode.one_grid=1,fused.wgmma=0,decode.l2_policy=evict_first,fused.pack_ahead=3,fused.tc_rows=128");
  EXPECT_EQ(t.decode.one_grid, std::optional<bool>(true));
  EXPECT_EQ(t.fused.wgmma, std::optional<bool>(false));
  EXPECT_EQ(t.decode.l2_policy, std::optional<L2Policy>(L2Policy::kEvictFirst));
  EXPECT_EQ(t.fused.pack_ahead, 3);
  EXPECT_EQ(t.fused.tc_rows, std::optional<int>(128));
  Tuning u;
  u.apply(t.str());
  EXPECT_EQ(u.str(), t.str());
  u.apply(" decode.one_grid = auto , fused.tc_rows=auto,");
  EXPECT_FALSE(u.decode.one_grid.has_value());
  EXPECT_FALSE(u.fused.tc_rows.has_value());
}

TEST(Tuning, BadSettingsAreRefusedAndChangeNothing) {
  Tuning t;
  t.apply("fused.pack_ahead=4");
  const std::string before = t.str();
  const char* bad[] = {"decode.one_grid=2", "fused.pack_ahead=17", "fused.pack_ahead=0", "fused.tc_rows=96",
                       "nonsense=1", "decode.one_grid", "fused.wgmma_warpgroups=3", "decode.max_heads_x_dim=16",
                       "fused.wgmma=0,decode.l2_policy=sometimes", "fused.exact_splits=17", "fused.tc_rows=100"};
  for (const char* s : bad) {
    SCOPED_TRACE(s);
    try {
      t.apply(s, "test");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("test"), std::string::npos) << e.what();
    }
    EXPECT_EQ(t.str(), before);
  }
  Tuning c;
  c.fused.tc_splits = 0;
  EXPECT_THROW(c.check("x"), InvalidArgument);
  EXPECT_THROW(TuningScope{c}, InvalidArgument);
}

// A call's own Tuning wins over the scope's, which wins over the device's; scopes nest.
TEST(Tuning, TheCallsTheScopesTheDevices) {
  auto dev = make_cpu_device();
  auto& s = dev->default_stream();
  const AttentionShape sh{1, 2, 2, 70, 70, 64};
  const std::size_t n = 2 * 70 * 64;
  Buffer<float> q(dev, n), k(dev, n), v(dev, n), out(dev, n);
  std::vector<float> h(n, 0.25f);
  q.copy_from_host(s, h);
  k.copy_from_host(s, h);
  v.copy_from_host(s, h);
  AttentionOptions o;
  o.precision = AttentionPrecision::kTensorCore;
  const auto ran_wgmma = [&](const AttentionOptions& opts) {
    detail::LaunchRecorder rec;
    attention(s, q, k, v, out, sh, opts);
    return rec.launched(kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false, true>>) ||
           rec.launched(kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false, true>>);
  };
  EXPECT_FALSE(ran_wgmma(o));  // the device's default: no emulation on the CPU
  Tuning wg;
  wg.fused.wgmma = true;
  {
    TuningScope scope(wg);
    EXPECT_TRUE(ran_wgmma(o));
    Tuning off;
    off.fused.wgmma = false;
    {
      TuningScope inner(off);
      EXPECT_FALSE(ran_wgmma(o));
    }
    EXPECT_TRUE(ran_wgmma(o));
    AttentionOptions own = o;
    own.tuning = &off;
    EXPECT_FALSE(ran_wgmma(own));
  }
  AttentionOptions own = o;
  own.tuning = &wg;
  EXPECT_TRUE(ran_wgmma(own));
  Tuning bad;
  bad.fused.pack_ahead = 99;
  own.tuning = &bad;
  out.fill(s, 42.0f);
  const std::uint64_t launches = s.launches();
  {
    detail::LaunchRecorder rec;
    EXPECT_THROW(attention(s, q, k, v, out, sh, own), InvalidArgument);
    EXPECT_TRUE(rec.kernels().empty());
  }
  EXPECT_EQ(s.launches(), launches);
  EXPECT_EQ(out.to_vector(s), std::vector<float>(n, 42.0f));
}

// LOCKSTEP_TUNING is read once, when a device is opened: a device opened before it was set keeps
// its defaults, one opened after takes it, and a bad value refuses the open.
TEST(Tuning, TheEnvironmentIsReadWhenADeviceIsOpened) {
  std::shared_ptr<Device> before, after;
  {
    const testing::ScopedEnv unset("LOCKSTEP_TUNING", nullptr);
    before = make_cpu_device();
  }
  {
    const testing::ScopedEnv one_grid("LOCKSTEP_TUNING", "decode.one_grid=1");
    after = make_cpu_device();
  }
  {
    const testing::ScopedEnv bad("LOCKSTEP_TUNING", "decode.one_grid=yes");
    EXPECT_THROW(make_cpu_device(), InvalidArgument);
  }
  EXPECT_FALSE(before->tuning().decode.one_grid.has_value());
  EXPECT_EQ(after->tuning().decode.one_grid, std::optional<bool>(true));
  EXPECT_EQ(after->tuning().str(), "decode.one_grid=1");
}

}  // namespace
}  // namespace lockstep
