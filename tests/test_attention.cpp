// The attention calls together on every backend: misaligned wrapped buffers and outputs that
// share memory with inputs are typed errors in every call. The suite's instantiation over the
// backends for every tests/test_*.cpp of the Attention suite.

#include <gtest/gtest.h>

#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/attention/multihead.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

// The decode kernels read q, the caches and the new tokens as 16-byte vectors: a wrapped pointer
// that is not 16-byte aligned is a typed error naming it, and nothing is written.
TEST_P(Attention, DecodeRejectsMisalignedWrappedBuffers) {
  const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 8, .slots = 1};
  KvCache cache(dev, c);
  auto q = filled(4 * 32 + 4, 0.5f), kn = filled(2 * 32 + 4, 1.0f), vn = filled(2 * 32 + 4, 2.0f);
  auto out = filled(4 * 32, 42.0f);
  auto shifted = [&](Buffer<float>& b, std::size_t n) { return Buffer<float>::wrap(dev, b.data().get() + 1, n); };
  auto q1 = shifted(q, 4 * 32), k1 = shifted(kn, 2 * 32), v1 = shifted(vn, 2 * 32);
  Buffer<float> k0 = Buffer<float>::wrap(dev, kn.data().get(), 2 * 32), v0 = Buffer<float>::wrap(dev, vn.data().get(), 2 * 32);
  Buffer<float> q0 = Buffer<float>::wrap(dev, q.data().get(), 4 * 32);
  const std::vector<std::int64_t> pos{0};
  expect_invalid([&] { flash_decoding(s(), cache, 0, q1, k0, v0, pos, out); }, "q.data()");
  try {  // the size a new token's K must have, with the kv heads named
    flash_decoding(s(), cache, 0, q0, q0, v0, pos, out);
    ADD_FAILURE() << "accepted a k_new of num_heads rows";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "k_new.size()");
    EXPECT_EQ(e.limit(), "64 (slots * num_kv_heads * head_dim)");
  }
  expect_invalid([&] { flash_decoding(s(), cache, 0, q0, k1, v0, pos, out); }, "k_new.data()");
  expect_invalid([&] { flash_decoding(s(), cache, 0, q0, k0, v1, pos, out); }, "v_new.data()");
  expect_all(out, 42.0f);
  EXPECT_EQ(cache.length(0), 0);
  // incremental_attention: q and the caches.
  auto kc = filled(2 * 8 * 32 + 4, 1.0f), vc = filled(2 * 8 * 32 + 4, 1.0f);
  auto kc1 = shifted(kc, 2 * 8 * 32), kc0 = Buffer<float>::wrap(dev, kc.data().get(), 2 * 8 * 32);
  auto vc0 = Buffer<float>::wrap(dev, vc.data().get(), 2 * 8 * 32);
  const DecodeShape sh{4, 2, 32, 8};
  expect_invalid([&] { incremental_attention(s(), q1, kc0, vc0, 4, out, sh); }, "q.data()");
  expect_invalid([&] { incremental_attention(s(), q0, kc1, vc0, 4, out, sh); }, "k_cache.data()");
  auto vc1 = shifted(vc, 2 * 8 * 32);
  expect_invalid([&] { incremental_attention(s(), q0, kc0, vc1, 4, out, sh); }, "v_cache.data()");
  expect_all(out, 42.0f);
  incremental_attention(s(), q0, kc0, vc0, 4, out, sh);  // aligned wraps are accepted
  for (float x : out.to_vector(s())) ASSERT_EQ(x, 1.0f);
}

// No attention call is in place: an output sharing memory with an input (the same buffer, or a
// wrapped pointer into it) is InvalidArgument naming the output, and nothing is written.
TEST_P(Attention, OutputsMayNotShareMemoryWithInputs) {
  auto view = [&](Buffer<float>& b, std::size_t offset, std::size_t n) {
    return Buffer<float>::wrap(dev, b.data().get() + offset, n);
  };
  // incremental_attention: out over q, or inside a cache.
  {
    const DecodeShape sh{4, 2, 32, 8};
    auto q = filled(4 * 32, 0.5f), kc = filled(2 * 8 * 32, 1.0f), vc = filled(2 * 8 * 32, 2.0f);
    auto in_v = view(vc, 64, 4 * 32);
    expect_invalid([&] { incremental_attention(s(), q, kc, vc, 4, q, sh); }, "out", "memory that overlaps q");
    expect_invalid([&] { incremental_attention(s(), q, kc, vc, 4, in_v, sh); }, "out", "memory that overlaps v_cache");
    expect_all(q, 0.5f);
    expect_all(vc, 2.0f);
    // kv_cache_scatter: src inside the cache.
    auto src = view(kc, 2 * 8 * 32 - 64, 64);
    expect_invalid([&] { kv_cache_scatter(s(), src, 0, kc, sh); }, "cache", "memory that overlaps src");
    expect_all(kc, 1.0f);
  }
  // multihead_attention: out over v (partly).
  {
    auto q = filled(4 * 64, 0.25f), k = filled(4 * 64, 0.5f), v = filled(4 * 64 + 32, 1.0f);
    auto v0 = view(v, 0, 4 * 64), out = view(v, 32, 4 * 64);
    expect_invalid([&] { multihead_attention(s(), q, k, v0, out, MhaShape{4, 2, 32}); }, "out",
                   "memory that overlaps v");
    expect_invalid([&] { multihead_attention(s(), q, k, v0, q, MhaShape{4, 2, 32}); }, "out", "memory that overlaps q");
    expect_all(v, 1.0f);
    expect_all(q, 0.25f);
  }
  // Fused attention: out over q or k, log-sum-exp over out; in both precisions.
  for (auto precision : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    const AttentionShape sh{.batch = 1, .num_heads = 2, .num_kv_heads = 1, .seq_q = 3, .seq_kv = 5, .head_dim = 32};
    auto q = filled(2 * 3 * 32, 0.5f), k = filled(5 * 32, 0.25f), v = filled(5 * 32, 1.0f);
    auto out = filled(2 * 3 * 32 + 6, 42.0f);
    auto out0 = view(out, 0, 2 * 3 * 32), lse_in_out = view(out, 2 * 3 * 32 - 1, 6);
    AttentionOptions o;
    o.precision = precision;
    expect_invalid([&] { attention(s(), q, k, v, q, sh, o); }, "out", "memory that overlaps q");
    auto q5 = view(q, 0, 5 * 32);
    const AttentionShape sh5{.batch = 1, .num_heads = 1, .num_kv_heads = 1, .seq_q = 5, .seq_kv = 5, .head_dim = 32};
    expect_invalid([&] { attention(s(), q5, k, v, k, sh5, o); }, "out", "memory that overlaps k");
    o.lse = &lse_in_out;
    expect_invalid([&] { attention(s(), q, k, v, out0, sh, o); }, "lse", "memory that overlaps out");
    auto k6 = view(k, 0, 6);
    o.lse = &k6;
    expect_invalid([&] { attention(s(), q, k, v, out0, sh, o); }, "lse", "memory that overlaps k");
    expect_all(out, 42.0f);
    expect_all(q, 0.5f);
    expect_all(k, 0.25f);
  }
  // flash_decoding, both overloads: out over q; status over positions.
  {
    const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 8, .slots = 2};
    KvCache cache(dev, c);
    auto q = filled(2 * 4 * 32, 0.5f), kn = filled(2 * 2 * 32, 1.0f), vn = filled(2 * 2 * 32, 2.0f);
    auto out = filled(2 * 4 * 32, 42.0f);
    const std::vector<std::int64_t> pos{0, 0};
    const auto k_before = cache.k(0).to_vector(s()), v_before = cache.v(0).to_vector(s());
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, pos, q); }, "out", "memory that overlaps q");
    Buffer<std::int32_t> dpos(dev, 2);
    dpos.copy_from_host(s(), std::vector<std::int32_t>{0, 0});
    auto status = Buffer<std::int32_t>::wrap(dev, dpos.data().get() + 1, 1);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos, out, DecodeOptions{.status = &status}); }, "options.status",
                   "memory that overlaps positions");
    auto status_in_q = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(q.data().get()), 1);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos, out, DecodeOptions{.status = &status_in_q}); }, "options.status",
                   "memory that overlaps q");
    // A wrapped view of the cache itself, as out or status.
    auto out_in_k = Buffer<float>::wrap(dev, cache.k(0).data().get() + 64, 2 * 4 * 32);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, pos, out_in_k); }, "out",
                   "memory that overlaps the cache's K");
    auto status_in_v = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(cache.v(0).data().get()), 1);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos, out, DecodeOptions{.status = &status_in_v}); }, "options.status",
                   "memory that overlaps the cache's V");
    // Inputs inside the cache the call writes: the new tokens (also for append), q, positions.
    auto kn_in_v = Buffer<float>::wrap(dev, cache.v(0).data().get() + 32, 2 * 2 * 32);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn_in_v, vn, pos, out); }, "k_new",
                   "memory that overlaps the cache's V");
    expect_invalid([&] { cache.append(s(), 0, kn, kn_in_v, pos); }, "v_new", "memory that overlaps the cache's V");
    auto q_in_k = Buffer<float>::wrap(dev, cache.k(0).data().get(), 2 * 4 * 32);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q_in_k, kn, vn, pos, out); }, "q",
                   "memory that overlaps the cache's K");
    auto dpos_in_k = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(cache.k(0).data().get()), 2);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos_in_k, out); }, "positions",
                   "memory that overlaps the cache's K");
    expect_all(out, 42.0f);
    expect_all(q, 0.5f);
    EXPECT_TRUE(same(cache.k(0).to_vector(s()), k_before)) << "the refused calls wrote no new token";
    EXPECT_TRUE(same(cache.v(0).to_vector(s()), v_before));
    EXPECT_EQ(cache.length(0), 0);
    EXPECT_EQ(cache.length(1), 0);
    flash_decoding(s(), cache, 0, q, kn, vn, pos, out);  // distinct buffers are accepted
    EXPECT_EQ(cache.length(0), 1);
    for (float x : out.to_vector(s())) ASSERT_EQ(x, 2.0f);
  }
  // rope: q and k rotated in place, so they may not share memory.
  {
    auto qk = filled(2 * 4 * 8, 0.75f);
    auto k = view(qk, 2 * 4 * 8 - 2 * 2 * 8, 2 * 2 * 8);
    const std::vector<std::int64_t> pos{1, 2};
    expect_invalid([&] { rope(s(), &qk, &k, pos, RopeConfig{4, 2, 8, 10000.0f, RopeStyle::kNorm}); }, "k",
                   "memory that overlaps q");
    expect_all(qk, 0.75f);
  }
}

LOCKSTEP_INSTANTIATE_BACKENDS(Attention);

}  // namespace
}  // namespace lockstep::testing
