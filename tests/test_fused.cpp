// Fused attention on every backend: edge cases and bad input, NaN and large inputs, the Exact,
// TensorCore and wgmma kernels' schedule variants, split keys, and the CPU row form.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "lockstep/attention/fused.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

TEST_P(Attention, FusedEdgeCasesAndBadInput) {
  const AttentionShape sh{1, 4, 2, 8, 6, 32};
  auto q = filled(4 * 8 * 32, 0.5f), k = filled(2 * 6 * 32, 0.25f), v = filled(2 * 6 * 32, 2.0f);
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    SCOPED_TRACE(prec == AttentionPrecision::kExact ? "exact" : "tensor core");
    auto out = filled(4 * 8 * 32, 42.0f), lse = filled(4 * 8, 42.0f);
    AttentionOptions o;
    o.lse = &lse;
    o.precision = prec;
    attention(s(), q, k, v, out, sh, o);
    // Every value row is 2 and 0.5, 0.25, 2 are exact in fp16: exactly 2 in both precisions.
    for (float x : out.to_vector(s())) ASSERT_EQ(x, 2.0f);
    // Six equal scores s = 32 * 0.5 * 0.25 / sqrt(32): log-sum-exp = s + log(6).
    const float expect_lse = 0.5f * 0.25f * 32 / std::sqrt(32.0f) + std::log(6.0f);
    for (float x : lse.to_vector(s())) ASSERT_NEAR(x, expect_lse, 1e-5f);
    // Causal with seq_q > seq_kv (bottom-right): the first two rows see no key.
    o.causal = true;
    attention(s(), q, k, v, out, sh, o);
    const auto oc = out.to_vector(s()), lc = lse.to_vector(s());
    for (int h = 0; h < 4; ++h) {
      for (int d = 0; d < 32; ++d) {
        ASSERT_EQ(bits(oc[(h * 8 + 0) * 32 + d]), 0u);
        ASSERT_EQ(bits(oc[(h * 8 + 1) * 32 + d]), 0u);
        ASSERT_EQ(oc[(h * 8 + 2) * 32 + d], 2.0f);
      }
      ASSERT_TRUE(std::isinf(lc[h * 8]) && lc[h * 8] < 0);
      ASSERT_TRUE(std::isinf(lc[h * 8 + 1]) && lc[h * 8 + 1] < 0);
    }
  }
  // Bad input: typed, nothing written.
  auto out2 = filled(4 * 8 * 32, 42.0f);
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 3, 8, 6, 32}); }, "num_kv_heads");
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 9, 6, 32}); }, "q.size()");
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 8, 7, 32}); }, "k.size()");
  EXPECT_THROW(attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 8, 6, 48}), Unsupported);
  AttentionOptions tc;
  tc.precision = AttentionPrecision::kTensorCore;
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 3, 8, 6, 32}, tc); }, "num_kv_heads");
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 8, 7, 32}, tc); }, "k.size()");
  // TensorCore reads K and V as 16-byte vectors: a wrapped buffer 4 bytes off is refused, by
  // name; Exact takes it (and gives the same 2.0).
  auto kbig = filled(2 * 6 * 32 + 1, 0.25f), vbig = filled(2 * 6 * 32 + 1, 2.0f);
  auto k_off = Buffer<float>::wrap(dev, kbig.data().get() + 1, 2 * 6 * 32);
  auto v_off = Buffer<float>::wrap(dev, vbig.data().get() + 1, 2 * 6 * 32);
  expect_invalid([&] { attention(s(), q, k_off, v, out2, sh, tc); }, "k.data()");
  expect_invalid([&] { attention(s(), q, k, v_off, out2, sh, tc); }, "v.data()");
  expect_all(out2, 42.0f);
  attention(s(), q, k_off, v_off, out2, sh, AttentionOptions{});
  expect_all(out2, 2.0f);
  out2 = filled(4 * 8 * 32, 42.0f);
}

// Every bad argument of attention() is an InvalidArgument naming it and the value passed, in
// both precisions, and out and lse keep their bytes; seq_q == 0 enqueues nothing; seq_kv == 0
// gives zeros and log-sum-exp -inf in both precisions.
TEST_P(Attention, FusedRejectsBadInputByNameAndWritesNothing) {
  const AttentionShape sh{1, 4, 2, 8, 6, 32};
  auto q = filled(4 * 8 * 32, 0.5f), k = filled(2 * 6 * 32, 0.25f), v = filled(2 * 6 * 32, 2.0f);
  auto out = filled(4 * 8 * 32, 42.0f), lse = filled(4 * 8, 42.0f);
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    SCOPED_TRACE(prec == AttentionPrecision::kExact ? "exact" : "tensor core");
    AttentionOptions o;
    o.precision = prec;
    o.lse = &lse;
    auto bad = [&](AttentionShape b, const std::string& param, const std::string& value) {
      expect_invalid([&] { attention(s(), q, k, v, out, b, o); }, param, value);
    };
    auto edit = [&](auto f) {
      AttentionShape b = sh;
      f(b);
      return b;
    };
    bad(edit([](AttentionShape& b) { b.batch = 0; }), "batch", "0");
    bad(edit([](AttentionShape& b) { b.batch = 70000; }), "batch", "70000");
    bad(edit([](AttentionShape& b) { b.num_heads = 0; }), "num_heads", "0");
    bad(edit([](AttentionShape& b) { b.num_heads = 70000; b.num_kv_heads = 70000; }), "num_heads", "70000");
    bad(edit([](AttentionShape& b) { b.num_kv_heads = 0; }), "num_kv_heads", "0");
    bad(edit([](AttentionShape& b) { b.seq_q = -1; }), "seq_q", "-1");
    bad(edit([](AttentionShape& b) { b.seq_kv = -3; }), "seq_kv", "-3");
    bad(edit([](AttentionShape& b) { b.seq_q = std::int64_t{1} << 31; }), "seq_q", "2147483648");
    bad(edit([](AttentionShape& b) { b.seq_kv = std::int64_t{1} << 31; }), "seq_kv", "2147483648");
    // A head_dim below 1 is bad input, not a size without a kernel (that is Unsupported).
    bad(edit([](AttentionShape& b) { b.head_dim = 0; }), "head_dim", "0");
    bad(edit([](AttentionShape& b) { b.head_dim = -64; }), "head_dim", "-64");
    AttentionOptions o_bad = o;
    o_bad.precision = static_cast<AttentionPrecision>(3);
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_bad); }, "options.precision", "3");
    o_bad = o;
    o_bad.layout = static_cast<AttentionLayout>(2);
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_bad); }, "options.layout", "2");
    auto v_short = filled(2 * 6 * 32 - 1, 2.0f), out_short = filled(4 * 8 * 32 - 1, 0.0f);
    auto lse_short = filled(4 * 8 - 1, 0.0f);
    expect_invalid([&] { attention(s(), q, k, v_short, out, sh, o); }, "v.size()", std::to_string(2 * 6 * 32 - 1));
    expect_invalid([&] { attention(s(), q, k, v, out_short, sh, o); }, "out.size()", std::to_string(4 * 8 * 32 - 1));
    AttentionOptions o_short = o;
    o_short.lse = &lse_short;
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_short); }, "lse.size()", "31");
    auto other = open("cpu:9");
    Buffer<float> lse_elsewhere(other, 4 * 8), v_elsewhere(other, 2 * 6 * 32);
    AttentionOptions o_else = o;
    o_else.lse = &lse_elsewhere;
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_else); }, "lse.device");
    expect_invalid([&] { attention(s(), q, k, v_elsewhere, out, sh, o); }, "v.device");
    expect_all(out, 42.0f);
    expect_all(lse, 42.0f);

    // seq_q == 0: no error, no launch.
    Buffer<float> none(dev, 0), none_out(dev, 0), none_lse(dev, 0);
    AttentionOptions o0 = o;
    o0.lse = &none_lse;
    const auto launches = s().launches();
    attention(s(), none, k, v, none_out, AttentionShape{1, 4, 2, 0, 6, 32}, o0);
    EXPECT_EQ(s().launches(), launches);
    // seq_kv == 0 (also causal): every row fully masked, zeros and -inf.
    for (bool causal : {false, true}) {
      auto out0 = filled(4 * 8 * 32, 42.0f), lse0 = filled(4 * 8, 42.0f);
      AttentionOptions ok = o;
      ok.lse = &lse0;
      ok.causal = causal;
      attention(s(), q, none, none, out0, AttentionShape{1, 4, 2, 8, 0, 32}, ok);
      for (float x : out0.to_vector(s())) ASSERT_EQ(bits(x), 0u);
      for (float x : lse0.to_vector(s())) ASSERT_TRUE(std::isinf(x) && x < 0) << x;
    }
  }
}

// A NaN in a query row reaches that row's output as NaN in both precisions (never zeros, which
// would pass for a fully masked row); the other rows stay finite.
TEST_P(Attention, FusedNanQueryRowGivesNanOutput) {
  const AttentionShape sh{1, 2, 1, 70, 90, 64};
  Lcg rng{5};
  auto buf = [&](std::vector<float> h) {
    Buffer<float> x(dev, h.size());
    x.copy_from_host(s(), h);
    return x;
  };
  auto hq = rng.floats(2 * 70 * 64, 1.0f);
  hq[std::size_t((1 * 70 + 65) * 64 + 3)] = NAN;  // head 1, row 65, one element
  auto q = buf(hq), k = buf(rng.floats(90 * 64, 1.0f)), v = buf(rng.floats(90 * 64, 1.0f));
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    SCOPED_TRACE(prec == AttentionPrecision::kExact ? "exact" : "tensor core");
    auto out = filled(2 * 70 * 64, 42.0f), lse = filled(2 * 70, 42.0f);
    AttentionOptions o;
    o.precision = prec;
    o.lse = &lse;
    attention(s(), q, k, v, out, sh, o);
    const auto ho = out.to_vector(s());
    for (std::size_t r = 0; r < 140; ++r)
      for (std::size_t d = 0; d < 64; ++d) {
        if (r == 70 + 65) ASSERT_TRUE(std::isnan(ho[r * 64 + d])) << d;
        else ASSERT_TRUE(std::isfinite(ho[r * 64 + d])) << r << " " << d;
      }
    EXPECT_TRUE(std::isnan(lse.to_vector(s())[70 + 65]));
  }
}

// Inputs beyond fp16's range (docs/numerics.md, "Input range of the tensor-core paths"): one
// V element of 1e5 (> 65504) at one key, then one K row of 1e5 at another. Exact stays finite
// everywhere; TensorCore rounds the value to infinity, so the output column that reads it (V), or
// every row's output (K: a score of inf), is not finite, while V's other columns stay finite.
TEST_P(Attention, FusedBeyondTheHalfRangeOnlyExactStaysFinite) {
  const std::int64_t S = 70, D = 64;
  const AttentionShape sh{1, 1, 1, S, S, D};
  Lcg rng{23};
  auto buf = [&](const std::vector<float>& h) {
    Buffer<float> x(dev, h.size());
    x.copy_from_host(s(), h);
    return x;
  };
  const auto hq = rng.floats(std::size_t(S * D), 1.0f);
  for (bool big_k : {false, true}) {
    auto hk = rng.floats(std::size_t(S * D), 1.0f), hv = rng.floats(std::size_t(S * D), 1.0f);
    if (big_k)
      for (std::int64_t d = 0; d < D; ++d) hk[std::size_t(11 * D + d)] = 1e5f;  // key 11
    else
      hv[std::size_t(7 * D + 5)] = 1e5f;  // key 7, column 5
    auto q = buf(hq), k = buf(hk), v = buf(hv);
    for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
      SCOPED_TRACE(std::string(prec == AttentionPrecision::kExact ? "exact" : "tensor core") + (big_k ? " K" : " V"));
      auto out = filled(std::size_t(S * D), 42.0f);
      AttentionOptions o;
      o.precision = prec;
      attention(s(), q, k, v, out, sh, o);
      const auto ho = out.to_vector(s());
      for (std::int64_t r = 0; r < S; ++r)
        for (std::int64_t d = 0; d < D; ++d) {
          const float x = ho[std::size_t(r * D + d)];
          const bool reads_inf = big_k || d == 5;
          if (prec == AttentionPrecision::kExact || !reads_inf) ASSERT_TRUE(std::isfinite(x)) << r << " " << d;
          else ASSERT_FALSE(std::isfinite(x)) << r << " " << d;
        }
    }
  }
}

// Exact with no key tile at all: seq_kv == 0, and causal blocks whose rows see no key (seq_q -
// seq_kv >= 64 rows: the block walks no tile). Every such row is +0 with log-sum-exp -inf; the
// rows that see keys are finite, and the last row (which sees all 5 keys) equals non-causal
// attention of that row over the 5 keys.
TEST_P(Attention, FusedExactRowsWithoutKeys) {
  Lcg rng{17};
  for (std::int64_t D : {32, 64, 96, 128, 256}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    auto buf = [&](std::size_t n) {
      Buffer<float> x(dev, n);
      x.copy_from_host(s(), rng.floats(n, 1.0f));
      return x;
    };
    auto q = buf(std::size_t(2 * 200 * D)), k = buf(std::size_t(5 * D)), v = buf(std::size_t(5 * D));
    AttentionOptions o;
    o.precision = AttentionPrecision::kExact;
    {  // seq_kv == 0
      Buffer<float> k0(dev, 0), v0(dev, 0);
      auto out = filled(std::size_t(2 * 200 * D), 42.0f), lse = filled(2 * 200, 42.0f);
      o.lse = &lse;
      attention(s(), q, k0, v0, out, AttentionShape{1, 2, 1, 200, 0, D}, o);
      for (float x : out.to_vector(s())) ASSERT_EQ(bits(x), 0u);
      for (float x : lse.to_vector(s())) ASSERT_TRUE(std::isinf(x) && x < 0);
    }
    // causal, 200 queries and 5 keys: row i sees keys j <= i - 195.
    auto out = filled(std::size_t(2 * 200 * D), 42.0f), lse = filled(2 * 200, 42.0f);
    o.lse = &lse;
    o.causal = true;
    attention(s(), q, k, v, out, AttentionShape{1, 2, 1, 200, 5, D}, o);
    const auto ho = out.to_vector(s()), hl = lse.to_vector(s());
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 200; ++i) {
        const bool sees = i >= 195;
        ASSERT_EQ(std::isinf(hl[h * 200 + i]) && hl[h * 200 + i] < 0, !sees) << h << " " << i;
        for (std::int64_t d = 0; d < D; ++d) {
          const float x = ho[(h * 200 + i) * D + d];
          if (sees) ASSERT_TRUE(std::isfinite(x)) << h << " " << i << " " << d;
          else ASSERT_EQ(bits(x), 0u) << h << " " << i << " " << d;
        }
      }
    // The last row of each head against non-causal attention of that one query row.
    std::vector<float> hq = q.to_vector(s()), last(std::size_t(2 * D));
    for (std::int64_t h = 0; h < 2; ++h)
      std::copy_n(hq.begin() + (h * 200 + 199) * D, D, last.begin() + h * D);
    Buffer<float> q1(dev, last.size());
    q1.copy_from_host(s(), last);
    auto out1 = filled(std::size_t(2 * D), 42.0f), lse1 = filled(2, 42.0f);
    o.causal = false;
    o.lse = &lse1;
    attention(s(), q1, k, v, out1, AttentionShape{1, 2, 1, 1, 5, D}, o);
    const auto h1 = out1.to_vector(s()), l1 = lse1.to_vector(s());
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(bits(hl[h * 200 + 199]), bits(l1[h]));
      for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(bits(ho[(h * 200 + 199) * D + d]), bits(h1[h * D + d])) << d;
    }
  }
}

// Exact copies K and V tiles with 16-byte asynchronous copies when they are 16-byte aligned and
// with plain loads otherwise (Note [exact tile pipeline]): a K and V 4 bytes off give the same
// bytes as aligned ones holding the same values, out and lse, for every head_dim's kernel (at
// head_dim 64 both: P in K's memory and in its own buffer).
TEST_P(Attention, FusedExactMisalignedInputsGiveTheSameBytes) {
  Lcg rng{13};
  for (std::int64_t d : {32, 64, 96, 128, 256, -64})
    for (bool causal : {false, true}) {
      // -64: head_dim 64 with P in K's memory forced (this grid is small enough for the other).
      const ScopedSetting p_buffer("fused.exact_separate_p", d < 0 ? "0" : nullptr);
      const std::int64_t D = d < 0 ? -d : d;
      SCOPED_TRACE("D=" + std::to_string(D) + (causal ? " causal" : "") + (d < 0 ? " P in K" : ""));
      const AttentionShape sh{1, 2, 1, 70, 150, D};
      const std::size_t nq = std::size_t(2 * 70 * D), nkv = std::size_t(150 * D);
      const auto hq = rng.floats(nq, 1.0f), hk = rng.floats(nkv, 1.0f), hv = rng.floats(nkv, 1.0f);
      Buffer<float> q(dev, nq), k(dev, nkv), v(dev, nkv), kbig(dev, nkv + 1), vbig(dev, nkv + 1);
      q.copy_from_host(s(), hq);
      k.copy_from_host(s(), hk);
      v.copy_from_host(s(), hv);
      std::vector<float> hk1(1, 0.0f), hv1(1, 0.0f);
      hk1.insert(hk1.end(), hk.begin(), hk.end());
      hv1.insert(hv1.end(), hv.begin(), hv.end());
      kbig.copy_from_host(s(), hk1);
      vbig.copy_from_host(s(), hv1);
      auto k_off = Buffer<float>::wrap(dev, kbig.data().get() + 1, nkv);
      auto v_off = Buffer<float>::wrap(dev, vbig.data().get() + 1, nkv);
      std::vector<float> outs[2], lses[2];
      for (int i = 0; i < 2; ++i) {
        auto out = filled(nq, 42.0f), lse = filled(2 * 70, 42.0f);
        AttentionOptions o;
        o.precision = AttentionPrecision::kExact;
        o.causal = causal;
        o.lse = &lse;
        if (i == 0) attention(s(), q, k, v, out, sh, o);
        else attention(s(), q, k_off, v_off, out, sh, o);
        outs[i] = out.to_vector(s());
        lses[i] = lse.to_vector(s());
      }
      EXPECT_TRUE(same(outs[0], outs[1]));
      EXPECT_TRUE(same(lses[0], lses[1]));
      bool finite = true;
      for (float x : outs[0]) finite = finite && std::isfinite(x);
      EXPECT_TRUE(finite);
    }
}

// TensorCore at head_dim 64-128 runs 64 or 128 query rows per block (one or two m-tiles per
// warp, chosen by the grid size): a schedule choice, so both give the same bytes, out and lse.
TEST_P(Attention, FusedTensorCoreRowsPerBlockGiveTheSameBytes) {
  Lcg rng{11};
  for (std::int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("D=" + std::to_string(D) + (causal ? " causal" : ""));
      const ScopedSetting mma("fused.wgmma", "0");  // the mma.sync kernels (wgmma: its own test)
      expect_knob_gives_same_bytes("fused.tc_rows", "64", "128", AttentionPrecision::kTensorCore,
                                   AttentionShape{2, 4, 2, 200, 230, D}, causal, rng, 1.0f);
    }
}

// Note [wgmma products]: on the CPU device the warpgroup-product kernel's emulation multiplies the
// same operands in the same order as FusedAttentionTensorCore's, so it gives that kernel's bytes,
// out and lse, with one and two warpgroups per block; 230 keys end with a partial tile (four
// tiles: both ways round the unrolled pair of score buffers), and 200 query rows with a partial
// block. (On CUDA it runs where the build has sm_90a, and the tensor-core properties hold it to
// the CPU within the bound.)
TEST_P(Attention, FusedWgmmaGivesTheTensorCoreBytesOnTheCpu) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "the CPU device's emulation (CUDA: the properties)";
  Lcg rng{15};
  for (const char* wg : {"1", "2"})
    for (std::int64_t D : {64, 128})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string("warpgroups ") + wg + " D=" + std::to_string(D) + (causal ? " causal" : ""));
        const ScopedSetting warpgroups("fused.wgmma_warpgroups", wg);
        expect_knob_gives_same_bytes("fused.wgmma", "0", "1", AttentionPrecision::kTensorCore,
                                     AttentionShape{2, 4, 2, 200, 230, D}, causal, rng, 1.0f);
      }
}

// Note [four wgmma blocks per SM]: the serial schedule (fused.wgmma_serial = 1, the
// default, here in its own order: fused.wgmma_deferred = 0) gives the overlapping
// schedule's (=0) bytes, with its own packing blocks and after the packing launch, causal or
// not, with partial tiles, a single tile and many. The launch record shows that the variant ran.
// On the CPU device the wgmma kernel is forced (its emulation); on an sm_90a build on compute
// capability 9.0 it runs where the one-warpgroup head_dim 64 wgmma kernel would.
TEST_P(Attention, FusedWgmmaSerialGivesTheSameBytes) {
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  Lcg rng{17};
  std::optional<ScopedSetting> forced;  // on the CPU device the wgmma kernel's emulation
  if (cpu) forced.emplace("fused.wgmma", "1");
  const ScopedSetting warpgroups("fused.wgmma_warpgroups", "1"), in_order("fused.wgmma_deferred", "0");
  for (const char* pack : {"0", "1"})
    for (const AttentionShape& sh : {AttentionShape{2, 4, 2, 200, 230, 64}, AttentionShape{3, 2, 1, 64, 700, 64},
                                     AttentionShape{1, 2, 2, 40, 17, 64}})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string("packing blocks ") + pack + " B=" + std::to_string(sh.batch) + " Skv=" +
                     std::to_string(sh.seq_kv) + (causal ? " causal" : ""));
        detail::LaunchRecorder rec;
        {
          const ScopedSetting packing("fused.pack_in_kernel", pack);
          expect_knob_gives_same_bytes("fused.wgmma_serial", "0", "1", AttentionPrecision::kTensorCore,
                                       sh, causal, rng, 1.0f);
        }
        const bool pk = pack[0] == '1';
        const int serial = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false>>
                              : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false>>;
        const int overlapped = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true>>
                                  : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1>>;
        if (!cpu && !rec.launched(overlapped))
          GTEST_SKIP() << "no wgmma kernel here (a library built without sm_90a, or compute capability not 9.0)";
        EXPECT_TRUE(rec.launched(serial));
        EXPECT_TRUE(rec.launched(overlapped));
        // With the knob unset the serial schedule is the one that runs (the default;
        // in its own order here, fused.wgmma_deferred = 0).
        {
          detail::LaunchRecorder by_default;
          tensor_core_attention(sh, causal, pack);
          EXPECT_TRUE(by_default.launched(serial));
          EXPECT_FALSE(by_default.launched(overlapped));
        }
      }
}

// Note [deferred P.V wait]: the serial schedule with tile j's softmax during tile j - 1's P.V
// (fused.wgmma_deferred = 1, the default) gives the serial order's bytes, with its own packing blocks
// and after the packing launch, causal or not, partial tiles, one tile and many, and (200 queries
// over 17 keys, causal) blocks whose rows see no key at all (no tile). Inputs in [-4, 4]
// as well, so that a row's max moves past the lazy rescale's threshold after its first tile and
// o's rescale, which this schedule moves to just before the next P.V, runs with alpha < 1.
TEST_P(Attention, FusedWgmmaDeferredGivesTheSameBytes) {
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  Lcg rng{23};
  std::optional<ScopedSetting> forced;  // on the CPU device the wgmma kernel's emulation
  if (cpu) forced.emplace("fused.wgmma", "1");
  std::optional<ScopedSetting> warpgroups(std::in_place, "fused.wgmma_warpgroups", "1");
  for (const char* pack : {"0", "1"})
    for (const AttentionShape& sh : {AttentionShape{2, 4, 2, 200, 230, 64}, AttentionShape{3, 2, 1, 64, 700, 64},
                                     AttentionShape{1, 2, 2, 40, 17, 64}, AttentionShape{1, 2, 1, 200, 17, 64}})
      for (bool causal : {false, true})
        for (float range : {1.0f, 4.0f}) {
          SCOPED_TRACE(std::string("packing blocks ") + pack + " B=" + std::to_string(sh.batch) + " Skv=" +
                       std::to_string(sh.seq_kv) + (causal ? " causal" : "") + " range " + std::to_string(range));
          detail::LaunchRecorder rec;
          {
            const ScopedSetting packing("fused.pack_in_kernel", pack);
            expect_knob_gives_same_bytes("fused.wgmma_deferred", "0", "1", AttentionPrecision::kTensorCore,
                                         sh, causal, rng, range);
          }
          const bool pk = pack[0] == '1';
          const int serial = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false>>
                                : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false>>;
          const int deferred = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false, true>>
                                  : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false, true>>;
          if (!cpu && !rec.launched(serial))
            GTEST_SKIP() << "no wgmma kernel here (a library built without sm_90a, or compute capability not 9.0)";
          EXPECT_TRUE(rec.launched(serial));
          EXPECT_TRUE(rec.launched(deferred));
          // With the knob unset the deferred order is the one that runs (the default).
          detail::LaunchRecorder by_default;
          tensor_core_attention(sh, causal, pack);
          EXPECT_TRUE(by_default.launched(deferred));
          EXPECT_FALSE(by_default.launched(serial));
        }
  warpgroups.reset();
  // By default one warpgroup per block at head_dim 64 (this kernel); at head_dim 128 two for grids
  // under two waves of the device's multiprocessors at 64 rows per block (here 8 blocks), else one.
  const bool two_at_128 = 8 < 2 * dev->caps().multiprocessors;
  for (std::int64_t D : {64, 128}) {
    SCOPED_TRACE("small grid, D=" + std::to_string(D));
    detail::LaunchRecorder rec;
    tensor_core_attention(AttentionShape{1, 2, 1, 200, 230, D}, false, "0");
    const int one = D == 64 ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false, true>>
                            : kernels::kernel_index_v<kernels::FusedAttentionWgmma<128, 1>>;
    const int two = D == 64 ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 2>>
                            : kernels::kernel_index_v<kernels::FusedAttentionWgmma<128, 2>>;
    EXPECT_EQ(rec.launched(one), D == 64 || !two_at_128);
    EXPECT_EQ(rec.launched(two), D == 128 && two_at_128);
  }
}

// Note [packing blocks]: the wgmma kernel with K and V rounded to fp16 by its own blocks (kv head
// by kv head, behind tickets and signals) gives the bytes of the packing kernel before it. On the
// CPU device the wgmma kernel is forced (its emulation); on an sm_90a build on compute capability
// 9.0 it is the default at these head_dims' grids. Each shape is first run with other K and V by
// the packing kernel, so that the stream's scratch holds wrong tiles where the packing blocks must
// write. Shapes: several kv heads and batches (blocks wait on the heads before theirs), one
// packing block per kv head packing many tiles (64 query rows, 700 keys), one kv head in all
// (packed by the kernel before only), partial tiles, GQA. Repeated calls on one stream also check
// that the tickets and counters are zeros again after a call. The blocks pack the default 8, one
// and two kv heads ahead (fused.pack_ahead, at most the kv heads per batch; the launch
// before packs that many; the last shape has 10 kv heads, so 8 ahead is not clamped there).
// Without split keys (Note [split keys]: the packing blocks never split; the knob keeps
// the packing launch from splitting too).
TEST_P(Attention, FusedWgmmaPackingBlocksGiveTheSameBytes) {
  Lcg rng{16};
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  std::optional<ScopedSetting> forced;  // on the CPU device the wgmma kernel's emulation
  if (cpu) forced.emplace("fused.wgmma", "1");
  const ScopedSetting one_range("fused.tc_splits", "1");
  for (const char* ahead : {"", "1", "2"})  // "": the default (8, at most the kv heads per batch)
    for (const char* wg : {"1", "2"})
      for (const AttentionShape& sh : {AttentionShape{2, 4, 2, 200, 230, 128}, AttentionShape{3, 2, 1, 64, 700, 64},
                                       AttentionShape{1, 3, 1, 130, 90, 128}, AttentionShape{2, 8, 2, 70, 333, 64},
                                       AttentionShape{1, 40, 10, 64, 140, 64}})
        for (bool causal : {false, true}) {
          SCOPED_TRACE(std::string("ahead ") + (*ahead != '\0' ? ahead : "default") + " warpgroups " + wg +
                       " B=" + std::to_string(sh.batch) + " Hkv=" + std::to_string(sh.num_kv_heads) + " D=" +
                       std::to_string(sh.head_dim) + (causal ? " causal" : ""));
          const ScopedSetting warpgroups("fused.wgmma_warpgroups", wg);
          const ScopedSetting pack_ahead("fused.pack_ahead", ahead);
          const std::size_t nq = std::size_t(sh.batch * sh.num_heads * sh.seq_q * sh.head_dim);
          const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * sh.head_dim);
          auto buf = [&](std::size_t n) {
            Buffer<float> x(dev, n);
            x.copy_from_host(s(), rng.floats(n, 1.0f));
            return x;
          };
          auto q = buf(nq), k = buf(nkv), v = buf(nkv), k_other = buf(nkv), v_other = buf(nkv);
          std::vector<float> outs[3];
          for (int i = 0; i < 3; ++i) {  // the other K and V packed before; in the kernel; before
            auto out = filled(nq, 42.0f);
            AttentionOptions o;
            o.precision = AttentionPrecision::kTensorCore;
            o.causal = causal;
            const ScopedSetting packing("fused.pack_in_kernel", i == 1 ? "1" : "0");
            attention(s(), q, i == 0 ? k_other : k, i == 0 ? v_other : v, out, sh, o);
            outs[i] = out.to_vector(s());
          }
          ASSERT_FALSE(same(outs[0], outs[2]));
          for (std::size_t e = 0; e < nq; ++e) ASSERT_EQ(bits(outs[1][e]), bits(outs[2][e])) << e;
        }
}

// batch_invariant (the default): one batch's rows of a large grid are the bytes of that batch
// alone, out and lse, by the default kernels. On sm_90a CUDA the grid's size picks the kernel's
// variant: 384 blocks of 64 rows (two waves of 132 SMs or more) run one warpgroup per block at
// head_dim 128 and the packing blocks at head_dim 64, the batch alone (96 blocks) two warpgroups
// and the packing launch (Notes [wgmma products], [packing blocks]); Exact's variants follow the
// grid too. (The property FusedRowsDoNotDependOnTheBatchHeadsOrQueryRows draws small grids.)
TEST_P(Attention, FusedBatchRowsOfALargeGridAreTheBatchAlone) {
  Lcg rng{18};
  const std::int64_t B = 4, H = 32, Hk = 8, Sq = 192, Skv = 256, b = 2;
  for (const auto prec : {AttentionPrecision::kTensorCore, AttentionPrecision::kExact})
    for (const std::int64_t D : {64, 128})
      for (const bool causal : {false, true}) {
        SCOPED_TRACE(std::string(prec == AttentionPrecision::kExact ? "exact" : "tensor core") +
                     " D=" + std::to_string(D) + (causal ? " causal" : ""));
        const std::size_t nq = std::size_t(B * H * Sq * D), nkv = std::size_t(B * Hk * Skv * D);
        const auto hq = rng.floats(nq, 1.0f), hk = rng.floats(nkv, 1.0f), hv = rng.floats(nkv, 1.0f);
        auto run = [&](std::int64_t batch, std::size_t q0, std::size_t kv0) {
          const std::size_t mq = nq / std::size_t(B) * std::size_t(batch), mkv = nkv / std::size_t(B) * std::size_t(batch);
          Buffer<float> q(dev, mq), k(dev, mkv), v(dev, mkv), lse(dev, std::size_t(batch * H * Sq));
          q.copy_from_host(s(), std::span<const float>(hq).subspan(q0, mq));
          k.copy_from_host(s(), std::span<const float>(hk).subspan(kv0, mkv));
          v.copy_from_host(s(), std::span<const float>(hv).subspan(kv0, mkv));
          auto out = filled(mq, 42.0f);
          AttentionOptions o;
          o.precision = prec;
          o.causal = causal;
          o.lse = &lse;
          attention(s(), q, k, v, out, AttentionShape{batch, H, Hk, Sq, Skv, D}, o);
          return std::pair{out.to_vector(s()), lse.to_vector(s())};
        };
        const auto full = run(B, 0, 0);
        const auto alone = run(1, nq / B * std::size_t(b), nkv / B * std::size_t(b));
        const std::size_t per_q = nq / std::size_t(B), per_lse = std::size_t(H * Sq);
        for (std::size_t e = 0; e < per_q; ++e)
          ASSERT_EQ(bits(alone.first[e]), bits(full.first[std::size_t(b) * per_q + e])) << e;
        for (std::size_t e = 0; e < per_lse; ++e)
          ASSERT_EQ(bits(alone.second[e]), bits(full.second[std::size_t(b) * per_lse + e])) << e;
      }
}

// TensorCore: within fp16's rounding of Q, K (scores within 2 uh qmag), P and V (a few uh); on the
// CPU device the wgmma kernel (forced, one and two warpgroups) gives FusedAttentionTensorCore's
// bytes with splits too, and FusedAttentionTensorCore<D, 2> (128 rows) those of <D, 1>.
TEST_P(Attention, FusedTensorCoreSplitKeys) {
  const double uh = std::ldexp(1.0, -11);
  split_keys_case(
      AttentionPrecision::kTensorCore, "fused.tc_splits",
      [uh](double qmag, std::int64_t, std::int64_t) { return 4.0 * qmag * uh + 8.0 * uh; },
      [](const AttentionShape&) { return false; },  // TensorCore: only when the knob asks
      [this](const AttentionShape& sh, bool causal, Lcg& rng, float range) {
        // The wgmma kernel after its packing launch (its packing blocks never split).
        const ScopedSetting no_packing_blocks("fused.pack_in_kernel", "0");
        for (const char* wg : {"1", "2"}) {
          const ScopedSetting warpgroups("fused.wgmma_warpgroups", wg);
          expect_knob_gives_same_bytes("fused.wgmma", "0", "1", AttentionPrecision::kTensorCore, sh,
                                       causal, rng, range);
        }
        const ScopedSetting mma("fused.wgmma", "0");
        expect_knob_gives_same_bytes("fused.tc_rows", "64", "128", AttentionPrecision::kTensorCore, sh,
                                     causal, rng, range);
      });
}

// Exact: within fp32's bound (every score's error, (D + 4) u qmag, and the sums', (keys + D + 40)
// u; the merge adds a few u); the CUDA bytes are the CPU's (the property FusedExactSplitKeys). On
// the CPU device the row-major path gives the lane path's bytes with splits too
// (CpuDeviceOptions::exact_lanes), and P in its own buffer those of P in K's memory (head_dim 64).
TEST_P(Attention, FusedExactSplitKeys) {
  const double u = std::ldexp(1.0, -24);
  split_keys_case(
      AttentionPrecision::kExact, "fused.exact_splits",
      [u](double qmag, std::int64_t keys, std::int64_t D) {
        return 4.0 * (qmag * double(D + 4) + double(keys + D + 40)) * u;
      },
      [](const AttentionShape&) { return true; },  // fewer than 12 warps per SM of 132
      [this](const AttentionShape& sh, bool causal, Lcg& rng, float range) {
        expect_cpu_path_gives_same_bytes(&CpuDeviceOptions::exact_lanes, AttentionPrecision::kExact, sh, causal,
                                         rng, range);
        if (sh.head_dim == 64)
          expect_knob_gives_same_bytes("fused.exact_separate_p", "0", "1", AttentionPrecision::kExact, sh, causal,
                                       rng, range);
      });
}

// Exact skips the mask on tiles whose every key is visible to every row of a full 64-row block.
// Rows do not interact, so a block of 63 rows (every tile masked) must give the same bytes for
// its rows as a block of 64 (full tiles unmasked): non-causal, and causal with the diagonal two
// tiles to the right (the extra row of the 64-row call sees one more key that no other row sees).
// Also with the keys cut into three ranges (Note [split keys]: the ranges depend on Skv's tiles
// only, the same for both calls), where the unmasked tiles are inside a range and the merge follows.
TEST_P(Attention, FusedExactUnmaskedTilesGiveTheMaskedBytes) {
  Lcg rng{14};
  for (const char* splits : {"1", "3"})
    for (std::int64_t D : {64, 128})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string("splits ") + splits + " D=" + std::to_string(D) + (causal ? " causal" : ""));
        const ScopedSetting ranges("fused.exact_splits", splits);
        const std::int64_t skv = causal ? 192 : 200;
        const auto hq = rng.floats(std::size_t(64 * D), 2.0f);
        const auto hk = rng.floats(std::size_t(skv * D), 2.0f), hv = rng.floats(std::size_t(skv * D), 2.0f);
        std::vector<float> outs[2], lses[2];
        for (int i = 0; i < 2; ++i) {
          const std::int64_t sq = 64 - i, sk = causal ? skv - i : skv;  // causal: the same shift
          const AttentionShape sh{1, 1, 1, sq, sk, D};
          Buffer<float> q(dev, std::size_t(sq * D)), k(dev, std::size_t(sk * D)), v(dev, std::size_t(sk * D));
          q.copy_from_host(s(), std::vector<float>(hq.begin(), hq.begin() + sq * D));
          k.copy_from_host(s(), std::vector<float>(hk.begin(), hk.begin() + sk * D));
          v.copy_from_host(s(), std::vector<float>(hv.begin(), hv.begin() + sk * D));
          auto out = filled(std::size_t(sq * D), 42.0f), lse = filled(std::size_t(sq), 42.0f);
          AttentionOptions o;
          o.precision = AttentionPrecision::kExact;
          o.causal = causal;
          o.lse = &lse;
          attention(s(), q, k, v, out, sh, o);
          outs[i] = out.to_vector(s());
          lses[i] = lse.to_vector(s());
        }
        for (std::size_t e = 0; e < outs[1].size(); ++e) ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
        for (std::size_t e = 0; e < lses[1].size(); ++e) ASSERT_EQ(bits(lses[0][e]), bits(lses[1][e])) << e;
        ASSERT_NE(outs[1][0], 42.0f);
      }
}

// Exact at head_dim 64 with P in K's memory and with P in a buffer of its own (the host picks by
// grid size; fused.exact_separate_p forces either): the same bytes, out and log-sum-exp.
TEST_P(Attention, FusedExactPBuffersGiveTheSameBytes) {
  Lcg rng{12};
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    expect_knob_gives_same_bytes("fused.exact_separate_p", "0", "1", AttentionPrecision::kExact,
                                 AttentionShape{2, 4, 2, 150, 201, 64}, causal, rng, 2.0f);
  }
}

// Note [row-major exact]: on the CPU's avx2 and avx3 variants FusedAttentionExact's blocks run
// row by row (x.exact_rows); CpuDeviceOptions::exact_lanes runs the lane path. The same bytes, out
// and log-sum-exp (NaN payloads aside, outside the contract), on the device's variant and on
// avx2 (two key and column vectors per register block), at every head_dim, causal or not, GQA,
// lengths that are not multiples of the 64-row blocks or the key tiles, rows that see no key
// (causal with seq_q > seq_kv), the interleaved layout, a NaN query element, scores that
// overflow to inf, and inf and NaN values in V at the last keys, which causal rows before them
// weight 0 (0 x inf is NaN on both paths: a path that skipped zero weights would differ).
TEST_P(Attention, FusedExactRowMajorGivesTheLaneBytes) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "a CPU device path (Note [row-major exact])";
  if (dev->name().find("AVX2") == std::string::npos && dev->name().find("AVX3") == std::string::npos)
    GTEST_SKIP() << dev->name() << ": this SIMD variant has no row-major path (it runs the lane path)";
  // Pairs of devices of one SIMD variant: the row path, the lane path.
  std::vector<std::string> variants{dev->name().find("AVX3") != std::string::npos ? "avx3" : "avx2"};
  if (variants[0] == "avx3") variants.push_back("avx2");
  struct Case {
    AttentionShape sh;
    AttentionLayout layout;
  };
  Lcg rng{31};
  for (const std::string& variant : variants)
    for (std::int64_t D : {32, 64, 96, 128, 256}) {
      const std::shared_ptr<Device> pair[2] = {make_cpu_device({.index = 7, .simd = variant}),
                                               make_cpu_device({.index = 8, .simd = variant, .exact_lanes = true})};
      const Case cases[] = {{{2, 4, 2, 70, 130, D}, AttentionLayout::kHeadsFirst},
                            {{1, 2, 1, 150, 40, D}, AttentionLayout::kHeadsFirst},
                            {{1, 4, 4, 65, 65, D}, AttentionLayout::kInterleaved}};
      for (const Case& c : cases)
        for (bool causal : {false, true}) {
          const AttentionShape& sh = c.sh;
          SCOPED_TRACE(variant + ": D " + std::to_string(D) + " Sq " + std::to_string(sh.seq_q) + " Skv " +
                       std::to_string(sh.seq_kv) + (causal ? " causal" : "") +
                       (c.layout == AttentionLayout::kInterleaved ? " interleaved" : ""));
          const std::size_t nq = std::size_t(sh.batch * sh.num_heads * sh.seq_q * D);
          const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * D);
          const std::size_t nl = std::size_t(sh.batch * sh.num_heads * sh.seq_q);
          auto hq = rng.floats(nq, 2.0f), hv = rng.floats(nkv, 2.0f);
          hq[1] = std::numeric_limits<float>::quiet_NaN();  // a row of head 0 (or row 0's heads): NaN
          hq[std::size_t(D) * 3 + 2] = 3e38f;                // another: scores overflow to +-inf
          // The last two keys' first values (the first kv head's, or every head's when
          // interleaved): inf and NaN.
          const std::int64_t vrow = c.layout == AttentionLayout::kInterleaved ? sh.num_kv_heads * D : D;
          hv[std::size_t((sh.seq_kv - 1) * vrow)] = std::numeric_limits<float>::infinity();
          hv[std::size_t((sh.seq_kv - 2) * vrow + 1)] = std::numeric_limits<float>::quiet_NaN();
          const auto hk = rng.floats(nkv, 2.0f);
          std::vector<float> outs[2], lses[2];
          for (int i = 0; i < 2; ++i) {
            const std::shared_ptr<Device>& d = pair[i];
            Stream& st = d->default_stream();
            Buffer<float> q(d, nq), k(d, nkv), v(d, nkv);
            q.copy_from_host(st, hq);
            k.copy_from_host(st, hk);
            v.copy_from_host(st, hv);
            Buffer<float> out(d, nq), lse(d, nl);
            out.fill(st, 42.0f);
            lse.fill(st, 42.0f);
            AttentionOptions o;
            o.precision = AttentionPrecision::kExact;
            o.causal = causal;
            o.layout = c.layout;
            o.lse = &lse;
            attention(st, q, k, v, out, sh, o);
            outs[i] = out.to_vector(st);
            lses[i] = lse.to_vector(st);
          }
          for (std::size_t e = 0; e < nq; ++e)
            ASSERT_TRUE(same_bits(outs[0][e], outs[1][e])) << "out " << e << ": " << outs[0][e] << " vs " << outs[1][e];
          for (std::size_t e = 0; e < nl; ++e)
            ASSERT_TRUE(same_bits(lses[0][e], lses[1][e])) << "lse " << e << ": " << lses[0][e] << " vs " << lses[1][e];
          for (float x : outs[0]) ASSERT_NE(bits(x), bits(42.0f)) << "every output written";
        }
    }
}

}  // namespace
}  // namespace lockstep::testing
