// The decode kernels' schedules on every backend, launched directly: heads per block, tile rings,
// merge batches and slices, signals, the folded merge, one grid, row-major CPU forms and L2
// policies, all giving the same bytes.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/kernels/decode.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

// Note [one grid]: whether a decode whose merge does not fold is one launch on `d`: the Tuning in
// force says (unset: two launches on every device).
bool one_grid_by_default(const Device& d) {
  const Tuning* t = detail::scoped_tuning();
  return (t != nullptr ? *t : d.tuning()).decode.one_grid.value_or(false);
}

// How the merge of run_decode learns that a row's chunks are done: it waits for the whole chunk
// kernel (no counters), or on the stream's counters (Note [block signals]), or it is folded into
// the chunk kernel and not launched (Note [folded merge]), or its blocks follow the chunk blocks
// in one launch and wait on the counters there (Note [one grid]).
enum class DecodeSync { kKernel, kSignals, kFold, kOneGrid };

// Chunk then Merge over `rows` query rows (row r's q is row r of q; every row reads slot 0's
// cache) of length len; with counters, checks that they are zero afterwards. l2_policy: the K/V
// copies' L2 policy (Note [streamed tiles]).
template <class Chunk, class Merge>
std::vector<float> run_decode(Stream& s, const std::shared_ptr<Device>& dev, const Buffer<float>& q,
                              const Buffer<float>& k, const Buffer<float>& v, int H, int Hkv, int L,
                              int len, int rows, DecodeSync sync, int l2_policy = kernels::kL2Unchanged) {
  constexpr int D = Chunk::kQuads * 32;
  const int chunks = (L + kernels::kDecodeChunk - 1) / kernels::kDecodeChunk;
  const std::size_t blocks_y = std::size_t(H / Chunk::kHeads);
  Buffer<float> ws(dev, std::size_t(rows) * H * chunks * (D + 2)), out(dev, std::size_t(rows) * H * D);
  kernels::DecodeParams p{};
  p.q = q.data().get();
  p.k = k.data().get();
  p.v = v.data().get();
  p.part_o = ws.data().get();
  p.part_ml = ws.data().get() + std::size_t(rows) * H * chunks * D;
  p.out = out.data().get();
  p.head_stride = std::int64_t{L} * D;
  p.slot_stride = 0;
  p.rows = rows;
  p.H = H;
  p.Hkv = Hkv;
  p.max_chunks = chunks;
  p.length = len;
  p.max_len = L;
  p.scale = 1.0f / std::sqrt(float(D));
  p.heads_per_block = Chunk::kHeads;
  p.kv_l2_policy = l2_policy;
  // The ticket, then the pairs (as launch_decode lays them out: Note [one grid]).
  const std::size_t counter_ints = 1 + rows * blocks_y * 2;
  bool fresh = false;
  std::int32_t* const counter_base =
      sync != DecodeSync::kKernel ? detail::StreamAccess::counters(s, counter_ints, &fresh) : nullptr;
  p.ticket = counter_base;
  p.counters = counter_base != nullptr ? counter_base + 1 : nullptr;
  p.ticket_after_wait = fresh ? 1 : 0;  // Note [one grid]
  p.fold = sync == DecodeSync::kFold ? 1 : 0;
  if (sync == DecodeSync::kOneGrid) {
    using One = kernels::DecodeOneGrid<Chunk, Merge>;
    if constexpr (kernels::registered_v<One>)
      launch<One>(s, Dim3{std::uint32_t(One::chunk_blocks(p) + One::merge_blocks(p)), 1, 1}, One::kSharedBytes, p);
    else
      ADD_FAILURE() << "no DecodeOneGrid of this chunk kernel and merge in AllKernels";
  } else {
    launch<Chunk>(s, Dim3{std::uint32_t(chunks), std::uint32_t(blocks_y), std::uint32_t(rows)},
                  Chunk::kSharedBytes, p);
  }
  if (sync == DecodeSync::kKernel || sync == DecodeSync::kSignals)
    launch<Merge>(s, Dim3{std::uint32_t(H * Merge::kSlices), std::uint32_t(rows), 1}, Merge::kSharedBytes, p);
  if (counter_base != nullptr) {
    std::vector<std::int32_t> counters(counter_ints, -1);
    detail::StreamAccess::copy_d2h(s, counters.data(), counter_base, counters.size() * sizeof(std::int32_t));
    s.synchronize();
    for (std::size_t i = 0; i < counters.size(); ++i) EXPECT_EQ(counters[i], 0) << "counter " << i;
  }
  return out.to_vector(s);
}

// The decode kernels' schedule choices (heads per block, tile rows, merge batches and slices) move
// loads, never arithmetic: every registered variant gives the same bytes (Note [row batches], Note
// [merge order]), for rows that the merge folds in one batch and in several.
template <class Chunk, class Merge>
std::vector<float> run_decode_variant(Stream& s, const std::shared_ptr<Device>& dev,
                                      const Buffer<float>& q, const Buffer<float>& k,
                                      const Buffer<float>& v, int H, int Hkv, int L, int len) {
  return run_decode<Chunk, Merge>(s, dev, q, k, v, H, Hkv, L, len, 1, DecodeSync::kKernel);
}

template <int D>
struct DecodeInputs {
  Buffer<float> q, k, v;
  DecodeInputs(const std::shared_ptr<Device>& dev, Stream& s, int H, int Hkv, int L, std::uint32_t seed)
      : q(dev, std::size_t(H) * D), k(dev, std::size_t(Hkv) * L * D), v(dev, std::size_t(Hkv) * L * D) {
    Lcg rng{seed};
    for (auto* b : {&q, &k, &v}) b->copy_from_host(s, rng.floats(b->size()));
  }
};

TEST_P(Attention, DecodeScheduleVariantsGiveTheSameBytes) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int L = 9000;
  for (int Hkv : {1, 2}) {
    const int H = 4 * Hkv;
    {
      constexpr int D = 128;
      DecodeInputs<D> in(dev, s(), H, Hkv, L, 12345u + Hkv);
      // One chunk; one merge batch (12 chunks); one batch at 8 chunks per batch but two at 4 (20
      // chunks); several batches (36 chunks).
      for (int len : {1, 3000, 5000, 9000}) {
        SCOPED_TRACE("D 128, Hkv " + std::to_string(Hkv) + ", length " + std::to_string(len));
        // Note [async tiles]: 16-row tiles in a ring of 4 with 4 or 2 query heads per block,
        // 32-row tiles in a ring of 3 with one.
        const auto a = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto b = run_decode_variant<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto c = run_decode_variant<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, b)) << "4 query heads per block vs 2";
        EXPECT_TRUE(same(a, c)) << "4 query heads per block, 16-row tiles vs 1, 32-row tiles";
        // Note [merge schedule]: 4 blocks per head; 2- and 4-chunk batches.
        const auto sl = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto m2 = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 2>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto m4 = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 4>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, sl)) << "merge without slices vs 4 slices";
        EXPECT_TRUE(same(a, m2)) << "merge batch 8 vs 2";
        EXPECT_TRUE(same(a, m4)) << "merge batch 8 vs 4";
        bool finite = true;
        for (float x : a) finite = finite && std::isfinite(x);
        EXPECT_TRUE(finite);
      }
    }
    {
      constexpr int D = 96;  // the merge's 480-thread shape (5 groups); 4, 2 and 1 heads per block
      DecodeInputs<D> in(dev, s(), H, Hkv, L, 777u + Hkv);
      for (int len : {300, 9000}) {
        SCOPED_TRACE("D 96, Hkv " + std::to_string(Hkv) + ", length " + std::to_string(len));
        const auto a = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto b = run_decode_variant<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto c = run_decode_variant<DecodeChunk<D, 1, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, b)) << "4 query heads per block vs 2";
        EXPECT_TRUE(same(a, c)) << "4 query heads per block vs 1";
      }
    }
  }
}

// Note [streamed tiles]: the K/V copies' L2 policy is a cache hint: every policy gives
// evict-unchanged's bytes through the two launches without counters, in the two launches with
// signals and in DecodeOneGrid (whose first tiles are issued by a loop that is not unrolled), for
// rows past and within the length, at head_dim 128 with 4 heads per block and with 1 (32-row
// tiles), and at head_dim 64 (whisper-tiny's kernel).
TEST_P(Attention, DecodeL2PoliciesGiveTheSameBytes) {
  const auto check = [&]<class Chunk>(int H, int Hkv, std::uint32_t seed) {
    constexpr int D = Chunk::kQuads * 32;
    using Merge = kernels::DecodeMerge<D>;
    constexpr int L = 1500;
    DecodeInputs<D> in(dev, s(), H, Hkv, L, seed);
    for (int len : {1500, 700}) {
      SCOPED_TRACE("head_dim " + std::to_string(D) + ", heads per block " + std::to_string(Chunk::kHeads) +
                   ", length " + std::to_string(len));
      const auto ref = run_decode<Chunk, Merge>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kKernel,
                                                kernels::kL2Unchanged);
      for (int policy : {kernels::kL2Unchanged, kernels::kL2EvictFirst, kernels::kL2EvictNormal}) {
        for (auto sync : {DecodeSync::kKernel, DecodeSync::kSignals, DecodeSync::kOneGrid}) {
          const auto got = run_decode<Chunk, Merge>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, sync, policy);
          EXPECT_TRUE(same(ref, got)) << "policy " << policy << ", sync " << int(sync);
        }
      }
    }
  };
  using kernels::DecodeChunk;
  check.template operator()<DecodeChunk<128, 4, 1, 4>>(8, 2, 97u);
  check.template operator()<DecodeChunk<128, 1, 2, 3>>(4, 4, 98u);
  check.template operator()<DecodeChunk<64, 1, 1, 4>>(6, 6, 96u);
}

// Three rows over the same cache (row r's q is row r of in.q): `sync` gives the bytes of the two
// launches with counters (kSignals), whose blocks of different rows run concurrently, and row 0's
// output is `ref`, the single row's.
template <class Chunk, class Merge, class In>
void expect_three_rows(Stream& s, const std::shared_ptr<Device>& dev, const In& in, int H, int Hkv, int L,
                       int len, DecodeSync sync, const std::vector<float>& ref) {
  const auto rows3 = run_decode<Chunk, Merge>(s, dev, in.q, in.k, in.v, H, Hkv, L, len, 3, sync);
  const auto rows3s = run_decode<Chunk, Merge>(s, dev, in.q, in.k, in.v, H, Hkv, L, len, 3, DecodeSync::kSignals);
  const auto same_bits = [](float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); };
  EXPECT_TRUE(rows3.size() == rows3s.size() && std::equal(rows3.begin(), rows3.end(), rows3s.begin(), same_bits))
      << "three rows vs the two launches with signals";
  EXPECT_TRUE(std::equal(ref.begin(), ref.end(), rows3.begin(), same_bits)) << "row 0 of three vs the single row";
}

// Note [block signals]: incremental_attention's merge waits on counters that the chunk blocks
// count up; it gives the bytes of the same kernels without counters (the merge then waits for
// the whole chunk kernel), and leaves the stream's counters zero for the next call, call after
// call (a counter left non-zero would let a later merge read partials before they are written).
TEST_P(Attention, DecodeSignalsGiveTheSameBytesAndLeaveCountersZero) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int D = 128, L = 5000, H = 16, Hkv = 2;  // 8 query heads per kv head: 2 blocks of 4
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 2024u);
  const DecodeShape sh{H, Hkv, D, L};
  Buffer<float> out(dev, std::size_t(H) * D);
  // Note [folded merge]: incremental_attention's chunks are those of its length; with 4 heads per
  // block, up to 2 chunks (G * chunks <= 8) the chunk kernel merges, one launch; more take the
  // separate merge, which waits on the counters: two launches.
  // With the one grid (Note [one grid]; the Tuning decode.one_grid = 1) the merges that do not fold
  // run in the chunk kernel's launch: one launch always.
  const bool one_grid = one_grid_by_default(*dev);
  const Tuning& tuning = detail::scoped_tuning() != nullptr ? *detail::scoped_tuning() : dev->tuning();
  const bool default_schedule = !tuning.decode.fold_merge.has_value() && tuning.decode.block_signals;
  for (int len : {4999, 1, 0, 700, 5000}) {
    SCOPED_TRACE("length " + std::to_string(len));
    const auto launches_before = s().launches();
    incremental_attention(s(), in.q, in.k, in.v, len, out, sh);
    const std::uint64_t expected = (std::max(len, 1) + 255) / 256 <= 2 || one_grid ? 1 : 2;
    if (default_schedule) EXPECT_EQ(s().launches() - launches_before, expected) << "folded merge or one grid: one launch";
    const auto plain = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
    EXPECT_TRUE(same(out.to_vector(s()), plain));
    std::vector<std::int32_t> counters(64, -1);
    auto* c = detail::StreamAccess::counters(s(), counters.size());
    detail::StreamAccess::copy_d2h(s(), counters.data(), c, counters.size() * sizeof(std::int32_t));
    s().synchronize();
    for (std::size_t i = 0; i < counters.size(); ++i) ASSERT_EQ(counters[i], 0) << "counter " << i;
  }
  {
    // One head per block at head_dim 128 (MHA) with 16 chunks: a merge batch of 4 chunks, whose
    // one-grid pair is not registered, so the knob takes the plain merge's (the same bits).
    DecodeInputs<D> mha(dev, s(), 4, 4, 4096, 2025u);
    Buffer<float> o(dev, std::size_t(4) * D);
    const auto launches_before = s().launches();
    incremental_attention(s(), mha.q, mha.k, mha.v, 4000, o, DecodeShape{4, 4, D, 4096});
    if (default_schedule) EXPECT_EQ(s().launches() - launches_before, one_grid ? 1u : 2u) << "MHA, 16 chunks";
    const auto plain = run_decode_variant<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, mha.q, mha.k, mha.v, 4, 4, 4096, 4000);
    EXPECT_TRUE(same(o.to_vector(s()), plain));
  }
  // Several rows of different lengths, one of them done, through flash_decoding, twice.
  KvCacheConfig cfg{.num_layers = 1, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .max_len = 1100, .slots = 3};
  KvCache cache(dev, cfg);
  Lcg rng{77u};
  for (std::int64_t slot : {0, 2}) {
    const std::int64_t n = slot == 0 ? 1000 : 300;
    const auto kh = rng.floats(std::size_t(2) * n * 64), vh = rng.floats(kh.size());
    cache.write_from_host(s(), slot, 0, kh, vh, n);
  }
  cache.mark_done(1);
  Buffer<float> fq(dev, 3 * 8 * 64), fk(dev, 3 * 2 * 64), fv(dev, 3 * 2 * 64), fo(dev, 3 * 8 * 64);
  for (auto* b : {&fq, &fk, &fv}) b->copy_from_host(s(), rng.floats(b->size()));
  for (int step = 0; step < 2; ++step) {
    const auto launches_before = s().launches();
    flash_decoding(s(), cache, 0, fq, fk, fv, std::vector<std::int64_t>{1000 + step, -1, 300 + step}, fo);
    // 5 chunks x 4 heads per block: too large a merge to fold by default (Note [folded merge]);
    // one with the one grid (Note [one grid]; the Tuning decode.one_grid = 1).
    if (default_schedule) EXPECT_EQ(s().launches() - launches_before, one_grid ? 1u : 2u) << "the chunk kernel and the merge";
    std::vector<std::int32_t> counters(64, -1);
    auto* c = detail::StreamAccess::counters(s(), counters.size());
    detail::StreamAccess::copy_d2h(s(), counters.data(), c, counters.size() * sizeof(std::int32_t));
    s().synchronize();
    for (std::size_t i = 0; i < counters.size(); ++i) ASSERT_EQ(counters[i], 0) << "step " << step << ", counter " << i;
    for (float v : fo.to_vector(s())) ASSERT_TRUE(std::isfinite(v));
  }
}

// Note [folded merge]: the last chunk block of each (row, block y) merges, in the chunk kernel;
// the bytes are those of the separate merge (waiting on the same counters, or on the whole chunk
// kernel), for rows of one merge batch and of several, every head count per block, several rows
// (whose last blocks merge concurrently) and rows of length 0; the counters end at zero.
TEST_P(Attention, DecodeFoldedMergeGivesTheSameBytes) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int L = 9000, H = 8, Hkv = 2;
  {
    constexpr int D = 128;
    DecodeInputs<D> in(dev, s(), 3 * H, Hkv, L, 5150u);  // q of 3 rows
    // 0 to 36 chunks; the folded merge's batch is 8 chunks with 4 heads per block (every head's
    // partials loaded at once), 16 with 2, 32 with 1: rows of one batch and of several.
    for (int len : {0, 1, 2048, 3000, 4096, 8192, 9000}) {
      SCOPED_TRACE("D 128, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto f4 = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      const auto f1 = run_decode<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      const auto f2 = run_decode<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      const auto w4 = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kSignals);
      EXPECT_TRUE(same(ref, f4)) << "folded, 4 heads per block";
      EXPECT_TRUE(same(ref, f1)) << "folded, 1 head per block";
      EXPECT_TRUE(same(ref, f2)) << "folded, 2 heads per block";
      EXPECT_TRUE(same(ref, w4)) << "signals, sliced merge";
      if (len == 0) EXPECT_TRUE(std::all_of(f4.begin(), f4.end(), [](float x) { return x == 0.0f; }));
      expect_three_rows<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in, H, Hkv, L, len, DecodeSync::kFold, ref);
    }
  }
  {
    constexpr int D = 96;  // 5 merge groups, 120 of 128 threads active
    DecodeInputs<D> in(dev, s(), H, Hkv, L, 5151u);
    for (int len : {300, 9000}) {
      SCOPED_TRACE("D 96, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto f = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      EXPECT_TRUE(same(ref, f));
    }
  }
}

// Note [one grid]: the chunk blocks and the merge blocks in one launch, each block's work given
// by its ticket, give the bytes of the two launches, for every chunk variant with the merges
// launch_decode pairs it with, rows of one merge batch and of several, three rows (blocks of
// different rows interleaved in ticket order), rows of length 0; the counters and the ticket end
// at zero (run_decode checks), so calls in a row work.
TEST_P(Attention, DecodeOneGridGivesTheSameBytes) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int L = 9000, H = 8, Hkv = 2;
  {
    constexpr int D = 128;
    DecodeInputs<D> in(dev, s(), 3 * H, Hkv, L, 6160u);
    for (int len : {0, 1, 2048, 4000, 9000}) {
      SCOPED_TRACE("D 128, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto a = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto b = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto c = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 2>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto d = run_decode<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto e = run_decode<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      EXPECT_TRUE(same(ref, a)) << "4 heads per block";
      EXPECT_TRUE(same(ref, b)) << "4 heads per block, sliced merge";
      EXPECT_TRUE(same(ref, c)) << "4 heads per block, 2-chunk merge batches";
      EXPECT_TRUE(same(ref, d)) << "1 head per block, sliced merge";
      EXPECT_TRUE(same(ref, e)) << "2 heads per block";
      if (len == 0) EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float x) { return x == 0.0f; }));
      expect_three_rows<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in, H, Hkv, L, len, DecodeSync::kOneGrid, ref);
    }
  }
  {
    constexpr int D = 64;  // 8 heads per block at most
    DecodeInputs<D> in(dev, s(), H, Hkv, L, 6161u);
    for (int len : {300, 9000}) {
      SCOPED_TRACE("D 64, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto a = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto b = run_decode<DecodeChunk<D, 1, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      EXPECT_TRUE(same(ref, a)) << "4 heads per block";
      EXPECT_TRUE(same(ref, b)) << "1 head per block";
    }
  }
}

// 129 chunks: more than the sliced merge folds in one batch (4 groups x 32).
// Note [row-major decode]: the CPU's row-by-row products give the lane path's bytes
// (CpuDeviceOptions::decode_lanes), for every head_dim, 1 to 8 query heads per block, lengths that
// end inside, at and just past a chunk, the fused append of flash_decoding (out and cache), rows
// whose scores overflow to inf and a NaN query; K/V past each length are NaN and never read.
TEST_P(Attention, DecodeRowMajorGivesTheLaneBytes) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "a CPU device path (Note [row-major decode])";
  if (dev->name().find("AVX2") == std::string::npos && dev->name().find("AVX3") == std::string::npos)
    GTEST_SKIP() << dev->name() << ": this SIMD variant has no row-major decode (it runs the lane path)";
  struct Case { int H, Hkv, D; };
  const Case cases[] = {{32, 8, 128}, {8, 8, 128}, {4, 2, 128}, {16, 2, 64}, {8, 1, 32},
                        {4, 2, 256}, {4, 1, 96}, {6, 6, 64}};
  Lcg rng{2024u};
  // The row path and the lane path: two devices of dev's SIMD variant.
  const std::string simd = dev->caps().simd_target == "AVX3" ? "avx3" : "avx2";
  const std::shared_ptr<Device> paths[2] = {make_cpu_device({.index = 7, .simd = simd}),
                                            make_cpu_device({.index = 8, .simd = simd, .decode_lanes = true})};
  const auto up = [](const std::shared_ptr<Device>& d, const std::vector<float>& h) {
    Buffer<float> b(d, h.size());
    b.copy_from_host(d->default_stream(), h);
    return b;
  };
  for (const Case& c : cases) {
    const int L = 700;
    for (int len : {1, 255, 256, 257, 700}) {
      SCOPED_TRACE("H " + std::to_string(c.H) + " Hkv " + std::to_string(c.Hkv) + " D " + std::to_string(c.D) +
                   " length " + std::to_string(len));
      auto kh = rng.floats(std::size_t(c.Hkv) * L * c.D), vh = rng.floats(kh.size());
      for (int h = 0; h < c.Hkv; ++h)
        for (std::size_t i = (std::size_t(h) * L + len) * c.D; i < std::size_t(h + 1) * L * c.D; ++i)
          kh[i] = vh[i] = std::numeric_limits<float>::quiet_NaN();
      auto qh = rng.floats(std::size_t(c.H) * c.D, 2.0f);
      if (len == 257) qh[0] = 1e30f;  // head 0's scores overflow to +-inf
      if (len == 255) qh[c.D + 1] = std::numeric_limits<float>::quiet_NaN();  // head 1: NaN
      std::vector<float> r[2];
      for (int i = 0; i < 2; ++i) {
        const auto& d = paths[i];
        auto q = up(d, qh), k = up(d, kh), v = up(d, vh), out = up(d, std::vector<float>(qh.size(), 42.0f));
        incremental_attention(d->default_stream(), q, k, v, len, out, DecodeShape{c.H, c.Hkv, c.D, L});
        r[i] = out.to_vector(d->default_stream());
      }
      const auto& a = r[0];
      EXPECT_TRUE(same(a, r[1])) << "incremental_attention";
      bool finite = true;
      for (std::size_t i = 2 * std::size_t(c.D); i < a.size(); ++i) finite = finite && std::isfinite(a[i]);
      EXPECT_TRUE(finite) << "heads without inf or NaN inputs";
    }
    // flash_decoding: three slots of different lengths, the new token appended in the chunk kernel.
    const KvCacheConfig cfg{.num_layers = 1, .num_heads = c.H, .num_kv_heads = c.Hkv, .head_dim = c.D,
                            .max_len = 600, .slots = 3};
    KvCache ca(paths[0], cfg), cb(paths[1], cfg);
    const std::int64_t pre[3] = {255, 0, 511};
    for (int slot = 0; slot < 3; ++slot) {
      if (pre[slot] == 0) continue;
      const auto kh = rng.floats(std::size_t(c.Hkv) * pre[slot] * c.D), vh = rng.floats(kh.size());
      ca.write_from_host(paths[0]->default_stream(), slot, 0, kh, vh, pre[slot]);
      cb.write_from_host(paths[1]->default_stream(), slot, 0, kh, vh, pre[slot]);
    }
    const auto qh = rng.floats(std::size_t(3) * c.H * c.D), knh = rng.floats(std::size_t(3) * c.Hkv * c.D),
               vnh = rng.floats(knh.size());
    std::vector<float> r[2];
    for (int i = 0; i < 2; ++i) {
      const auto& d = paths[i];
      auto q = up(d, qh), kn = up(d, knh), vn = up(d, vnh), out = up(d, std::vector<float>(qh.size(), 42.0f));
      flash_decoding(d->default_stream(), i == 0 ? ca : cb, 0, q, kn, vn, std::vector<std::int64_t>{255, 0, 511}, out);
      r[i] = out.to_vector(d->default_stream());
    }
    EXPECT_TRUE(same(r[0], r[1])) << "flash_decoding";
    Stream &sa = paths[0]->default_stream(), &sb = paths[1]->default_stream();
    EXPECT_TRUE(same(ca.k(0).to_vector(sa), cb.k(0).to_vector(sb)) && same(ca.v(0).to_vector(sa), cb.v(0).to_vector(sb)))
        << "the caches after the append";
  }
}

TEST_P(Attention, DecodeMergeSlicesGiveTheSameBytesOnLongRows) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int D = 128, L = 33000, H = 4, Hkv = 1;
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 99u);
  const auto a = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, L);
  const auto b = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, L);
  EXPECT_TRUE(same(a, b));
  bool finite = true;
  for (float x : b) finite = finite && std::isfinite(x);
  EXPECT_TRUE(finite);
}

// The asynchronous tile copies never read a row at or past the length: NaN there changes no bit.
TEST_P(Attention, DecodeAsyncTilesNeverReadPastTheLength) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int D = 128, L = 1200, H = 8, Hkv = 2;
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 4242u);
  for (int len : {1, 37, 256, 1000}) {
    SCOPED_TRACE("length " + std::to_string(len));
    const auto clean = run_decode_variant<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
    DecodeInputs<D> poisoned(dev, s(), H, Hkv, L, 4242u);
    for (auto* b : {&poisoned.k, &poisoned.v}) {
      auto h = b->to_vector(s());
      for (int hk = 0; hk < Hkv; ++hk)
        for (int t = len; t < L; ++t)
          for (int d = 0; d < D; ++d) h[(std::size_t(hk) * L + t) * D + d] = std::numeric_limits<float>::quiet_NaN();
      b->copy_from_host(s(), h);
    }
    const auto p3 = run_decode_variant<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, poisoned.q, poisoned.k, poisoned.v, H, Hkv, L, len);
    const auto p4 = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, poisoned.q, poisoned.k, poisoned.v, H, Hkv, L, len);
    EXPECT_TRUE(same(clean, p3));
    EXPECT_TRUE(same(clean, p4));
  }
}

}  // namespace
}  // namespace lockstep::testing
