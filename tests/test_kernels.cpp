// The first kernels through their host calls, on every backend: known values, edge cases, and
// bad input (typed errors, outputs untouched).

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include <cstdlib>
#include <functional>

#include "../backends/cpu/kernel_table.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/attention/multihead.hpp"
#include "lockstep/attention/ops.hpp"
#include "support/backends.hpp"
#include "support/calls.hpp"
#include "support/random.hpp"

namespace lockstep::testing {
namespace {

class Kernels : public CallTest {
 protected:
  std::vector<float> download(const Buffer<float>& b) { return b.to_vector(s()); }
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
  // +inf in a row: inf - inf is NaN, so the whole row is NaN (docs/api.md), short rows and rows
  // past 1024 (the two paths of the kernel) alike; and a row shifted by +200 (exp(200) overflows
  // fp32) gives the unshifted row's values: the row's maximum is subtracted first.
  for (const std::int64_t n : {3, 1500}) {
    std::vector<float> r(std::size_t(2 * n));
    for (std::int64_t j = 0; j < n; ++j) {
      r[std::size_t(j)] = j == 1 ? inf : float(j % 7);
      r[std::size_t(n + j)] = float(j % 7) + 200.0f;
    }
    auto ri = upload(r);
    Buffer<float> ro(dev, r.size());
    ops::softmax_rows(s(), ri, ro, 2, n);
    const auto z = download(ro);
    for (std::int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(z[std::size_t(j)])) << n << " " << j;
    double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += z[std::size_t(n + j)];
    EXPECT_NEAR(sum, 1.0, 1e-5) << n;
    // Values 0..6 repeat; weight of value 6 over weight of value 0 is e^6.
    const std::int64_t top = std::min<std::int64_t>(n - 1, 6);
    EXPECT_NEAR(z[std::size_t(n + top)] / z[std::size_t(n)], std::exp(double(top)), 1e-3 * std::exp(double(top))) << n;
  }
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

// Note [softmax exponentials once]: rows of up to 1024 (held in registers, each exponential
// computed once) and longer rows (read in three passes, the exponentials computed twice) give the
// same bits. A row of 1024 against the same row with a -inf appended (1025: the general path; the
// -inf adds exp(-inf) = +0 to one lane's sum, which changes nothing): the first 1024 outputs are
// the same bytes, the last is 0. Values over a wide range, several rows and a partial last block.
TEST_P(Kernels, SoftmaxRowsInRegistersGiveTheLongPathBytes) {
  constexpr std::int64_t rows = 11, n = 1024;
  Lcg rng{21};
  const auto vals = rng.floats(std::size_t(rows * n), 30.0f);
  std::vector<float> padded(std::size_t(rows * (n + 1)));
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy_n(vals.begin() + r * n, n, padded.begin() + r * (n + 1));
    padded[std::size_t(r * (n + 1) + n)] = -INFINITY;
  }
  auto a = upload(vals), b = upload(padded);
  Buffer<float> oa(dev, vals.size()), ob(dev, padded.size());
  ops::softmax_rows(s(), a, oa, rows, n);
  ops::softmax_rows(s(), b, ob, rows, n + 1);
  const auto x = download(oa), y = download(ob);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j)
      ASSERT_TRUE(same_bits(x[std::size_t(r * n + j)], y[std::size_t(r * (n + 1) + j)])) << r << " " << j;
    ASSERT_EQ(y[std::size_t(r * (n + 1) + n)], 0.0f);
  }
}

// In place gives the bytes of a separate output, on both paths (rows in registers, and longer
// rows, whose exponentials the CPU device keeps in the output between passes).
TEST_P(Kernels, SoftmaxInPlace) {
  for (std::int64_t n : {40, 1500}) {
    SCOPED_TRACE(n);
    std::vector<float> in(std::size_t(64 * n));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = float(int(i % 997)) * 0.05f - 20.0f;
    auto a = upload(in);
    Buffer<float> ref(dev, in.size());
    ops::softmax_rows(s(), a, ref, 64, n);
    ops::softmax_rows(s(), a, a, 64, n);
    const auto x = download(a), y = download(ref);
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(x[i], y[i])) << i;
  }
}

// Note [row-major softmax]: on the CPU device's avx2 and avx3 variants each row is computed by the
// backend's row-major code, and CpuDeviceOptions::softmax_lanes runs the kernel's lane code: the
// same bytes (NaN payloads aside, outside the contract), out of place and in place, on each of
// those variants this CPU has. Row lengths around the 32-lane groups and around 1024 (the rows
// held in registers), 1 to 17 rows (partial blocks of 8), values over a wide range, and rows of
// only -inf, with one -inf, with a NaN, with +inf, with every value above exp's range, with
// zeros of both signs. The row-major path is also timed against the lane path
// (lockstep-bench --filter softmax_rows, docs/performance.md), which shows that it runs.
TEST(CpuRowMajor, SoftmaxGivesTheLaneBytes) {
  int variants = 0;
  for (const char* simd : {"avx2", "avx3"}) {
    const auto dev = cpu_variant_or_null(simd);
    if (dev == nullptr) continue;
    ++variants;
    auto& s = dev->default_stream();
    Lcg rng{31};
    for (std::int64_t n : {1, 2, 5, 31, 32, 33, 63, 100, 1000, 1023, 1024, 1025, 1056, 3001})
      for (std::int64_t rows : {1, 9, 17}) {
        SCOPED_TRACE(std::string(simd) + " n " + std::to_string(n) + " rows " + std::to_string(rows));
        auto h = rng.floats(std::size_t(rows * n), 40.0f);
        const auto at = [&](std::int64_t r, std::int64_t j) -> float& { return h[std::size_t(r * n + j)]; };
        for (std::int64_t j = 0; j < n; ++j) {
          if (rows > 1) at(1, j) = -INFINITY;
          if (rows > 8) at(8, j) += 200.0f;                      // every exp(x) overflows
          if (rows > 9) at(9, j) = j % 2 == 0 ? 0.0f : -0.0f;  // zeros of both signs
        }
        if (rows > 2) at(2, n / 2) = -INFINITY;
        if (rows > 3) at(3, n - 1) = NAN;
        if (rows > 4) at(4, n / 3) = INFINITY;
        for (bool in_place : {false, true}) {
          std::vector<float> got[2];
          for (int lanes = 0; lanes < 2; ++lanes) {
            const ScopedCpuPath path(*dev, &CpuDeviceOptions::softmax_lanes, lanes == 1);
            Buffer<float> in(dev, h.size()), out(dev, h.size());
            in.copy_from_host(s, h);
            out.copy_from_host(s, std::vector<float>(h.size(), 42.0f));
            ops::softmax_rows(s, in, in_place ? in : out, rows, n);
            got[lanes] = (in_place ? in : out).to_vector(s);
          }
          for (std::size_t i = 0; i < h.size(); ++i)
            ASSERT_TRUE(same_bits(got[0][i], got[1][i]))
                << (in_place ? "in place, " : "") << "element " << i << ": 0x" << std::hex << bits(got[0][i])
                << " row-major, 0x" << bits(got[1][i]) << " lanes";
          ASSERT_NE(got[0][0], 42.0f);
        }
      }
  }
  if (variants == 0) GTEST_SKIP() << "this CPU has neither avx2 nor avx3: no row-major softmax";
}

// The elementwise calls run in place (out = in) but refuse an output that partly overlaps the
// input (a wrapped buffer a few elements in): InvalidArgument naming the output, nothing
// written. Buffer::copy_from likewise: onto itself it is a no-op, a partial overlap is refused.
TEST_P(Kernels, ElementwiseCallsRefuseAPartialOverlap) {
  const std::size_t n = 64 * 40;
  std::vector<float> in(n + 8);
  std::iota(in.begin(), in.end(), -100.0f);
  auto a = upload(in);
  auto head = Buffer<float>::wrap(dev, a.data().get(), n);
  for (std::size_t shift : {1, 8}) {
    auto tail = Buffer<float>::wrap(dev, a.data().get() + shift, n);
    expect_invalid([&] { ops::softmax_rows(s(), head, tail, 64, 40); }, "out", "memory that partly overlaps in");
    expect_invalid([&] { ops::softmax_rows(s(), tail, head, 64, 40); }, "out", "memory that partly overlaps in");
    expect_invalid([&] { ops::scale(s(), head, tail, 2.0f); }, "out", "memory that partly overlaps in");
    expect_invalid([&] { ops::add(s(), head, tail); }, "y", "memory that partly overlaps x");
    expect_invalid([&] { tail.copy_from(s(), head); }, "src", "memory that partly overlaps the destination");
    ASSERT_TRUE(same(download(a), in)) << "a refused call wrote";
  }
  // In place, and copy_from onto itself, still work.
  ops::scale(s(), head, head, 2.0f);
  head.copy_from(s(), head);
  const auto x = download(a);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], 2.0f * in[i]) << i;
  for (std::size_t i = n; i < n + 8; ++i) ASSERT_EQ(x[i], in[i]) << i;
  ops::add(s(), head, head);
  EXPECT_EQ(download(a)[3], 4.0f * in[3]);
}

// Note [warp passes] (backends/cpu/lanes/cpu_exec.hpp): the CPU runs warp-independent kernels one warp at
// a time; CpuDeviceOptions::block_passes runs them block-wide. Every such kernel, through its host
// call, gives the same bytes both ways: partial blocks, rows of 1 to 3000, -inf, NaN and inf.
TEST_P(Kernels, WarpPassesGiveTheBlockPassBytes) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "warp passes are a CPU execution mode";
  // Runs `op` (which returns the bytes it produced) with warp passes and with block passes.
  auto both = [&](const char* what, const std::function<std::vector<float>()>& op) {
    SCOPED_TRACE(what);
    std::vector<float> warp, block;
    const auto ranges0 = cpu::warp_pass_ranges().load();
    {
      const ScopedCpuPath passes(*dev, &CpuDeviceOptions::block_passes, false);
      warp = op();
    }
    const auto ranges1 = cpu::warp_pass_ranges().load();
    {
      const ScopedCpuPath passes(*dev, &CpuDeviceOptions::block_passes, true);
      block = op();
    }
    const auto ranges2 = cpu::warp_pass_ranges().load();
    EXPECT_GT(ranges1, ranges0) << "warp passes ran";
    EXPECT_EQ(ranges2, ranges1) << "block passes ran none as warp passes";
    ASSERT_EQ(warp.size(), block.size());
    for (std::size_t i = 0; i < warp.size(); ++i) ASSERT_EQ(bits(warp[i]), bits(block[i])) << i;
  };
  Lcg rng{11};
  for (std::int64_t n : {1, 31, 33, 1000, 1025, 3000}) {
    const std::int64_t rows = 13;  // one full block of 8 rows and a partial one
    auto h = rng.floats(std::size_t(rows * n), 30.0f);
    h[std::size_t(n)] = NAN;                                             // row 1
    for (std::int64_t j = 0; j < n; ++j) h[std::size_t(2 * n + j)] = -INFINITY;  // row 2
    h[std::size_t(3 * n + n / 2)] = INFINITY;                             // row 3
    auto in = upload(h);
    both(("softmax n = " + std::to_string(n)).c_str(), [&] {
      Buffer<float> out(dev, h.size());
      ops::softmax_rows(s(), in, out, rows, n);
      return download(out);
    });
  }
  auto x = upload(rng.floats(5000, 3.0f));
  both("scale", [&] {
    Buffer<float> out(dev, 5000);
    ops::scale(s(), x, out, 0.37f);
    return download(out);
  });
  both("add", [&] {
    auto y = upload(std::vector<float>(5000, 0.25f));
    ops::add(s(), x, y);
    return download(y);
  });
  both("interleaved_to_batched", [&] {
    Buffer<float> out(dev, 5000);
    ops::interleaved_to_batched(s(), x, out, 125, 5, 8);
    return download(out);
  });
  {
    const std::int64_t S = 37, H = 3, D = 32;
    auto q = upload(rng.floats(S * H * D)), k = upload(rng.floats(S * H * D)), v = upload(rng.floats(S * H * D));
    both("multihead_attention, causal (scale_mask)", [&] {
      Buffer<float> out(dev, S * H * D);
      MhaOptions o;
      o.causal = true;
      o.gemm = GemmKind::kExact;
      multihead_attention(s(), q, k, v, out, MhaShape{S, H, D}, o);
      return download(out);
    });
  }
  {
    const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 64, .max_len = 8, .slots = 3};
    auto kn = upload(rng.floats(3 * 2 * 64)), vn = upload(rng.floats(3 * 2 * 64));
    auto q = upload(rng.floats(3 * 2 * 64 * 2)), kr = upload(rng.floats(3 * 2 * 64));
    both("KvCache::append, copy_slot_from, rope", [&] {
      KvCache cache(dev, c), other(dev, c);
      cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{0, 0, 0});
      other.copy_slot_from(s(), 2, cache, 1);
      auto qq = upload(download(q)), kk = upload(download(kr));
      rope(s(), &qq, &kk, std::vector<std::int64_t>{3, 700, 90000}, RopeConfig{4, 2, 64, 10000.0f, RopeStyle::kNeox});
      auto r = download(cache.k(0)), rv = download(other.v(0)), rq = download(qq), rk = download(kk);
      r.insert(r.end(), rv.begin(), rv.end());
      r.insert(r.end(), rq.begin(), rq.end());
      r.insert(r.end(), rk.begin(), rk.end());
      return r;
    });
  }
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
  EXPECT_EQ(download(a), std::vector<float>(100, 1.0f)) << "the refused gemm's c (a itself) is untouched";
  expect([&] { ops::transpose(s(), a, out, 1, 10, 11); }, "in.size()");
  expect([&] { ops::interleaved_to_batched(s(), a, out, 5, 0, 20); }, "num_heads");
  // Not in place: the same buffer, or wrapped pointers that overlap, are refused (they gave
  // wrong numbers), and out keeps its bytes.
  expect([&] { ops::transpose(s(), out, out, 1, 10, 10); }, "out");
  expect([&] { ops::interleaved_to_batched(s(), out, out, 5, 2, 10); }, "out");
  {
    auto in_view = Buffer<float>::wrap(dev, out.data().get(), 60);
    auto out_view = Buffer<float>::wrap(dev, out.data().get() + 40, 60);
    expect([&] { ops::batched_to_interleaved(s(), in_view, out_view, 3, 2, 10); }, "out");
    auto a_view = Buffer<float>::wrap(dev, out.data().get(), 4);
    auto c_view = Buffer<float>::wrap(dev, out.data().get() + 2, 4);
    expect([&] { ops::gemm(s(), a_view, a_view, c_view, 1, 2, 2, 2); }, "c");
  }
  // A zero dimension makes every size product 0: the other dimensions' products are not computed
  // (they may not fit: undefined behaviour before), and nothing is enqueued.
  {
    const std::int64_t big = std::int64_t(1) << 40;
    Buffer<float> none(dev, 0), none_out(dev, 0);
    const auto launches = s().launches();
    ops::gemm(s(), none, none, none_out, 0, big, big, big);
    ops::interleaved_to_batched(s(), none, none_out, 0, big, big);
    ops::batched_to_interleaved(s(), none, none_out, 0, big, big);
    ops::extract_head(s(), none, none_out, 0, big, big, 1);
    ops::copy_head_back(s(), none, none_out, 0, big, big, 1);
    expect([&] { ops::extract_head(s(), none, none_out, 0, big, big, big); }, "head");
    EXPECT_EQ(s().launches(), launches);
  }
  // A row of heads * dim past the copy's 32-bit offsets is refused by the call's own name for it
  // (it used to name the internal copy3d's limit). The views are never read: every check runs
  // before anything is enqueued.
  {
    const std::int64_t heads = std::int64_t(1) << 26, dim = 4;
    const auto launches = s().launches();
    auto in_view = Buffer<float>::wrap(dev, a.data().get(), std::size_t(heads * dim));
    auto out_view = Buffer<float>::wrap(dev, out.data().get(), std::size_t(heads * dim));
    auto head_view = Buffer<float>::wrap(dev, out.data().get(), std::size_t(dim));
    expect([&] { ops::interleaved_to_batched(s(), in_view, out_view, 1, heads, dim); }, "8 * num_heads * head_dim + head_dim");
    expect([&] { ops::batched_to_interleaved(s(), in_view, out_view, 1, heads, dim); }, "8 * num_heads * head_dim + head_dim");
    expect([&] { ops::extract_head(s(), in_view, head_view, 1, heads, dim, 0); }, "8 * num_heads * head_dim + head_dim");
    expect([&] { ops::copy_head_back(s(), head_view, out_view, 1, heads, dim, 0); }, "8 * num_heads * head_dim + head_dim");
    EXPECT_EQ(s().launches(), launches);
  }
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:3") : open("cpu");
  Buffer<float> foreign(other, 100);
  expect([&] { ops::scale(s(), foreign, out, 2.0f); }, "in.device");
  for (float v : download(out)) ASSERT_EQ(v, 42.0f);
}

LOCKSTEP_INSTANTIATE_BACKENDS(Kernels);

}  // namespace
}  // namespace lockstep::testing
