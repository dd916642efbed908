#pragma once
// The Attention test suite's fixture, shared by the tests of the attention calls (tests/test_*.cpp:
// incremental, decode kernels, multihead, KV cache, rope, flash_decoding, fused), which are one
// suite instantiated over the backends in test_attention.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "harness/harness.hpp"
#include "lockstep/attention/fused.hpp"
#include "support/calls.hpp"
#include "support/random.hpp"

namespace lockstep::testing {

class Attention : public CallTest {
 protected:
  // A Tuning field (ScopedSetting) set to a and then to b gives the same bytes, out and
  // log-sum-exp, for fused attention of shape sh (inputs uniform in [-range, range]).
  void expect_knob_gives_same_bytes(const char* knob, const char* a, const char* b,
                                    AttentionPrecision precision, const AttentionShape& sh,
                                    bool causal, Lcg& rng, float range) {
    const std::size_t nq = std::size_t(sh.batch * sh.num_heads * sh.seq_q * sh.head_dim);
    const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * sh.head_dim);
    const std::size_t nl = std::size_t(sh.batch * sh.num_heads * sh.seq_q);
    auto buf = [&](std::size_t n) {
      Buffer<float> x(dev, n);
      x.copy_from_host(s(), rng.floats(n, range));
      return x;
    };
    auto q = buf(nq), k = buf(nkv), v = buf(nkv);
    std::vector<float> outs[2], lses[2];
    for (int i = 0; i < 2; ++i) {
      auto out = filled(nq, 42.0f), lse = filled(nl, 42.0f);
      AttentionOptions o;
      o.precision = precision;
      o.causal = causal;
      o.lse = &lse;
      const ScopedSetting knob_value(knob, i == 0 ? a : b);
      attention(s(), q, k, v, out, sh, o);
      outs[i] = out.to_vector(s());
      lses[i] = lse.to_vector(s());
    }
    for (std::size_t e = 0; e < outs[0].size(); ++e) ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
    for (std::size_t e = 0; e < lses[0].size(); ++e) ASSERT_EQ(bits(lses[0][e]), bits(lses[1][e])) << e;
    ASSERT_NE(outs[0][0], 42.0f);
    ASSERT_NE(lses[0][0], 42.0f);
  }
  // A CPU device path (CpuDeviceOptions::exact_lanes, ...) off and on gives the same bytes, out
  // and log-sum-exp, for fused attention of shape sh on two new CPU devices of dev's SIMD variant
  // (under the Tuning in force on this thread).
  void expect_cpu_path_gives_same_bytes(bool CpuDeviceOptions::*path, AttentionPrecision precision,
                                        const AttentionShape& sh, bool causal, Lcg& rng, float range) {
    const std::size_t nq = std::size_t(sh.batch * sh.num_heads * sh.seq_q * sh.head_dim);
    const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * sh.head_dim);
    const std::size_t nl = std::size_t(sh.batch * sh.num_heads * sh.seq_q);
    const auto hq = rng.floats(nq, range), hk = rng.floats(nkv, range), hv = rng.floats(nkv, range);
    std::vector<float> outs[2], lses[2];
    for (int i = 0; i < 2; ++i) {
      CpuDeviceOptions opt;
      opt.index = 7;
      opt.simd = dev->caps().simd_target == "AVX3" ? "avx3" : dev->caps().simd_target == "AVX2" ? "avx2" : "generic";
      opt.*path = i == 1;
      const auto d = make_cpu_device(opt);
      Stream& st = d->default_stream();
      Buffer<float> q(d, nq), k(d, nkv), v(d, nkv), out(d, nq), lse(d, nl);
      q.copy_from_host(st, hq);
      k.copy_from_host(st, hk);
      v.copy_from_host(st, hv);
      out.fill(st, 42.0f);
      lse.fill(st, 42.0f);
      AttentionOptions o;
      o.precision = precision;
      o.causal = causal;
      o.lse = &lse;
      attention(st, q, k, v, out, sh, o);
      outs[i] = out.to_vector(st);
      lses[i] = lse.to_vector(st);
    }
    for (std::size_t e = 0; e < outs[0].size(); ++e) ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
    for (std::size_t e = 0; e < lses[0].size(); ++e) ASSERT_EQ(bits(lses[0][e]), bits(lses[1][e])) << e;
    ASSERT_NE(outs[0][0], 42.0f);
  }
  // One TensorCore attention call with the defaults (fused.pack_in_kernel = pack), synchronized:
  // what a launch record around it shows is what runs by default.
  void tensor_core_attention(const AttentionShape& sh, bool causal, const char* pack) {
    const ScopedSetting packing("fused.pack_in_kernel", pack);
    auto q = filled(std::size_t(sh.batch * sh.num_heads * sh.seq_q * sh.head_dim), 0.5f);
    auto kv = filled(std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * sh.head_dim), 0.25f);
    auto out = filled(std::size_t(sh.batch * sh.num_heads * sh.seq_q * sh.head_dim), 42.0f);
    AttentionOptions o;
    o.precision = AttentionPrecision::kTensorCore;
    o.causal = causal;
    attention(s(), q, kv, kv, out, sh, o);
    s().synchronize();
  }
  void expect_all(const Buffer<float>& b, float v) {
    for (float x : b.to_vector(s())) ASSERT_EQ(bits(x), bits(v)) << "a rejected call wrote";
  }
  // Note [split keys]: a split cuts each query tile's key tiles into S ranges, one block each, and
  // the last block of a tile merges them in split order. Shapes: one kv head of 700 keys under 150
  // rows (11 tiles; Exact's S = 2 with batch_invariant = false); GQA, two batches, 1100 keys at
  // head_dim 128 (18 tiles, Exact's S = 4; 70 rows: partial query tiles); 600 queries over 560 keys
  // (9 tiles, S = 2), causal: the first 40 rows see no key, and the later splits of early query
  // tiles none either. (TensorCore splits only when its knob asks.)
  // For each, with `knob` = 3 and with the default: against the float64 reference
  // (harness::attention_reference) within `tol(qmag, keys, D)` (qmag: the row's largest sum of
  // |q k| scale), rows that see no key +0 with
  // log-sum-exp -inf, the same bytes from a second call on the stream (the counters are zeros
  // again), and other bytes than without splits (`knob` = 1: the split ran); by default
  // (batch_invariant) the bytes of no split; with batch_invariant = false, other bytes where
  // `by_default(shape)` says the library splits, else the same. Then, on the CPU
  // device, `same_bytes(sh, causal, rng, range)` with `knob` = 3 set (the schedule variants' bytes).
  // LOCKSTEP_TEST_SPLIT_SHAPES=1 keeps the first shape (for compute-sanitizer's slower runs).
  template <class Tol, class ByDefault, class SameBytes>
  void split_keys_case(AttentionPrecision precision, const char* knob, Tol tol, ByDefault by_default,
                       SameBytes same_bytes) {
    Lcg rng{31};
    const char* few = std::getenv("LOCKSTEP_TEST_SPLIT_SHAPES");
    const std::size_t shapes = few != nullptr && std::atoi(few) == 1 ? 1 : 3;
    const AttentionShape all[] = {AttentionShape{1, 2, 1, 150, 700, 64}, AttentionShape{2, 4, 2, 70, 1100, 128},
                                  AttentionShape{1, 2, 1, 600, 560, 64}};
    for (const AttentionShape& sh : std::span(all, shapes))
      for (bool causal : {false, true})
        for (float range : {1.0f, 4.0f}) {
          SCOPED_TRACE("B=" + std::to_string(sh.batch) + " Sq=" + std::to_string(sh.seq_q) + " Skv=" +
                       std::to_string(sh.seq_kv) + " D=" + std::to_string(sh.head_dim) + (causal ? " causal" : "") +
                       " range " + std::to_string(range));
          const std::int64_t D = sh.head_dim, Sq = sh.seq_q, Skv = sh.seq_kv, g = sh.num_heads / sh.num_kv_heads;
          const std::size_t nq = std::size_t(sh.batch * sh.num_heads * Sq * D);
          const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * Skv * D);
          const std::size_t nl = std::size_t(sh.batch * sh.num_heads * Sq);
          const auto hq = rng.floats(nq, range), hk = rng.floats(nkv, range), hv = rng.floats(nkv, 1.0f);
          auto up = [&](const std::vector<float>& h) {
            Buffer<float> x(dev, h.size());
            x.copy_from_host(s(), h);
            return x;
          };
          auto q = up(hq), k = up(hk), v = up(hv);
          auto call = [&](const char* splits, std::vector<float>& lse_out, bool invariant = true) {
            auto out = up(std::vector<float>(nq, 42.0f)), lse = up(std::vector<float>(nl, 42.0f));
            AttentionOptions o;
            o.precision = precision;
            o.causal = causal;
            o.lse = &lse;
            o.batch_invariant = invariant;
            const ScopedSetting split(knob, splits);  // nullptr: the default
            attention(s(), q, k, v, out, sh, o);
            lse_out = lse.to_vector(s());
            return out.to_vector(s());
          };
          std::vector<float> l1, l3, l3b, ld, lf;
          const auto o1 = call("1", l1), o3 = call("3", l3), o3b = call("3", l3b), od = call(nullptr, ld),
                     of = call(nullptr, lf, false);
          for (std::size_t e = 0; e < nq; ++e) ASSERT_EQ(bits(o3[e]), bits(o3b[e])) << e;
          for (std::size_t e = 0; e < nl; ++e) ASSERT_EQ(bits(l3[e]), bits(l3b[e])) << e;
          EXPECT_FALSE(same(o1, o3));
          EXPECT_TRUE(same(o1, od));                 // batch-invariant by default: no split
          EXPECT_TRUE(same(l1, ld));
          EXPECT_EQ(same(o1, of), !by_default(sh));  // batch_invariant = false: the heuristic's
          // The float64 reference (the properties' oracle), once per (batch, head) for both runs.
          for (std::int64_t b = 0; b < sh.batch; ++b)
            for (std::int64_t h = 0; h < sh.num_heads; ++h) {
              const std::size_t q0 = std::size_t((b * sh.num_heads + h) * Sq) * D;
              const std::size_t kv0 = std::size_t((b * sh.num_kv_heads + h / g) * Skv) * D;
              const auto ref = harness::attention_reference(hq.data() + q0, D, hk.data() + kv0, hv.data() + kv0, D,
                                                            Sq, Skv, D, causal);
              for (const auto* run : {&o3, &of}) {
                const auto& lr = run == &o3 ? l3 : lf;
                for (std::int64_t i = 0; i < Sq; ++i) {
                  const std::int64_t vis = causal ? std::clamp<std::int64_t>(i + 1 + Skv - Sq, 0, Skv) : Skv;
                  const std::size_t row = std::size_t((b * sh.num_heads + h) * Sq + i);
                  if (vis == 0) {
                    for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(bits((*run)[row * D + d]), bits(0.0f)) << row;
                    ASSERT_TRUE(std::isinf(lr[row]) && lr[row] < 0) << row;
                    continue;
                  }
                  const double e = tol(ref.qk_mag[std::size_t(i)], vis, D);  // |v| <= 1
                  for (std::int64_t d = 0; d < D; ++d)
                    ASSERT_NEAR((*run)[row * D + d], ref.out[std::size_t(i * D + d)], e) << row << " " << d;
                  const double ref_lse = ref.lse[std::size_t(i)];
                  ASSERT_NEAR(lr[row], ref_lse, e + 1e-6 * std::fabs(ref_lse)) << row;
                }
              }
            }
          if (dev->id().kind == DeviceKind::kCpu) {
            const ScopedSetting split(knob, "3");
            same_bytes(sh, causal, rng, range);
          }
        }
  }
};

}  // namespace lockstep::testing
