// Properties of batched decoding (RapidCheck): Flash-Decoding against the float64 oracle and
// CUDA == CPU; batch invariance (a sequence's bytes alone, or with any others at any slot);
// incremental_attention == flash_decoding bytes; rollback then re-append == never appended;
// RoPE: CUDA == CPU, NORM == NEOX after the permutation, norm and relative-position properties.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "generators.hpp"
#include "harness/harness.hpp"
#include "harness/harness_decode.hpp"
#include "harness/harness_decode_formats.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/kernels/decode.hpp"
#include "lockstep/kernels/rope.hpp"

namespace lockstep::harness {
namespace {

// A batch of sequences: mostly a few slots up to 700 tokens (1 to 3 chunks of 256); one world in
// five long (up to 16 chunks, so that a sequence and its batch have different chunk counts and
// the merge takes several batches of chunks); one in twenty with more slots than a launch's
// parameters hold (128: the positions are copied to the device first, Note [inline positions]).
DecodeWorldShape world_gen() {
  DecodeWorldShape s;
  const std::int64_t kind = full_range(0, 20);
  if (kind < 4) {  // long
    s.dim = *rc::gen::element<std::int64_t>(32, 64, 128);
    s.kv_heads = full_range(1, 3);
    s.heads = s.kv_heads * *rc::gen::element<std::int64_t>(1, 4);
    s.slots = full_range(1, 5);
    s.max_len = full_range(700, 4200);
  } else if (kind == 4) {  // many slots
    s.dim = *rc::gen::element<std::int64_t>(32, 64);
    s.kv_heads = 1;
    s.heads = *rc::gen::element<std::int64_t>(1, 4);
    s.slots = full_range(129, 160);
    s.max_len = full_range(1, 300);
  } else {
    s.dim = *rc::gen::element<std::int64_t>(32, 64, 96, 128, 256);
    s.kv_heads = full_range(1, 4);
    s.heads = s.kv_heads * *rc::gen::element<std::int64_t>(1, 2, 3, 4, 8);
    s.slots = full_range(1, 6);
    s.max_len = *rc::gen::oneOf(rc::gen::elementOf(std::vector<std::int64_t>{1, 31, 32, 33, 97, 257, 513}),
                                rc::gen::resize(100, rc::gen::inRange<std::int64_t>(1, 700)));
  }
  // One world in four has two or three layers (the decoded one drawn; the others must stay as
  // written), one in four queries of +-300 (scores past exp's range: the max subtraction).
  if (full_range(0, 4) == 0) {
    s.layers = full_range(2, 4);
    s.layer = full_range(0, s.layers);
  }
  if (full_range(0, 4) == 0) s.q_scale = 300.0f;
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  return s;
}

// Chunks of a sequence of n tokens (Note [fixed split size]).
std::int64_t chunks_of(std::int64_t n) { return (n + kernels::kDecodeChunk - 1) / kernels::kDecodeChunk; }

// Copies slot `from` of world `a` into slot `to` of world `b` (same geometry).
void put_sequence(const DecodeWorld& a, std::int64_t from, DecodeWorld& b, std::int64_t to) {
  const auto& s = a.shape;
  const std::size_t kv = std::size_t(s.kv_heads * s.max_len * s.dim), tok = std::size_t(s.kv_heads * s.dim),
                    qs = std::size_t(s.heads * s.dim);
  std::copy_n(a.k.begin() + std::ptrdiff_t(from * kv), kv, b.k.begin() + std::ptrdiff_t(to * kv));
  std::copy_n(a.v.begin() + std::ptrdiff_t(from * kv), kv, b.v.begin() + std::ptrdiff_t(to * kv));
  std::copy_n(a.k_new.begin() + std::ptrdiff_t(from * tok), tok, b.k_new.begin() + std::ptrdiff_t(to * tok));
  std::copy_n(a.v_new.begin() + std::ptrdiff_t(from * tok), tok, b.v_new.begin() + std::ptrdiff_t(to * tok));
  std::copy_n(a.q.begin() + std::ptrdiff_t(from * qs), qs, b.q.begin() + std::ptrdiff_t(to * qs));
  b.lengths[std::size_t(to)] = a.lengths[std::size_t(from)];
  b.done[std::size_t(to)] = false;
}

bool rows_equal(const std::vector<float>& a, std::int64_t ra, const std::vector<float>& b,
                std::int64_t rb, std::size_t row) {
  for (std::size_t i = 0; i < row; ++i) {
    const float x = a[std::size_t(ra) * row + i], y = b[std::size_t(rb) * row + i];
    if (!((x != x && y != y) || float_bits(x) == float_bits(y))) return false;
  }
  return true;
}

RC_GTEST_PROP(Decode, FlashDecoding, ()) {
  const auto s = world_gen();
  const auto c = flash_case(s);
  RC_CLASSIFY(s.layers > 1, "a layer of several");
  RC_CLASSIFY(s.q_scale > 1.0f, "scores past exp's range");
  RC_LOG() << c->describe() << "\n";
  const Verdict v = verify(*c, true, true);
  RC_LOG() << v.failure << "\n";
  RC_ASSERT(v.failure.empty());
}

// The batch-invariance properties' worlds: sequence i of a batch, alone in a one-slot world, and
// at slot j of a larger world of other random sequences.
struct InvarianceWorlds {
  DecodeWorld batch, alone, other;
  std::int64_t i, j;
};
InvarianceWorlds invariance_worlds(const DecodeWorldShape& s) {
  DecodeWorld batch(s);
  const std::int64_t i = *rc::gen::inRange<std::int64_t>(0, s.slots);
  RC_PRE(!batch.done[std::size_t(i)]);
  // Alone in a one-slot cache.
  DecodeWorldShape s1 = s;
  s1.slots = 1;
  DecodeWorld alone(s1);
  put_sequence(batch, i, alone, 0);
  // Among other random sequences, at another slot index.
  DecodeWorldShape s2 = s;
  s2.slots = s.slots + *rc::gen::inRange<std::int64_t>(0, 4);
  s2.seed = s.seed ^ 0x5bd1e995u;
  DecodeWorld other(s2);
  other.scale = batch.scale;  // the same call options (the scale comes from the seed)
  // Another slot index whenever the batch has one (full_range: not narrowed in the first cases).
  std::int64_t j = full_range(0, s2.slots);
  if (s2.slots > 1 && j == i) j = (i + 1) % s2.slots;
  put_sequence(batch, i, other, j);
  return {std::move(batch), std::move(alone), std::move(other), i, j};
}

RC_GTEST_PROP(Decode, BatchInvariance, ()) {
  const auto s = world_gen();
  const auto [batch, alone, other, i, j] = invariance_worlds(s);
  const std::int64_t others = other.shape.slots;
  const std::size_t row = std::size_t(s.heads * s.dim);
  // Coverage (printed by RapidCheck): the sequence's chunks against its batches' longest.
  std::int64_t longest = 0;
  for (std::size_t m = 0; m < batch.lengths.size(); ++m)
    if (!batch.done[m]) longest = std::max(longest, batch.lengths[m] + 1);
  const std::int64_t mine = chunks_of(batch.lengths[std::size_t(i)] + 1);
  RC_CLASSIFY(mine > 1, "the sequence spans several chunks");
  RC_CLASSIFY(chunks_of(longest) > mine, "its batch has more chunks than it");
  RC_CLASSIFY(others > 128, "more than 128 slots");
  RC_CLASSIFY(j != i, "at another slot index");
  for (const auto& dev : backends()) {
    const auto a = batch.decode(dev), b = alone.decode(dev), c = other.decode(dev);
    RC_LOG() << dev->id().str() << ": slot " << i << " vs alone, vs slot " << j << " of " << others << "\n";
    RC_ASSERT(rows_equal(a, i, b, 0, row));
    RC_ASSERT(rows_equal(a, i, c, j, row));
  }
}

// Note [decode formats]: every pair of activation and cache formats against the oracle on the
// values the cache holds, the codes against the conversions, CUDA == CPU and the portable SIMD
// variant (the lane path) == the CPU's row form.
RC_GTEST_PROP(Decode, FlashDecodingInFormats, ()) {
  FormatWorldShape s;
  s.world = world_gen();
  s.world.layers = 1;
  s.world.layer = 0;
  s.act = Format(full_range(0, 3));
  s.cache = Format(full_range(0, 5));
  RC_TAG(format_name(s.act), format_name(s.cache));
  const auto c = format_flash_case(s);
  RC_LOG() << c->describe() << "\n";
  const Verdict v = verify(*c, true, true);
  RC_LOG() << v.failure << "\n";
  RC_ASSERT(v.failure.empty());
}

// Batch invariance per format: a sequence's output bytes alone and among others.
RC_GTEST_PROP(Decode, BatchInvarianceInFormats, ()) {
  auto s = world_gen();
  s.layers = 1;
  s.layer = 0;
  const Format act = Format(full_range(0, 3)), cache = Format(full_range(0, 5));
  RC_TAG(format_name(act), format_name(cache));
  auto [batch, alone, other, i, j] = invariance_worlds(s);
  // fp8 scales come from the world's seed: the same for all three worlds.
  alone.shape.seed = other.shape.seed = s.seed;
  const std::size_t row = std::size_t(s.heads * s.dim);
  for (const auto& dev : backends()) {
    const auto a = format_flash_outputs(batch, act, cache, dev), b = format_flash_outputs(alone, act, cache, dev),
               c = format_flash_outputs(other, act, cache, dev);
    RC_ASSERT(rows_equal(a, i, b, 0, row));
    RC_ASSERT(rows_equal(a, i, c, j, row));
  }
}

RC_GTEST_PROP(Decode, IncrementalAttentionGivesFlashDecodingBytes, ()) {
  auto s = world_gen();
  const DecodeWorld w(s);
  const std::int64_t i = *rc::gen::inRange<std::int64_t>(0, s.slots);
  RC_PRE(!w.done[std::size_t(i)]);
  const std::int64_t Hk = s.kv_heads, L = s.max_len, D = s.dim, n = w.lengths[std::size_t(i)] + 1;
  // The slot as a single-sequence cache [Hk, L, D] with the new token at position n - 1.
  std::vector<float> kc(std::size_t(Hk * L * D)), vc(kc.size());
  std::copy_n(w.k.begin() + std::ptrdiff_t(i * Hk * L * D), kc.size(), kc.begin());
  std::copy_n(w.v.begin() + std::ptrdiff_t(i * Hk * L * D), vc.size(), vc.begin());
  for (std::int64_t h = 0; h < Hk; ++h)
    for (std::int64_t d = 0; d < D; ++d) {
      kc[std::size_t((h * L + n - 1) * D + d)] = w.k_new[std::size_t((i * Hk + h) * D + d)];
      vc[std::size_t((h * L + n - 1) * D + d)] = w.v_new[std::size_t((i * Hk + h) * D + d)];
    }
  const std::size_t row = std::size_t(s.heads * D);
  for (const auto& dev : backends()) {
    const auto flash = w.decode(dev);
    auto& st = dev->default_stream();
    Buffer<float> q(dev, row), k(dev, kc.size()), v(dev, vc.size()), out(dev, row);
    q.copy_from_host(st, std::span<const float>(w.q).subspan(std::size_t(i) * row, row));
    k.copy_from_host(st, kc);
    v.copy_from_host(st, vc);
    incremental_attention(st, q, k, v, n, out, DecodeShape{s.heads, Hk, D, L}, w.options());
    RC_ASSERT(rows_equal(flash, i, out.to_vector(st), 0, row));
  }
}

// Note [row-major decode]: the CPU device's row-by-row products give the bytes of its lane path
// (which the CUDA == CPU properties hold to the GPU's), for any batch of sequences.
RC_GTEST_PROP(Decode, CpuRowMajorGivesTheLaneBytes, ()) {
  const auto s = world_gen();
  const DecodeWorld w(s);
  const auto cpu = open("cpu");
  const auto rows = w.decode(cpu);
  const auto lanes = w.decode(make_cpu_device({.index = 7, .simd = cpu->caps().simd_target == "AVX3"  ? "avx3"
                                                                 : cpu->caps().simd_target == "AVX2" ? "avx2"
                                                                                                      : "generic",
                                                 .decode_lanes = true}));
  for (std::int64_t r = 0; r < s.slots; ++r) RC_ASSERT(rows_equal(rows, r, lanes, r, std::size_t(s.heads * s.dim)));
}

// The KV-cache operations (append, copy_slot_from, grow) and Flash-Decoding with device positions
// (skipped slots, positions out of range with the status word, rewinds), drawn as the harness
// draws them for `lockstep parity`: each case against its oracle, the CPU's portable SIMD variant
// and, with a GPU, CUDA's bytes. (They ran only as parity's 3 cases per CI run.)
RC_GTEST_PROP(Decode, CacheOperationsAndDevicePositions, ()) {
  const std::string name = *rc::gen::element<std::string>("kv_cache_append", "kv_cache_copy_slot_from",
                                                           "kv_cache_grow", "flash_decoding_device_positions");
  const auto& entries = kernel_entries();
  const auto it = std::find_if(entries.begin(), entries.end(), [&](const KernelEntry& e) { return e.name == name; });
  RC_ASSERT(it != entries.end());
  std::mt19937_64 rng(*rc::gen::arbitrary<std::uint64_t>());
  RC_TAG(name);
  check(*it->random_case(rng));
}

RC_GTEST_PROP(Decode, RollbackThenReappendGivesTheSameBytes, ()) {
  auto s = world_gen();
  s.max_len = std::max<std::int64_t>(s.max_len, 4);
  s.done.assign(std::size_t(s.slots), false);
  DecodeWorld w(s);
  for (auto& l : w.lengths) l = std::min<std::int64_t>(l, s.max_len - 3);
  const std::size_t tok = std::size_t(s.kv_heads * s.dim);
  const auto spec_k = uniform(s.seed + 9, w.k_new.size(), -1.0f, 1.0f);
  const auto spec_v = uniform(s.seed + 10, w.v_new.size(), -1.0f, 1.0f);
  for (const auto& dev : backends()) {
    auto& st = dev->default_stream();
    Buffer<float> q(dev, w.q.size()), kn(dev, w.k_new.size()), vn(dev, w.v_new.size()),
        ks(dev, spec_k.size()), vs(dev, spec_v.size()), out1(dev, w.q.size()), out2(dev, w.q.size());
    q.copy_from_host(st, w.q);
    kn.copy_from_host(st, w.k_new);
    vn.copy_from_host(st, w.v_new);
    ks.copy_from_host(st, spec_k);
    vs.copy_from_host(st, spec_v);
    // Each step runs every layer, as a model's step does (a layer may not take a second token
    // before the others took the first).
    const auto step = [&](KvCache& c, const Buffer<float>& k, const Buffer<float>& v,
                          const std::vector<std::int64_t>& pos, Buffer<float>& out) {
      std::vector<std::vector<float>> outs;
      for (std::int64_t l = 0; l < s.layers; ++l) {
        flash_decoding(st, c, l, q, k, v, pos, out);
        outs.push_back(out.to_vector(st));
      }
      return outs;
    };
    // Never speculated.
    auto plain = w.make_cache(dev);
    const auto a = step(plain, kn, vn, w.lengths, out1);
    // Two speculative tokens, rolled back, then the real one.
    auto spec = w.make_cache(dev);
    std::vector<std::int64_t> p1 = w.lengths, p2 = w.lengths;
    for (auto& p : p2) ++p;
    step(spec, ks, vs, p1, out2);
    step(spec, ks, vs, p2, out2);
    for (std::int64_t m = 0; m < s.slots; ++m) spec.rollback(m, w.lengths[std::size_t(m)]);
    const auto b = step(spec, kn, vn, w.lengths, out2);
    for (std::int64_t l = 0; l < s.layers; ++l) RC_ASSERT(compare_bits(Run{a[std::size_t(l)], 0}, Run{b[std::size_t(l)], 0}).mismatches == 0u);
    for (std::int64_t m = 0; m < s.slots; ++m) {
      RC_ASSERT(spec.length(m) == w.lengths[std::size_t(m)] + 1);
      for (std::int64_t l = 0; l < s.layers; ++l) RC_ASSERT(spec.length(m, l) == w.lengths[std::size_t(m)] + 1);
    }
    (void)tok;
  }
}

RC_GTEST_PROP(Rope, MatchesOracleAndBackends, ()) {
  RopeCaseShape s;
  s.rows = *rc::gen::inRange<std::int64_t>(1, 40);
  s.kv_heads = *rc::gen::inRange<std::int64_t>(1, 4);
  s.heads = s.kv_heads * *rc::gen::inRange<std::int64_t>(1, 4);
  s.dim = 2 * *rc::gen::inRange<std::int64_t>(1, 129);
  s.theta = *rc::gen::element(10000.0f, 1e6f, 500000.0f);
  s.neox = *rc::gen::arbitrary<bool>();
  s.max_pos = *rc::gen::element<std::int64_t>(1, 64, 4096, kernels::kRopeMaxPosition - 1);  // up to the limit
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto c = rope_case(s);
  RC_LOG() << c->describe() << "\n";
  const Verdict v = verify(*c, true, true);
  RC_LOG() << v.failure << "\n";
  RC_ASSERT(v.failure.empty());
}

std::vector<float> apply_rope(const std::vector<float>& x, std::int64_t rows, std::int64_t heads,
                              std::int64_t D, const std::vector<std::int64_t>& pos, float theta,
                              RopeStyle style) {
  auto dev = open("cpu");
  auto& st = dev->default_stream();
  Buffer<float> b(dev, x.size());
  b.copy_from_host(st, x);
  rope(st, &b, nullptr, pos, RopeConfig{heads, 0, D, theta, style});
  (void)rows;
  return b.to_vector(st);
}

RC_GTEST_PROP(Rope, NeoxIsNormOfTheInterleavedPermutation, ()) {
  const std::int64_t D = 2 * *rc::gen::inRange<std::int64_t>(1, 65), rows = *rc::gen::inRange<std::int64_t>(1, 9);
  const auto x = uniform(*rc::gen::arbitrary<std::uint64_t>(), std::size_t(rows * D), -3.0f, 3.0f);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(rows));
  for (auto& p : pos) p = *rc::gen::inRange<std::int64_t>(0, 5000);
  // P: x'[2i] = x[i], x'[2i + 1] = x[i + D/2].
  std::vector<float> px(x.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < D / 2; ++i) {
      px[std::size_t(r * D + 2 * i)] = x[std::size_t(r * D + i)];
      px[std::size_t(r * D + 2 * i + 1)] = x[std::size_t(r * D + i + D / 2)];
    }
  const auto neox = apply_rope(x, rows, 1, D, pos, 10000.0f, RopeStyle::kNeox);
  const auto norm = apply_rope(px, rows, 1, D, pos, 10000.0f, RopeStyle::kNorm);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < D / 2; ++i) {
      RC_ASSERT(float_bits(norm[std::size_t(r * D + 2 * i)]) == float_bits(neox[std::size_t(r * D + i)]));
      RC_ASSERT(float_bits(norm[std::size_t(r * D + 2 * i + 1)]) == float_bits(neox[std::size_t(r * D + i + D / 2)]));
    }
}

RC_GTEST_PROP(Rope, PreservesPairNormsAndDependsOnlyOnRelativePosition, ()) {
  const std::int64_t D = 2 * *rc::gen::inRange<std::int64_t>(1, 65);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const auto q = uniform(seed, std::size_t(D), -1.0f, 1.0f), k = uniform(seed + 1, std::size_t(D), -1.0f, 1.0f);
  // Positions near the limit (kRopeMaxPosition) a quarter of the time.
  const std::int64_t top = *rc::gen::element<std::int64_t>(2048, 2048, 2048, kernels::kRopeMaxPosition / 2);
  const std::int64_t m = *rc::gen::inRange<std::int64_t>(0, top), n = *rc::gen::inRange<std::int64_t>(0, top),
                     shift = *rc::gen::inRange<std::int64_t>(0, top);
  const float theta = *rc::gen::element(10000.0f, 1e6f);
  const auto style = *rc::gen::arbitrary<bool>() ? RopeStyle::kNeox : RopeStyle::kNorm;
  const auto qm = apply_rope(q, 1, 1, D, {m}, theta, style), kn = apply_rope(k, 1, 1, D, {n}, theta, style);
  const auto qs = apply_rope(q, 1, 1, D, {m + shift}, theta, style), ks = apply_rope(k, 1, 1, D, {n + shift}, theta, style);
  double d1 = 0, d2 = 0, mag = 0;
  for (std::int64_t i = 0; i < D; ++i) {
    d1 += double(qm[std::size_t(i)]) * kn[std::size_t(i)];
    d2 += double(qs[std::size_t(i)]) * ks[std::size_t(i)];
    mag += (std::fabs(q[std::size_t(i)]) + 1e-30) * (std::fabs(k[std::size_t(i)]) + 1e-30);
  }
  // Note [rope bound]: each rotated component within (8 (pos + 1) + 16) u of its pair's size. Near
  // the position limit that bound exceeds |q| |k| itself (a rope that ignored positions would pass),
  // so the relative-position check runs at positions up to 6144 only.
  const double pmax = double(std::max(m, n) + shift + 1);
  if (top == 2048) RC_ASSERT(std::fabs(d1 - d2) <= 4.0 * mag * (8.0 * pmax + 16.0) * 0x1p-24);
  // |rotated pair| = |pair| at any angle: the angle's error moves the pair, not its size; sin and
  // cos (2 ulp each) and the rotation's roundings keep it within 16 u (as the unit test).
  for (std::int64_t i = 0; i < D / 2; ++i) {
    const std::size_t a = style == RopeStyle::kNeox ? std::size_t(i) : std::size_t(2 * i);
    const std::size_t b = style == RopeStyle::kNeox ? std::size_t(i + D / 2) : std::size_t(2 * i + 1);
    const double before = std::hypot(double(q[a]), double(q[b])), after = std::hypot(double(qm[a]), double(qm[b]));
    RC_ASSERT(std::fabs(after - before) <= before * 16.0 * 0x1p-24 + 1e-30);
  }
}

}  // namespace
}  // namespace lockstep::harness
