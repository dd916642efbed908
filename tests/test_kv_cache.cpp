// The KV cache on every backend: its memory, configurations, moves, appends, layer lengths, host
// and device imports, done slots, growth and slot copies.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

KvCacheConfig small_config() {
  return {.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 8, .slots = 3};
}

TEST_P(Attention, KvCacheMemoryIsExactlyTheLayout) {
  const auto before = dev->memory_stats().in_use;
  KvCache cache(dev, small_config());
  EXPECT_EQ(cache.bytes(), 2ull * 2 * 3 * 2 * 8 * 32 * 4);
  EXPECT_EQ(cache.bytes_per_token_per_layer(), 2ull * 2 * 32 * 4);
  EXPECT_EQ(dev->memory_stats().in_use - before, cache.bytes());
}

// Every bad KvCacheConfig field is refused by its own name (the config's, not another call's)
// and the value passed; nothing stays allocated.
TEST_P(Attention, KvCacheRejectsBadConfigurations) {
  const auto in_use = dev->memory_stats().in_use;
  auto bad = [&](auto edit, const std::string& param, const std::string& value) {
    auto c = small_config();
    edit(c);
    expect_invalid([&] { KvCache cache(dev, c); }, param, value);
  };
  bad([](KvCacheConfig& c) { c.num_kv_heads = 3; }, "num_kv_heads", "3");
  bad([](KvCacheConfig& c) { c.num_kv_heads = 0; }, "num_kv_heads", "0");
  bad([](KvCacheConfig& c) { c.num_heads = 0; }, "num_heads", "0");
  bad([](KvCacheConfig& c) { c.num_heads = 70000; c.num_kv_heads = 70000; }, "num_heads", "70000");
  bad([](KvCacheConfig& c) { c.slots = 0; }, "slots", "0");
  bad([](KvCacheConfig& c) { c.num_layers = -1; }, "num_layers", "-1");
  bad([](KvCacheConfig& c) { c.max_len = 0; }, "max_len", "0");
  bad([](KvCacheConfig& c) { c.head_dim = 0; }, "head_dim", "0");
  bad([](KvCacheConfig& c) { c.max_len = std::int64_t(1) << 40; }, "max_len * head_dim", "35184372088832");
  auto c = small_config();
  c.head_dim = 80;
  EXPECT_THROW(KvCache(dev, c), Unsupported);
  EXPECT_EQ(dev->memory_stats().in_use, in_use);
}

// A moved-from cache holds nothing (slots 0, bytes 0, not valid) and every operation on it, as
// the cache or as copy_slot_from's source, is InvalidArgument naming `cache` or `src`; the cache
// it moved into works, with the contents and lengths it had. A moved-into cache's old memory
// is released.
TEST_P(Attention, KvCacheMovedFromIsTypedAndTheMoveKeepsTheContents) {
  const auto in_use = dev->memory_stats().in_use;
  KvCache a(dev, small_config());
  auto kn = filled(3 * 2 * 32, 1.5f), vn = filled(3 * 2 * 32, 2.5f);
  const std::vector<std::int64_t> pos = {0, 0, 0};
  for (std::int64_t l = 0; l < 2; ++l) a.append(s(), l, kn, vn, pos);
  const auto k0 = a.k(0).to_vector(s());
  KvCache b(std::move(a));
  EXPECT_FALSE(a.valid());
  EXPECT_TRUE(b.valid());
  EXPECT_EQ(a.slots(), 0);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_TRUE(a.lengths().empty());
  EXPECT_EQ(b.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_TRUE(same(b.k(0).to_vector(s()), k0));
  auto q = filled(3 * 4 * 32, 0.5f), out = filled(3 * 4 * 32, 42.0f);
  const std::vector<std::int64_t> next = {1, 1, 1};
  expect_invalid([&] { (void)a.length(0); }, "cache");
  expect_invalid([&] { (void)a.length(0, 0); }, "cache");
  expect_invalid([&] { (void)a.done(0); }, "cache");
  expect_invalid([&] { (void)a.k(0); }, "cache");
  expect_invalid([&] { (void)a.device(); }, "cache");
  expect_invalid([&] { a.reset(0); }, "cache");
  expect_invalid([&] { a.reset_all(); }, "cache");
  expect_invalid([&] { a.rollback(0, 0); }, "cache");
  expect_invalid([&] { a.set_length(0, 0); }, "cache");
  expect_invalid([&] { a.mark_done(0); }, "cache");
  expect_invalid([&] { a.append(s(), 0, kn, vn, next); }, "cache");
  expect_invalid([&] { a.grow(s(), 4); }, "cache");
  expect_invalid([&] { a.write_from_device(s(), 0, 0, kn, vn, 1); }, "cache");
  expect_invalid([&] { flash_decoding(s(), a, 0, q, kn, vn, next, out); }, "cache");
  expect_invalid([&] { b.copy_slot_from(s(), 0, a, 0); }, "src");
  expect_all(out, 42.0f);
  EXPECT_EQ(b.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  // The moved-into cache decodes: the next token in every layer.
  for (std::int64_t l = 0; l < 2; ++l) flash_decoding(s(), b, l, q, kn, vn, next, out);
  EXPECT_EQ(b.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  // Move assignment: c's own memory is released, b is left empty.
  KvCache c(dev, small_config());
  const auto with_both = dev->memory_stats().in_use;
  c = std::move(b);
  EXPECT_FALSE(b.valid());
  EXPECT_EQ(c.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ(with_both - dev->memory_stats().in_use, c.bytes());
  EXPECT_GE(dev->memory_stats().in_use - in_use, c.bytes());
}

TEST_P(Attention, KvCacheAppendValidatesAndWritesNothingOnError) {
  KvCache cache(dev, small_config());
  const auto c = cache.config();
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  std::vector<std::int64_t> pos = {0, 0, 0};
  cache.append(s(), 0, kn, vn, pos);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  cache.append(s(), 1, kn, vn, pos);  // the same token in the next layer
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  const auto snapshot = cache.k(0).to_vector(s());
  auto kn2 = filled(3 * 2 * 32, 9.0f);
  expect_invalid([&] { cache.append(s(), 0, kn2, vn, std::vector<std::int64_t>{1, 3, 1}); }, "positions[1]");
  expect_invalid([&] { cache.append(s(), 0, kn2, vn, std::vector<std::int64_t>{1, 1}); }, "positions.size()");
  expect_invalid([&] { cache.append(s(), 2, kn2, vn, std::vector<std::int64_t>{1, 1, 1}); }, "layer");
  Buffer<float> wrong(dev, 5);
  expect_invalid([&] { cache.append(s(), 0, wrong, vn, std::vector<std::int64_t>{1, 1, 1}); }, "k_new.size()");
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), snapshot));
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  // Fill slot 0 to max_len (slots 1 and 2 done meanwhile), then one more is refused.
  cache.mark_done(1);
  cache.mark_done(2);
  for (std::int64_t t = 1; t < c.max_len; ++t)
    for (std::int64_t l = 0; l < 2; ++l) cache.append(s(), l, kn, vn, std::vector<std::int64_t>{t, 0, 0});
  EXPECT_EQ(cache.length(0), c.max_len);
  expect_invalid([&] { cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{c.max_len, 0, 0}); }, "positions[0]",
                 std::to_string(c.max_len));
  expect_invalid([&] { cache.rollback(1, cache.length(1) + 1); }, "position");
  expect_invalid([&] { cache.reset(3); }, "slot");
}

// Note [layer lengths]: each layer appends the step's token once. length - 1 is accepted only in
// a layer that does not hold it yet; a new token only when every layer holds the slot's tokens.
// So a token written twice in a layer, positions re-read after the first layer (which skipped
// a token in the later layers), or a layer imported with fewer tokens are refused with nothing
// written; and a rollback cuts every layer to the new length.
TEST_P(Attention, KvCacheKeepsEveryLayerAtTheSlotsLength) {
  KvCache cache(dev, small_config());
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f), kn9 = filled(3 * 2 * 32, 9.0f);
  auto q = filled(3 * 4 * 32, 0.5f), out = filled(3 * 4 * 32, 0.0f);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{0, 0, 0});
  EXPECT_EQ(cache.length(0, 0), 1);
  EXPECT_EQ(cache.length(0, 1), 0);
  const auto k0 = cache.k(0).to_vector(s()), v0 = cache.v(0).to_vector(s());
  const auto k1 = cache.k(1).to_vector(s()), v1 = cache.v(1).to_vector(s()), out0 = out.to_vector(s());
  // Layer 0 again at position 0: refused, in append and in flash_decoding, nothing written.
  expect_invalid([&] { cache.append(s(), 0, kn9, kn9, std::vector<std::int64_t>{1, 0, 1}); }, "positions[0]", "1");
  expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn9, kn9, std::vector<std::int64_t>{0, 1, 1}, out); },
                 "positions[0]", "0");
  // The positions re-read after layer 0 (the lengths are now 1): a new token in layer 1 would
  // skip token 0 there. Refused.
  expect_invalid([&] { flash_decoding(s(), cache, 1, q, kn9, kn9, cache.lengths(), out); }, "positions[0]", "1");
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), k0));
  EXPECT_TRUE(same(cache.v(0).to_vector(s()), v0));
  EXPECT_TRUE(same(cache.k(1).to_vector(s()), k1));
  EXPECT_TRUE(same(cache.v(1).to_vector(s()), v1));
  EXPECT_TRUE(same(out.to_vector(s()), out0));
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  // A no-op rollback mid-step does not take the step's token from layer 1.
  cache.rollback(0, 1);
  // Layer 1 takes the step's token once (by flash_decoding), then it has it.
  flash_decoding(s(), cache, 1, q, kn, vn, std::vector<std::int64_t>{0, 0, 0}, out);
  EXPECT_EQ(cache.length(0, 1), 1);
  const auto k1b = cache.k(1).to_vector(s()), v1b = cache.v(1).to_vector(s());
  expect_invalid([&] { cache.append(s(), 1, kn9, kn9, std::vector<std::int64_t>{0, 0, 0}); }, "positions[0]", "0");
  EXPECT_TRUE(same(cache.k(1).to_vector(s()), k1b));
  EXPECT_TRUE(same(cache.v(1).to_vector(s()), v1b));
  // A layer may take the new token first; the other layer then appends length - 1.
  cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{1, 1, 1});
  EXPECT_EQ(cache.length(2, 0), 1);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{1, 1, 1});
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  // Rollback cuts every layer: re-appending the token before the new length is refused, and
  // the rolled-back position is a new token again.
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{2, 2, 2});
  for (std::int64_t sl = 0; sl < 3; ++sl) cache.rollback(sl, 2);
  EXPECT_EQ(cache.length(0, 0), 2);
  EXPECT_EQ(cache.length(0, 1), 2);
  expect_invalid([&] { cache.append(s(), 1, kn9, kn9, std::vector<std::int64_t>{1, 2, 2}); }, "positions[0]", "1");
  cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{2, 2, 2});  // a new token again
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{3, 3, 3}));
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{2, 2, 2});
  // A layer imported with fewer tokens than the length: the next token is refused until it is
  // written again (write_from_host with the same count for every layer).
  std::vector<float> h4(2 * 4 * 32, 1.0f), h6(2 * 6 * 32, 1.0f);
  cache.write_from_host(s(), 1, 0, h4, h4, 4);
  cache.write_from_host(s(), 1, 1, h6, h6, 6);
  EXPECT_EQ(cache.length(1), 6);
  EXPECT_EQ(cache.length(1, 0), 4);
  expect_invalid([&] { cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{3, 6, 3}); }, "positions[1]", "6");
  expect_invalid([&] { cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{3, 5, 3}); }, "positions[1]", "5");
  cache.write_from_host(s(), 1, 0, h6, h6, 6);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{3, 6, 3});
  // set_length sets every layer.
  cache.set_length(2, 3);
  EXPECT_EQ(cache.length(2, 0), 3);
  EXPECT_EQ(cache.length(2, 1), 3);
  // Re-importing one layer of a used slot starts a new sequence: the other layer holds nothing of
  // it, and the next token is refused until that layer is imported too.
  cache.write_from_host(s(), 2, 0, h4, h4, 4);
  EXPECT_EQ(cache.length(2, 0), 4);
  EXPECT_EQ(cache.length(2, 1), 0);
  cache.write_from_host(s(), 2, 1, h4, h4, 4);
  EXPECT_EQ(cache.length(2, 1), 4);
  // After that complete import, the next sequence's first layer starts a new run (its layer was
  // written by the run before): layer 1 holds nothing of it, and the next token is refused until
  // layer 1 is imported too. (The run used to go on: layer 1 kept the old sequence's 4 rows and
  // reported them as the new one's, and decoding attended them.)
  std::vector<float> y4(2 * 4 * 32, 5.0f);
  cache.write_from_host(s(), 2, 0, y4, y4, 4);
  EXPECT_EQ(cache.length(2, 0), 4);
  EXPECT_EQ(cache.length(2, 1), 0);
  expect_invalid([&] { cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{3, 6, 4}); }, "positions[2]", "4");
  // mark_done inside a run only sets the flag: the run goes on (layer 0 keeps its 4 rows), and
  // the run's next import clears the flag.
  cache.mark_done(2);
  cache.write_from_host(s(), 2, 1, y4, y4, 4);
  EXPECT_EQ(cache.length(2, 0), 4);
  EXPECT_EQ(cache.length(2, 1), 4);
  EXPECT_FALSE(cache.done(2));
  // copy_slot_from takes each layer's length from the source: a source in the middle of a step
  // stays there.
  auto one = small_config();
  one.slots = 1;
  KvCache src(dev, one);
  auto kn1 = filled(2 * 32, 1.0f), vn1 = filled(2 * 32, 2.0f);
  src.append(s(), 0, kn1, vn1, std::vector<std::int64_t>{0});
  cache.copy_slot_from(s(), 0, src);
  EXPECT_EQ(cache.length(0), 1);
  EXPECT_EQ(cache.length(0, 0), 1);
  EXPECT_EQ(cache.length(0, 1), 0);
  expect_invalid([&] { cache.length(3, 0); }, "slot");
  expect_invalid([&] { cache.length(0, 2); }, "layer");
}

// KvCache::append writes every slot's token in one launch, with the positions inline (up to
// kInlineRows slots) or staged by one copy (more): 2 M launches in the seed.
TEST_P(Attention, KvCacheAppendIsOneLaunchForAnyNumberOfSlots) {
  for (std::int64_t slots : {std::int64_t{3}, std::int64_t{200}}) {
    SCOPED_TRACE(std::to_string(slots) + " slots");
    auto c = small_config();
    c.slots = slots;
    KvCache cache(dev, c);
    const std::size_t tok = std::size_t(slots * 2 * 32);
    std::vector<float> hk(tok);
    for (std::size_t i = 0; i < tok; ++i) hk[i] = float(i);
    Buffer<float> kn(dev, tok), vn(dev, tok);
    kn.copy_from_host(s(), hk);
    vn.fill(s(), 1.0f);
    std::vector<std::int64_t> pos(std::size_t(slots), 0);
    const auto launches = s().launches();
    cache.append(s(), 0, kn, vn, pos);
    EXPECT_EQ(s().launches() - launches, 1u);
    const auto k = cache.k(0).to_vector(s());
    for (std::int64_t sl = 0; sl < slots; sl += 37)
      for (std::int64_t h = 0; h < 2; ++h)
        ASSERT_EQ(k[std::size_t(((sl * 2 + h) * 8) * 32 + 5)], float((sl * 2 + h) * 32 + 5)) << sl << " " << h;
  }
}

// write_from_host makes a done slot live again, as set_length and copy_slot_from do.
TEST_P(Attention, KvCacheWriteFromHostClearsDone) {
  KvCache cache(dev, small_config());
  cache.mark_done(2);
  std::vector<float> k(2 * 3 * 32, 1.0f), v(2 * 3 * 32, 2.0f);
  cache.write_from_host(s(), 2, 0, k, v, 3);
  EXPECT_FALSE(cache.done(2));
  EXPECT_EQ(cache.length(2), 3);
}

// write_from_device imports the same bytes as write_from_host (the cache's K and V, and so the
// attention over them), mixes with it in one import run, refuses bad input with nothing written,
// and an unfinished import is named as such when the next token is refused.
TEST_P(Attention, KvCacheWriteFromDeviceIsWriteFromHostWithoutTheRoundTrip) {
  const KvCacheConfig c{.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 16, .slots = 2};
  KvCache a(dev, c), b(dev, c);
  Lcg rng(7);
  const std::int64_t count = 11;
  const std::size_t n = std::size_t(2 * count * 32);
  std::vector<std::vector<float>> hk, hv;
  for (int l = 0; l < 2; ++l) {
    hk.push_back(rng.floats(n, 1.0f));
    hv.push_back(rng.floats(n, 1.0f));
  }
  Buffer<float> dk(dev, n), dv(dev, n);
  for (std::int64_t l = 0; l < 2; ++l) a.write_from_host(s(), 1, l, hk[std::size_t(l)], hv[std::size_t(l)], count);
  dk.copy_from_host(s(), hk[0]);
  dv.copy_from_host(s(), hv[0]);
  b.write_from_device(s(), 1, 0, dk, dv, count);
  // Layer 1 not yet written: the next token is refused, and the message says why.
  auto q = filled(2 * 4 * 32, 0.5f), kn = filled(2 * 2 * 32, 0.25f), vn = filled(2 * 2 * 32, -1.0f);
  auto out_a = filled(2 * 4 * 32, 42.0f), out_b = filled(2 * 4 * 32, 42.0f);
  const std::vector<std::int64_t> pos{-1, count};
  b.mark_done(0);
  a.mark_done(0);
  try {
    flash_decoding(s(), b, 0, q, kn, vn, pos, out_b);
    ADD_FAILURE() << "a token after an unfinished import was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.limit()).find("layer 1's missing tokens: it holds 0 of the slot's 11"), std::string::npos)
        << e.what();
  }
  expect_all(out_b, 42.0f);
  // The run continues with a host import of layer 1 (mixed), as `a` was written.
  b.write_from_host(s(), 1, 1, hk[1], hv[1], count);
  EXPECT_EQ(b.length(1, 0), count);
  EXPECT_EQ(b.length(1, 1), count);
  // Slot 1's tokens [0, n) of each kv head (the rest of a layer is memory nobody wrote).
  auto written = [&](const Buffer<float>& layer, std::int64_t n) {
    const auto h = layer.to_vector(s());
    std::vector<float> w;
    for (std::size_t hk = 0; hk < 2; ++hk) {
      const auto* base = h.data() + ((1 * 2 + hk) * 16) * 32;
      w.insert(w.end(), base, base + n * 32);
    }
    return w;
  };
  for (std::int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(same(written(a.k(l), count), written(b.k(l), count))) << l;
    EXPECT_TRUE(same(written(a.v(l), count), written(b.v(l), count))) << l;
    EXPECT_FALSE(same(written(a.k(l), count), written(b.k(1 - l), count))) << l;  // not trivially equal
    flash_decoding(s(), a, l, q, kn, vn, pos, out_a);
    flash_decoding(s(), b, l, q, kn, vn, pos, out_b);
    EXPECT_TRUE(same(out_a.to_vector(s()), out_b.to_vector(s()))) << l;
  }
  // Bad input: nothing written (the whole of layer 0's and 1's K and V: the refused calls target
  // slot 0, or a slot or layer out of range), lengths kept.
  std::vector<std::vector<float>> before;
  for (std::int64_t l = 0; l < 2; ++l) before.push_back(b.k(l).to_vector(s())), before.push_back(b.v(l).to_vector(s()));
  Buffer<float> short_k(dev, n - 1);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, short_k, dv, count); }, "k.size()", std::to_string(n - 1));
  expect_invalid([&] { b.write_from_device(s(), 0, 2, dk, dv, count); }, "layer", "2");
  expect_invalid([&] { b.write_from_device(s(), 2, 0, dk, dv, count); }, "slot", "2");
  expect_invalid([&] { b.write_from_device(s(), 0, 0, dk, dv, 17); }, "count", "17");
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:3") : open("cpu");
  Buffer<float> far(other, n);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, far, dv, count); }, "k.device");
  // A source over the rows it is written to (slot 0's first kv head), in either of k and v; a
  // source elsewhere in the cache (slot 1 of layer 0, into slot 0 of layer 1) is a plain copy.
  auto over_dest = Buffer<float>::wrap(dev, b.k(0).data().get() + 8 * 32, n);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, over_dest, dv, count); }, "k",
                 "memory that overlaps the rows it is written to");
  auto v_over_dest = Buffer<float>::wrap(dev, b.v(0).data().get() + 16 * 32 + 5 * 32, n);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, dk, v_over_dest, count); }, "v",
                 "memory that overlaps the rows it is written to");
  for (std::int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(same(before[std::size_t(2 * l)], b.k(l).to_vector(s()))) << l;
    EXPECT_TRUE(same(before[std::size_t(2 * l + 1)], b.v(l).to_vector(s()))) << l;
  }
  EXPECT_EQ(b.length(0), 0);
  EXPECT_EQ(b.length(1), count + 1);
  // From elsewhere in the cache: n floats from slot 1's rows of layer 0 into slot 0 of layer 1.
  auto from_k = Buffer<float>::wrap(dev, b.k(0).data().get() + 2 * 16 * 32, n);
  auto from_v = Buffer<float>::wrap(dev, b.v(0).data().get() + 2 * 16 * 32, n);
  b.write_from_device(s(), 0, 1, from_k, from_v, count);
  EXPECT_EQ(b.length(0), count);
  const auto src = b.k(0).to_vector(s()), dst = b.k(1).to_vector(s());
  for (std::size_t i = 0; i < std::size_t(count * 32); ++i)  // kv head 0's rows
    ASSERT_EQ(bits(dst[i]), bits(src[2 * 16 * 32 + i])) << i;
}

// copy_slot_from names the stream when it is the stream that is on another device (it named
// src.device, with the cache's own id as the value).
TEST_P(Attention, KvCacheCopySlotFromNamesAStreamOnAnotherDevice) {
  KvCache a(dev, small_config()), b(dev, small_config());
  std::vector<float> k(2 * 3 * 32, 1.0f), v(2 * 3 * 32, 2.0f);
  for (std::int64_t l = 0; l < 2; ++l) b.write_from_host(s(), 0, l, k, v, 3);
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:9") : open("cpu");
  expect_invalid([&] { a.copy_slot_from(other->default_stream(), 1, b, 0); }, "stream.device", other->id().str());
  EXPECT_EQ(a.length(1), 0);
  a.copy_slot_from(s(), 1, b, 0);
  EXPECT_EQ(a.length(1), 3);
}

// A done slot is not attended: its tokens (NaN here) never reach the output, which is zeros, and
// nothing is appended to it.
TEST_P(Attention, KvCacheDoneSlotsAreNotReadAndGiveZeros) {
  KvCache cache(dev, small_config());
  auto q = filled(3 * 4 * 32, 0.5f), kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  auto out = filled(3 * 4 * 32, 42.0f);
  cache.mark_done(1);
  flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{0, 123, 0}, out);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 0, 1}));
  const auto o = out.to_vector(s());
  for (int i = 0; i < 128; ++i) {
    ASSERT_EQ(o[i], 2.0f);            // one token: its value
    ASSERT_EQ(bits(o[128 + i]), 0u);  // done slot
  }
  // A done slot with tokens: still zeros, never NaN (its NaN tokens are not read), and no append.
  std::vector<float> nan_tokens(2 * 5 * 32, NAN);
  cache.write_from_host(s(), 1, 1, nan_tokens, nan_tokens, 5);
  cache.mark_done(1);
  const auto k_before = cache.k(1).to_vector(s());
  flash_decoding(s(), cache, 1, q, kn, vn, std::vector<std::int64_t>{0, 77, 0}, out);
  const auto o2 = out.to_vector(s());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(bits(o2[128 + i]), 0u);
  EXPECT_EQ(cache.length(1), 5);
  const std::size_t slot1 = 1 * 2 * 8 * 32;
  const auto k_after = cache.k(1).to_vector(s());
  for (std::size_t i = 0; i < 2 * 8 * 32; ++i) ASSERT_EQ(bits(k_after[slot1 + i]), bits(k_before[slot1 + i])) << i;
  cache.reset(1);
  EXPECT_FALSE(cache.done(1));
  // reset forgets the tokens in every layer: the slot takes a new sequence from position 0, whose
  // one token is all it attends.
  EXPECT_EQ(cache.length(1), 0);
  for (std::int64_t l = 0; l < 2; ++l) EXPECT_EQ(cache.length(1, l), 0);
  auto vn3 = filled(3 * 2 * 32, 3.0f);
  flash_decoding(s(), cache, 0, q, kn, vn3, std::vector<std::int64_t>{1, 0, 1}, out);
  const auto o3 = out.to_vector(s());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(o3[128 + i], 3.0f);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{2, 1, 2}));
  // mark_done(slot, false) undoes mark_done: the slot is attended and appended to again.
  cache.mark_done(1);
  cache.mark_done(1, false);
  EXPECT_FALSE(cache.done(1));
  flash_decoding(s(), cache, 1, q, kn, vn3, std::vector<std::int64_t>{1, 0, 1}, out);
  EXPECT_EQ(cache.length(1, 1), 1);
  const auto o4 = out.to_vector(s());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(o4[128 + i], 3.0f);
}

// A done slot costs nothing in attention: its 2000 tokens do not lengthen the launch. A live slot
// of 10 tokens beside it takes the kernels of that slot alone (one chunk: by default the merge
// folded into the chunk kernel, Note [folded merge]), where the same slot live takes others
// (eight chunks of two heads per block: by default a merge kernel of its own; with a decode knob
// set, as the CI's knob runs do, the kernels may be the same), and the live slot's output is the
// same bytes.
TEST_P(Attention, KvCacheDoneSlotsDoNotLengthenTheLaunch) {
  const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 2048, .slots = 2};
  Lcg rng{19};
  const auto long_k = rng.floats(2 * 2000 * 32), long_v = rng.floats(2 * 2000 * 32);
  const auto short_k = rng.floats(2 * 10 * 32), short_v = rng.floats(2 * 10 * 32);
  auto q = filled(2 * 4 * 32, 0.25f), kn = filled(2 * 2 * 32, 0.5f), vn = filled(2 * 2 * 32, 0.75f);
  // 0: slot 1 done with 2000 tokens; 1: slot 1 empty; 2: slot 1 live with 2000 tokens.
  std::uint64_t launches[3];
  std::vector<int> kernels[3];
  std::vector<float> outs[3];
  for (int i = 0; i < 3; ++i) {
    KvCache cache(dev, c);
    cache.write_from_host(s(), 0, 0, short_k, short_v, 10);
    if (i != 1) cache.write_from_host(s(), 1, 0, long_k, long_v, 2000);
    if (i == 0) cache.mark_done(1);
    auto out = filled(2 * 4 * 32, 42.0f);
    s().synchronize();
    const auto before = s().launches();
    {
      detail::LaunchRecorder rec;
      flash_decoding(s(), cache, 0, q, kn, vn, cache.lengths(), out);
      kernels[i] = rec.kernels();
    }
    launches[i] = s().launches() - before;
    outs[i] = out.to_vector(s());
  }
  EXPECT_EQ(launches[0], launches[1]);
  EXPECT_EQ(kernels[0], kernels[1]);
  // The same slot live: other kernels (a merge of its own, or with decode.one_grid the one-grid
  // kernel), unless the Tuning decides the folding (fold_merge, block_signals).
  const Tuning& t = tuning_in_force(*dev);
  if (!t.decode.fold_merge.has_value() && t.decode.block_signals) {
    EXPECT_NE(kernels[2], kernels[1]);
    if (!t.decode.one_grid.value_or(false)) EXPECT_GT(launches[2], launches[1]);
  }
  for (std::size_t e = 0; e < 4 * 32; ++e) {
    ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
    ASSERT_EQ(bits(outs[2][e]), bits(outs[1][e])) << e;
  }
}

TEST_P(Attention, KvCacheGrowKeepsContentsAndCopySlotWorks) {
  KvCache cache(dev, small_config());
  const std::size_t tok = 3 * 2 * 32;
  // Distinct values for every token, layer, K and V, so that a copy that mixed them up fails.
  for (std::int64_t t = 0; t < 3; ++t)
    for (std::int64_t l = 0; l < 2; ++l) {
      std::vector<float> hk(tok), hv(tok);
      for (std::size_t i = 0; i < tok; ++i) {
        hk[i] = float(t * 10000 + l * 1000) + float(i);
        hv[i] = -hk[i];
      }
      Buffer<float> kn(dev, tok), vn(dev, tok);
      kn.copy_from_host(s(), hk);
      vn.copy_from_host(s(), hv);
      cache.append(s(), l, kn, vn, std::vector<std::int64_t>{t, t, t});
    }
  cache.rollback(2, 1);
  cache.mark_done(1);
  std::vector<std::vector<float>> before;
  for (std::int64_t l = 0; l < 2; ++l) {
    before.push_back(cache.k(l).to_vector(s()));
    before.push_back(cache.v(l).to_vector(s()));
  }
  // An allocation failure while growing leaves the cache as it was.
  {
    CpuDeviceOptions o;
    o.memory_capacity = 4 * cache.bytes() / 3;  // room for 4 slots' worth, not 5 more
    auto small = make_cpu_device(o);
    KvCache c2(small, small_config());
    auto& s2 = small->default_stream();
    std::vector<float> hk(2 * 2 * 32, 3.0f);
    c2.write_from_host(s2, 0, 0, hk, hk, 2);
    const auto in_use = small->memory_stats().in_use;
    try {
      c2.grow(s2, 5);
      ADD_FAILURE() << "grow beyond the capacity succeeded";
    } catch (const OutOfMemory& e) {  // the whole request, and what was available before it
      EXPECT_EQ(e.requested(), 2ull * 2 * 5 * 2 * 8 * 32 * 4) << e.what();
      EXPECT_EQ(e.available(), o.memory_capacity - in_use) << e.what();
      EXPECT_NE(std::string(e.what()).find("growing a KvCache to 5 slots"), std::string::npos) << e.what();
    }
    try {  // a cache that does not fit: reported as one request
      KvCache too_big(small, small_config());
      ADD_FAILURE() << "a second cache fit";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.requested(), c2.bytes()) << e.what();
      EXPECT_EQ(e.available(), o.memory_capacity - in_use) << e.what();
    }
    // 2^40 layers: an OutOfMemory for the whole request before the first buffer on a capped
    // device, and on an uncapped one too (the host's list of 2^40 buffers cannot be had; it used to
    // escape as a std::bad_alloc).
    auto huge = small_config();
    huge.num_layers = std::int64_t(1) << 40;
    const std::uint64_t layer_bytes = c2.bytes() / std::uint64_t(c2.config().num_layers);  // K and V
    try {
      KvCache c3(small, huge);
      ADD_FAILURE() << "a cache of 2^40 layers fit";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.requested(), (std::uint64_t(1) << 40) * layer_bytes) << e.what();
      EXPECT_EQ(e.available(), o.memory_capacity - in_use) << e.what();
    }
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer aborts on an allocation of that size
    EXPECT_THROW(KvCache(dev, huge), OutOfMemory);
#endif
    EXPECT_EQ(c2.slots(), 3);
    EXPECT_EQ(c2.length(0), 2);
    EXPECT_EQ(small->memory_stats().in_use, in_use);
    EXPECT_EQ(c2.k(0).to_vector(s2)[33], 3.0f);
  }
  cache.grow(s(), 5);
  EXPECT_EQ(cache.slots(), 5);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{3, 3, 1, 0, 0}));
  EXPECT_TRUE(cache.done(1));
  EXPECT_FALSE(cache.done(0) || cache.done(2) || cache.done(3) || cache.done(4));
  EXPECT_EQ(cache.bytes(), 2ull * 2 * 5 * 2 * 8 * 32 * 4);
  for (std::int64_t l = 0; l < 2; ++l) {
    const auto k1 = cache.k(l).to_vector(s()), v1 = cache.v(l).to_vector(s());
    const auto& k0 = before[std::size_t(2 * l)];
    const auto& v0 = before[std::size_t(2 * l + 1)];
    ASSERT_EQ(k1.size(), k0.size() / 3 * 5);
    EXPECT_TRUE(same(k0, std::vector<float>(k1.begin(), k1.begin() + std::ptrdiff_t(k0.size())))) << "K, layer " << l;
    EXPECT_TRUE(same(v0, std::vector<float>(v1.begin(), v1.begin() + std::ptrdiff_t(v0.size())))) << "V, layer " << l;
  }
  expect_invalid([&] { cache.grow(s(), 2); }, "new_slots", "2");
  // A single-slot prefill cache copied into slot 4 (every layer, K and V).
  auto pc = small_config();
  pc.slots = 1;
  pc.max_len = 4;
  KvCache prefill(dev, pc);
  std::vector<float> hk(2 * 2 * 32), hv(2 * 2 * 32), hk1(2 * 2 * 32);
  std::iota(hk.begin(), hk.end(), 0.0f);
  std::iota(hv.begin(), hv.end(), 1000.0f);
  std::iota(hk1.begin(), hk1.end(), 5000.0f);
  prefill.write_from_host(s(), 0, 0, hk, hv, 2);
  prefill.write_from_host(s(), 0, 1, hk1, hv, 2);
  cache.mark_done(4);
  cache.copy_slot_from(s(), 4, prefill);
  EXPECT_EQ(cache.length(4), 2);
  EXPECT_FALSE(cache.done(4));
  const std::size_t slot4 = 4 * 2 * 8 * 32;
  const auto k2 = cache.k(0).to_vector(s()), v2 = cache.v(0).to_vector(s()), k3 = cache.k(1).to_vector(s());
  EXPECT_EQ(k2[slot4 + 0], 0.0f);
  EXPECT_EQ(k2[slot4 + 32 + 5], 37.0f);          // head 0, token 1
  EXPECT_EQ(k2[slot4 + 8 * 32 + 5], 64.0f + 5);  // head 1, token 0
  EXPECT_EQ(v2[slot4 + 8 * 32 + 32 + 7], 1000.0f + 96 + 7);  // head 1, token 1
  EXPECT_EQ(k3[slot4 + 32 + 5], 5037.0f);        // layer 1
  // Bad copies: named, nothing changed.
  const auto k_snapshot = cache.k(0).to_vector(s());
  expect_invalid([&] { cache.copy_slot_from(s(), 4, prefill, 1); }, "src_slot", "1");
  expect_invalid([&] { cache.copy_slot_from(s(), 5, prefill); }, "slot", "5");
  auto geo = small_config();
  geo.num_kv_heads = 1;
  geo.num_heads = 2;
  KvCache other_geometry(dev, geo);
  expect_invalid([&] { cache.copy_slot_from(s(), 4, other_geometry); }, "src geometry");
  auto longer = small_config();
  longer.max_len = 16;
  longer.slots = 1;
  KvCache long_src(dev, longer);
  long_src.set_length(0, 12);
  expect_invalid([&] { cache.copy_slot_from(s(), 4, long_src); }, "src length", "12");
  KvCache elsewhere(open("cpu:9"), pc);
  expect_invalid([&] { cache.copy_slot_from(s(), 4, elsewhere); }, "src.device");
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), k_snapshot));
  EXPECT_EQ(cache.length(4), 2);
  // reset_all: every slot empty and live.
  cache.mark_done(3);
  cache.reset_all();
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>(5, 0)));
  for (std::int64_t sl = 0; sl < 5; ++sl) EXPECT_FALSE(cache.done(sl));
}

}  // namespace
}  // namespace lockstep::testing
