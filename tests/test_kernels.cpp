// The first kernels through their host calls, on every backend: known values, edge cases, and
// bad input (typed errors, outputs untouched).

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "lockstep/attention/ops.hpp"
#include "support/backends.hpp"

namespace lockstep::testing {
namespace {

class Kernels : public BackendTest {
 protected:
  Buffer<float> upload(const std::vector<float>& h) {
    Buffer<float> b(dev, h.size());
    b.copy_from_host(dev->default_stream(), h);
    return b;
  }
  std::vector<float> download(const Buffer<float>& b) { return b.to_vector(dev->default_stream()); }
  Stream& s() { return dev->default_stream(); }
};

TEST_P(Kernels, SoftmaxKnownValuesAndEdgeRows) {
  const float inf = INFINITY;
  // Four rows of 3: ordinary, all -inf, a NaN, a -inf entry.
  std::vector<float> in = {0.0f, std::log(2.0f), 0.0f, -inf, -inf, -inf, 1.0f, NAN, 2.0f,
                           -inf, 5.0f, 5.0f};
  auto a = upload(in);
  Buffer<float> out(dev, in.size());
  ops::softmax_rows(s(), a, out, 4, 3);
  const auto y = download(out);
  EXPECT_NEAR(y[0], 0.25f, 1e-7f);
  EXPECT_NEAR(y[1], 0.5f, 1e-7f);
  EXPECT_NEAR(y[2], 0.25f, 1e-7f);
  for (int j = 3; j < 6; ++j) EXPECT_EQ(bits(y[j]), 0u) << "all -inf row gives zeros";
  for (int j = 6; j < 9; ++j) EXPECT_TRUE(std::isnan(y[j])) << "NaN propagates to its row";
  EXPECT_EQ(y[9], 0.0f);
  EXPECT_EQ(y[10], 0.5f);
  EXPECT_EQ(y[11], 0.5f);
}

TEST_P(Kernels, SoftmaxLongRowSumsToOne) {
  const std::int64_t n = 100003;
  std::vector<float> in(n);
  for (std::int64_t i = 0; i < n; ++i) in[i] = std::sin(float(i)) * 5.0f;
  auto a = upload(in);
  Buffer<float> out(dev, n);
  ops::softmax_rows(s(), a, out, 1, n);
  const auto y = download(out);
  double sum = 0;
  for (float v : y) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-4);
}

TEST_P(Kernels, SoftmaxInPlace) {
  std::vector<float> in(64 * 40);
  std::iota(in.begin(), in.end(), -100.0f);
  auto a = upload(in);
  Buffer<float> ref(dev, in.size());
  ops::softmax_rows(s(), a, ref, 64, 40);
  ops::softmax_rows(s(), a, a, 64, 40);
  const auto x = download(a), y = download(ref);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(x[i], y[i]));
}

TEST_P(Kernels, GemmOfSmallIntegersIsExact) {
  const std::int64_t B = 2, M = 67, N = 33, K = 129;
  std::vector<float> a(B * M * K), b(B * K * N);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 7) - 3);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2);
  auto da = upload(a), db = upload(b);
  Buffer<float> c(dev, B * M * N);
  ops::gemm(s(), da, db, c, B, M, N, K);
  const auto y = download(c);
  for (std::int64_t t = 0; t < B; ++t)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        float ref = 0;
        for (std::int64_t l = 0; l < K; ++l) ref += a[(t * M + i) * K + l] * b[(t * K + l) * N + j];
        ASSERT_EQ(y[(t * M + i) * N + j], ref);
      }
}

TEST_P(Kernels, LayoutsRoundTrip) {
  const std::int64_t S = 37, H = 6, D = 64;
  std::vector<float> in(S * H * D);
  std::iota(in.begin(), in.end(), 0.0f);
  auto a = upload(in);
  Buffer<float> b(dev, in.size()), c(dev, in.size()), head(dev, S * D);
  ops::interleaved_to_batched(s(), a, b, S, H, D);
  ops::batched_to_interleaved(s(), b, c, S, H, D);
  EXPECT_EQ(download(c), in);
  const auto bt = download(b);
  EXPECT_EQ(bt[(2 * S + 5) * D + 7], in[(5 * H + 2) * D + 7]);
  ops::extract_head(s(), a, head, S, H, D, 4);
  const auto h = download(head);
  EXPECT_EQ(h[3 * D + 9], in[(3 * H + 4) * D + 9]);
  Buffer<float> back(dev, in.size());
  back.fill(s(), -1.0f);
  ops::copy_head_back(s(), head, back, S, H, D, 4);
  const auto bk = download(back);
  EXPECT_EQ(bk[(3 * H + 4) * D + 9], in[(3 * H + 4) * D + 9]);
  EXPECT_EQ(bk[(3 * H + 3) * D + 9], -1.0f) << "other heads untouched";
}

TEST_P(Kernels, TransposeTwiceIsIdentity) {
  const std::int64_t B = 3, R = 45, C = 70;
  std::vector<float> in(B * R * C);
  std::iota(in.begin(), in.end(), 0.0f);
  auto a = upload(in);
  Buffer<float> t(dev, in.size()), u(dev, in.size());
  ops::transpose(s(), a, t, B, R, C);
  ops::transpose(s(), t, u, B, C, R);
  EXPECT_EQ(download(u), in);
  EXPECT_EQ(download(t)[1 * R * C + 5 * R + 2], in[1 * R * C + 2 * C + 5]);
}

TEST_P(Kernels, BadInputIsTypedAndLeavesOutputsUntouched) {
  auto a = upload(std::vector<float>(100, 1.0f));
  Buffer<float> out(dev, 100);
  out.fill(s(), 42.0f);
  auto expect = [&](auto&& call, const std::string& param) {
    try {
      call();
      ADD_FAILURE() << "accepted bad " << param;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), param) << e.what();
      EXPECT_FALSE(e.value().empty());
      EXPECT_FALSE(e.limit().empty());
    }
  };
  expect([&] { ops::softmax_rows(s(), a, out, 10, 11); }, "in.size()");
  expect([&] { ops::softmax_rows(s(), a, out, 10, 0); }, "n");
  expect([&] { ops::softmax_rows(s(), a, out, -1, 10); }, "rows");
  expect([&] { ops::softmax_rows(s(), a, out, std::int64_t(1) << 40, std::int64_t(1) << 40); },
         "rows * n");
  expect([&] { ops::extract_head(s(), a, out, 10, 1, 10, 1); }, "head");
  expect([&] { ops::gemm(s(), a, a, a, 1, 10, 10, 10); }, "c");
  expect([&] { ops::transpose(s(), a, out, 1, 10, 11); }, "in.size()");
  expect([&] { ops::interleaved_to_batched(s(), a, out, 5, 0, 20); }, "heads");
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:3") : open("cpu");
  Buffer<float> foreign(other, 100);
  expect([&] { ops::scale(s(), foreign, out, 2.0f); }, "in.device");
  for (float v : download(out)) ASSERT_EQ(v, 42.0f);
}

LOCKSTEP_INSTANTIATE_BACKENDS(Kernels);

}  // namespace
}  // namespace lockstep::testing
