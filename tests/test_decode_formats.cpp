// Decode in every format (Note [decode formats] in kernels/decode/params.hpp): q, out and the new
// tokens in float, half or bfloat16, the KV cache in float, half, bfloat16, fp8 e4m3 or e5m2
// (fp8 with a scale per layer and kv head). Each call against a float64 oracle on the values the
// cache holds; the cache's codes against the conversions; CUDA against the CPU device and the
// CPU's two paths against each other, byte for byte; refusals that write nothing.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/ops.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/kernels/launch.hpp"
#include "harness/harness_decode_formats.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

using harness::encode;
using harness::raw;
using harness::widen;

// One decode problem: a cache of format C with `prefill[s]` tokens per slot imported from host
// floats, then `steps` flash_decoding steps with new tokens (q, k_new, v_new in T), every layer.
struct Problem {
  std::int64_t layers = 2, heads = 8, kv_heads = 2, head_dim = 64, max_len = 600;
  std::vector<std::int64_t> prefill{300, 0, 517};
  int steps = 2;
  std::uint32_t seed = 5;
};

// What one run leaves: each step's outputs (widened), the final cache codes of every layer, and
// the float64 oracle's outputs with the largest error relative to max |v| found.
struct Run {
  std::vector<std::vector<std::uint8_t>> out_bytes;  // per (step, layer)
  std::vector<std::vector<std::uint8_t>> cache_bytes;  // per (layer, K/V)
  double worst = 0;                                  // max |out - oracle| / bound scale
};

// The values the cache holds for x with scale s (0: none), widened: what the oracle attends.
template <class C>
float held(float x, float s) {
  if constexpr (std::is_same_v<C, float>) return x;
  else return to_float(from_float<C>(s != 0.0f ? x / s : x)) * (s != 0.0f ? s : 1.0f);
}

template <class T, class C>
Run run(const std::shared_ptr<Device>& dev, const Problem& pr) {
  Stream& st = dev->default_stream();
  const std::int64_t S = std::int64_t(pr.prefill.size()), H = pr.heads, Hk = pr.kv_heads, D = pr.head_dim;
  KvCacheConfig c{.num_layers = pr.layers, .num_heads = H, .num_kv_heads = Hk, .head_dim = D,
                  .max_len = pr.max_len, .slots = S};
  c.format = format_of<C>();
  Lcg rng{pr.seed};
  if (is_fp8(c.format)) {  // scales so that the values span the format's range
    for (std::int64_t i = 0; i < pr.layers * Hk; ++i) {
      c.k_scales.push_back(0.004f + 0.001f * float(i));
      c.v_scales.push_back(0.003f * float(i + 1));
    }
  }
  KvCache cache(dev, c);
  // Host mirror of the values each (layer, slot, kv head, token) holds.
  std::vector<float> hk(std::size_t(pr.layers * S * Hk * pr.max_len * D)), hv(hk.size());
  auto at = [&](std::int64_t l, std::int64_t s, std::int64_t h, std::int64_t t) {
    return std::size_t((((l * S + s) * Hk + h) * pr.max_len + t) * D);
  };
  auto scale_of = [&](bool v, std::int64_t l, std::int64_t h) {
    return is_fp8(c.format) ? (v ? c.v_scales : c.k_scales)[std::size_t(l * Hk + h)] : 0.0f;
  };
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t l = 0; l < pr.layers; ++l) {
      const std::int64_t n = pr.prefill[std::size_t(s)];
      const auto k = rng.floats(std::size_t(Hk * n * D), 1.0f), v = rng.floats(std::size_t(Hk * n * D), 1.0f);
      cache.write_from_host(st, s, l, k, v, n);
      for (std::int64_t h = 0; h < Hk; ++h)
        for (std::int64_t i = 0; i < n * D; ++i) {
          hk[at(l, s, h, 0) + std::size_t(i)] = held<C>(k[std::size_t(h * n * D + i)], scale_of(false, l, h));
          hv[at(l, s, h, 0) + std::size_t(i)] = held<C>(v[std::size_t(h * n * D + i)], scale_of(true, l, h));
        }
    }
  Run r;
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<std::int64_t> len = pr.prefill;
  for (int step = 0; step < pr.steps; ++step) {
    std::vector<std::int64_t> pos = len;
    for (std::int64_t l = 0; l < pr.layers; ++l) {
      const auto q = encode<T>(rng.floats(std::size_t(S * H * D), 1.0f));
      const auto kn = encode<T>(rng.floats(std::size_t(S * Hk * D), 1.0f));
      const auto vn = encode<T>(rng.floats(std::size_t(S * Hk * D), 1.0f));
      Buffer<T> bq(dev, q.size()), bk(dev, kn.size()), bv(dev, vn.size()), bo(dev, q.size());
      bq.copy_from_host(st, q);
      bk.copy_from_host(st, kn);
      bv.copy_from_host(st, vn);
      flash_decoding(st, cache, l, bq, bk, bv, pos, bo);
      const auto o = bo.to_vector(st);
      r.out_bytes.push_back(raw(o));
      // The oracle: the new token as the cache stores it, then attention over len + 1 tokens.
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < Hk; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            const std::size_t i = std::size_t((s * Hk + h) * D + d);
            hk[at(l, s, h, pos[std::size_t(s)]) + std::size_t(d)] = held<C>(widen(kn[i]), scale_of(false, l, h));
            hv[at(l, s, h, pos[std::size_t(s)]) + std::size_t(d)] = held<C>(widen(vn[i]), scale_of(true, l, h));
          }
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h) {
          const std::int64_t g = h / (H / Hk), n = pos[std::size_t(s)] + 1;
          std::vector<double> sc(static_cast<std::size_t>(n));
          double m = -1e300;
          for (std::int64_t t = 0; t < n; ++t) {
            double dot = 0;
            for (std::int64_t d = 0; d < D; ++d)
              dot += double(widen(q[std::size_t((s * H + h) * D + d)])) * hk[at(l, s, g, t) + std::size_t(d)];
            sc[std::size_t(t)] = dot * scale;
            m = std::max(m, sc[std::size_t(t)]);
          }
          double L = 0;
          for (auto& e : sc) L += (e = std::exp(e - m));
          for (std::int64_t d = 0; d < D; ++d) {
            double ref = 0, vmax = 0;
            for (std::int64_t t = 0; t < n; ++t) {
              ref += sc[std::size_t(t)] / L * hv[at(l, s, g, t) + std::size_t(d)];
              vmax = std::max(vmax, std::abs(double(hv[at(l, s, g, t) + std::size_t(d)])));
            }
            const double got = widen(o[std::size_t((s * H + h) * D + d)]);
            // fp32 arithmetic (a few ulps of max |v| and of the scores' effect) plus the
            // output's own rounding to T (half an ulp of T at |ref|).
            const double ulp_t = std::is_same_v<T, float> ? 0x1p-24 : std::is_same_v<T, half> ? 0x1p-11 : 0x1p-8;
            const double bound = 2e-5 * vmax + ulp_t * std::abs(ref) + 1e-30;
            r.worst = std::max(r.worst, std::abs(got - ref) / bound);
          }
        }
    }
    for (auto& p : len) ++p;
  }
  // Each layer's codes with the tokens past each slot's length zeroed: only what was written is
  // compared (the rest of a cache's memory is whatever the device's allocation held).
  const auto written = [&](std::vector<std::uint8_t> b) {
    const std::size_t tok = std::size_t(D) * sizeof(C);
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < Hk; ++h)
        for (std::int64_t t = len[std::size_t(s)]; t < pr.max_len; ++t)
          std::fill_n(b.begin() + std::ptrdiff_t(std::size_t((s * Hk + h) * pr.max_len + t) * tok), tok, std::uint8_t{0});
    return b;
  };
  for (std::int64_t l = 0; l < pr.layers; ++l) {
    r.cache_bytes.push_back(written(raw(cache.k_as<C>(l).to_vector(st))));
    r.cache_bytes.push_back(written(raw(cache.v_as<C>(l).to_vector(st))));
  }
  // Check the stored codes of every token written: exactly the conversion of x / scale.
  for (std::int64_t l = 0; l < pr.layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      const auto codes = cache.template k_as<C>(l);  // size only
      std::vector<C> h(codes.size());
      std::memcpy(h.data(), r.cache_bytes[std::size_t(2 * l + kv)].data(), h.size() * sizeof(C));
      const auto& mirror = kv == 0 ? hk : hv;
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t g = 0; g < Hk; ++g)
          for (std::int64_t t = 0; t < len[std::size_t(s)]; ++t)
            for (std::int64_t d = 0; d < D; d += 7) {
              const std::size_t ci = std::size_t(((s * Hk + g) * pr.max_len + t) * D + d);
              const float sc = scale_of(kv == 1, l, g);
              const float want = mirror[at(l, s, g, t) + std::size_t(d)];
              const float have = widen(h[ci]) * (sc != 0.0f ? sc : 1.0f);
              EXPECT_EQ(bits(want), bits(have)) << "layer " << l << (kv ? " V" : " K") << " slot " << s << " t " << t;
              if (::testing::Test::HasFailure()) return r;
            }
    }
  return r;
}

template <class T, class C>
void check_pair(const std::shared_ptr<Device>& dev, const Problem& pr) {
  SCOPED_TRACE(std::string("q/out ") + format_name(format_of<T>()) + ", cache " + format_name(format_of<C>()) +
               ", head_dim " + std::to_string(pr.head_dim));
  const Run r = run<T, C>(dev, pr);
  EXPECT_LE(r.worst, 1.0) << "error against the float64 oracle, in units of the bound";
  if (dev->id().kind == DeviceKind::kCuda) {
    const Run cpu = run<T, C>(open("cpu"), pr);
    ASSERT_EQ(r.out_bytes.size(), cpu.out_bytes.size());
    for (std::size_t i = 0; i < r.out_bytes.size(); ++i) EXPECT_EQ(r.out_bytes[i], cpu.out_bytes[i]) << "output " << i;
    for (std::size_t i = 0; i < r.cache_bytes.size(); ++i) EXPECT_EQ(r.cache_bytes[i], cpu.cache_bytes[i]) << "cache " << i;
  } else {
    // Note [row-major decode]: the lane path gives the row form's bytes in every format.
    const Run lanes = run<T, C>(cpu_with(&CpuDeviceOptions::decode_lanes), pr);
    for (std::size_t i = 0; i < r.out_bytes.size(); ++i) EXPECT_EQ(r.out_bytes[i], lanes.out_bytes[i]) << "output " << i;
    for (std::size_t i = 0; i < r.cache_bytes.size(); ++i) EXPECT_EQ(r.cache_bytes[i], lanes.cache_bytes[i]) << "cache " << i;
  }
}

TEST_P(Attention, DecodeInEveryFormatMatchesTheOracleAndTheOtherPaths) {
  for (std::int64_t D : {64, 128}) {
    Problem pr;
    pr.head_dim = D;
    pr.heads = D == 64 ? 8 : 4;
    pr.kv_heads = D == 64 ? 2 : 4;  // GQA with 4 heads per block, and MHA
    check_pair<float, half>(dev, pr);
    check_pair<float, fp8_e4m3>(dev, pr);
    check_pair<half, half>(dev, pr);
    check_pair<half, fp8_e5m2>(dev, pr);
    check_pair<bfloat16, bfloat16>(dev, pr);
    check_pair<bfloat16, fp8_e4m3>(dev, pr);
    check_pair<bfloat16, float>(dev, pr);
  }
  Problem small;  // head_dim 32: fp8 tiles of fewer copies than threads
  small.head_dim = 32;
  small.heads = 16;
  small.kv_heads = 2;
  small.prefill = {40, 700 - 300};
  small.max_len = 700;
  check_pair<bfloat16, fp8_e5m2>(dev, small);
  check_pair<half, bfloat16>(dev, small);
  Problem wide;
  wide.head_dim = 256;
  wide.heads = 4;
  wide.kv_heads = 2;
  wide.prefill = {260};
  check_pair<bfloat16, fp8_e4m3>(dev, wide);
  check_pair<half, half>(dev, wide);
}

// Note [wide tiles]: at head_dim 128, tiles of the float tiles' bytes for caches of 1- and 2-byte
// codes (decode.wide_tiles = 1) give the bytes of 16-row tiles, outputs and appended cache, with
// 4, 2 and 1 query heads per block, on every backend (on the CPU device also on the lane path,
// the one that runs the tiles); the launch record shows that the wide kernel ran.
TEST_P(Attention, DecodeWideTilesGiveTheSameBytes) {
  const auto same_both_ways = [&]<class T, class C>(const std::shared_ptr<Device>& d, const Problem& pr) {
    SCOPED_TRACE(std::string(format_name(format_of<T>())) + " / " + format_name(format_of<C>()) + ", heads " +
                 std::to_string(pr.heads) + "/" + std::to_string(pr.kv_heads));
    decltype(run<T, C>(d, pr)) narrow, wide;  // (Run names gtest's member here)
    {
      const ScopedSetting knob("decode.wide_tiles", "0");
      narrow = run<T, C>(d, pr);
    }
    {
      const ScopedSetting knob("decode.wide_tiles", "1");
      detail::LaunchRecorder rec;
      wide = run<T, C>(d, pr);
      constexpr int kW = 4 / int(sizeof(C));
      const int g = int(pr.heads / pr.kv_heads);
      const int idx = g == 4   ? kernels::kernel_index_v<kernels::DecodeChunk<128, 4, kW, 4, C>>
                      : g == 2 ? kernels::kernel_index_v<kernels::DecodeChunk<128, 2, kW, 4, C>>
                               : kernels::kernel_index_v<kernels::DecodeChunk<128, 1, 2 * kW, 3, C>>;
      EXPECT_TRUE(rec.launched(idx)) << "the wide chunk kernel did not run";
    }
    EXPECT_EQ(narrow.out_bytes, wide.out_bytes);
    EXPECT_EQ(narrow.cache_bytes, wide.cache_bytes);
  };
  for (const auto& [H, Hk] : {std::pair<std::int64_t, std::int64_t>{8, 2}, {4, 2}, {4, 4}}) {
    Problem pr;
    pr.head_dim = 128;
    pr.heads = H;
    pr.kv_heads = Hk;
    std::vector<std::shared_ptr<Device>> devs{dev};
    if (dev->id().kind == DeviceKind::kCpu) devs.push_back(cpu_with(&CpuDeviceOptions::decode_lanes));
    for (const auto& d : devs) {
      same_both_ways.template operator()<bfloat16, bfloat16>(d, pr);
      same_both_ways.template operator()<half, half>(d, pr);
      same_both_ways.template operator()<bfloat16, fp8_e4m3>(d, pr);
      same_both_ways.template operator()<float, fp8_e5m2>(d, pr);
    }
  }
}

// Batch invariance in each format: a sequence's output bytes alone equal its bytes as slot 1 of a
// batch whose other slots have other lengths (Note [fixed split size]).
template <class T, class C>
void expect_batch_invariant(const std::shared_ptr<Device>& dev) {
  SCOPED_TRACE(std::string(format_name(format_of<T>())) + " / " + format_name(format_of<C>()));
  Stream& st = dev->default_stream();
  const std::int64_t H = 8, Hk = 2, D = 128, L = 1100, n = 700;
  Lcg rng{11};
  const auto k = rng.floats(std::size_t(Hk * n * D)), v = rng.floats(std::size_t(Hk * n * D));
  const auto q = encode<T>(rng.floats(std::size_t(H * D))), kn = encode<T>(rng.floats(std::size_t(Hk * D))),
             vn = encode<T>(rng.floats(std::size_t(Hk * D)));
  std::vector<std::uint8_t> outs[2];
  for (int batch = 0; batch < 2; ++batch) {
    const std::int64_t S = batch == 0 ? 1 : 3, me = batch == 0 ? 0 : 1;
    KvCacheConfig c{.num_layers = 1, .num_heads = H, .num_kv_heads = Hk, .head_dim = D, .max_len = L, .slots = S};
    c.format = format_of<C>();
    if (is_fp8(c.format)) c.k_scales = c.v_scales = {0.01f, 0.02f};
    KvCache cache(dev, c);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(S));
    std::vector<T> bq, bk, bv;
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t len = s == me ? n : 1000 - 400 * s;
      if (s == me) {
        cache.write_from_host(st, s, 0, k, v, n);
      } else {
        cache.write_from_host(st, s, 0, rng.floats(std::size_t(Hk * len * D)), rng.floats(std::size_t(Hk * len * D)), len);
      }
      pos[std::size_t(s)] = len;
      const auto oq = s == me ? q : encode<T>(rng.floats(q.size()));
      const auto ok = s == me ? kn : encode<T>(rng.floats(kn.size()));
      const auto ov = s == me ? vn : encode<T>(rng.floats(vn.size()));
      bq.insert(bq.end(), oq.begin(), oq.end());
      bk.insert(bk.end(), ok.begin(), ok.end());
      bv.insert(bv.end(), ov.begin(), ov.end());
    }
    Buffer<T> dq(dev, bq.size()), dk(dev, bk.size()), dv(dev, bv.size()), dout(dev, bq.size());
    dq.copy_from_host(st, bq);
    dk.copy_from_host(st, bk);
    dv.copy_from_host(st, bv);
    flash_decoding(st, cache, 0, dq, dk, dv, pos, dout);
    const auto o = raw(dout.to_vector(st));
    const std::size_t per = std::size_t(H * D) * sizeof(T);
    outs[batch].assign(o.begin() + std::ptrdiff_t(per * std::size_t(me)), o.begin() + std::ptrdiff_t(per * std::size_t(me + 1)));
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST_P(Attention, DecodeFormatsAreBatchInvariant) {
  expect_batch_invariant<bfloat16, fp8_e4m3>(dev);
  expect_batch_invariant<half, half>(dev);
  expect_batch_invariant<float, bfloat16>(dev);
}

// incremental_attention over caches of each format gives flash_decoding's bytes (the same
// kernels), fp8 with the scales as a buffer.
TEST_P(Attention, IncrementalInFormatsEqualsFlashDecoding) {
  const std::int64_t H = 8, Hk = 2, D = 128, L = 700, n = 600;
  KvCacheConfig c{.num_layers = 1, .num_heads = H, .num_kv_heads = Hk, .head_dim = D, .max_len = L, .slots = 1};
  c.format = Format::fp8_e4m3;
  c.k_scales = {0.01f, 0.02f};
  c.v_scales = {0.005f, 0.03f};
  KvCache cache(dev, c);
  Lcg rng{9};
  cache.write_from_host(s(), 0, 0, rng.floats(std::size_t(Hk * (n - 1) * D)), rng.floats(std::size_t(Hk * (n - 1) * D)), n - 1);
  auto put = [&](std::size_t count) {
    Buffer<bfloat16> b(dev, count);
    b.copy_from_host(s(), encode<bfloat16>(rng.floats(count)));
    return b;
  };
  auto q = put(std::size_t(H * D)), kn = put(std::size_t(Hk * D)), vn = put(std::size_t(Hk * D));
  Buffer<bfloat16> o1(dev, std::size_t(H * D)), o2(dev, std::size_t(H * D));
  const auto kc = cache.k_as<fp8_e4m3>(0), vc = cache.v_as<fp8_e4m3>(0);
  Buffer<fp8_e4m3> kcopy(dev, kc.size());  // the cache before the append
  kcopy.copy_from(s(), kc);
  flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{n - 1}, o1);
  Buffer<float> scales(dev, 4);
  scales.copy_from_host(s(), std::vector<float>{0.01f, 0.02f, 0.005f, 0.03f});
  DecodeOptions o;
  o.kv_scales = &scales;
  incremental_attention(s(), q, kc, vc, n, o2, DecodeShape{H, Hk, D, L}, o);
  EXPECT_EQ(raw(o1.to_vector(s())), raw(o2.to_vector(s())));
  // kv_cache_scatter stores the token as the cache's append did.
  Buffer<float> kscale(dev, 2);
  kscale.copy_from_host(s(), std::vector<float>{0.01f, 0.02f});
  kv_cache_scatter(s(), kn, n - 1, kcopy, DecodeShape{H, Hk, D, L}, &kscale);
  EXPECT_EQ(raw(kcopy.to_vector(s())), raw(kc.to_vector(s())));
}

// A NaN or inf in one slot's cache reaches no other slot, in every cache format.
TEST_P(Attention, NonFiniteCacheValuesStayInTheirSlot) {
  for (Format f : {Format::f16, Format::bf16, Format::fp8_e4m3}) {
    SCOPED_TRACE(format_name(f));
    const std::int64_t H = 4, Hk = 2, D = 64, L = 400;
    KvCacheConfig c{.num_layers = 1, .num_heads = H, .num_kv_heads = Hk, .head_dim = D, .max_len = L, .slots = 2};
    c.format = f;
    KvCache cache(dev, c);
    Lcg rng{3};
    for (std::int64_t s0 = 0; s0 < 2; ++s0) {
      auto k = rng.floats(std::size_t(Hk * 300 * D)), v = rng.floats(std::size_t(Hk * 300 * D));
      if (s0 == 0) {
        k[5] = std::numeric_limits<float>::quiet_NaN();
        v[77] = std::numeric_limits<float>::infinity();
      }
      cache.write_from_host(s(), s0, 0, k, v, 300);
    }
    Buffer<half> q(dev, std::size_t(2 * H * D)), kn(dev, std::size_t(2 * Hk * D)), vn(dev, std::size_t(2 * Hk * D)),
        out(dev, std::size_t(2 * H * D));
    q.copy_from_host(s(), encode<half>(rng.floats(q.size())));
    kn.copy_from_host(s(), encode<half>(rng.floats(kn.size())));
    vn.copy_from_host(s(), encode<half>(rng.floats(vn.size())));
    flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{300, 300}, out);
    const auto o = out.to_vector(s());
    bool slot0_nonfinite = false;
    for (std::size_t i = 0; i < o.size(); ++i) {
      const float x = to_float(o[i]);
      if (i < o.size() / 2) slot0_nonfinite |= !std::isfinite(x);
      else ASSERT_TRUE(std::isfinite(x)) << "slot 1, element " << i - o.size() / 2;
    }
    EXPECT_TRUE(slot0_nonfinite) << "the NaN should reach slot 0's output";
  }
}

// RoPE on half and bfloat16 buffers: each value widened, rotated in float, rounded once, so the
// result is the float RoPE of the widened values, rounded.
template <class T>
void expect_rope_rounds_once(const std::shared_ptr<Device>& dev) {
  SCOPED_TRACE(format_name(format_of<T>()));
  Stream& st = dev->default_stream();
  const std::int64_t rows = 5, H = 3, Hk = 2, D = 64;
  Lcg rng{21};
  const auto q = encode<T>(rng.floats(std::size_t(rows * H * D), 4.0f)), k = encode<T>(rng.floats(std::size_t(rows * Hk * D), 4.0f));
  const std::vector<std::int64_t> pos{0, 7, 1000, 65535, 1 << 19};
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    const RopeConfig rc{H, Hk, D, 10000.0f, style};
    Buffer<T> bq(dev, q.size()), bk(dev, k.size());
    bq.copy_from_host(st, q);
    bk.copy_from_host(st, k);
    rope(st, &bq, &bk, pos, rc);
    std::vector<float> fq(q.size()), fk(k.size());
    for (std::size_t i = 0; i < q.size(); ++i) fq[i] = widen(q[i]);
    for (std::size_t i = 0; i < k.size(); ++i) fk[i] = widen(k[i]);
    Buffer<float> wq(dev, fq.size()), wk(dev, fk.size());
    wq.copy_from_host(st, fq);
    wk.copy_from_host(st, fk);
    rope(st, &wq, &wk, pos, rc);
    EXPECT_EQ(raw(bq.to_vector(st)), raw(encode<T>(wq.to_vector(st))));
    EXPECT_EQ(raw(bk.to_vector(st)), raw(encode<T>(wk.to_vector(st))));
  }
}

TEST_P(Attention, RopeInFormatsRoundsOnce) {
  expect_rope_rounds_once<half>(dev);
  expect_rope_rounds_once<bfloat16>(dev);
}

// The layout ops move 16-bit codes as they are, NaN payloads included; an odd head_dim is
// Unsupported for them, with nothing written.
TEST_P(Attention, LayoutOpsMoveHalfCodesAsTheyAre) {
  const std::int64_t S = 5, H = 3, D = 6;
  std::vector<half> in(std::size_t(S * H * D));
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = half{static_cast<std::uint16_t>(0x7c01 + 37 * i)};  // NaNs too
  Buffer<half> a(dev, in.size()), b(dev, in.size()), c(dev, in.size()), e(dev, std::size_t(S * D));
  a.copy_from_host(s(), in);
  ops::interleaved_to_batched(s(), a, b, S, H, D);
  ops::batched_to_interleaved(s(), b, c, S, H, D);
  const auto hb = b.to_vector(s()), hc = c.to_vector(s());
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d)
        ASSERT_EQ(hb[std::size_t((h * S + t) * D + d)].bits, in[std::size_t((t * H + h) * D + d)].bits);
  EXPECT_EQ(raw(hc), raw(in));
  ops::extract_head(s(), a, e, S, H, D, 2);
  const auto he = e.to_vector(s());
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(he[std::size_t(t * D + d)].bits, in[std::size_t((t * H + 2) * D + d)].bits);
  Buffer<bfloat16> odd(dev, std::size_t(S * H * 5)), odd_out(dev, std::size_t(S * H * 5));
  odd_out.copy_from_host(s(), std::vector<bfloat16>(odd_out.size(), bfloat16{0x1234}));
  EXPECT_THROW(ops::interleaved_to_batched(s(), odd, odd_out, S, H, 5), Unsupported);
  for (const auto& x : odd_out.to_vector(s())) ASSERT_EQ(x.bits, 0x1234);
}

// Note [softmax in formats]: softmax over half and bfloat16 rows is the float softmax of the
// widened rows, rounded once, at every row length (the register path, the long-row path) and for
// a row of -inf only (zeros).
template <class T>
void expect_softmax_rounds_once(const std::shared_ptr<Device>& dev) {
  SCOPED_TRACE(format_name(format_of<T>()));
  Stream& st = dev->default_stream();
  Lcg rng{5};
  for (std::int64_t n : {1, 7, 100, 1024, 1500, 5000}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const std::int64_t rows = 9;
    auto x = rng.floats(std::size_t(rows * n), 20.0f);
    for (std::int64_t i = 0; i < n; ++i) x[std::size_t(3 * n + i)] = -std::numeric_limits<float>::infinity();
    const auto codes = encode<T>(x);
    std::vector<float> wide(codes.size());
    for (std::size_t i = 0; i < codes.size(); ++i) wide[i] = widen(codes[i]);
    Buffer<T> in(dev, codes.size()), out(dev, codes.size());
    in.copy_from_host(st, codes);
    ops::softmax_rows(st, in, out, rows, n);
    Buffer<float> fin(dev, wide.size()), fout(dev, wide.size());
    fin.copy_from_host(st, wide);
    ops::softmax_rows(st, fin, fout, rows, n);
    EXPECT_EQ(raw(out.to_vector(st)), raw(encode<T>(fout.to_vector(st))));
    ops::softmax_rows(st, in, in, rows, n);  // in place
    EXPECT_EQ(raw(in.to_vector(st)), raw(encode<T>(fout.to_vector(st))));
  }
}

TEST_P(Attention, SoftmaxInFormatsRoundsOnce) {
  expect_softmax_rounds_once<half>(dev);
  expect_softmax_rounds_once<bfloat16>(dev);
}

TEST_P(Attention, CacheFormatsReportTheirBytes) {
  for (Format f : {Format::f32, Format::f16, Format::bf16, Format::fp8_e4m3, Format::fp8_e5m2}) {
    KvCacheConfig c{.num_layers = 3, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .max_len = 10, .slots = 4};
    c.format = f;
    KvCache cache(dev, c);
    const std::uint64_t e = format_bytes(f);
    EXPECT_EQ(cache.bytes_per_token_per_layer(), 2u * 2 * 64 * e);
    EXPECT_EQ(cache.bytes(), 2u * 3 * 4 * 2 * 10 * 64 * e + (is_fp8(f) ? 2u * 3 * 2 * 4 : 0u)) << format_name(f);
    EXPECT_EQ(cache.format(), f);
  }
}

// Refusals: InvalidArgument naming the parameter, nothing written.
TEST_P(Attention, DecodeFormatRefusalsWriteNothing) {
  KvCacheConfig c{.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 64, .max_len = 50, .slots = 1};
  c.format = Format::fp8_e4m3;
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    KvCacheConfig b = c;
    b.k_scales = {1, 1, 1, bad};
    expect_invalid([&] { KvCache x(dev, b); }, "k_scales[3]");
  }
  {
    KvCacheConfig b = c;
    b.v_scales = {1, 1, 1};
    expect_invalid([&] { KvCache x(dev, b); }, "v_scales.size()");
    b = c;
    b.format = Format::bf16;
    b.k_scales = {1, 1, 1, 1};
    expect_invalid([&] { KvCache x(dev, b); }, "k_scales / v_scales");
  }
  KvCache cache(dev, c);
  Lcg rng{1};
  cache.write_from_host(s(), 0, 0, rng.floats(2 * 10 * 64), rng.floats(2 * 10 * 64), 10);
  const auto before = raw(cache.k_as<fp8_e4m3>(0).to_vector(s()));
  const std::vector<float> ok{1, 2}, nan{1, std::numeric_limits<float>::quiet_NaN()};
  expect_invalid([&] { cache.set_scales(s(), 0, ok, nan); }, "v_scales[1]");
  expect_invalid([&] { cache.set_scales(s(), 0, ok, std::vector<float>{1}); }, "v_scales.size()");
  expect_invalid([&] { (void)cache.k_as<half>(0); }, "C");
  Buffer<float> fk(dev, 2 * 64), fv(dev, 2 * 64);
  expect_invalid([&] { cache.write_from_device(s(), 0, 0, fk, fv, 1); }, "k, v element type");
  Buffer<float> q(dev, 4 * 64), out(dev, 4 * 64);
  Buffer<float> scales(dev, 4);
  DecodeOptions o;
  o.kv_scales = &scales;
  expect_invalid([&] { flash_decoding(s(), cache, 0, q, fk, fv, std::vector<std::int64_t>{10}, out, o); },
                 "options.kv_scales");
  const auto kc = cache.k_as<fp8_e4m3>(0), vc = cache.v_as<fp8_e4m3>(0);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 10, out, DecodeShape{4, 2, 64, 50}); },
                 "options.kv_scales");
  Buffer<float> fc(dev, 2 * 50 * 64);
  expect_invalid([&] { incremental_attention(s(), q, fc, fc, 10, out, DecodeShape{4, 2, 64, 50}, o); },
                 "options.kv_scales");
  EXPECT_EQ(cache.length(0), 10);
  EXPECT_EQ(raw(cache.k_as<fp8_e4m3>(0).to_vector(s())), before);
  // A changed scale rescales what the cache holds (the codes stay).
  cache.set_scales(s(), 0, std::vector<float>{2, 3}, std::vector<float>{4, 5});
  EXPECT_EQ(cache.config().k_scales[1], 3.0f);
  EXPECT_EQ(raw(cache.k_as<fp8_e4m3>(0).to_vector(s())), before);
}

}  // namespace
}  // namespace lockstep::testing
