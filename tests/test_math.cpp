// Strict math (kernels/math.hpp): accuracy on a dense sample against float64 references, special
// values, and the same bits from the host scalar instantiation and the CPU device's SIMD one.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "harness/harness.hpp"
#include "lockstep/kernels/launch.hpp"
#include "lockstep/kernels/math.hpp"
#include "lockstep/kernels/math_eval.hpp"
#include "support/backends.hpp"

namespace lockstep::testing {
namespace {

using kernels::MathFn;

float host_eval(MathFn fn, float x) {
  switch (fn) {
    case MathFn::kExp: return math::exp(x);
    case MathFn::kExp2: return math::exp2(x);
    case MathFn::kLog: return math::log(x);
    case MathFn::kSin: return math::sin(x);
    case MathFn::kCos: return math::cos(x);
    case MathFn::kExp2Weight: return math::exp2_weight(x);
    case MathFn::kExp2Tc: return math::exp2_weight(x);  // the CPU device's exp2_tc
    case MathFn::kHalfPair:
    case MathFn::kStoreHalf: {  // the fp16 bits of x twice in one word (math_eval.hpp)
      const std::uint32_t h = math::half_bits_rn(x);
      return from_bits((h << 16) | h);
    }
    default: return math::round_to_half(x);
  }
}
double reference(MathFn fn, double x) { return harness::math_reference(int(fn), float(x)); }
double ulps(float got, double ref) { return harness::ulp_distance(got, ref); }

// Every 4099th float bit pattern (about a million), both signs.
double max_ulp_over_sweep(MathFn fn, float lo, float hi) {
  double worst = 0;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4099) {
    const float x = from_bits(static_cast<std::uint32_t>(b));
    if (!(x >= lo && x <= hi)) continue;
    worst = std::max(worst, ulps(host_eval(fn, x), reference(fn, x)));
  }
  return worst;
}

TEST(StrictMath, ExpIsWithinOneUlp) { EXPECT_LE(max_ulp_over_sweep(MathFn::kExp, -200, 200), 1.0); }
TEST(StrictMath, Exp2IsWithinOneUlp) { EXPECT_LE(max_ulp_over_sweep(MathFn::kExp2, -200, 200), 1.0); }
TEST(StrictMath, LogIsWithinOneUlp) { EXPECT_LE(max_ulp_over_sweep(MathFn::kLog, 0, INFINITY), 1.0); }
TEST(StrictMath, SinCosAreWithinTwoUlpsUpTo1e5) {
  EXPECT_LE(max_ulp_over_sweep(MathFn::kSin, -1e5f, 1e5f), 2.0);
  EXPECT_LE(max_ulp_over_sweep(MathFn::kCos, -1e5f, 1e5f), 2.0);
}

TEST(StrictMath, SpecialValues) {
  const float inf = INFINITY, nan = NAN;
  EXPECT_EQ(math::exp(-inf), 0.0f);
  EXPECT_EQ(math::exp(inf), inf);
  EXPECT_TRUE(std::isnan(math::exp(nan)));
  EXPECT_EQ(math::exp(0.0f), 1.0f);
  EXPECT_EQ(math::exp(89.0f), inf);
  EXPECT_EQ(math::exp(-104.0f), 0.0f);
  EXPECT_GT(math::exp(-100.0f), 0.0f) << "gradual underflow to a subnormal";
  EXPECT_LT(math::exp(-100.0f), 1.2e-38f);
  for (int k = -149; k <= 127; ++k) ASSERT_EQ(math::exp2(float(k)), std::ldexp(1.0f, k)) << k;
  EXPECT_EQ(math::exp2(128.0f), inf);
  EXPECT_EQ(math::log(0.0f), -inf);
  EXPECT_EQ(math::log(-0.0f), -inf);
  EXPECT_TRUE(std::isnan(math::log(-1.0f)));
  EXPECT_EQ(math::log(inf), inf);
  EXPECT_TRUE(std::isnan(math::log(nan)));
  EXPECT_EQ(math::log(1.0f), 0.0f);
  EXPECT_LE(ulps(math::log(1e-45f), std::log(double(1e-45f))), 1.0);
  EXPECT_TRUE(std::isnan(math::sin(inf)));
  EXPECT_TRUE(std::isnan(math::cos(-inf)));
  EXPECT_EQ(bits(math::sin(-0.0f)), bits(-0.0f));
  EXPECT_EQ(math::cos(0.0f), 1.0f);
  EXPECT_EQ(math::round_to_half(65519.0f), 65504.0f);
  EXPECT_EQ(math::round_to_half(65520.0f), inf);
  EXPECT_EQ(math::round_to_half(1.0f + 0x1p-11f), 1.0f) << "tie to even";
  EXPECT_EQ(math::round_to_half(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f) << "tie to even (up)";
  EXPECT_EQ(math::round_to_half(0x1p-25f), 0.0f) << "half the smallest fp16 subnormal ties to 0";
  EXPECT_EQ(math::round_to_half(0x1.8p-25f), 0x1p-24f);
}

// exp2_weight (the fused tensor-core softmax's weights): within 2.5 ulp of 2^x on its domain
// (measured 2.04 over every float in [-126, 2]), exactly 1 at 0 (the rescale of a row whose max
// stays), exact powers of two at integers, a subnormal between -126.5 and -126, and 0 below.
TEST(StrictMath, Exp2WeightIsWithinItsBoundAndFlushesBelowTheNormalRange) {
  std::uint64_t checked = 0;
  double worst = 0;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4099) {
    const float x = from_bits(static_cast<std::uint32_t>(b));
    if (!(x <= 127.0f)) continue;
    const float w = math::exp2_weight(x);
    if (x < -126.5f) {
      ASSERT_EQ(bits(w), 0u) << x;
    } else {
      worst = std::max(worst, ulps(w, std::exp2(double(x))));
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000u);
  EXPECT_LE(worst, 2.5);
  EXPECT_GT(worst, 0.5) << "a degree-5 polynomial is not correctly rounded: the sweep measures nothing";
  EXPECT_EQ(bits(math::exp2_weight(0.0f)), bits(1.0f));
  EXPECT_EQ(bits(math::exp2_weight(-0.0f)), bits(1.0f));
  for (int k = -126; k <= 127; ++k) ASSERT_EQ(math::exp2_weight(float(k)), std::ldexp(1.0f, k)) << k;
  const float sub = math::exp2_weight(-126.25f);
  EXPECT_GT(sub, 0.0f);
  EXPECT_LT(sub, 0x1p-126f) << "between -126.5 and -126: a subnormal";
  EXPECT_GT(math::exp2_weight(-126.5f), 0.0f) << "-126.5 rounds to -126 (ties to even)";
  EXPECT_EQ(math::exp2_weight(-126.50001f), 0.0f);
  EXPECT_EQ(math::exp2_weight(-1000.0f), 0.0f);
  EXPECT_EQ(math::exp2_weight(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(math::exp2_weight(NAN)));
}

// math::half_bits_rn (the CPU device's fp16 rounding, also what every test's expected fp16 bits
// come from) against an encoding written here of the float64 reference rounding (harness
// math_reference, kRoundHalf): every 61st float bit pattern, and the codes at the edges (ties to
// even, the largest finite half, overflow, the subnormal grid, signed zero). Independent of the
// GPU: DeviceMath.HalfRoundingIsTheCpusOverEveryFloat checks CUDA's against it where one is.
TEST(StrictMath, HalfBitsAreTheNearestHalfsEncoding) {
  const auto encode = [](double r) -> std::uint32_t {
    const std::uint32_t sign = std::signbit(r) ? 0x8000u : 0u;
    const double a = std::fabs(r);
    if (std::isinf(a)) return sign | 0x7c00u;
    if (a < 0x1p-14) return sign | static_cast<std::uint32_t>(a * 0x1p24);
    const int e = std::ilogb(a);
    return sign | static_cast<std::uint32_t>((e + 15) << 10) |
           static_cast<std::uint32_t>((a / std::ldexp(1.0, e) - 1.0) * 1024.0);
  };
  const auto expect = [&](float x) {
    return encode(harness::math_reference(int(MathFn::kRoundHalf), x));
  };
  std::uint64_t checked = 0;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 61) {
    const float x = from_bits(static_cast<std::uint32_t>(b));
    const std::uint32_t h = math::half_bits_rn(x);
    if (std::isnan(x)) {  // CUDA's fp16 NaN, whatever the sign and payload
      ASSERT_EQ(h, 0x7fffu) << std::hex << b;
      continue;
    }
    ASSERT_EQ(h, expect(x)) << "x = 0x" << std::hex << b;
    ++checked;
  }
  EXPECT_GT(checked, 70000000u);
  const std::pair<float, std::uint32_t> codes[] = {
      {1.0f, 0x3c00u}, {-2.0f, 0xc000u}, {65504.0f, 0x7bffu}, {65519.99f, 0x7bffu}, {65520.0f, 0x7c00u},
      {-1e9f, 0xfc00u}, {INFINITY, 0x7c00u}, {0x1p-14f, 0x0400u}, {0x1p-24f, 0x0001u}, {0x1p-25f, 0x0000u},
      {0x1.8p-25f, 0x0001u}, {0x1.8p-24f, 0x0002u}, {-0.0f, 0x8000u}, {1.0f + 0x1p-11f, 0x3c00u},
      {1.0f + 0x3p-11f, 0x3c02u}, {0.1f, 0x2e66u}};
  for (const auto& [x, code] : codes) EXPECT_EQ(math::half_bits_rn(x), code) << x;
}

// max_num ignores a NaN operand (either side) and otherwise returns the larger.
TEST(StrictMath, MaxNumSkipsNaN) {
  EXPECT_EQ(math::max_num(NAN, 1.0f), 1.0f);
  EXPECT_EQ(math::max_num(1.0f, NAN), 1.0f);
  EXPECT_TRUE(std::isnan(math::max_num(NAN, NAN)));
  EXPECT_EQ(math::max_num(-INFINITY, -3.0f), -3.0f);
  EXPECT_EQ(math::max_num(2.0f, -3.0f), 2.0f);
  EXPECT_EQ(math::max_keep_nan(-200.0f, -127.0f), -127.0f);
  EXPECT_EQ(math::max_keep_nan(-INFINITY, -127.0f), -127.0f);
  EXPECT_EQ(math::max_keep_nan(5.0f, -127.0f), 5.0f);
  EXPECT_TRUE(std::isnan(math::max_keep_nan(NAN, -127.0f)));
}

TEST(StrictMath, MaxAndMinAreCommutativeIncludingZerosAndNaN) {
  const float v[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 1e-45f};
  for (float a : v)
    for (float b : v) {
      ASSERT_EQ(bits(math::max(a, b)), bits(math::max(b, a))) << a << " " << b;
      ASSERT_EQ(bits(math::min(a, b)), bits(math::min(b, a))) << a << " " << b;
    }
  EXPECT_EQ(bits(math::max(0.0f, -0.0f)), bits(0.0f));
  EXPECT_EQ(bits(math::min(0.0f, -0.0f)), bits(-0.0f));
  EXPECT_EQ(bits(math::max(NAN, 1.0f)), 0x7fffffffu) << "NaN propagates as the canonical NaN";
}

// The device's SIMD instantiation returns the host scalar instantiation's bits: 2^20 consecutive
// bit patterns at several places, every function, every CPU SIMD variant available here.
class DeviceMath : public BackendTest {};

TEST_P(DeviceMath, MatchesHostScalarBits) {
  using K = kernels::MathEval;
  const std::int64_t n = 1 << 20;
  Buffer<float> out(dev, n);
  auto& s = dev->default_stream();
  for (int f = 0; f < static_cast<int>(MathFn::kCount); ++f)
    for (std::uint32_t start : {0x00000000u, 0x3f000000u, 0x42a00000u, 0x80700000u, 0xc2b00000u,
                                0x7f700000u}) {
      // Not strict on CUDA (the SFU's ex2.approx): held to its bound by DeviceMath.Exp2Tc... below.
      if (static_cast<MathFn>(f) == MathFn::kExp2Tc && dev->id().kind != DeviceKind::kCpu) continue;
      launch<K>(s, Dim3{std::uint32_t(n / K::kPerBlock), 1, 1}, 0,
                K::Params{nullptr, out.data().get(), n, start, static_cast<MathFn>(f)});
      const auto host = out.to_vector(s);
      for (std::int64_t i = 0; i < n; ++i) {
        const float x = from_bits(start + std::uint32_t(i));
        ASSERT_TRUE(same_bits(host[i], host_eval(static_cast<MathFn>(f), x)))
            << "fn " << f << " x=" << x << " (0x" << std::hex << bits(x) << ")";
      }
    }
}

// Note [hardware exp2 on the tensor-core path]: the tensor-core softmax's exp2 (the SFU's
// ex2.approx on CUDA, exp2_weight on the CPU) within its documented bound over the weights' domain,
// [-126, 8] (arguments are at most 8 by Note [lazy rescale]; below -126 both give 0 or a weight no
// fp32 sum beside a weight near 1 can see), every 257th float there; and its special values.
TEST_P(DeviceMath, Exp2TcIsWithinItsBoundOnTheWeightsDomain) {
  using K = kernels::MathEval;
  std::vector<float> in;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 257) {
    const float x = from_bits(static_cast<std::uint32_t>(b));
    if (x >= -126.0f && x <= 8.0f) in.push_back(x);
  }
  in.push_back(-126.0f);  // the domain's ends, which the stride misses
  in.push_back(8.0f);
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 8.0f, -INFINITY, NAN, -200.0f};
  in.insert(in.end(), std::begin(specials), std::end(specials));
  const auto n = static_cast<std::int64_t>(in.size());
  Buffer<float> bin(dev, in.size()), out(dev, in.size());
  auto& s = dev->default_stream();
  bin.copy_from_host(s, in);
  launch<K>(s, Dim3{std::uint32_t((n + K::kPerBlock - 1) / K::kPerBlock), 1, 1}, 0,
            K::Params{bin.data().get(), out.data().get(), n, 0, MathFn::kExp2Tc});
  const auto got = out.to_vector(s);
  const std::size_t ns = std::size(specials), body = in.size() - ns;
  double worst = 0;
  float worst_x = 0;
  for (std::size_t i = 0; i < body; ++i) {
    const double u = ulps(got[i], reference(MathFn::kExp2Tc, in[i]));
    if (!(u <= worst)) worst = u, worst_x = in[i];
  }
  std::printf("exp2_tc on %s: max %.3f ulp over %zu floats in [-126, 8] (at x = %.9g)\n",
              GetParam().c_str(), worst, body, double(worst_x));
  EXPECT_LE(worst, harness::math_ulp_bound(int(MathFn::kExp2Tc)));
  EXPECT_EQ(got[body + 0], 1.0f) << "2^0 is exactly 1 (Note [lazy rescale])";
  EXPECT_EQ(got[body + 1], 1.0f);
  EXPECT_EQ(got[body + 2], 2.0f);
  EXPECT_EQ(got[body + 3], 0.5f);
  EXPECT_EQ(got[body + 4], 256.0f);
  EXPECT_EQ(got[body + 5], 0.0f) << "a masked score's weight";
  EXPECT_TRUE(std::isnan(got[body + 6])) << "a NaN score reaches its row";
  EXPECT_EQ(got[body + 7], 0.0f);
}

// The tensor-core paths' fp16 rounding on CUDA (__floats2half2_rn for P, __float2half_rn for K
// and V) gives math::half_bits_rn's bits, the CPU device's rounding, for every one of the 2^32
// floats, NaNs included: CUDA gives 0x7fff for every NaN whatever its sign and payload, and so
// does half_bits_rn (lockstep::to_half). The CPU device's rounding is half_bits_rn itself: there
// MatchesHostScalarBits covers it.
TEST_P(DeviceMath, HalfRoundingIsTheCpusOverEveryFloat) {
  if (dev->id().kind == DeviceKind::kCpu)
    GTEST_SKIP() << "the CPU device rounds by math::half_bits_rn itself (MatchesHostScalarBits covers it)";
  using K = kernels::MathEval;
  const std::int64_t chunk = std::int64_t(1) << 26;
  Buffer<float> out(dev, chunk);
  std::vector<float> host(static_cast<std::size_t>(chunk));
  auto& s = dev->default_stream();
  const unsigned T = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (MathFn fn : {MathFn::kHalfPair, MathFn::kStoreHalf}) {
    std::uint64_t mismatches = 0;
    std::uint32_t first_bad = 0;
    for (std::uint64_t start = 0; start < (1ull << 32); start += std::uint64_t(chunk)) {
      launch<K>(s, Dim3{std::uint32_t(chunk / K::kPerBlock), 1, 1}, 0,
                K::Params{nullptr, out.data().get(), chunk, std::uint32_t(start), fn});
      out.copy_to_host(s, std::span<float>(host));
      s.synchronize();
      std::vector<std::uint64_t> bad(T, 0);
      std::vector<std::uint32_t> at(T, 0);
      std::vector<std::thread> workers;
      for (unsigned t = 0; t < T; ++t)
        workers.emplace_back([&, t] {
          for (std::int64_t i = t; i < chunk; i += T) {
            const std::uint32_t b = std::uint32_t(start + std::uint64_t(i)), got = bits(host[std::size_t(i)]);
            if (got != bits(host_eval(fn, from_bits(b))) && bad[t]++ == 0) at[t] = b;
          }
        });
      for (auto& w : workers) w.join();
      for (unsigned t = 0; t < T; ++t) {
        if (bad[t] != 0 && mismatches == 0) first_bad = at[t];
        mismatches += bad[t];
      }
    }
    EXPECT_EQ(mismatches, 0u) << "fn " << int(fn) << ": first at x = 0x" << std::hex << first_bad;
  }
}

LOCKSTEP_INSTANTIATE_BACKENDS(DeviceMath);

TEST(DeviceMath, EverySimdVariantMatchesHostScalarBits) {
  using K = kernels::MathEval;
  for (const char* simd : {"generic", "avx2", "avx3"}) {
    const auto dev = cpu_variant_or_null(simd);
    if (dev == nullptr) continue;
    const std::int64_t n = 1 << 18;
    Buffer<float> out(dev, n);
    auto& s = dev->default_stream();
    for (int f = 0; f < static_cast<int>(MathFn::kCount); ++f) {
      launch<K>(s, Dim3{std::uint32_t(n / K::kPerBlock), 1, 1}, 0,
                K::Params{nullptr, out.data().get(), n, 0x3e800000u, static_cast<MathFn>(f)});
      const auto host = out.to_vector(s);
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(same_bits(host[i], host_eval(static_cast<MathFn>(f),
                                                 from_bits(0x3e800000u + std::uint32_t(i)))))
            << simd << " fn " << f;
    }
  }
}

}  // namespace
}  // namespace lockstep::testing
