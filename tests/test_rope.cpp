// rope on every backend: bad input (typed errors, nothing written).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

// rope refuses every bad argument with InvalidArgument naming it, and leaves q and k untouched;
// the largest accepted position still rotates within Note [rope bound] (positions of 2^28 gave
// norms 4500 times too large before the limit).
TEST_P(Attention, RopeValidatesAndWritesNothingOnError) {
  const std::int64_t rows = 3, H = 4, Hk = 2, D = 8;
  auto q = filled(rows * H * D, 0.75f), k = filled(rows * Hk * D, -0.5f);
  const auto q0 = q.to_vector(s()), k0 = k.to_vector(s());
  const std::vector<std::int64_t> pos = {0, 5, 9};
  const RopeConfig ok{H, Hk, D, 10000.0f, RopeStyle::kNorm};
  auto with = [&](auto edit) {
    RopeConfig c = ok;
    edit(c);
    return c;
  };
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.head_dim = 7; })); }, "head_dim", "7");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.head_dim = 0; })); }, "head_dim", "0");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.theta = 1.0f; })); }, "theta");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.theta = INFINITY; })); }, "theta");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.theta = NAN; })); }, "theta");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.style = static_cast<RopeStyle>(7); })); },
                 "config.style", "7");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.num_heads = 0; })); }, "num_heads", "0");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.num_heads = 70000; })); }, "q.size()");
  expect_invalid([&] { rope(s(), nullptr, &k, pos, with([](RopeConfig& c) { c.num_kv_heads = 70000; })); },
                 "k.size()");
  {
    Buffer<float> big(dev, std::size_t(rows) * 70000 * 2);
    expect_invalid([&] { rope(s(), nullptr, &big, pos, RopeConfig{0, 70000, 2, 10000.0f, RopeStyle::kNorm}); },
                   "num_kv_heads", "70000");
  }
  expect_invalid([&] { rope(s(), &q, &k, std::vector<std::int64_t>{0, -1, 2}, ok); }, "positions[1]", "-1");
  expect_invalid([&] { rope(s(), &q, &k, std::vector<std::int64_t>{0, 1, std::int64_t{1} << 20}, ok); },
                 "positions[2]", "1048576");
  expect_invalid([&] { rope(s(), &q, &k, std::vector<std::int64_t>{0, 1}, ok); }, "q.size()");
  expect_invalid([&] { rope(s(), nullptr, &k, std::vector<std::int64_t>{0, 1}, ok); }, "k.size()");
  auto other = open("cpu:9");
  Buffer<float> qo(other, q0.size());
  expect_invalid([&] { rope(s(), &qo, &k, pos, ok); }, "q.device");
  EXPECT_TRUE(same(q.to_vector(s()), q0));
  EXPECT_TRUE(same(k.to_vector(s()), k0));

  // One launch for q and k together; k alone gives the bits k gets with q.
  const auto launches = s().launches();
  rope(s(), &q, &k, pos, ok);
  EXPECT_EQ(s().launches() - launches, 1u);
  auto k_alone = filled(rows * Hk * D, -0.5f);
  rope(s(), nullptr, &k_alone, pos, ok);
  EXPECT_TRUE(same(k_alone.to_vector(s()), k.to_vector(s())));
  EXPECT_FALSE(same(k.to_vector(s()), k0));  // it did rotate (positions 5 and 9)

  // The largest position: each pair's norm within Note [rope bound], and the float64 rotation of
  // the same float angle within it too.
  const std::int64_t pmax = (std::int64_t{1} << 20) - 1;
  std::vector<float> x(std::size_t(2 * 128));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i) + 0.1f);
  Buffer<float> xb(dev, x.size());
  xb.copy_from_host(s(), x);
  rope(s(), &xb, nullptr, std::vector<std::int64_t>{pmax, 0}, RopeConfig{1, 0, 128, 500000.0f, RopeStyle::kNeox});
  const auto y = xb.to_vector(s());
  const double bound = (8.0 * double(pmax + 1) + 16.0) * 0x1p-24;
  for (int i = 0; i < 64; ++i) {
    const double a = x[std::size_t(i)], b = x[std::size_t(i + 64)];
    const double ya = y[std::size_t(i)], yb = y[std::size_t(i + 64)];
    const double norm = std::hypot(a, b);
    // The norm does not depend on the angle's accuracy: cos and sin of any float (2 ulp each) and
    // the rotation's roundings keep it within 16 u.
    EXPECT_LE(std::fabs(std::hypot(ya, yb) - norm), 16.0 * norm * 0x1p-24) << "pair " << i;
    const float freq = std::exp2(-(float(2 * i) / 128.0f) * std::log2(500000.0f));
    const double ang = double(freq * float(pmax));
    EXPECT_LE(std::fabs(ya - (a * std::cos(ang) - b * std::sin(ang))), (std::fabs(a) + std::fabs(b)) * bound) << i;
    EXPECT_LE(std::fabs(yb - (a * std::sin(ang) + b * std::cos(ang))), (std::fabs(a) + std::fabs(b)) * bound) << i;
  }
  for (int i = 0; i < 128; ++i) EXPECT_EQ(bits(y[std::size_t(128 + i)]), bits(x[std::size_t(128 + i)])) << "position 0";
}

}  // namespace
}  // namespace lockstep::testing
