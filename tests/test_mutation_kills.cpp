// Tests written from a mutation-testing pass (mutants applied by hand to the library, one at a
// time): each test here failed with a mutant that every other test let through, and passes on the
// library as it is. Each comment names the behaviour it pins down.

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "harness/harness.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/ops.hpp"
#include "lockstep/kernels/elementwise.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/calls.hpp"

namespace lockstep::testing {
namespace {

class MutationKills : public CallTest {
 protected:
  // Distinct host tokens: kv_heads * count * head_dim values from `base` on.
  static std::vector<float> tokens(std::size_t n, float base) {
    std::vector<float> h(n);
    std::iota(h.begin(), h.end(), base);
    return h;
  }
};

KvCacheConfig config(std::int64_t slots = 3, std::int64_t max_len = 8) {
  return {.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = max_len,
          .slots = slots};
}

// rollback and set_length refuse negative lengths by name and value, and change nothing.
TEST_P(MutationKills, KvCacheRollbackAndSetLengthRefuseNegativeLengths) {
  KvCache cache(dev, config());
  cache.set_length(0, 3);
  expect_invalid([&] { cache.rollback(0, -1); }, "position", "-1");
  expect_invalid([&] { cache.set_length(0, -1); }, "n", "-1");
  EXPECT_EQ(cache.length(0), 3);
  EXPECT_EQ(cache.length(0, 0), 3);
  EXPECT_EQ(cache.length(0, 1), 3);
}

// set_length makes a done slot live again (as write_from_host and copy_slot_from do).
TEST_P(MutationKills, KvCacheSetLengthClearsDone) {
  KvCache cache(dev, config());
  cache.mark_done(1);
  cache.set_length(1, 2);
  EXPECT_FALSE(cache.done(1));
}

// reset_all forgets every layer's length: afterwards each layer holds nothing, and a new sequence
// appends token 0 in every layer.
TEST_P(MutationKills, KvCacheResetAllEmptiesEveryLayer) {
  KvCache cache(dev, config());
  const auto h = tokens(2 * 3 * 32, 1.0f);
  for (std::int64_t l = 0; l < 2; ++l) cache.write_from_host(s(), 0, l, h, h, 3);
  cache.reset_all();
  EXPECT_EQ(cache.length(0, 0), 0);
  EXPECT_EQ(cache.length(0, 1), 0);
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{0, 0, 0});
  cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{0, 0, 0});
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_EQ(cache.length(0, 1), 1);
}

// grow to the current number of slots is accepted and changes nothing; grow on another device's
// stream is refused by name, the cache unchanged.
TEST_P(MutationKills, KvCacheGrowToTheSameSizeAndOnAnotherDevice) {
  KvCache cache(dev, config());
  const auto h = tokens(2 * 2 * 32, 5.0f);
  cache.write_from_host(s(), 1, 0, h, h, 2);
  const auto k0 = cache.k(0).to_vector(s());
  cache.grow(s(), 3);
  EXPECT_EQ(cache.slots(), 3);
  EXPECT_EQ(cache.length(1), 2);
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), k0));
  auto other = open(dev->id().kind == DeviceKind::kCpu && dev->id().index == 9 ? "cpu:8" : "cpu:9");
  expect_invalid([&] { cache.grow(other->default_stream(), 4); }, "stream.device",
                 other->id().str());
  EXPECT_EQ(cache.slots(), 3);
  EXPECT_EQ(cache.bytes(), 2ull * 2 * 3 * 2 * 8 * 32 * 4);
}

// copy_slot_from copies a source that is full (length == this cache's max_len), every token.
TEST_P(MutationKills, KvCacheCopySlotFromAFullSource) {
  KvCache src(dev, config(1, 8)), dst(dev, config(2, 8));
  const auto hk = tokens(2 * 8 * 32, 0.0f), hv = tokens(2 * 8 * 32, 10000.0f);
  for (std::int64_t l = 0; l < 2; ++l) src.write_from_host(s(), 0, l, hk, hv, 8);
  dst.copy_slot_from(s(), 1, src, 0);
  EXPECT_EQ(dst.length(1), 8);
  EXPECT_EQ(dst.length(1, 1), 8);
  const auto k = dst.k(1).to_vector(s()), v = dst.v(0).to_vector(s());
  const std::size_t slot1 = 1 * 2 * 8 * 32;
  for (std::size_t i = 0; i < hk.size(); ++i) {
    ASSERT_EQ(k[slot1 + i], hk[i]) << i;
    ASSERT_EQ(v[slot1 + i], hv[i]) << i;
  }
}

// copy_slot_from over a slot in the middle of a step: the slot then is the source's, complete in
// every layer, and takes its next token.
TEST_P(MutationKills, KvCacheCopySlotFromOverASlotMidStep) {
  KvCache src(dev, config(1)), dst(dev, config(1));
  src.set_length(0, 2);
  auto kn = filled(2 * 32, 1.0f), vn = filled(2 * 32, 2.0f);
  dst.append(s(), 0, kn, vn, std::vector<std::int64_t>{0});  // layer 1 not yet
  dst.copy_slot_from(s(), 0, src);
  EXPECT_EQ(dst.length(0), 2);
  dst.append(s(), 0, kn, vn, std::vector<std::int64_t>{2});  // a new token
  dst.append(s(), 1, kn, vn, std::vector<std::int64_t>{2});
  EXPECT_EQ(dst.length(0), 3);
  EXPECT_EQ(dst.length(0, 1), 3);
}

// write_from_host fills a slot to max_len.
TEST_P(MutationKills, KvCacheWriteFromHostFillsASlot) {
  KvCache cache(dev, config());
  const auto h = tokens(2 * 8 * 32, 3.0f);
  cache.write_from_host(s(), 2, 1, h, h, 8);
  EXPECT_EQ(cache.length(2), 8);
  EXPECT_EQ(cache.length(2, 1), 8);
  const auto k = cache.k(1).to_vector(s());
  const std::size_t last = 2 * 2 * 8 * 32 + 1 * 8 * 32 + 7 * 32 + 31;  // slot 2, head 1, token 7
  EXPECT_EQ(k[last], h.back());
}

// Note [layer lengths]: an append ends a run of write_from_host calls. Re-importing one layer
// afterwards starts a new sequence: the other layer holds none of it.
TEST_P(MutationKills, KvCacheAppendEndsAnImport) {
  KvCache cache(dev, config(1));
  const auto h2 = tokens(2 * 2 * 32, 1.0f), h1 = tokens(2 * 1 * 32, 9.0f);
  cache.write_from_host(s(), 0, 0, h2, h2, 2);
  cache.write_from_host(s(), 0, 1, h2, h2, 2);
  auto kn = filled(2 * 32, 1.0f), vn = filled(2 * 32, 2.0f);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{2});
  cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{2});
  cache.write_from_host(s(), 0, 0, h1, h1, 1);
  EXPECT_EQ(cache.length(0), 1);
  EXPECT_EQ(cache.length(0, 0), 1);
  EXPECT_EQ(cache.length(0, 1), 0);
}

// positions must have exactly one entry per slot: longer is refused too, nothing written.
TEST_P(MutationKills, KvCachePositionsLongerThanTheSlotsAreRefused) {
  KvCache cache(dev, config());
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  auto q = filled(3 * 4 * 32, 0.5f), out = filled(3 * 4 * 32, 42.0f);
  const auto k0 = cache.k(0).to_vector(s());
  const std::vector<std::int64_t> four{0, 0, 0, 0};
  expect_invalid([&] { cache.append(s(), 0, kn, vn, four); }, "positions.size()", "4");
  expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, four, out); }, "positions.size()", "4");
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), k0));
  for (float x : out.to_vector(s())) ASSERT_EQ(x, 42.0f);
}

// Note [layer lengths]: flash_decoding with device positions completes its layer for every slot,
// so after a step whose other layer ran with host positions the next new token is accepted.
TEST_P(MutationKills, FlashDecodingWithDevicePositionsCompletesItsLayer) {
  KvCache cache(dev, config(1));
  const auto h = tokens(2 * 2 * 32, 0.0f);
  for (std::int64_t l = 0; l < 2; ++l) cache.write_from_host(s(), 0, l, h, h, 2);
  auto q = filled(4 * 32, 0.5f), kn = filled(2 * 32, 1.0f), vn = filled(2 * 32, 2.0f);
  auto out = filled(4 * 32, 0.0f);
  flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{2}, out);  // new token 2
  Buffer<std::int32_t> pos(dev, 1);
  pos.copy_from_host(s(), std::vector<std::int32_t>{2});
  flash_decoding(s(), cache, 1, q, kn, vn, pos, out);  // token 2 in layer 1
  EXPECT_EQ(cache.length(0, 1), 3);
  flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{3}, out);  // the next token
  EXPECT_EQ(cache.length(0), 4);
}

// KvCache::append on a stream of another device is refused as the stream's fault.
TEST_P(MutationKills, KvCacheAppendOnAnotherDevicesStreamNamesTheStream) {
  KvCache cache(dev, config());
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  auto other = open(dev->id().kind == DeviceKind::kCpu && dev->id().index == 9 ? "cpu:8" : "cpu:9");
  expect_invalid([&] { cache.append(other->default_stream(), 0, kn, vn, std::vector<std::int64_t>{0, 0, 0}); },
                 "stream.device", other->id().str());
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{0, 0, 0}));
}

// rope's theta must be > 1 (a theta in (0, 1] gives frequencies above 1), and q is untouched.
TEST_P(MutationKills, RopeRefusesThetaAtMostOne) {
  auto q = filled(2 * 1 * 8, 0.75f);
  const std::vector<std::int64_t> pos{1, 2};
  for (float theta : {0.5f, -2.0f}) {
    try {
      rope(s(), &q, nullptr, pos, RopeConfig{1, 1, 8, theta, RopeStyle::kNorm});
      ADD_FAILURE() << "accepted theta " << theta;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), "theta") << e.what();
    }
  }
  for (float x : q.to_vector(s())) ASSERT_EQ(x, 0.75f);
}

// The scale_mask kernel's causal mask is bottom-right aligned when there are more columns than
// rows (row i sees columns <= i + cols - rows), as its header says.
TEST_P(MutationKills, ScaleMaskKernelIsBottomRightAligned) {
  const std::int64_t rows = 2, cols = 5;
  std::vector<float> h(std::size_t(rows * cols));
  std::iota(h.begin(), h.end(), 1.0f);
  auto in = upload(h);
  auto out = filled(h.size(), 42.0f);
  kernels::ScaleMaskParams p{};
  p.in = in.data().get();
  p.out = out.data().get();
  p.batch = 1;
  p.rows = rows;
  p.cols = cols;
  p.scale = 2.0f;
  p.causal = 1;
  launch<kernels::ScaleMask>(s(), Dim3{std::uint32_t(rows), 1, 1}, 0, p);
  const auto o = out.to_vector(s());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> want{2, 4, 6, 8, -inf, 12, 14, 16, 18, 20};
  for (std::size_t i = 0; i < o.size(); ++i) EXPECT_EQ(o[i], want[i]) << i;
}

// Ranges past the end of a buffer are refused even when nothing would be copied (offset > size).
TEST_P(MutationKills, BufferHostCopiesRefuseOffsetsPastTheEnd) {
  Buffer<float> b(dev, 10);
  b.fill(s(), 1.0f);
  expect_invalid([&] { b.copy_from_host(s(), std::span<const float>{}, 11); }, "offset + count", "11 + 0");
  std::vector<float> none;
  expect_invalid([&] { b.copy_to_host(s(), std::span<float>(none), 12); }, "offset + count", "12 + 0");
  for (float x : b.to_vector(s())) ASSERT_EQ(x, 1.0f);
}

// copy_across needs equal sizes; a refused copy writes nothing.
TEST_P(MutationKills, CopyAcrossRefusesDifferentSizes) {
  auto other = open(dev->id().kind == DeviceKind::kCpu && dev->id().index == 9 ? "cpu:8" : "cpu:9");
  Buffer<float> src(dev, 10), dst(other, 20);
  src.fill(s(), 1.0f);
  dst.fill(other->default_stream(), 7.0f);
  expect_invalid([&] { copy_across(other->default_stream(), dst, s(), src); }, "src.size()", "10");
  for (float x : dst.to_vector(other->default_stream())) ASSERT_EQ(x, 7.0f);
}

// Wrapped buffers that touch but do not overlap are not "in place".
TEST_P(MutationKills, AdjacentWrappedBuffersDoNotOverlap) {
  std::vector<float> h(16);
  std::iota(h.begin(), h.end(), 1.0f);
  auto base = upload(h);
  auto in = Buffer<float>::wrap(dev, base.data().get(), 8);
  auto out = Buffer<float>::wrap(dev, base.data().get() + 8, 8);
  ops::transpose(s(), in, out, 1, 2, 4);
  const auto o = base.to_vector(s());
  const std::vector<float> want{1, 2, 3, 4, 5, 6, 7, 8, 1, 5, 2, 6, 3, 7, 4, 8};
  EXPECT_EQ(o, want);
  auto overlapping = Buffer<float>::wrap(dev, base.data().get() + 7, 8);
  try {
    ops::transpose(s(), in, overlapping, 1, 2, 4);
    ADD_FAILURE() << "accepted an overlapping output";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "out") << e.what();
  }
}

// Decode inputs must be 16-byte aligned: a wrap 8 bytes in is refused.
TEST_P(MutationKills, DecodeRefusesEightByteAlignedQueries) {
  KvCache cache(dev, KvCacheConfig{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32,
                                   .max_len = 8, .slots = 1});
  auto q = filled(4 * 32 + 4, 0.5f), kn = filled(2 * 32, 1.0f), vn = filled(2 * 32, 2.0f);
  auto out = filled(4 * 32, 42.0f);
  auto q2 = Buffer<float>::wrap(dev, q.data().get() + 2, 4 * 32);
  try {
    flash_decoding(s(), cache, 0, q2, kn, vn, std::vector<std::int64_t>{0}, out);
    ADD_FAILURE() << "accepted an 8-byte aligned q";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "q.data()") << e.what();
  }
  EXPECT_EQ(cache.length(0), 0);
  for (float x : out.to_vector(s())) ASSERT_EQ(x, 42.0f);
}

// Note [device positions]: a position at max_len (the slot is full) is reported in status as
// 1 + its row, and writes nothing. At head_dim 128 with four query heads per kv head, the status
// comes from the chunk kernel, or with LOCKSTEP_DECODE_STAGES=0 from the separate KvScatter launch
// (ctest mutation_kills_decode_stages0 runs this test so).
TEST_P(MutationKills, FlashDecodingReportsAPositionAtMaxLen) {
  for (const auto& [H, Hkv, D] : {std::array<std::int64_t, 3>{4, 2, 32}, std::array<std::int64_t, 3>{4, 1, 128}}) {
    SCOPED_TRACE("head_dim " + std::to_string(D));
    const KvCacheConfig c{.num_layers = 1, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D, .max_len = 8, .slots = 3};
    KvCache cache(dev, c);
    for (std::int64_t sl = 0; sl < 3; ++sl) cache.set_length(sl, 8);
    auto q = filled(std::size_t(3 * H * D), 0.5f), kn = filled(std::size_t(3 * Hkv * D), 1.0f),
         vn = filled(std::size_t(3 * Hkv * D), 2.0f);
    auto out = filled(std::size_t(3 * H * D), 42.0f);
    Buffer<std::int32_t> pos(dev, 3), status(dev, 1);
    pos.copy_from_host(s(), std::vector<std::int32_t>{-1, 8, -1});
    status.copy_from_host(s(), std::vector<std::int32_t>{0});
    const auto k0 = cache.k(0).to_vector(s()), v0 = cache.v(0).to_vector(s());
    flash_decoding(s(), cache, 0, q, kn, vn, pos, out, DecodeOptions{.status = &status});
    EXPECT_EQ(status.to_vector(s())[0], 2);
    EXPECT_TRUE(same(cache.k(0).to_vector(s()), k0));
    EXPECT_TRUE(same(cache.v(0).to_vector(s()), v0));
  }
}

// extract_head and copy_head_back take a head in [0, heads): -1 and heads are refused by name
// and value, and nothing is written.
TEST_P(MutationKills, HeadCopiesRefuseHeadsOutOfRange) {
  const std::int64_t seq = 2, heads = 3, dim = 4;
  auto wide = filled(std::size_t(seq * heads * dim), 1.0f), narrow = filled(std::size_t(seq * dim), 2.0f);
  for (std::int64_t head : {std::int64_t{-1}, heads}) {
    expect_invalid([&] { ops::extract_head(s(), wide, narrow, seq, heads, dim, head); }, "head", std::to_string(head));
    expect_invalid([&] { ops::copy_head_back(s(), narrow, wide, seq, heads, dim, head); }, "head", std::to_string(head));
  }
  for (float x : narrow.to_vector(s())) ASSERT_EQ(x, 2.0f);
  for (float x : wide.to_vector(s())) ASSERT_EQ(x, 1.0f);
}

// rope over no positions is accepted and launches nothing.
TEST_P(MutationKills, RopeOfNoPositionsDoesNothing) {
  Buffer<float> q(dev, 0), k(dev, 0);
  const auto launches = s().launches();
  rope(s(), &q, &k, std::vector<std::int64_t>{}, RopeConfig{4, 2, 8, 10000.0f, RopeStyle::kNorm});
  s().synchronize();
  EXPECT_EQ(s().launches(), launches);
}

LOCKSTEP_INSTANTIATE_BACKENDS(MutationKills);

// A capped CPU device hands out exactly its capacity; one byte more is OutOfMemory.
TEST(MutationKillsCpu, CapacityIsUsableToTheLastByte) {
  CpuDeviceOptions o;
  o.memory_capacity = 1 << 20;
  auto dev = make_cpu_device(o);
  Buffer<char> all(dev, 1 << 20);
  EXPECT_EQ(dev->memory_stats().in_use, 1u << 20);
  EXPECT_THROW(Buffer<char>(dev, 1), OutOfMemory);
}

// elapsed_ms needs both events recorded: a start event never recorded is refused.
TEST(MutationKillsCpu, ElapsedFromAnUnrecordedStartIsRefused) {
  auto dev = make_cpu_device({});
  auto& s = dev->default_stream();
  auto start = dev->create_event(true), end = dev->create_event(true);
  end->record(s);
  end->synchronize();
  try {
    (void)end->elapsed_ms(*start);
    ADD_FAILURE() << "elapsed time from an event never recorded";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "events") << e.what();
  }
}

// The cross-backend comparison (lockstep parity, the property tests) counts a NaN against a
// number as a mismatch; only two NaNs are equal.
TEST(MutationKillsHarness, CompareBitsCountsNanAgainstANumber) {
  harness::Run a, b;
  a.out = {1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f, std::numeric_limits<float>::quiet_NaN()};
  b.out = {1.0f, 2.0f, 3.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(harness::compare_bits(a, b).mismatches, 1u);
  EXPECT_EQ(harness::compare_bits(b, a).mismatches, 1u);
  b.out[1] = -0.0f;
  a.out[1] = 0.0f;
  EXPECT_EQ(harness::compare_bits(a, b).mismatches, 1u);
}

}  // namespace
}  // namespace lockstep::testing
