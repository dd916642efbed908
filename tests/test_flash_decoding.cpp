// flash_decoding on every backend: device positions, the append in the chunk kernel, more slots
// than the launch's inline rows.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/kernels/decode.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

// Note [device positions]: the graph-capturable call gives the host-positions call's bytes (out
// and cache), skips -1 and out-of-range positions without writing, and records the latter.
TEST_P(Attention, FlashDecodingWithDevicePositionsGivesTheSameBytes) {
  const KvCacheConfig c{.num_layers = 2, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .max_len = 300, .slots = 3};
  KvCache a(dev, c), b(dev, c);
  const std::vector<std::int64_t> prefill{100, 0, 250};
  Lcg rng{7};
  auto rnd = [&](std::size_t n) { return rng.floats(n, 0.5f); };
  for (std::int64_t slot = 0; slot < 3; ++slot)
    for (std::int64_t l = 0; l < 2; ++l) {
      const std::size_t n = std::size_t(2 * prefill[std::size_t(slot)] * 64);
      const auto hk = rnd(n), hv = rnd(n);
      a.write_from_host(s(), slot, l, hk, hv, prefill[std::size_t(slot)]);
      b.write_from_host(s(), slot, l, hk, hv, prefill[std::size_t(slot)]);
    }
  auto buf = [&](std::size_t n) {
    Buffer<float> x(dev, n);
    x.copy_from_host(s(), rnd(n));
    return x;
  };
  auto ints = [&](std::vector<std::int32_t> v) {
    Buffer<std::int32_t> x(dev, v.size());
    x.copy_from_host(s(), v);
    return x;
  };
  Buffer<std::int32_t> status(dev, 1);
  status.copy_from_host(s(), std::vector<std::int32_t>{0});
  // The caches' tokens [0, len[slot]) of every kv head (the rest is uninitialized memory).
  std::vector<std::int64_t> len = prefill;
  auto written = [&](const Buffer<float>& b) {
    const auto h = b.to_vector(s());
    std::vector<float> w;
    for (std::size_t slot = 0; slot < 3; ++slot)
      for (std::size_t hk = 0; hk < 2; ++hk) {
        const auto* base = h.data() + ((slot * 2 + hk) * 300) * 64;
        w.insert(w.end(), base, base + len[slot] * 64);
      }
    return w;
  };
  // Two steps over both layers; in the second, slot 1 is done.
  for (int step = 0; step < 2; ++step) {
    if (step == 1) a.mark_done(1);
    std::vector<std::int64_t> hp{100 + step, step == 0 ? 0 : 5, 250 + step};
    const auto dpos = ints({100 + step, step == 0 ? 0 : -1, 250 + step});
    for (std::int64_t l = 0; l < 2; ++l) {
      const auto q = buf(3 * 8 * 64), kn = buf(3 * 2 * 64), vn = buf(3 * 2 * 64);
      auto oa = filled(3 * 8 * 64, 42.0f), ob = filled(3 * 8 * 64, 42.0f);
      flash_decoding(s(), a, l, q, kn, vn, hp, oa);
      flash_decoding(s(), b, l, q, kn, vn, dpos, ob, DecodeOptions{.status = &status});
      SCOPED_TRACE("step " + std::to_string(step) + ", layer " + std::to_string(l));
      EXPECT_TRUE(same(oa.to_vector(s()), ob.to_vector(s())));
      for (std::size_t slot = 0; slot < 3; ++slot) len[slot] = a.length(std::int64_t(slot));
      EXPECT_TRUE(same(written(a.k(l)), written(b.k(l))));
      EXPECT_TRUE(same(written(a.v(l)), written(b.v(l))));
    }
  }
  EXPECT_EQ(status.to_vector(s())[0], 0) << "no position was out of range";
  EXPECT_EQ(b.lengths(), prefill) << "the device path leaves the host lengths alone";
  b.set_length(0, 102);
  EXPECT_EQ(b.length(0), 102);
  expect_invalid([&] { b.set_length(0, 301); }, "n");

  // Out of range: 300 (= max_len), 5000 and -7 write nothing (no byte of the caches changes) and
  // attend nothing.
  const auto k0 = b.k(0).to_vector(s()), v0 = b.v(0).to_vector(s());
  const auto q = buf(3 * 8 * 64), kn = buf(3 * 2 * 64), vn = buf(3 * 2 * 64);
  auto ob = filled(3 * 8 * 64, 42.0f);
  flash_decoding(s(), b, 0, q, kn, vn, ints({300, 5000, -7}), ob, DecodeOptions{.status = &status});
  EXPECT_TRUE(same(k0, b.k(0).to_vector(s())));
  EXPECT_TRUE(same(v0, b.v(0).to_vector(s())));
  for (float x : ob.to_vector(s())) ASSERT_EQ(bits(x), 0u);
  // Every slot is out of range: the status holds the highest, 1 + slot 2, whichever of the
  // blocks that flag the three slots (in parallel, on the CPU device too) stores last.
  EXPECT_EQ(status.to_vector(s())[0], 3);
  // INT32_MAX: its length (position + 1) must not overflow into a valid one; -1 is a done slot,
  // not an error.
  status.fill(s(), 0);
  flash_decoding(s(), b, 0, q, kn, vn, ints({-1, 2147483647, -1}), ob, DecodeOptions{.status = &status});
  EXPECT_TRUE(same(k0, b.k(0).to_vector(s())));
  for (float x : ob.to_vector(s())) ASSERT_EQ(bits(x), 0u);
  EXPECT_EQ(status.to_vector(s())[0], 2);
  // A later call never lowers it (the maximum over calls, until the caller clears it).
  flash_decoding(s(), b, 0, q, kn, vn, ints({-7, -1, -1}), ob, DecodeOptions{.status = &status});
  EXPECT_EQ(status.to_vector(s())[0], 2);
  status.fill(s(), 0);
  flash_decoding(s(), b, 0, q, kn, vn, ints({-7, -1, -1}), ob, DecodeOptions{.status = &status});
  EXPECT_EQ(status.to_vector(s())[0], 1);

  // Host-side checks: typed errors, nothing enqueued (the position buffers are uploaded first:
  // their copies are enqueued), nothing written.
  auto oc = filled(3 * 8 * 64, 42.0f);
  auto pos2 = ints({1, 2}), pos3 = ints({1, 2, 3});
  Buffer<std::int32_t> two(dev, 2);
  two.fill(s(), 7);
  const auto k_before = b.k(0).to_vector(s()), v_before = b.v(0).to_vector(s());
  const auto launches = s().launches();
  expect_invalid([&] { flash_decoding(s(), b, 0, q, kn, vn, pos2, oc); }, "positions.size()");
  expect_invalid([&] { flash_decoding(s(), b, 0, q, kn, vn, pos3, oc, DecodeOptions{.status = &two}); }, "options.status.size()");
  expect_invalid([&] { flash_decoding(s(), b, 2, q, kn, vn, pos3, oc); }, "layer");
  EXPECT_EQ(s().launches(), launches);
  expect_all(oc, 42.0f);
  EXPECT_EQ(two.to_vector(s()), (std::vector<std::int32_t>{7, 7}));
  EXPECT_TRUE(same(b.k(0).to_vector(s()), k_before));
  EXPECT_TRUE(same(b.v(0).to_vector(s()), v_before));
}

// Note [fused append]: flash_decoding appends each slot's new token in its chunk kernel. The cache
// then holds what KvCache::append (the KvScatter kernel) writes, and the attention takes the new
// token from k_new / v_new, never from the cache (a NaN left at the position changes no bit). At
// head_dim 128 with 8 query heads per kv head, two chunk blocks share each kv head's chunk (one
// of them writes). Positions: a chunk's first row, its last row, 0; then one further.
TEST_P(Attention, FlashDecodingAppendsInItsChunkKernel) {
  constexpr int H = 16, Hkv = 2, D = 128, M = 700;
  const KvCacheConfig c{.num_layers = 1, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D, .max_len = M, .slots = 3};
  KvCache fused(dev, c), scattered(dev, c), poisoned(dev, c);
  const std::vector<std::int64_t> prefill{256, 511, 0};
  Lcg rng{31};
  for (std::int64_t slot = 0; slot < 3; ++slot) {
    const std::int64_t n = prefill[std::size_t(slot)];
    const auto hk = rng.floats(std::size_t(Hkv * n * D)), hv = rng.floats(hk.size());
    fused.write_from_host(s(), slot, 0, hk, hv, n);
    scattered.write_from_host(s(), slot, 0, hk, hv, n);
    // The poisoned cache holds NaN at the position the call appends to.
    std::vector<float> pk(std::size_t(Hkv * (n + 1) * D), std::numeric_limits<float>::quiet_NaN()), pv = pk;
    for (std::int64_t hk_i = 0; hk_i < Hkv; ++hk_i)
      for (std::int64_t i = 0; i < n * D; ++i) {
        pk[std::size_t(hk_i * (n + 1) * D + i)] = hk[std::size_t(hk_i * n * D + i)];
        pv[std::size_t(hk_i * (n + 1) * D + i)] = hv[std::size_t(hk_i * n * D + i)];
      }
    poisoned.write_from_host(s(), slot, 0, pk, pv, n + 1);
    poisoned.set_length(slot, n);
  }
  auto written = [&](const KvCache& kc, bool v) {  // tokens [0, length) of every slot and kv head
    const auto h = (v ? kc.v(0) : kc.k(0)).to_vector(s());
    std::vector<float> w;
    for (std::int64_t slot = 0; slot < 3; ++slot)
      for (std::int64_t hk = 0; hk < Hkv; ++hk) {
        const auto* base = h.data() + std::size_t((slot * Hkv + hk) * M * D);
        w.insert(w.end(), base, base + kc.length(slot) * D);
      }
    return w;
  };
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<std::int64_t> pos{prefill[0] + step, prefill[1] + step, prefill[2] + step};
    Buffer<float> q(dev, 3 * H * D), kn(dev, 3 * Hkv * D), vn(dev, 3 * Hkv * D);
    for (auto* b : {&q, &kn, &vn}) b->copy_from_host(s(), rng.floats(b->size()));
    auto of = filled(3 * H * D, 42.0f), op = filled(3 * H * D, 42.0f);
    flash_decoding(s(), fused, 0, q, kn, vn, pos, of);
    flash_decoding(s(), poisoned, 0, q, kn, vn, pos, op);
    scattered.append(s(), 0, kn, vn, pos);
    const auto o = of.to_vector(s());
    for (float x : o) ASSERT_TRUE(std::isfinite(x));
    EXPECT_TRUE(same(o, op.to_vector(s()))) << "a NaN at the appended position reached the output";
    EXPECT_EQ(fused.lengths(), scattered.lengths());
    // The same bytes as incremental_attention over each slot of the scattered cache.
    const auto qh = q.to_vector(s()), sk = scattered.k(0).to_vector(s()), sv = scattered.v(0).to_vector(s());
    for (std::int64_t slot = 0; slot < 3; ++slot) {
      const auto at = [&](const std::vector<float>& h, std::int64_t off, std::int64_t n) {
        return std::vector<float>(h.begin() + off, h.begin() + off + n);
      };
      Buffer<float> q1(dev, H * D), k1(dev, std::size_t(Hkv * M * D)), v1(dev, std::size_t(Hkv * M * D)), o1(dev, H * D);
      q1.copy_from_host(s(), at(qh, slot * H * D, H * D));
      k1.copy_from_host(s(), at(sk, slot * Hkv * M * D, Hkv * M * D));
      v1.copy_from_host(s(), at(sv, slot * Hkv * M * D, Hkv * M * D));
      incremental_attention(s(), q1, k1, v1, pos[std::size_t(slot)] + 1, o1, DecodeShape{H, Hkv, D, M});
      EXPECT_TRUE(same(o1.to_vector(s()), at(o, slot * H * D, H * D))) << "slot " << slot;
    }
    for (bool v : {false, true}) {
      const auto ws = written(scattered, v);
      EXPECT_TRUE(same(written(fused, v), ws)) << (v ? "V" : "K") << ": the fused append differs from KvScatter's";
      EXPECT_TRUE(same(written(poisoned, v), ws)) << (v ? "V" : "K") << ": the poisoned row was not overwritten";
    }
    // The appended rows hold k_new / v_new.
    const auto kh = kn.to_vector(s()), kc = fused.k(0).to_vector(s());
    for (std::int64_t slot = 0; slot < 3; ++slot)
      for (std::int64_t hk = 0; hk < Hkv; ++hk)
        for (std::int64_t d = 0; d < D; ++d)
          ASSERT_EQ(bits(kc[std::size_t(((slot * Hkv + hk) * M + pos[std::size_t(slot)]) * D + d)]),
                    bits(kh[std::size_t((slot * Hkv + hk) * D + d)]));
  }
}

// Note [inline positions]: up to kInlineRows slots' positions travel in the launch's parameters;
// more are staged in device memory. Both give the bytes of the device-positions call.
TEST_P(Attention, FlashDecodingPastTheInlineRowsGivesTheSameBytes) {
  for (std::int64_t slots : {std::int64_t{kernels::kInlineRows}, std::int64_t{kernels::kInlineRows} + 2}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 40, .slots = slots};
    KvCache a(dev, c), b(dev, c), d(dev, c);
    Lcg rng{std::uint32_t(slots)};
    std::vector<std::int64_t> pos(static_cast<std::size_t>(slots));
    std::vector<std::int32_t> dpos(pos.size());
    for (std::int64_t slot = 0; slot < slots; ++slot) {
      const std::int64_t n = slot % 37;
      const auto hk = rng.floats(std::size_t(2 * n * 32)), hv = rng.floats(hk.size());
      for (KvCache* kc : {&a, &b, &d}) kc->write_from_host(s(), slot, 0, hk, hv, n);
      pos[std::size_t(slot)] = n;
      dpos[std::size_t(slot)] = std::int32_t(n);
    }
    Buffer<float> q(dev, std::size_t(slots) * 4 * 32), kn(dev, std::size_t(slots) * 2 * 32), vn(dev, kn.size());
    for (auto* buf : {&q, &kn, &vn}) buf->copy_from_host(s(), rng.floats(buf->size()));
    Buffer<std::int32_t> dp(dev, dpos.size());
    dp.copy_from_host(s(), dpos);
    auto oa = filled(q.size(), 42.0f), ob = filled(q.size(), 42.0f);
    flash_decoding(s(), a, 0, q, kn, vn, pos, oa);
    flash_decoding(s(), b, 0, q, kn, vn, dp, ob);
    d.append(s(), 0, kn, vn, pos);
    auto written = [&](const Buffer<float>& buf) {  // tokens [0, position] (the rest is not written)
      const auto h = buf.to_vector(s());
      std::vector<float> w;
      for (std::int64_t slot = 0; slot < slots; ++slot)
        for (std::int64_t hk = 0; hk < 2; ++hk) {
          const auto* base = h.data() + std::size_t((slot * 2 + hk) * 40 * 32);
          w.insert(w.end(), base, base + (pos[std::size_t(slot)] + 1) * 32);
        }
      return w;
    };
    EXPECT_TRUE(same(oa.to_vector(s()), ob.to_vector(s())));
    EXPECT_TRUE(same(written(a.k(0)), written(b.k(0))));
    EXPECT_TRUE(same(written(a.v(0)), written(b.v(0))));
    EXPECT_TRUE(same(written(a.v(0)), written(d.v(0)))) << "KvCache::append";
    EXPECT_TRUE(same(written(a.k(0)), written(d.k(0)))) << "KvCache::append";
  }
}

}  // namespace
}  // namespace lockstep::testing
