// multihead_attention on every backend: launches, bad shapes, the automatic choice of kernels.

#include <gtest/gtest.h>

#include <vector>

#include "lockstep/attention/multihead.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

TEST_P(Attention, MultiheadReportsLaunchesAndRejectsBadShapes) {
  const std::int64_t S = 20, H = 3, D = 32;
  auto q = filled(S * H * D, 0.1f), k = filled(S * H * D, 0.2f), v = filled(S * H * D, 0.3f);
  auto out = filled(S * H * D, 42.0f);
  MhaOptions o;
  o.gemm = GemmKind::kExact;
  o.impl = MhaImpl::kPerHead;
  MhaReport rep;
  o.report = &rep;
  multihead_attention(s(), q, k, v, out, MhaShape{S, H, D}, o);
  EXPECT_EQ(rep.launches, 9 * H);
  EXPECT_EQ(rep.impl, MhaImpl::kPerHead);
  o.impl = MhaImpl::kBatched;
  multihead_attention(s(), q, k, v, out, MhaShape{S, H, D}, o);
  EXPECT_EQ(rep.launches, 9);
  EXPECT_EQ(rep.impl, MhaImpl::kBatched);
  o.report = nullptr;
  // Every value row is 0.3: attention returns 0.3 exactly (convex combination of equal values).
  for (float x : out.to_vector(s())) ASSERT_NEAR(x, 0.3f, 1e-6f);
  auto out2 = filled(S * H * D, 42.0f);
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S + 1, H, D}, o); }, "q.size()");
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S, 0, D}, o); }, "num_heads");
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{std::int64_t(1) << 40, 1 << 20, 1 << 20}, o); },
                 "seq_len * num_heads * head_dim");
  // With seq_len 0 the size product is 0: num_heads * head_dim is checked on its own.
  Buffer<float> none(dev, 0), none_out(dev, 0);
  const std::int64_t big = std::int64_t(1) << 40;
  expect_invalid([&] { multihead_attention(s(), none, none, none, none_out, MhaShape{0, big, big}, o); },
                 "num_heads * head_dim");
  // The batched kernels take the heads as a grid dimension: more than 65535 is refused by name
  // before anything is enqueued (kPerHead takes them one by one).
  auto wide = filled(65536, 0.1f), wide_out = filled(65536, 42.0f);
  expect_invalid([&] { multihead_attention(s(), wide, wide, wide, wide_out, MhaShape{1, 65536, 1}, o); }, "num_heads",
                 "65536");
  expect_all(wide_out, 42.0f);
  // A head_dim past the GEMMs' 32-bit offsets (64 * lda + the k-tile): refused by name before
  // anything is enqueued or any scratch taken, by both implementations on both GEMMs (2^25 used
  // to fail inside the score GEMM, after three copies and the transpose were enqueued and 1 GiB
  // of scratch was taken).
  {
    const std::int64_t big_d = std::int64_t(1) << 25;
    auto bq = filled(big_d, 0.1f), bout = filled(big_d, 42.0f);
    for (const auto impl : {MhaImpl::kBatched, MhaImpl::kPerHead})
      for (const auto gemm : {GemmKind::kExact, GemmKind::kTensorCore}) {
        MhaOptions bo;
        bo.impl = impl;
        bo.gemm = gemm;
        const auto launches = s().launches();
        const auto in_use = dev->memory_stats().in_use;
        expect_invalid([&] { multihead_attention(s(), bq, bq, bq, bout, MhaShape{1, 1, big_d}, bo); },
                       "64 * head_dim + 64");
        EXPECT_EQ(s().launches(), launches);
        EXPECT_EQ(dev->memory_stats().in_use, in_use);
      }
    expect_all(bout, 42.0f);
  }
  MhaOptions bad_impl = o, bad_gemm = o;
  bad_impl.impl = static_cast<MhaImpl>(7);
  bad_gemm.gemm = static_cast<GemmKind>(-1);
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S, H, D}, bad_impl); }, "options.impl", "7");
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S, H, D}, bad_gemm); }, "options.gemm", "-1");
  expect_all(out2, 42.0f);
}

TEST_P(Attention, MultiheadAutoFollowsTheSeedRule) {
  auto run = [&](std::int64_t S, std::int64_t D, MhaOptions opts = {}) {
    auto q = filled(S * D, 0.1f), k = filled(S * D, 0.1f), v = filled(S * D, 0.1f), o = filled(S * D, 0.0f);
    MhaReport rep;
    opts.report = &rep;
    multihead_attention(s(), q, k, v, o, MhaShape{S, 1, D}, opts);
    return rep;
  };
  auto r = run(64, 64);
  EXPECT_EQ(r.score_gemm, GemmKind::kTensorCore);  // m = n = 64 >= 16, k = 64
  EXPECT_EQ(r.value_gemm, GemmKind::kTensorCore);
  r = run(64, 32);
  EXPECT_EQ(r.score_gemm, GemmKind::kExact);        // k = head_dim = 32 < 64
  EXPECT_EQ(r.value_gemm, GemmKind::kTensorCore);  // k = seq_len = 64
  r = run(64, 64, MhaOptions{.gemm = GemmKind::kExact});
  EXPECT_EQ(r.score_gemm, GemmKind::kExact);
  EXPECT_EQ(r.value_gemm, GemmKind::kExact);
}

}  // namespace
}  // namespace lockstep::testing
