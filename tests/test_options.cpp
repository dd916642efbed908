// What every attention call's options share (docs/api.md, "Vocabulary", "Workspace"): the
// softmax scale, a caller-owned workspace instead of the stream's scratch, and optional outputs
// as pointers in the options; each on every backend.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/multihead.hpp"
#include "support/attention.hpp"
#include "support/random.hpp"

namespace lockstep::testing {
namespace {

class Options : public Attention {
 protected:
  std::vector<float> download(const Buffer<float>& b) { return b.to_vector(s()); }
  Buffer<float> random(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
    Lcg rng{seed};
    return upload(rng.floats(n, scale));
  }
  // The device memory a call allocates on a fresh stream (its scratch, its counters), after the
  // default stream's work (the inputs' uploads and fills) is done.
  template <class F>
  std::uint64_t allocated_by(F&& call) {
    s().synchronize();
    auto st = dev->create_stream();
    const std::uint64_t before = dev->memory_stats().in_use;
    call(*st);
    st->synchronize();
    const std::uint64_t after = dev->memory_stats().in_use;
    return after - before;
  }
};

// Property: an explicit scale of 1 / sqrt(head_dim) is the default (the same bytes); scale 0
// weighs every token alike, so each output is the mean of the value rows; a non-finite scale is
// refused by name and writes nothing.
TEST_P(Options, IncrementalScale) {
  const std::int64_t H = 4, Hk = 2, D = 64, L = 40, n = 33;
  const DecodeShape sh{H, Hk, D, L};
  auto q = random(std::size_t(H * D), 1), kc = random(std::size_t(Hk * L * D), 2), vc = random(std::size_t(Hk * L * D), 3);
  auto a = filled(std::size_t(H * D), 42.0f), b = filled(std::size_t(H * D), 42.0f);
  incremental_attention(s(), q, kc, vc, n, a, sh);
  incremental_attention(s(), q, kc, vc, n, b, sh, DecodeOptions{.scale = 1.0f / std::sqrt(float(D))});
  EXPECT_TRUE(same(download(a), download(b)));
  incremental_attention(s(), q, kc, vc, n, b, sh, DecodeOptions{.scale = 0.0f});
  const auto v = download(vc), out = download(b);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t d = 0; d < D; ++d) {
      double mean = 0;
      for (std::int64_t t = 0; t < n; ++t) mean += v[std::size_t(((h / (H / Hk)) * L + t) * D + d)];
      mean /= double(n);
      ASSERT_NEAR(out[std::size_t(h * D + d)], mean, 1e-5) << "head " << h << " dim " << d;
    }
  auto c = filled(std::size_t(H * D), 42.0f);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, n, c, sh, DecodeOptions{.scale = NAN}); }, "options.scale");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, n, c, sh, DecodeOptions{.scale = INFINITY}); },
                 "options.scale");
  Buffer<std::int32_t> status(dev, 1);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, n, c, sh, DecodeOptions{.status = &status}); },
                 "options.status");
  expect_all(c, 42.0f);
}

// Property: a scale s on flash_decoding gives what incremental_attention gives with s on the same
// tokens (the two calls share their kernels and bytes).
TEST_P(Options, FlashDecodingScaleMatchesIncremental) {
  const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 50, .slots = 1};
  KvCache cache(dev, c);
  Lcg rng{11};
  const auto hk = rng.floats(2 * 20 * 32), hv = rng.floats(2 * 20 * 32);
  cache.write_from_host(s(), 0, 0, hk, hv, 20);
  auto q = random(4 * 32, 12), kn = random(2 * 32, 13), vn = random(2 * 32, 14);
  auto out = filled(4 * 32, 42.0f);
  const DecodeOptions o{.scale = 0.37f};
  flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{20}, out, o);
  // The same 21 tokens, head-first, for incremental_attention.
  const auto k = download(cache.k(0)), v = download(cache.v(0));
  auto kc = upload(k), vc = upload(v);
  auto ref = filled(4 * 32, 42.0f);
  incremental_attention(s(), q, kc, vc, 21, ref, DecodeShape{4, 2, 32, 50}, o);
  EXPECT_TRUE(same(download(out), download(ref)));
  Buffer<std::int32_t> status(dev, 1);
  auto untouched = filled(4 * 32, 42.0f);
  expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{21}, untouched,
                                      DecodeOptions{.status = &status}); },
                 "options.status");
  expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{21}, untouched,
                                      DecodeOptions{.scale = NAN}); },
                 "options.scale");
  expect_all(untouched, 42.0f);
  EXPECT_EQ(cache.length(0), 21) << "the refused calls appended nothing";
}

// Property: with a caller's workspace, each call gives the bytes it gives with the stream's
// scratch, and allocates no scratch block (at most the stream's small counter block).
TEST_P(Options, WorkspaceGivesTheSameBytesWithoutScratch) {
  constexpr std::uint64_t kCounterBlock = 4096;
  {  // incremental_attention
    const DecodeShape sh{8, 2, 128, 300};
    auto q = random(8 * 128, 21), kc = random(2 * 300 * 128, 22), vc = random(2 * 300 * 128, 23);
    auto a = filled(8 * 128, 0.0f), b = filled(8 * 128, 0.0f);
    EXPECT_GT(allocated_by([&](Stream& st) { incremental_attention(st, q, kc, vc, 290, a, sh); }), kCounterBlock)
        << "without a workspace the call takes a scratch block (what the checks below tell apart)";
    Buffer<std::byte> ws(dev, incremental_attention_workspace_bytes(sh));
    EXPECT_LE(allocated_by([&](Stream& st) {
                incremental_attention(st, q, kc, vc, 290, b, sh, DecodeOptions{.workspace = &ws});
              }),
              kCounterBlock);
    EXPECT_TRUE(same(download(a), download(b)));
  }
  {  // flash_decoding, host and device positions (more slots than travel inline)
    const KvCacheConfig c{.num_layers = 1, .num_heads = 2, .num_kv_heads = 1, .head_dim = 32, .max_len = 40, .slots = 130};
    KvCache x(dev, c), y(dev, c);
    std::vector<std::int64_t> pos(130);
    std::vector<std::int32_t> pos32(130);
    // Lengths up to max_len - 1 (then max_len with the device positions below): the workspace
    // is used at the size its query gives.
    for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = pos32[i] = std::int32_t((i * 7) % 39);
    for (std::int64_t slot = 0; slot < 130; ++slot) {
      Lcg rng{std::uint64_t(100 + slot)};
      const auto n = pos[std::size_t(slot)];
      const auto hk = rng.floats(std::size_t(n * 32)), hv = rng.floats(std::size_t(n * 32));
      x.write_from_host(s(), slot, 0, hk, hv, n);
      y.write_from_host(s(), slot, 0, hk, hv, n);
    }
    auto q = random(130 * 2 * 32, 31), kn = random(130 * 32, 32), vn = random(130 * 32, 33);
    auto a = filled(130 * 2 * 32, 0.0f), b = filled(130 * 2 * 32, 0.0f);
    flash_decoding(s(), x, 0, q, kn, vn, pos, a);
    Buffer<std::byte> ws(dev, flash_decoding_workspace_bytes(c));
    EXPECT_LE(allocated_by([&](Stream& st) { flash_decoding(st, y, 0, q, kn, vn, pos, b, DecodeOptions{.workspace = &ws}); }),
              kCounterBlock);
    EXPECT_TRUE(same(download(a), download(b)));
    // The tokens written (each slot's first pos + 1; the rest of a cache is uninitialized memory).
    const auto written = [&](const Buffer<float>& layer) {
      const auto h = download(layer);
      std::vector<float> w;
      for (std::size_t slot = 0; slot < pos.size(); ++slot)
        w.insert(w.end(), h.begin() + std::ptrdiff_t(slot * 40 * 32),
                 h.begin() + std::ptrdiff_t(slot * 40 * 32 + std::size_t(pos[slot] + 1) * 32));
      return w;
    };
    EXPECT_TRUE(same(written(x.k(0)), written(y.k(0))) && same(written(x.v(0)), written(y.v(0))))
        << "the appended tokens";
    // Device positions: the next token of every slot.
    Buffer<std::int32_t> dpos(dev, 130);
    for (auto& p : pos32) ++p;
    dpos.copy_from_host(s(), pos32);
    for (auto& p : pos) ++p;
    flash_decoding(s(), x, 0, q, kn, vn, pos, a);
    EXPECT_LE(allocated_by([&](Stream& st) { flash_decoding(st, y, 0, q, kn, vn, dpos, b, DecodeOptions{.workspace = &ws}); }),
              kCounterBlock);
    EXPECT_TRUE(same(download(a), download(b)));
  }
  {  // attention, Exact and TensorCore (the packed K and V live in the workspace)
    for (auto precision : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
      const AttentionShape sh{.batch = 1, .num_heads = 2, .num_kv_heads = 1, .seq_q = 70, .seq_kv = 90, .head_dim = 64};
      AttentionOptions o;
      o.precision = precision;
      o.causal = true;
      auto q = random(2 * 70 * 64, 41), k = random(90 * 64, 42), v = random(90 * 64, 43);
      auto a = filled(2 * 70 * 64, 0.0f), b = filled(2 * 70 * 64, 0.0f);
      attention(s(), q, k, v, a, sh, o);
      const std::uint64_t bytes = attention_workspace_bytes(*dev, sh, o);
      if (precision == AttentionPrecision::kTensorCore) EXPECT_GT(bytes, 0u) << "fp16 K and V";
      Buffer<std::byte> ws(dev, bytes);
      o.workspace = &ws;
      EXPECT_LE(allocated_by([&](Stream& st) { attention(st, q, k, v, b, sh, o); }), kCounterBlock);
      EXPECT_TRUE(same(download(a), download(b)));
    }
  }
  {  // multihead_attention, both implementations
    for (auto impl : {MhaImpl::kBatched, MhaImpl::kPerHead}) {
      const MhaShape sh{24, 3, 32};
      MhaOptions o;
      o.impl = impl;
      o.gemm = GemmKind::kExact;
      auto q = random(24 * 3 * 32, 51), k = random(24 * 3 * 32, 52), v = random(24 * 3 * 32, 53);
      auto a = filled(24 * 3 * 32, 0.0f), b = filled(24 * 3 * 32, 0.0f);
      multihead_attention(s(), q, k, v, a, sh, o);
      Buffer<std::byte> ws(dev, multihead_attention_workspace_bytes(sh, o));
      o.workspace = &ws;
      EXPECT_LE(allocated_by([&](Stream& st) { multihead_attention(st, q, k, v, b, sh, o); }), kCounterBlock);
      EXPECT_TRUE(same(download(a), download(b)));
    }
  }
}

// A workspace that is too small, misaligned or overlaps an argument is refused by name, and the
// call writes nothing.
TEST_P(Options, BadWorkspaceIsRefusedAndWritesNothing) {
  const DecodeShape sh{4, 4, 64, 100};
  auto q = random(4 * 64, 61), kc = random(4 * 100 * 64, 62), vc = random(4 * 100 * 64, 63);
  auto out = filled(4 * 64, 42.0f);
  const std::uint64_t need = incremental_attention_workspace_bytes(sh);
  Buffer<std::byte> small(dev, 16);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 100, out, sh, DecodeOptions{.workspace = &small}); },
                 "options.workspace.size()");
  Buffer<std::byte> big(dev, need + 64);
  auto shifted = Buffer<std::byte>::wrap(dev, big.data().get() + 4, need);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 100, out, sh, DecodeOptions{.workspace = &shifted}); },
                 "options.workspace.data()");
  auto over_cache = Buffer<std::byte>::wrap(dev, reinterpret_cast<std::byte*>(kc.data().get()), kc.size_bytes());
  ASSERT_GE(over_cache.size(), need);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 100, out, sh, DecodeOptions{.workspace = &over_cache}); },
                 "options.workspace");
  expect_all(out, 42.0f);

  const AttentionShape ash{.batch = 1, .num_heads = 1, .num_kv_heads = 1, .seq_q = 64, .seq_kv = 64, .head_dim = 64};
  AttentionOptions o;
  o.precision = AttentionPrecision::kTensorCore;
  auto aq = random(64 * 64, 64), ak = random(64 * 64, 65), av = random(64 * 64, 66);
  auto aout = filled(64 * 64, 42.0f);
  o.workspace = &small;
  expect_invalid([&] { attention(s(), aq, ak, av, aout, ash, o); }, "options.workspace.size()");
  Buffer<std::byte> enough(dev, attention_workspace_bytes(*dev, ash, o));
  auto over_k = Buffer<std::byte>::wrap(dev, reinterpret_cast<std::byte*>(ak.data().get()), ak.size_bytes());
  ASSERT_GE(over_k.size(), enough.size());
  o.workspace = &over_k;
  expect_invalid([&] { attention(s(), aq, ak, av, aout, ash, o); }, "options.workspace");
  expect_all(aout, 42.0f);
  EXPECT_TRUE(same(download(ak), Lcg{65}.floats(64 * 64))) << "k is untouched";

  // The size queries check the shape as the calls do.
  expect_invalid([&] { attention_workspace_bytes(*dev, AttentionShape{.num_heads = 3, .num_kv_heads = 2}); },
                 "num_kv_heads");
  expect_invalid([&] { incremental_attention_workspace_bytes(DecodeShape{8, 3, 64, 100}); }, "num_kv_heads");
  expect_invalid([&] { multihead_attention_workspace_bytes(MhaShape{4, 0, 32}); }, "num_heads");

  // flash_decoding: over the positions, the status, or the layer's K; nothing appended.
  const KvCacheConfig c{.num_layers = 1, .num_heads = 2, .num_kv_heads = 1, .head_dim = 32, .max_len = 64, .slots = 2};
  KvCache cache(dev, c);
  auto fq = random(2 * 2 * 32, 67), kn = random(2 * 32, 68), vn = random(2 * 32, 69);
  auto fout = filled(2 * 2 * 32, 42.0f);
  Buffer<std::int32_t> dpos(dev, 2), status(dev, 1);
  dpos.copy_from_host(s(), std::vector<std::int32_t>{3, 5});
  const std::uint64_t fneed = flash_decoding_workspace_bytes(c);
  Buffer<std::byte> over_pos_and_more(dev, fneed + 64);
  auto pos_view = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(over_pos_and_more.data().get()), 2);
  auto status_view = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(over_pos_and_more.data().get()) + 8, 1);
  pos_view.copy_from_host(s(), std::vector<std::int32_t>{3, 5});
  expect_invalid([&] { flash_decoding(s(), cache, 0, fq, kn, vn, pos_view, fout,
                                      DecodeOptions{.workspace = &over_pos_and_more}); },
                 "options.workspace");
  expect_invalid([&] { flash_decoding(s(), cache, 0, fq, kn, vn, dpos, fout,
                                      DecodeOptions{.workspace = &over_pos_and_more, .status = &status_view}); },
                 "options.workspace");
  auto over_layer = Buffer<std::byte>::wrap(dev, reinterpret_cast<std::byte*>(const_cast<float*>(cache.k(0).data().get())),
                                            cache.k(0).size_bytes());
  ASSERT_GE(over_layer.size(), fneed);
  expect_invalid([&] { flash_decoding(s(), cache, 0, fq, kn, vn, std::vector<std::int64_t>{0, 0}, fout,
                                      DecodeOptions{.workspace = &over_layer}); },
                 "options.workspace");
  expect_all(fout, 42.0f);
  EXPECT_EQ(cache.length(0), 0) << "nothing appended";

  // multihead_attention: over q.
  auto mq = random(8 * 2 * 32, 70), mk = random(8 * 2 * 32, 71), mv = random(8 * 2 * 32, 72);
  auto mout = filled(8 * 2 * 32, 42.0f);
  MhaOptions mo;
  auto over_q = Buffer<std::byte>::wrap(dev, reinterpret_cast<std::byte*>(mq.data().get()), mq.size_bytes());
  mo.workspace = &over_q;
  expect_invalid([&] { multihead_attention(s(), mq, mk, mv, mout, MhaShape{8, 2, 32}, mo); }, "options.workspace");
  expect_all(mout, 42.0f);
}

// The one way of optional outputs: a pointer in the options, written by a call that succeeds,
// left alone by one that is refused.
TEST_P(Options, MultiheadReportIsAnOptionalOutput) {
  const MhaShape sh{16, 2, 32};
  auto q = random(16 * 2 * 32, 71), k = random(16 * 2 * 32, 72), v = random(16 * 2 * 32, 73);
  auto out = filled(16 * 2 * 32, 0.0f);
  MhaReport rep;
  rep.launches = -5;
  MhaOptions o;
  o.report = &rep;
  o.scale = NAN;
  expect_invalid([&] { multihead_attention(s(), q, k, v, out, sh, o); }, "options.scale");
  EXPECT_EQ(rep.launches, -5) << "a refused call leaves the report alone";
  o.scale.reset();
  o.impl = MhaImpl::kPerHead;
  o.gemm = GemmKind::kExact;
  multihead_attention(s(), q, k, v, out, sh, o);
  EXPECT_EQ(rep.launches, 18);
  EXPECT_EQ(rep.score_gemm, GemmKind::kExact);
  // Scale: the explicit default gives the default's bytes.
  auto b = filled(16 * 2 * 32, 0.0f);
  o.scale = 1.0f / std::sqrt(32.0f);
  multihead_attention(s(), q, k, v, b, sh, o);
  EXPECT_TRUE(same(download(out), download(b)));
}

LOCKSTEP_INSTANTIATE_BACKENDS(Options);

}  // namespace
}  // namespace lockstep::testing
