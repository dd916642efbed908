// Fused attention (Exact) and multi-head attention in half and bfloat16 (Note [exact formats] in
// kernels/fused/exact.hpp): q, k, v and out in one 16-bit format, float arithmetic. The property: the call's bytes are
// those of the float call on the widened inputs, rounded once, and its log-sum-exp is the float
// call's, on every backend and CPU path; CUDA's bytes are the CPU device's. Refusals write nothing.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/multihead.hpp"
#include "harness/harness_decode_formats.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

using harness::encode;
using harness::raw;
using harness::widen;

// q, k and v uploaded to dev from host values in T, and out (q's size) filled with 42.
template <class T>
struct Operands {
  Buffer<T> q, k, v, out;
  Operands(const std::shared_ptr<Device>& dev, const std::vector<T>& hq, const std::vector<T>& hk,
           const std::vector<T>& hv)
      : q(dev, hq.size()), k(dev, hk.size()), v(dev, hv.size()), out(dev, hq.size()) {
    Stream& st = dev->default_stream();
    q.copy_from_host(st, hq);
    k.copy_from_host(st, hk);
    v.copy_from_host(st, hv);
    out.copy_from_host(st, std::vector<T>(hq.size(), encode<T>({42.0f})[0]));
  }
};

// The bytes of a float call's output, each value rounded to T.
template <class T>
std::vector<std::uint8_t> rounded(const std::vector<std::uint8_t>& float_bytes) {
  std::vector<float> f(float_bytes.size() / sizeof(float));
  std::memcpy(f.data(), float_bytes.data(), float_bytes.size());
  return raw(encode<T>(f));
}

struct Outputs {
  std::vector<std::uint8_t> out;  // bytes
  std::vector<float> lse;
};

// attention<T> on dev over host inputs already in T (out and lse filled with a marker first).
template <class T>
Outputs call(const std::shared_ptr<Device>& dev, const std::vector<T>& hq, const std::vector<T>& hk,
             const std::vector<T>& hv, const AttentionShape& sh, AttentionOptions o) {
  Stream& st = dev->default_stream();
  Operands<T> b(dev, hq, hk, hv);
  Buffer<float> lse(dev, std::size_t(sh.batch * sh.num_heads * sh.seq_q));
  lse.fill(st, 42.0f);
  o.lse = &lse;
  attention(st, b.q, b.k, b.v, b.out, sh, o);
  return {raw(b.out.to_vector(st)), lse.to_vector(st)};
}

// The property for T on dev at shape sh: the bytes of the float call on the widened inputs,
// rounded to T, and its log-sum-exp; on CUDA also the CPU device's bytes.
template <class T>
void expect_float_call_rounded(const std::shared_ptr<Device>& dev, const AttentionShape& sh, AttentionOptions o,
                               Lcg& rng, bool specials, bool cross_backend = true) {
  SCOPED_TRACE(std::string(format_name<T>()) + (o.precision == AttentionPrecision::kTensorCore ? " TensorCore" : "") +
               " D " + std::to_string(sh.head_dim) + " Sq " +
               std::to_string(sh.seq_q) + " Skv " + std::to_string(sh.seq_kv) + (o.causal ? " causal" : "") +
               (o.layout == AttentionLayout::kInterleaved ? " interleaved" : "") +
               (o.batch_invariant ? "" : " split keys"));
  const std::size_t nq = std::size_t(sh.batch * sh.num_heads * sh.seq_q * sh.head_dim);
  const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * sh.head_dim);
  auto fq = rng.floats(nq, 2.0f), fk = rng.floats(nkv, 2.0f), fv = rng.floats(nkv, 2.0f);
  if (specials) {
    fq[1] = std::numeric_limits<float>::quiet_NaN();  // one row NaN
    fv[nkv - 1] = std::numeric_limits<float>::infinity();
    fk[3] = 1e30f;  // inf in half (past its range), finite in bfloat16
  }
  const auto q = encode<T>(fq), k = encode<T>(fk), v = encode<T>(fv);
  const Outputs got = call<T>(dev, q, k, v, sh, o);
  const Outputs want = call<float>(dev, widen(q), widen(k), widen(v), sh, o);
  EXPECT_EQ(got.out, rounded<T>(want.out)) << "out: not the float call's bytes rounded once";
  ASSERT_EQ(got.lse.size(), want.lse.size());
  for (std::size_t i = 0; i < got.lse.size(); ++i)
    ASSERT_TRUE(same_bits(got.lse[i], want.lse[i])) << "lse " << i << ": " << got.lse[i] << " vs " << want.lse[i];
  ASSERT_NE(got.lse[0], 42.0f);
  if (!cross_backend) return;  // TensorCore: the CPU emulates the tiles within a bound
  if (dev->id().kind == DeviceKind::kCuda) {
    const Outputs cpu = call<T>(open("cpu"), q, k, v, sh, o);
    EXPECT_EQ(got.out, cpu.out) << "CUDA against the CPU device";
    for (std::size_t i = 0; i < got.lse.size(); ++i) ASSERT_TRUE(same_bits(got.lse[i], cpu.lse[i])) << "lse " << i;
  } else {  // the lane path gives the row form's bytes (Note [row-major exact])
    const Outputs lanes = call<T>(cpu_with(&CpuDeviceOptions::exact_lanes), q, k, v, sh, o);
    EXPECT_EQ(got.out, lanes.out) << "the CPU's lane path against its row form";
    for (std::size_t i = 0; i < got.lse.size(); ++i) ASSERT_TRUE(same_bits(got.lse[i], lanes.lse[i])) << "lse " << i;
  }
}

TEST_P(Attention, FusedExactInFormatsIsTheFloatCallRounded) {
  Lcg rng{17};
  for (std::int64_t D : {32, 64, 96, 128, 256}) {
    AttentionOptions o;
    o.precision = AttentionPrecision::kExact;
    for (bool causal : {false, true}) {
      o.causal = causal;
      expect_float_call_rounded<half>(dev, AttentionShape{2, 4, 2, 70, 130, D}, o, rng, D == 64);
      expect_float_call_rounded<bfloat16>(dev, AttentionShape{1, 2, 1, 150, 40, D}, o, rng, D == 128);
    }
  }
  AttentionOptions il;  // interleaved, odd lengths, MHA
  il.layout = AttentionLayout::kInterleaved;
  il.causal = true;
  expect_float_call_rounded<bfloat16>(dev, AttentionShape{1, 4, 4, 65, 97, 64}, il, rng, false);
  AttentionOptions split;  // Note [split keys]: a small grid splits its keys; partials stay float
  split.batch_invariant = false;
  expect_float_call_rounded<half>(dev, AttentionShape{1, 2, 1, 64, 1500, 64}, split, rng, false);
  split.causal = true;
  expect_float_call_rounded<bfloat16>(dev, AttentionShape{1, 2, 2, 100, 1200, 128}, split, rng, false);
}

// Note [tensor-core formats]: TensorCore on half inputs gives the float call's bytes on the widened
// inputs, rounded (its tiles are fp16 either way), on each backend; the wgmma kernel's packing
// blocks and the split keys too.
TEST_P(Attention, FusedTensorCoreInHalfIsTheFloatCallRounded) {
  Lcg rng{19};
  AttentionOptions o;
  o.precision = AttentionPrecision::kTensorCore;
  for (std::int64_t D : {64, 128}) {
    for (bool causal : {false, true}) {
      o.causal = causal;
      expect_float_call_rounded<half>(dev, AttentionShape{2, 4, 2, 70, 130, D}, o, rng, false, false);
    }
  }
  o.layout = AttentionLayout::kInterleaved;
  expect_float_call_rounded<half>(dev, AttentionShape{1, 2, 1, 33, 200, 32}, o, rng, false, false);
  o.layout = AttentionLayout::kHeadsFirst;
  expect_float_call_rounded<half>(dev, AttentionShape{17, 16, 4, 5, 70, 64}, o, rng, false, false);  // a large grid
  const ScopedSetting splits("fused.tc_splits", "3");
  expect_float_call_rounded<half>(dev, AttentionShape{1, 4, 2, 100, 700, 128}, o, rng, false, false);
}

// Note [tensor-core formats]: TensorCore on bfloat16 inputs multiplies bfloat16 on the tensor cores
// (Q, K, V as given, P rounded to bfloat16). So V far past fp16's range (2^70) stays finite, where
// an fp16 product would be inf; and each output is within 2^-5 max|v| of Exact's on the same
// inputs (bfloat16's rounding of P and of both outputs: about 3 x 2^-8 max|v|). On the CPU device
// the wgmma kernel's emulation gives the mma.sync kernel's bytes, with and without its packing
// blocks; CUDA is held to the CPU device within the same distance.
std::vector<float> tc_bf16_outputs(const std::shared_ptr<Device>& dev, const std::vector<bfloat16>& q,
                                   const std::vector<bfloat16>& k, const std::vector<bfloat16>& v,
                                   const AttentionShape& sh, AttentionOptions o, std::vector<float>* lse = nullptr) {
  const Outputs r = call<bfloat16>(dev, q, k, v, sh, o);
  if (lse != nullptr) *lse = r.lse;
  std::vector<bfloat16> out(r.out.size() / sizeof(bfloat16));
  std::memcpy(out.data(), r.out.data(), r.out.size());
  return widen(out);
}

TEST_P(Attention, FusedTensorCoreInBfloat16MultipliesBfloat16) {
  Lcg rng{29};
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  for (std::int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      const AttentionShape sh{2, 4, 2, 200, 230, D};
      SCOPED_TRACE("D " + std::to_string(D) + (causal ? " causal" : ""));
      const std::size_t nq = std::size_t(sh.batch * sh.num_heads * sh.seq_q * D);
      const std::size_t nkv = std::size_t(sh.batch * sh.num_kv_heads * sh.seq_kv * D);
      auto fv = rng.floats(nkv, 2.0f);
      float vmax = 0.0f;
      for (float& e : fv) vmax = std::max(vmax, std::fabs(e *= 0x1p70f));
      const auto q = encode<bfloat16>(rng.floats(nq, 2.0f)), k = encode<bfloat16>(rng.floats(nkv, 2.0f)),
                 v = encode<bfloat16>(fv);
      AttentionOptions o;
      o.causal = causal;
      o.precision = AttentionPrecision::kExact;
      std::vector<float> lse_exact, lse_tc;
      const auto exact = tc_bf16_outputs(dev, q, k, v, sh, o, &lse_exact);
      o.precision = AttentionPrecision::kTensorCore;
      const auto tc = tc_bf16_outputs(dev, q, k, v, sh, o, &lse_tc);
      const float tol = 0x1p-5f * vmax;
      for (std::size_t i = 0; i < tc.size(); ++i) {
        ASSERT_TRUE(std::isfinite(tc[i])) << "out " << i << ": " << tc[i];
        ASSERT_LE(std::fabs(tc[i] - exact[i]), tol) << "out " << i << ": " << tc[i] << " vs Exact's " << exact[i];
      }
      for (std::size_t i = 0; i < lse_tc.size(); ++i)
        ASSERT_NEAR(lse_tc[i], lse_exact[i], 0x1p-5f) << "lse " << i;
      if (cpu) {
        for (const char* pack : {"0", "1"}) {
          const ScopedSetting packing("fused.pack_in_kernel", pack);
          std::vector<std::vector<float>> by;
          for (const char* wg : {"0", "1"}) {
            const ScopedSetting wgmma("fused.wgmma", wg);
            by.push_back(tc_bf16_outputs(dev, q, k, v, sh, o));
          }
          EXPECT_EQ(raw(encode<bfloat16>(by[0])), raw(encode<bfloat16>(by[1])))
              << "the wgmma kernel's emulation against the mma.sync kernel, packing blocks " << pack;
        }
      } else {
        const auto on_cpu = tc_bf16_outputs(open("cpu"), q, k, v, sh, o);
        for (std::size_t i = 0; i < tc.size(); ++i)
          ASSERT_LE(std::fabs(tc[i] - on_cpu[i]), tol) << "out " << i << ": CUDA " << tc[i] << ", CPU " << on_cpu[i];
      }
    }
}

// Multi-head attention in half and bfloat16: the float call's bytes on the widened inputs, rounded
// once, for both implementations and both GEMMs; Exact's bytes on CUDA are the CPU device's.
template <class T>
std::vector<std::uint8_t> mha(const std::shared_ptr<Device>& dev, const std::vector<T>& hq, const std::vector<T>& hk,
                              const std::vector<T>& hv, const MhaShape& sh, const MhaOptions& o) {
  Operands<T> b(dev, hq, hk, hv);
  multihead_attention(dev->default_stream(), b.q, b.k, b.v, b.out, sh, o);
  return raw(b.out.to_vector(dev->default_stream()));
}

template <class T>
void expect_mha_float_call_rounded(const std::shared_ptr<Device>& dev, Lcg& rng) {
  for (MhaImpl impl : {MhaImpl::kPerHead, MhaImpl::kBatched})
    for (GemmKind g : {GemmKind::kExact, GemmKind::kTensorCore}) {
      const MhaShape sh{70, 3, 64};
      MhaOptions o;
      o.impl = impl;
      o.gemm = g;
      o.causal = g == GemmKind::kExact;
      SCOPED_TRACE(std::string(format_name<T>()) + (impl == MhaImpl::kPerHead ? " per head" : " batched") +
                   (g == GemmKind::kExact ? " exact" : " tensor core"));
      const std::size_t n = std::size_t(sh.seq_len * sh.num_heads * sh.head_dim);
      const auto q = encode<T>(rng.floats(n)), k = encode<T>(rng.floats(n)), v = encode<T>(rng.floats(n));
      const auto got = mha<T>(dev, q, k, v, sh, o);
      EXPECT_EQ(got, rounded<T>(mha<float>(dev, widen(q), widen(k), widen(v), sh, o)));
      EXPECT_NE(got, raw(std::vector<T>(n, encode<T>({42.0f})[0])));
      if (dev->id().kind == DeviceKind::kCuda && g == GemmKind::kExact)
        EXPECT_EQ(got, mha<T>(open("cpu"), q, k, v, sh, o)) << "CUDA against the CPU device";
    }
}

TEST_P(Attention, MultiheadInFormatsIsTheFloatCallRounded) {
  Lcg rng{23};
  expect_mha_float_call_rounded<half>(dev, rng);
  expect_mha_float_call_rounded<bfloat16>(dev, rng);
}

// Refusals name the parameter and write nothing: a buffer of the wrong size (InvalidArgument), in
// either precision.
TEST_P(Attention, FusedFormatRefusalsWriteNothing) {
  const AttentionShape sh{1, 2, 2, 16, 16, 64};
  const std::size_t n = 2 * 16 * 64;
  Lcg rng{3};
  Buffer<bfloat16> q(dev, n), k(dev, n), v(dev, n), out(dev, n), small(dev, n - 1);
  const auto hq = encode<bfloat16>(rng.floats(n));
  q.copy_from_host(s(), hq);
  k.copy_from_host(s(), hq);
  v.copy_from_host(s(), hq);
  const auto marker = encode<bfloat16>(std::vector<float>(n, 42.0f));
  out.copy_from_host(s(), marker);
  AttentionOptions tc;
  tc.precision = AttentionPrecision::kTensorCore;
  expect_invalid([&] { attention(s(), q, small, v, out, sh); }, "k.size()");
  expect_invalid([&] { attention(s(), q, k, small, out, sh, tc); }, "v.size()");
  EXPECT_EQ(raw(out.to_vector(s())), raw(marker));
  attention(s(), q, k, v, out, sh, tc);  // and the same call with every size right runs
  EXPECT_NE(raw(out.to_vector(s())), raw(marker));
}

}  // namespace
}  // namespace lockstep::testing
