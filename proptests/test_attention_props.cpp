// Properties of the attention algorithms (RapidCheck): multi-head attention (fp32 GEMM: CPU within
// the float64 oracle's bound, CUDA == CPU bitwise, PerHead == Batched bitwise; tensor-core GEMM:
// both backends within the documented bound), incremental decode attention (oracle, bitwise,
// poisoned positions past seq_len never read, agreement with the last row of causal attention)
// and the KV-cache scatter.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "generators.hpp"
#include "harness/harness.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/multihead.hpp"
#include "lockstep/kernels/decode.hpp"

namespace lockstep::harness {
namespace {

rc::Gen<std::int64_t> head_dim_gen() { return rc::gen::element<std::int64_t>(32, 64, 96, 128, 256); }


RC_GTEST_PROP(Attention, MultiheadFp32, ()) {
  MhaCaseShape s;
  s.seq = *size_gen(130);
  s.heads = *rc::gen::inRange<std::int64_t>(1, 5);
  s.dim = *rc::gen::oneOf(head_dim_gen(), size_gen(80));
  s.causal = *rc::gen::arbitrary<bool>();
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*mha_case(s));
  // PerHead and Batched run the same kernels on the same values: the same bytes, on every backend
  // (and PerHead itself against the oracle and CUDA == CPU).
  auto batched = mha_case(s);
  s.impl = 1;
  auto per_head = mha_case(s);
  check(*per_head);
  for (const auto& dev : backends()) {
    const auto a = batched->run(dev), b = per_head->run(dev);
    const auto cmp = compare_bits(a, b);
    RC_LOG() << dev->id().str() << ": per-head vs batched: " << cmp.first << "\n";
    RC_ASSERT(cmp.mismatches == 0u);
  }
}

RC_GTEST_PROP(Attention, MultiheadTensorCore, ()) {
  MhaCaseShape s;
  s.seq = *size_gen(80);
  s.heads = *rc::gen::inRange<std::int64_t>(1, 3);
  s.dim = *rc::gen::oneOf(rc::gen::just<std::int64_t>(64), size_gen(70));
  s.causal = *rc::gen::arbitrary<bool>();
  s.gemm = 1;
  s.impl = *rc::gen::inRange(0, 2);
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*mha_case(s));
}

RC_GTEST_PROP(Attention, IncrementalDecode, ()) {
  DecodeCaseShape s;
  s.dim = *head_dim_gen();
  s.kv_heads = *rc::gen::inRange<std::int64_t>(1, 5);
  s.heads = s.kv_heads * *rc::gen::element<std::int64_t>(1, 2, 3, 4, 6, 8);
  // Long rows (up to 34000 tokens, 133 chunks) reach the merge's multi-batch path (Note [merge
  // order]: more than 512 / head_dim * 8 chunks).
  // (resize: over the whole range at every case; rc::gen::inRange narrows with the case's size.)
  s.max_len = *rc::gen::weightedOneOf<std::int64_t>(
      {{8, size_gen(1100)}, {1, rc::gen::resize(100, rc::gen::inRange<std::int64_t>(2000, 5000))},
       {1, rc::gen::resize(100, rc::gen::inRange<std::int64_t>(8000, 34000))}});
  // A full cache one case in four; otherwise a poisoned tail past seq_len that must never be read.
  s.len = *rc::gen::weightedOneOf<std::int64_t>(
      {{3, rc::gen::resize(100, rc::gen::inRange<std::int64_t>(0, s.max_len + 1))}, {1, rc::gen::just(s.max_len)}});
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  const std::int64_t chunks = (s.len + 1 + kernels::kDecodeChunk - 1) / kernels::kDecodeChunk;
  RC_CLASSIFY(chunks > 512 / s.dim * 8, "several merge batches");
  check(*decode_case(s));
}

Buffer<float> on_device(const std::shared_ptr<Device>& dev, const std::vector<float>& host) {
  Buffer<float> b(dev, host.size());
  b.copy_from_host(dev->default_stream(), host);
  return b;
}

// incremental_attention of the last query row ql [H, D] over the head-first cache kc, vc [Hkv, S,
// D] (dk, dv on the device) equals last_row(h, d) within twice the fp32 bound of each head's
// float64 reference over its kv head's keys (h / (H / Hkv)).
template <class LastRow>
void expect_decode_matches(const std::shared_ptr<Device>& dev, const std::vector<float>& ql,
                           const std::vector<float>& kc, const std::vector<float>& vc, const Buffer<float>& dk,
                           const Buffer<float>& dv, std::int64_t H, std::int64_t Hkv, std::int64_t S, std::int64_t D,
                           LastRow last_row) {
  auto& st = dev->default_stream();
  const auto dq = on_device(dev, ql);
  Buffer<float> dout(dev, ql.size());
  incremental_attention(st, dq, dk, dv, S, dout, DecodeShape{H, Hkv, D, S});
  const auto dec = dout.to_vector(st);
  const std::int64_t group = H / Hkv;
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t hk = h / group;
    const auto ref = attention_reference(ql.data() + h * D, D, kc.data() + hk * S * D, vc.data() + hk * S * D, D, 1,
                                         S, D, false);
    for (std::int64_t d = 0; d < D; ++d) {
      const double b = 2 * attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], S, D);
      RC_ASSERT(std::fabs(double(dec[std::size_t(h * D + d)]) - double(last_row(h, d))) <= b);
    }
  }
}

// Decoding the last token equals the last row of causal multi-head attention over the same
// tokens, within the bound (two different summation orders of the same math).
RC_GTEST_PROP(Attention, DecodeMatchesLastRowOfCausalAttention, ()) {
  const std::int64_t S = *size_gen(300), H = *rc::gen::inRange<std::int64_t>(1, 4);
  const std::int64_t D = *head_dim_gen();
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto q = uniform(seed, std::size_t(S * H * D), -1.0f, 1.0f);
  const auto k = uniform(seed + 1, std::size_t(S * H * D), -1.0f, 1.0f);
  const auto v = uniform(seed + 2, std::size_t(S * H * D), -1.0f, 1.0f);
  auto dev = open("cpu");
  auto& st = dev->default_stream();
  const auto bq = on_device(dev, q), bk = on_device(dev, k), bv = on_device(dev, v);
  Buffer<float> bo(dev, q.size());
  MhaOptions opt;
  opt.causal = true;
  opt.gemm = GemmKind::kExact;
  multihead_attention(st, bq, bk, bv, bo, MhaShape{S, H, D}, opt);
  const auto mha = bo.to_vector(st);
  // The same tokens as a head-first cache [H, S, D] and the last query row [H, D].
  std::vector<float> kc(k.size()), vc(v.size()), ql(std::size_t(H * D));
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        kc[std::size_t((h * S + t) * D + d)] = k[std::size_t((t * H + h) * D + d)];
        vc[std::size_t((h * S + t) * D + d)] = v[std::size_t((t * H + h) * D + d)];
        if (t == S - 1) ql[std::size_t(h * D + d)] = q[std::size_t((t * H + h) * D + d)];
      }
  const auto dk = on_device(dev, kc), dv = on_device(dev, vc);
  expect_decode_matches(dev, ql, kc, vc, dk, dv, H, H, S, D,
                        [&](std::int64_t h, std::int64_t d) { return mha[std::size_t(((S - 1) * H + h) * D + d)]; });
}

// The same with grouped queries (which multihead_attention has not): incremental_attention over
// an [Hkv, S, D] cache equals the last row of Exact causal fused attention over the same keys,
// within twice the fp32 bound of each head's float64 reference (its own kv head, h / group).
RC_GTEST_PROP(Attention, DecodeMatchesLastRowOfCausalFusedAttentionWithGqa, ()) {
  const std::int64_t S = *size_gen(300), Hkv = *rc::gen::inRange<std::int64_t>(1, 4);
  const std::int64_t H = Hkv * *rc::gen::element<std::int64_t>(1, 2, 4, 8);
  const std::int64_t D = *head_dim_gen();
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  // Heads-first layouts: q [H, S, D], k and v [Hkv, S, D] (the decode cache's layout, max_len S).
  const auto q = uniform(seed, std::size_t(H * S * D), -1.0f, 1.0f);
  const auto k = uniform(seed + 1, std::size_t(Hkv * S * D), -1.0f, 1.0f);
  const auto v = uniform(seed + 2, std::size_t(Hkv * S * D), -1.0f, 1.0f);
  auto dev = open("cpu");
  auto& st = dev->default_stream();
  const auto bq = on_device(dev, q), bk = on_device(dev, k), bv = on_device(dev, v);
  Buffer<float> bo(dev, q.size());
  AttentionOptions opt;
  opt.causal = true;
  opt.precision = AttentionPrecision::kExact;
  attention(st, bq, bk, bv, bo, AttentionShape{1, H, Hkv, S, S, D}, opt);
  const auto fused = bo.to_vector(st);
  std::vector<float> ql(std::size_t(H * D));
  for (std::int64_t h = 0; h < H; ++h)
    std::copy_n(q.begin() + std::ptrdiff_t((h * S + S - 1) * D), D, ql.begin() + std::ptrdiff_t(h * D));
  expect_decode_matches(dev, ql, k, v, bk, bv, H, Hkv, S, D,
                        [&](std::int64_t h, std::int64_t d) { return fused[std::size_t((h * S + S - 1) * D + d)]; });
}

RC_GTEST_PROP(Attention, KvCacheScatter, ()) {
  ScatterCaseShape s;
  s.dim = *head_dim_gen();
  s.kv_heads = *rc::gen::inRange<std::int64_t>(1, 9);
  s.max_len = *size_gen(300);
  s.pos = *rc::gen::inRange<std::int64_t>(0, s.max_len);
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*scatter_case(s));
}

}  // namespace
}  // namespace lockstep::harness

#include "lockstep/attention/fused.hpp"

namespace lockstep::harness {
namespace {

// Exact's tiles are 64 keys (32 at head_dim 256) and 64 query rows (Note [exact register tiles]):
// lengths at and around one, two and three tiles, and up to five tiles of keys, besides the edge
// sizes, so that the pipelined loads (Note [exact tile pipeline]) meet every tile boundary.
rc::Gen<std::int64_t> exact_tile_size_gen(std::int64_t max) {
  return rc::gen::oneOf(rc::gen::element<std::int64_t>(31, 32, 33, 63, 64, 65, 127, 128, 129, 192, 193),
                        size_gen(max));
}

// Queries of +-300 in one case in four: scores of about +-100, past exp's range (88), so that a
// softmax or a merge that forgot to subtract its running maximum gives inf or NaN.
float q_scale_gen() { return *rc::gen::element(1.0f, 1.0f, 1.0f, 300.0f); }

RC_GTEST_PROP(Attention, FusedExact, ()) {
  FusedCaseShape s;
  s.dim = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
  s.batch = full_range(1, 3);
  s.kv_heads = full_range(1, 3);
  s.heads = s.kv_heads * full_range(1, 4);
  s.seq_q = *exact_tile_size_gen(200);
  s.seq_kv = *rc::gen::oneOf(rc::gen::just(s.seq_q), exact_tile_size_gen(300));
  s.causal = *rc::gen::arbitrary<bool>();
  s.interleaved = *rc::gen::arbitrary<bool>();
  s.q_scale = q_scale_gen();
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_CLASSIFY(s.q_scale > 1.0f, "scores past exp's range");
  check(*fused_case(s));
}

// Note [exact formats]: q, k, v and out in half or bfloat16, float arithmetic: CUDA against the
// CPU device bitwise, and the float64 oracle on the rounded inputs within the fp32 bound plus
// the output's one rounding; with split keys (batch_invariant = false) in one case in three.
RC_GTEST_PROP(Attention, FusedExactInFormats, ()) {
  FusedCaseShape s;
  s.act = *rc::gen::element(Format::f16, Format::bf16);
  s.dim = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
  s.batch = full_range(1, 2);
  s.kv_heads = full_range(1, 3);
  s.heads = s.kv_heads * full_range(1, 3);
  s.seq_q = *exact_tile_size_gen(150);
  s.seq_kv = *rc::gen::oneOf(rc::gen::just(s.seq_q), exact_tile_size_gen(600));
  s.causal = *rc::gen::arbitrary<bool>();
  s.interleaved = *rc::gen::arbitrary<bool>();
  s.batch_invariant = *rc::gen::element(true, true, false);
  s.q_scale = q_scale_gen();
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_CLASSIFY(s.act == Format::f16, "half");
  RC_CLASSIFY(!s.batch_invariant, "split keys");
  check(*fused_case(s));
}

// In every input format (Note [tensor-core formats]): float and half inputs multiply in fp16,
// bfloat16 inputs in bfloat16 (P rounded to bfloat16: the bound with bfloat16's unit roundoff).
RC_GTEST_PROP(Attention, FusedTensorCore, ()) {
  FusedCaseShape s;
  s.act = *rc::gen::element(Format::f32, Format::f32, Format::f16, Format::bf16);
  s.dim = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
  s.batch = full_range(1, 3);
  s.kv_heads = full_range(1, 3);
  s.heads = s.kv_heads * full_range(1, 4);
  s.q_scale = q_scale_gen();
  s.seq_q = *size_gen(200);
  s.seq_kv = *rc::gen::oneOf(rc::gen::just(s.seq_q), size_gen(200));
  s.causal = *rc::gen::arbitrary<bool>();
  s.interleaved = *rc::gen::arbitrary<bool>();
  s.tensor_core = true;
  s.key_ramp = *rc::gen::element(0.0f, 0.05f, 0.5f);  // Note [lazy rescale]: moves and stale maxima
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_CLASSIFY(s.act == Format::bf16, "bfloat16 products");
  check(*fused_case(s));
}

// Note [split keys]: small grids over many keys (from 8 key tiles: seq_kv > 448 at head_dim <= 128,
// > 224 at 256), with S key ranges per query tile forced by the precision's knob (2 to 16: 16
// leaves some ranges empty) and the last block of a tile merging them: CUDA against the CPU
// device (bitwise for Exact, within the bound for TensorCore) and both against float64, as
// FusedExact and FusedTensorCore.
void split_keys_property(bool tensor_core) {
  FusedCaseShape s;
  s.dim = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
  s.batch = full_range(1, 3);
  s.kv_heads = full_range(1, 3);
  s.heads = s.kv_heads * full_range(1, 3);
  s.q_scale = q_scale_gen();
  s.seq_q = *rc::gen::inRange<std::int64_t>(1, 140);
  s.seq_kv = *rc::gen::inRange<std::int64_t>(s.dim == 256 ? 225 : 449, 1100);
  s.causal = *rc::gen::arbitrary<bool>();
  s.interleaved = *rc::gen::arbitrary<bool>();
  s.tensor_core = tensor_core;
  s.key_ramp = *rc::gen::element(0.0f, 0.002f, 0.02f);  // maxima that move from range to range
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  const int splits = *rc::gen::element(2, 3, 5, 8, 16);
  Tuning t;  // the case's runs on every backend take it (a scope on this thread)
  if (tensor_core)
    t.fused.tc_splits = splits;
  else
    t.fused.exact_splits = splits;
  const TuningScope scope(t);
  check(*fused_case(s));
}

RC_GTEST_PROP(Attention, FusedTensorCoreSplitKeys, ()) { split_keys_property(true); }

RC_GTEST_PROP(Attention, FusedExactSplitKeys, ()) { split_keys_property(false); }

// The fused kernel (Exact or TensorCore) and the unfused multi-head attention (fp32 GEMM) compute
// the same function: within the sum of their bounds (two summation orders, and the tensor-core
// rounding points).
RC_GTEST_PROP(Attention, FusedMatchesMultiheadAndCausalRowsMatchPrefixes, ()) {
  const std::int64_t S = *size_gen(120), H = *rc::gen::inRange<std::int64_t>(1, 3);
  const std::int64_t D = *rc::gen::element<std::int64_t>(32, 64, 128);
  const bool causal = *rc::gen::arbitrary<bool>();
  const bool tc = *rc::gen::arbitrary<bool>();  // the fused kernel on tensor cores, or Exact
  const auto prec = tc ? AttentionPrecision::kTensorCore : AttentionPrecision::kExact;
  // One side's bound: the fused kernel's precision; the other side is fp32.
  auto fused_bound = [tc](double pv, double qk, std::int64_t n, std::int64_t D) {
    return tc ? attention_bound_tc(pv, qk, n, D) : attention_bound_fp32(pv, qk, n, D);
  };
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto q = uniform(seed, std::size_t(S * H * D), -1.0f, 1.0f), k = uniform(seed + 1, q.size(), -1.0f, 1.0f),
             v = uniform(seed + 2, q.size(), -1.0f, 1.0f);
  auto dev = open("cpu");
  auto& st = dev->default_stream();
  Buffer<float> bq(dev, q.size()), bk(dev, k.size()), bv(dev, v.size()), o1(dev, q.size()), o2(dev, q.size());
  bq.copy_from_host(st, q);
  bk.copy_from_host(st, k);
  bv.copy_from_host(st, v);
  AttentionOptions fo;
  fo.causal = causal;
  fo.layout = AttentionLayout::kInterleaved;
  fo.precision = prec;
  attention(st, bq, bk, bv, o1, AttentionShape{1, H, H, S, S, D}, fo);
  MhaOptions mo;
  mo.causal = causal;
  mo.gemm = GemmKind::kExact;
  multihead_attention(st, bq, bk, bv, o2, MhaShape{S, H, D}, mo);
  const auto a = o1.to_vector(st), b = o2.to_vector(st);
  for (std::int64_t h = 0; h < H; ++h) {
    const auto ref = attention_reference(q.data() + h * D, H * D, k.data() + h * D, v.data() + h * D, H * D, S, S, D, causal);
    for (std::int64_t i = 0; i < S; ++i)
      for (std::int64_t d = 0; d < D; ++d) {
        const std::size_t o = std::size_t((i * H + h) * D + d), e = std::size_t(i * D + d);
        const std::int64_t n = causal ? i + 1 : S;
        const double bound = fused_bound(ref.pv_mag[e], ref.qk_mag[std::size_t(i)], n, D) +
                             attention_bound_fp32(ref.pv_mag[e], ref.qk_mag[std::size_t(i)], n, D);
        RC_ASSERT(std::fabs(double(a[o]) - double(b[o])) <= bound);
      }
  }
  if (!causal) return;
  // Causal row t equals non-causal attention of that row over the first t + 1 keys.
  const std::int64_t t = *rc::gen::inRange<std::int64_t>(0, S);
  Buffer<float> q1(dev, std::size_t(H * D)), k1(dev, std::size_t((t + 1) * H * D)), v1(dev, std::size_t((t + 1) * H * D)),
      out1(dev, std::size_t(H * D));
  q1.copy_from_host(st, std::span<const float>(q).subspan(std::size_t(t * H * D), std::size_t(H * D)));
  k1.copy_from_host(st, std::span<const float>(k).subspan(0, std::size_t((t + 1) * H * D)));
  v1.copy_from_host(st, std::span<const float>(v).subspan(0, std::size_t((t + 1) * H * D)));
  AttentionOptions no;
  no.layout = AttentionLayout::kInterleaved;
  no.precision = prec;
  attention(st, q1, k1, v1, out1, AttentionShape{1, H, H, 1, t + 1, D}, no);
  const auto c = out1.to_vector(st);
  for (std::int64_t h = 0; h < H; ++h) {
    const auto ref = attention_reference(q.data() + t * H * D + h * D, H * D, k.data() + h * D, v.data() + h * D, H * D, 1, t + 1, D, false);
    for (std::int64_t d = 0; d < D; ++d) {
      const double bound = 2 * fused_bound(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], t + 1, D);
      RC_ASSERT(std::fabs(double(c[std::size_t(h * D + d)]) - double(a[std::size_t((t * H + h) * D + d)])) <= bound);
    }
  }
}

// Causal masking is bottom-right aligned: with seq_q <= seq_kv, query row i of the causal call
// equals the non-causal attention of that row over keys [0, seq_kv - seq_q + i] (within twice the
// fused bound); with seq_q > seq_kv the first seq_q - seq_kv rows see no key (zeros). Any batch,
// GQA, both layouts, every head_dim, both precisions.
RC_GTEST_PROP(Attention, FusedCausalRowsAreBottomRightPrefixes, ()) {
  const std::int64_t D = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
  const std::int64_t B = *rc::gen::inRange<std::int64_t>(1, 3), Hk = *rc::gen::inRange<std::int64_t>(1, 3);
  const std::int64_t H = Hk * *rc::gen::inRange<std::int64_t>(1, 4);
  const std::int64_t Sq = *size_gen(100), Skv = *size_gen(150);
  const bool interleaved = *rc::gen::arbitrary<bool>(), tc = *rc::gen::arbitrary<bool>();
  const auto prec = tc ? AttentionPrecision::kTensorCore : AttentionPrecision::kExact;
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto q = uniform(seed, std::size_t(B * H * Sq * D), -1.0f, 1.0f);
  const auto k = uniform(seed + 1, std::size_t(B * Hk * Skv * D), -1.0f, 1.0f);
  const auto v = uniform(seed + 2, k.size(), -1.0f, 1.0f);
  // Element d of row i of head h of batch b, in a tensor of `heads` heads and `seq` rows.
  auto at = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t heads, std::int64_t seq) {
    return std::size_t(interleaved ? ((b * seq + i) * heads + h) * D : ((b * heads + h) * seq + i) * D);
  };
  auto dev = open("cpu");
  auto& st = dev->default_stream();
  auto upload = [&](const std::vector<float>& h) {
    Buffer<float> x(dev, h.size());
    x.copy_from_host(st, h);
    return x;
  };
  auto bq = upload(q), bk = upload(k), bv = upload(v);
  Buffer<float> out(dev, q.size());
  AttentionOptions o;
  o.causal = true;
  o.precision = prec;
  o.layout = interleaved ? AttentionLayout::kInterleaved : AttentionLayout::kHeadsFirst;
  attention(st, bq, bk, bv, out, AttentionShape{B, H, Hk, Sq, Skv, D}, o);
  const auto a = out.to_vector(st);
  // A few rows of every head, always including the first and the last.
  const std::int64_t rows_checked = std::min<std::int64_t>(Sq, 3);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t r = 0; r < rows_checked; ++r) {
        const std::int64_t i = r == 0 ? 0 : r == 1 ? Sq - 1 : *rc::gen::inRange<std::int64_t>(0, Sq);
        const std::int64_t n = Skv - Sq + i + 1;  // keys row i sees
        const std::size_t oi = at(b, h, i, H, Sq);
        if (n <= 0) {
          for (std::int64_t d = 0; d < D; ++d) RC_ASSERT(float_bits(a[oi + std::size_t(d)]) == 0u);
          continue;
        }
        const std::int64_t kh = h / (H / Hk);
        std::vector<float> q1(q.begin() + std::ptrdiff_t(oi), q.begin() + std::ptrdiff_t(oi + std::size_t(D)));
        std::vector<float> k1(std::size_t(n * D)), v1(std::size_t(n * D));
        for (std::int64_t j = 0; j < n; ++j)
          for (std::int64_t d = 0; d < D; ++d) {
            k1[std::size_t(j * D + d)] = k[at(b, kh, j, Hk, Skv) + std::size_t(d)];
            v1[std::size_t(j * D + d)] = v[at(b, kh, j, Hk, Skv) + std::size_t(d)];
          }
        auto pq = upload(q1), pk = upload(k1), pv = upload(v1);
        Buffer<float> po(dev, std::size_t(D));
        AttentionOptions no;
        no.precision = prec;
        attention(st, pq, pk, pv, po, AttentionShape{1, 1, 1, 1, n, D}, no);
        const auto c = po.to_vector(st);
        const auto ref = attention_reference(q1.data(), D, k1.data(), v1.data(), D, 1, n, D, false);
        for (std::int64_t d = 0; d < D; ++d) {
          const double bound = tc ? attention_bound_tc(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], n, D)
                                  : attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], n, D);
          RC_ASSERT(std::fabs(double(c[std::size_t(d)]) - double(a[oi + std::size_t(d)])) <= 2 * bound);
        }
      }
}

// AttentionOptions::batch_invariant (the default): a row's bytes, its output and its log-sum-exp,
// do not depend on the batch, the number of heads or seq_q. Batch b alone, query head h alone
// (with its kv head) and the last r query rows alone (causal masks are bottom-right aligned, so
// those rows see the same keys) give the full call's bytes: on every backend (on CUDA the grid's
// size picks the kernel's variant: Notes [packing blocks], [wgmma products]), both precisions,
// both layouts.
RC_GTEST_PROP(Attention, FusedRowsDoNotDependOnTheBatchHeadsOrQueryRows, ()) {
  const std::int64_t D = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
  const std::int64_t B = full_range(2, 4), Hk = full_range(1, 3), H = Hk * full_range(1, 4);
  // Keys past 8 tiles one case in five: where a split of a row's keys would pay (Note [split keys]),
  // which the default must not make depend on the grid.
  const std::int64_t Sq = *size_gen(100);
  const std::int64_t Skv = *rc::gen::weightedOneOf<std::int64_t>(
      {{2, rc::gen::just(Sq)}, {2, size_gen(150)}, {1, rc::gen::resize(100, rc::gen::inRange<std::int64_t>(449, 700))}});
  const bool causal = *rc::gen::arbitrary<bool>(), interleaved = *rc::gen::arbitrary<bool>(),
             tc = *rc::gen::arbitrary<bool>();
  const float q_scale = q_scale_gen();
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const std::int64_t b = full_range(0, B), h = full_range(0, H), r = full_range(1, Sq + 1);
  RC_LOG() << "B=" << B << " H=" << H << " Hk=" << Hk << " Sq=" << Sq << " Skv=" << Skv << " D=" << D
           << (causal ? " causal" : "") << (interleaved ? " interleaved" : "") << (tc ? " tensor core" : " exact")
           << " q_scale=" << q_scale << " b=" << b << " h=" << h << " last rows=" << r << "\n";
  const auto q = uniform(seed, std::size_t(B * H * Sq * D), -q_scale, q_scale);
  const auto k = uniform(seed + 1, std::size_t(B * Hk * Skv * D), -1.0f, 1.0f);
  const auto v = uniform(seed + 2, k.size(), -1.0f, 1.0f);
  // Element 0 of row i of head hh of batch bb, in a tensor of `heads` heads and `seq` rows.
  auto at = [&](std::int64_t bb, std::int64_t hh, std::int64_t i, std::int64_t heads, std::int64_t seq) {
    return std::size_t(interleaved ? ((bb * seq + i) * heads + hh) * D : ((bb * heads + hh) * seq + i) * D);
  };
  // Rows [r0, r0 + n) of heads [h0, h0 + nh) of batch bb of x, as a batch of one.
  auto slice = [&](const std::vector<float>& x, std::int64_t heads, std::int64_t seq, std::int64_t bb,
                   std::int64_t h0, std::int64_t nh, std::int64_t r0, std::int64_t n) {
    std::vector<float> y(std::size_t(nh * n * D));
    for (std::int64_t hh = 0; hh < nh; ++hh)
      for (std::int64_t i = 0; i < n; ++i)
        std::copy_n(x.begin() + std::ptrdiff_t(at(bb, h0 + hh, r0 + i, heads, seq)), D,
                    y.begin() + std::ptrdiff_t(at(0, hh, i, nh, n)));
    return y;
  };
  const std::int64_t hk = h / (H / Hk);
  RC_CLASSIFY(Skv > 448, "more than 8 key tiles");
  RC_CLASSIFY(tc, "tensor core");
  for (const auto& dev : backends()) {
    auto& st = dev->default_stream();
    // out, then the log-sum-exp [batch, heads, seq_q].
    auto run = [&](const std::vector<float>& hq, const std::vector<float>& hk_, const std::vector<float>& hv,
                   const AttentionShape& shape) {
      Buffer<float> bq(dev, hq.size()), bk(dev, hk_.size()), bv(dev, hv.size()), o(dev, hq.size()),
          lse(dev, std::size_t(shape.batch * shape.num_heads * shape.seq_q));
      bq.copy_from_host(st, hq);
      bk.copy_from_host(st, hk_);
      bv.copy_from_host(st, hv);
      AttentionOptions opt;
      opt.causal = causal;
      opt.precision = tc ? AttentionPrecision::kTensorCore : AttentionPrecision::kExact;
      opt.layout = interleaved ? AttentionLayout::kInterleaved : AttentionLayout::kHeadsFirst;
      opt.lse = &lse;
      attention(st, bq, bk, bv, o, shape, opt);
      return std::pair{o.to_vector(st), lse.to_vector(st)};
    };
    const auto full = run(q, k, v, AttentionShape{B, H, Hk, Sq, Skv, D});
    // The part's rows (batch 0, heads nh, rows n) against rows [r0, r0 + n) of heads [h0, h0 + nh)
    // of batch b of the full call.
    auto same = [&](const std::pair<std::vector<float>, std::vector<float>>& part, std::int64_t h0,
                    std::int64_t nh, std::int64_t r0, std::int64_t n, const char* what) {
      for (std::int64_t hh = 0; hh < nh; ++hh)
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int64_t d = 0; d < D; ++d)
            if (float_bits(part.first[at(0, hh, i, nh, n) + std::size_t(d)]) !=
                float_bits(full.first[at(b, h0 + hh, r0 + i, H, Sq) + std::size_t(d)]))
              RC_FAIL(dev->id().str() + ": " + what + ": head " + std::to_string(h0 + hh) + " row " +
                      std::to_string(r0 + i) + " element " + std::to_string(d) + " differs from the full call's");
          if (float_bits(part.second[std::size_t(hh * n + i)]) !=
              float_bits(full.second[std::size_t((b * H + h0 + hh) * Sq + r0 + i)]))
            RC_FAIL(dev->id().str() + ": " + what + ": head " + std::to_string(h0 + hh) + " row " +
                    std::to_string(r0 + i) + ": the log-sum-exp differs from the full call's");
        }
    };
    same(run(slice(q, H, Sq, b, 0, H, 0, Sq), slice(k, Hk, Skv, b, 0, Hk, 0, Skv), slice(v, Hk, Skv, b, 0, Hk, 0, Skv),
             AttentionShape{1, H, Hk, Sq, Skv, D}),
         0, H, 0, Sq, "batch b alone");
    same(run(slice(q, H, Sq, b, h, 1, 0, Sq), slice(k, Hk, Skv, b, hk, 1, 0, Skv), slice(v, Hk, Skv, b, hk, 1, 0, Skv),
             AttentionShape{1, 1, 1, Sq, Skv, D}),
         h, 1, 0, Sq, "head h alone");
    same(run(slice(q, H, Sq, b, 0, H, Sq - r, r), slice(k, Hk, Skv, b, 0, Hk, 0, Skv),
             slice(v, Hk, Skv, b, 0, Hk, 0, Skv), AttentionShape{1, H, Hk, r, Skv, D}),
         0, H, Sq - r, r, "the last query rows alone");
  }
}

}  // namespace
}  // namespace lockstep::harness
