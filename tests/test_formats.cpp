// The storage formats' conversions (lockstep/formats.hpp) against a reference written another
// way: each code's value from its fields with ldexp in double, and float -> format as the nearest
// value of the code table (ties to the even code, saturation or infinity past the largest).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "lockstep/formats.hpp"
#include "lockstep/attention/ops.hpp"
#include "support/backends.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lockstep::testing {
namespace {

struct Format {
  const char* name;
  int bits, exp_bits, man_bits, bias;
  bool has_inf;      // IEEE-style: the top exponent is inf / NaN (half, bf16, e5m2); e4m3: only S.1111.111 is NaN
  bool saturates;    // float -> format clamps to the largest finite value (fp8, satfinite)
};
constexpr Format kHalf{"half", 16, 5, 10, 15, true, false};
constexpr Format kBf16{"bfloat16", 16, 8, 7, 127, true, false};
constexpr Format kE4m3{"fp8_e4m3", 8, 4, 3, 7, false, true};
constexpr Format kE5m2{"fp8_e5m2", 8, 5, 2, 15, true, true};

// A code's value from its fields (NaN: quiet NaN).
double reference_value(const Format& f, std::uint32_t code) {
  const std::uint32_t man_mask = (1u << f.man_bits) - 1, exp_mask = (1u << f.exp_bits) - 1;
  const bool neg = (code >> (f.bits - 1)) & 1u;
  const std::uint32_t e = (code >> f.man_bits) & exp_mask, m = code & man_mask;
  double v;
  if (f.has_inf && e == exp_mask) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && e == exp_mask && m == man_mask) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(double(m + (1u << f.man_bits)), int(e) - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

template <class T>
std::uint32_t code_of(T v) {
  return v.bits;
}
template <class T>
T make(std::uint32_t c) {
  T v;
  v.bits = static_cast<decltype(v.bits)>(c);
  return v;
}

// float -> code by the table: the nearest finite non-negative value, ties to the even code; past
// the largest finite value, by the format's rule (half, bf16: infinity from halfway to the next
// power of the spacing; fp8: the largest finite value).
struct Table {
  Format f;
  std::vector<std::pair<double, std::uint32_t>> finite;  // ascending
  double next_up;  // the value one spacing past the largest finite (where rounding turns to inf)
  explicit Table(const Format& fmt) : f(fmt) {
    for (std::uint32_t c = 0; c < (1u << (f.bits - 1)); ++c) {
      const double v = reference_value(f, c);
      if (std::isfinite(v)) finite.emplace_back(v, c);
    }
    std::sort(finite.begin(), finite.end());
    const double top = finite.back().first, below = finite[finite.size() - 2].first;
    next_up = top + (top - below);
  }
  std::uint32_t round(float x) const {
    const std::uint32_t sign = std::signbit(x) ? 1u << (f.bits - 1) : 0u;
    const double a = std::fabs(double(x));
    const double top = finite.back().first;
    if (a > top) {
      if (f.saturates) return sign | finite.back().second;
      // IEEE: infinity from the midpoint to next_up on (ties go to the even, infinite, code).
      if (a >= (top + next_up) / 2) return sign | (((1u << f.exp_bits) - 1) << f.man_bits);
      return sign | finite.back().second;
    }
    auto it = std::lower_bound(finite.begin(), finite.end(), std::make_pair(a, 0u));
    if (it->first == a) return sign | it->second;
    const auto lo = it - 1;
    const double dl = a - lo->first, dh = it->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | it->second;
    return sign | ((lo->second & 1u) == 0 ? lo->second : it->second);
  }
};

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

template <class T, class ToT>
void check_format(const Format& f, ToT to_format) {
  SCOPED_TRACE(f.name);
  const Table table(f);
  // Every code -> float: the field value exactly; NaN stays NaN; and back to the same code.
  for (std::uint32_t c = 0; c < (1u << f.bits); ++c) {
    const double ref = reference_value(f, c);
    const float got = to_float(make<T>(c));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << "code " << c;
      ASSERT_TRUE(std::isnan(to_float(to_format(got)))) << "NaN code " << c << " back";
      continue;
    }
    ASSERT_EQ(double(got), ref) << "code " << c;
    ASSERT_EQ(std::signbit(got), std::signbit(ref)) << "code " << c;
    if (std::isinf(ref) && f.saturates)  // satfinite: an infinity comes back as the largest finite
      ASSERT_EQ(code_of(to_format(got)), table.round(got)) << "round trip of infinite code " << c;
    else
      ASSERT_EQ(code_of(to_format(got)), c) << "round trip of code " << c;
  }
  // Midpoints between neighbours, and a float either side of each: ties to even, else nearest.
  for (std::size_t i = 0; i + 1 < table.finite.size(); ++i) {
    const double mid = (table.finite[i].first + table.finite[i + 1].first) / 2;
    const float m = float(mid);
    ASSERT_EQ(double(m), mid) << "midpoints are floats";
    for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY), -m}) {
      ASSERT_EQ(code_of(to_format(x)), table.round(x)) << "x = " << x;
    }
  }
  // Past the largest finite value, infinities, zeros, NaNs.
  const double top = table.finite.back().first;
  for (double x : {top, top * 1.03, top * 1.0625, top * 1.07, top * 2, 1e30, 3.4e38}) {
    ASSERT_EQ(code_of(to_format(float(x))), table.round(float(x))) << "x = " << x;
    ASSERT_EQ(code_of(to_format(float(-x))), table.round(float(-x))) << "x = " << -x;
  }
  const std::uint32_t inf_code = f.saturates ? table.finite.back().second : ((1u << f.exp_bits) - 1) << f.man_bits;
  EXPECT_EQ(code_of(to_format(INFINITY)), inf_code);
  EXPECT_EQ(code_of(to_format(-INFINITY)), inf_code | (1u << (f.bits - 1)));
  EXPECT_EQ(code_of(to_format(0.0f)), 0u);
  EXPECT_EQ(code_of(to_format(-0.0f)), 1u << (f.bits - 1));
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fa5a5a5u})
    EXPECT_TRUE(std::isnan(to_float(to_format(float_of(nan))))) << std::hex << nan;
  // Random floats of every magnitude: the table's code.
  std::mt19937 rng(7 + f.bits);
  for (int i = 0; i < 200000; ++i) {
    const float x = float_of(rng());
    if (std::isnan(x)) continue;
    ASSERT_EQ(code_of(to_format(x)), table.round(x)) << "x = " << x << " (bits " << std::hex << bits_of(x) << ")";
  }
  // Floats near the format's own range, densely (subnormals, the normal range, the top).
  const double lo = table.finite[1].first / 4;
  for (int i = 0; i < 200000; ++i) {
    const float x = float(lo * std::exp2(std::uniform_real_distribution<double>(0, std::log2(top * 4 / lo))(rng)));
    ASSERT_EQ(code_of(to_format(x)), table.round(x)) << "x = " << x;
  }
}

TEST(Formats, HalfMatchesTheTable) { check_format<half>(kHalf, [](float x) { return to_half(x); }); }
TEST(Formats, Bfloat16MatchesTheTable) { check_format<bfloat16>(kBf16, [](float x) { return to_bfloat16(x); }); }
TEST(Formats, Fp8E4m3MatchesTheTable) { check_format<fp8_e4m3>(kE4m3, [](float x) { return to_fp8_e4m3(x); }); }
TEST(Formats, Fp8E5m2MatchesTheTable) { check_format<fp8_e5m2>(kE5m2, [](float x) { return to_fp8_e5m2(x); }); }

// The documented NaN codes, CUDA's (tools/gpu/formats.cu): every NaN float gives 0x7fff (half,
// bfloat16) or 0x7f (fp8), whatever its sign and payload; every NaN code of half and fp8 gives
// the float 0x7fffffff; bfloat16's codes keep their bits as the float's upper half.
TEST(Formats, NaNCodes) {
  for (std::uint32_t nan : {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xffffffffu}) {
    EXPECT_EQ(to_half(float_of(nan)).bits, 0x7fff);
    EXPECT_EQ(to_bfloat16(float_of(nan)).bits, 0x7fff);
    EXPECT_EQ(to_fp8_e4m3(float_of(nan)).bits, 0x7f);
    EXPECT_EQ(to_fp8_e5m2(float_of(nan)).bits, 0x7f);
  }
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const bool nan16 = (c & 0x7c00) == 0x7c00 && (c & 0x3ff) != 0;
    if (nan16) EXPECT_EQ(bits_of(to_float(half{std::uint16_t(c)})), 0x7fffffffu) << c;
    if ((c & 0x7f80) == 0x7f80 && (c & 0x7f) != 0)
      EXPECT_EQ(bits_of(to_float(bfloat16{std::uint16_t(c)})), c << 16) << c;
  }
  for (std::uint32_t c : {0x7fu, 0xffu}) EXPECT_EQ(bits_of(to_float(fp8_e4m3{std::uint8_t(c)})), 0x7fffffffu);
  for (std::uint32_t c : {0x7du, 0x7eu, 0x7fu, 0xfdu, 0xfeu, 0xffu})
    EXPECT_EQ(bits_of(to_float(fp8_e5m2{std::uint8_t(c)})), 0x7fffffffu);
}

#if defined(__x86_64__)
// The processor's own float -> half (F16C, round to nearest even) on every 7th float that is not
// a NaN (F16C keeps a NaN's payload; lockstep gives CUDA's canonical NaN).
__attribute__((target("f16c"))) std::uint16_t f16c_half(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
TEST(Formats, HalfMatchesF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this processor has no F16C";
  std::uint64_t checked = 0;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 7) {
    const float x = float_of(std::uint32_t(u));
    if (std::isnan(x)) continue;
    const std::uint16_t want = f16c_half(x), got = to_half(x).bits;
    if (want != got) FAIL() << "x bits " << std::hex << u << ": F16C " << want << ", lockstep " << got;
    ++checked;
  }
  EXPECT_GT(checked, 600000000u);
}
#endif

// A Buffer of each format holds its codes: copied to a device, between buffers, and back, every
// code keeps its bits (NaNs included), on every backend.
class FormatBuffers : public BackendTest {};

template <class T>
void round_trip_codes(const std::shared_ptr<Device>& dev) {
  constexpr std::uint32_t kCodes = 1u << (8 * sizeof(T));
  std::vector<T> host(kCodes);
  for (std::uint32_t c = 0; c < kCodes; ++c) host[c] = make<T>(c);
  auto& st = dev->default_stream();
  Buffer<T> a(dev, host.size()), b(dev, host.size());
  a.copy_from_host(st, std::span<const T>(host));
  b.copy_from(st, a);
  const auto back = b.to_vector(st);
  ASSERT_EQ(back.size(), host.size());
  for (std::uint32_t c = 0; c < kCodes; ++c) ASSERT_EQ(back[c].bits, host[c].bits) << "code " << c;
  EXPECT_EQ(a.size_bytes(), host.size() * sizeof(T));
}

TEST_P(FormatBuffers, HoldEveryCode) {
  round_trip_codes<half>(dev);
  round_trip_codes<bfloat16>(dev);
  round_trip_codes<fp8_e4m3>(dev);
  round_trip_codes<fp8_e5m2>(dev);
  static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2 && sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
}

// ops::convert gives the formats' conversions on every backend: every code of each format to
// float, and floats of every kind (every 4099th bit pattern, NaNs, infinities, the formats'
// midpoints) to each format.
template <class S>
void convert_matches(const std::shared_ptr<Device>& dev) {
  SCOPED_TRACE(format_name<S>());
  auto& st = dev->default_stream();
  constexpr std::uint32_t kCodes = 1u << (8 * sizeof(S));
  std::vector<S> codes(kCodes);
  for (std::uint32_t c = 0; c < kCodes; ++c) codes[c] = make<S>(c);
  Buffer<S> in(dev, codes.size());
  in.copy_from_host(st, std::span<const S>(codes));
  Buffer<float> wide(dev, codes.size());
  ops::convert(st, in, wide);
  const auto got = wide.to_vector(st);
  for (std::uint32_t c = 0; c < kCodes; ++c)
    ASSERT_EQ(bits_of(got[c]), bits_of(to_float(codes[c]))) << "code " << c;
  std::vector<float> xs;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) xs.push_back(float_of(std::uint32_t(u)));
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65520.0f, 448.0f, 464.0f, 57344.0f, 61440.0f})
    xs.push_back(x);
  for (std::uint32_t c = 0; c + 1 < kCodes; ++c) xs.push_back(0.5f * (got[c] + got[c + 1]));
  Buffer<float> f(dev, xs.size());
  f.copy_from_host(st, std::span<const float>(xs));
  Buffer<S> narrow(dev, xs.size());
  ops::convert(st, f, narrow);
  const auto back = narrow.to_vector(st);
  for (std::size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(back[i].bits, from_float<S>(xs[i]).bits) << "x bits " << std::hex << bits_of(xs[i]);
}

TEST_P(FormatBuffers, ConvertGivesTheFormatsConversions) {
  std::vector<std::shared_ptr<Device>> devices{dev};
  if (dev->id().kind == DeviceKind::kCpu)  // every SIMD variant of the CPU device
    for (const char* simd : {"avx2", "generic"}) {
      CpuDeviceOptions o;
      o.index = 40;
      o.simd = simd;
      try {
        devices.push_back(make_cpu_device(o));
      } catch (const Error&) {  // a variant this processor cannot run
      }
    }
  for (const auto& d : devices) {
    SCOPED_TRACE(d->name());
    convert_matches<half>(d);
    convert_matches<bfloat16>(d);
    convert_matches<fp8_e4m3>(d);
    convert_matches<fp8_e5m2>(d);
  }
}

TEST_P(FormatBuffers, ConvertRefusesBadBuffersAndWritesNothing) {
  auto& st = dev->default_stream();
  Buffer<float> in(dev, 100), out(dev, 100);
  in.fill(st, 1.5f);
  std::vector<half> sentinel(99, half{0x1234});
  Buffer<half> short_out(dev, 99);
  short_out.copy_from_host(st, std::span<const half>(sentinel));
  try {
    ops::convert(st, in, short_out);
    ADD_FAILURE() << "a size mismatch was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "out.size()");
  }
  for (const auto& h : short_out.to_vector(st)) ASSERT_EQ(h.bits, 0x1234);
  // out over in's own memory (a wrapped view).
  auto view = Buffer<half>::wrap(dev, reinterpret_cast<half*>(in.data().get()), 100);
  try {
    ops::convert(st, in, view);
    ADD_FAILURE() << "an overlapping out was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "out");
  }
  for (float x : in.to_vector(st)) ASSERT_EQ(x, 1.5f);
  Buffer<half> none(dev, 0);
  Buffer<float> none_f(dev, 0);
  ops::convert(st, none_f, none);  // nothing to do
  const std::uint64_t before = st.launches();
  ops::convert(st, none_f, none);
  EXPECT_EQ(st.launches(), before) << "an empty conversion launches nothing";
}

LOCKSTEP_INSTANTIATE_BACKENDS(FormatBuffers);

}  // namespace
}  // namespace lockstep::testing
