#pragma once
// Strict math: the project's own exp, exp2, log, sin, cos (and max/min), written once as
// templates over a value type V and used by both backends, so both return the same bits.
//
// V is `float` on CUDA and on the host, and a SIMD chunk type on the CPU backend
// (backends/cpu/lanes.hpp). Only these primitives are used, each exactly specified by IEEE 754 or
// pure bit manipulation, hence identical on every backend:
//   + - * (never contracted; see Note [strict numerics flags]), fma, comparisons, select,
//   as_int/as_float (bit casts), integer + - & | << >>, rint and floor (exact rounding to an
//   integral value), conversion of small integers to float.
// No division, no hardware approximation (ex2.approx, __expf, rsqrt), no libm.
//
// Accuracy is measured against correctly rounded references in docs/numerics.md (`lockstep mathacc`, apps/mathacc.cpp).

#include <cstdint>
#include <cstring>

#include "lockstep/formats.hpp"
#include "lockstep/kernels/hd.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace lockstep::math {

// --- scalar primitives (the CPU backend defines the same names for its chunk types) -----------

LOCKSTEP_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
LOCKSTEP_HD std::int32_t as_int(float x) { return static_cast<std::int32_t>(formats::float_bits(x)); }
LOCKSTEP_HD float as_float(std::int32_t i) { return formats::bits_float(static_cast<std::uint32_t>(i)); }
LOCKSTEP_HD float select(bool m, float a, float b) { return m ? a : b; }
LOCKSTEP_HD std::int32_t select(bool m, std::int32_t a, std::int32_t b) { return m ? a : b; }
// Exact int32 -> float (round to nearest even for |i| > 2^24, as on both backends).
LOCKSTEP_HD float to_float(std::int32_t i) { return static_cast<float>(i); }
// Round to an integral value, ties to even. Exact.
LOCKSTEP_HD float rint(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
LOCKSTEP_HD float floor(float x) {
#if defined(__CUDA_ARCH__)
  return floorf(x);
#else
  return std::floor(x);
#endif
}
LOCKSTEP_HD bool isnan(float x) { return x != x; }
LOCKSTEP_HD float abs(float x) { return as_float(as_int(x) & 0x7fffffff); }

// The canonical NaN every lockstep max/min returns (CUDA's canonical quiet NaN).
inline constexpr std::int32_t kCanonicalNaN = 0x7fffffff;

// --- max / min ----------------------------------------------------------------------------------
// Note [max is commutative]
// Warp reductions are butterflies whose lanes combine operands in opposite orders, and the CPU
// backend evaluates the same butterfly as a tree; both are only equal bit for bit because the
// combining operation is commutative *including* signed zeros and NaN. So max(+0,-0) = +0 either
// way round, and any NaN operand gives the canonical NaN (NaN propagates, unlike fmaxf).

template <class V>
LOCKSTEP_HD V max(V a, V b) {
  V r = select(a > b, a, b);
  r = select(a == b, as_float(as_int(a) & as_int(b)), r);
  return select(isnan(a) | isnan(b), V(as_float(kCanonicalNaN)), r);
}
template <class V>
LOCKSTEP_HD V min(V a, V b) {
  V r = select(a < b, a, b);
  r = select(a == b, as_float(as_int(a) | as_int(b)), r);
  return select(isnan(a) | isnan(b), V(as_float(kCanonicalNaN)), r);
}

// max(y, lo) for a constant lo that is not NaN, with a NaN y kept NaN (its payload is not part of
// the contract). One instruction on the GPU (PTX max.NaN, sm_80 and later).
template <class V>
LOCKSTEP_HD V max_keep_nan(V y, V lo) {
  return select(y < lo, lo, y);
}
LOCKSTEP_HD float max_keep_nan(float y, float lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(y), "f"(lo));
  return r;
#else
  return max_keep_nan<float>(y, lo);
#endif
}

// The larger operand, a NaN operand ignored (IEEE 754 maxNum, C's fmaxf): one instruction on the
// GPU. Which of +0 and -0 it returns for the pair is not specified (CUDA's fmaxf and this source
// may differ), and it is not commutative on NaN the way max is: use it only where neither can
// change a result (the fused tensor-core softmax's per-lane running max).
template <class V>
LOCKSTEP_HD V max_num(V a, V b) {
  return select(isnan(a), b, select(b > a, b, a));
}
LOCKSTEP_HD float max_num(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return max_num<float>(a, b);
#endif
}

// --- exact scaling --------------------------------------------------------------------------------

// 2^k as a float for integer k in [-126, 127], built from bits.
template <class I>
LOCKSTEP_HD auto pow2i(I k) {
  return as_float((k + 127) << 23);
}

// x * 2^n for n in [-252, 254]: two exact power-of-two factors, so a subnormal result is rounded
// exactly once (in the last multiplication).
template <class V, class I>
LOCKSTEP_HD V ldexp_split(V x, I n) {
  I n1 = n >> 1;
  I n2 = n - n1;
  return (x * pow2i(n1)) * pow2i(n2);
}

// --- exp -----------------------------------------------------------------------------------------
namespace detail {
// 1.5 * 2^23: adding it rounds a float with |v| < 2^22 to an integer (ties to even).
inline constexpr float kRoundMagic = 12582912.0f;

// e^r for |r| <= ln2/2 + small: Taylor to degree 7 (truncation < 0.13 ulp).
template <class V>
LOCKSTEP_HD V exp_poly(V r) {
  V p = V(1.98412701e-4f);                 // 1/7!
  p = fma(p, r, V(1.38888892e-3f));        // 1/6!
  p = fma(p, r, V(8.33333377e-3f));        // 1/5!
  p = fma(p, r, V(4.16666679e-2f));        // 1/4!
  p = fma(p, r, V(1.66666672e-1f));        // 1/3!
  p = fma(p, r, V(0.5f));
  p = fma(p, r, V(1.0f));
  return fma(p, r, V(1.0f));
}

// 2^r for |r| <= 0.5: 2^r = e^(r ln2), Taylor coefficients ln2^i / i!.
template <class V>
LOCKSTEP_HD V exp2_poly(V r) {
  V p = V(1.52527336e-5f);
  p = fma(p, r, V(1.54035297e-4f));
  p = fma(p, r, V(1.33335579e-3f));
  p = fma(p, r, V(9.61812865e-3f));
  p = fma(p, r, V(5.55041097e-2f));
  p = fma(p, r, V(2.40226507e-1f));
  p = fma(p, r, V(6.93147182e-1f));
  p = fma(p, r, V(1.0f));
  return p;
}

// 2^r for |r| <= 0.5, degree 5 (exp2_weight): minimax for the relative error, p(0) = 1 exactly.
template <class V>
LOCKSTEP_HD V exp2_poly5(V r) {
  V p = V(1.326472731e-03f);
  p = fma(p, r, V(9.671512991e-03f));
  p = fma(p, r, V(5.550733581e-02f));
  p = fma(p, r, V(2.402224243e-01f));
  p = fma(p, r, V(6.931470037e-01f));
  return fma(p, r, V(1.0f));
}

// y = n + r with n = rint(y) (ties to even) and r = y - n exact, |r| <= 0.5, for |y| < 2^22:
// returns n, sets r (exp2 and exp2_weight).
template <class V>
LOCKSTEP_HD auto round_split(V y, V& r) {
  const V t = y + V(kRoundMagic);
  r = y - (t - V(kRoundMagic));
  return as_int(t) - as_int(kRoundMagic);
}
}  // namespace detail

// e^x. Max error 1 ulp over all floats (docs/numerics.md); exp(-inf) = 0, exp(+inf) = +inf,
// overflow to +inf above 88.72284, gradual underflow to subnormals and 0 below -87.3365.
template <class V>
LOCKSTEP_HD V exp(V x) {
  // Clamp keeps the exponent arithmetic in range; NaN passes through (comparisons are false).
  x = select(x > V(89.0f), V(89.0f), x);
  x = select(x < V(-104.0f), V(-104.0f), x);
  const V t = fma(x, V(1.44269502f), V(detail::kRoundMagic));  // rint(x / ln2), biased
  const V k = t - V(detail::kRoundMagic);
  auto n = as_int(t) - as_int(detail::kRoundMagic);
  V r = fma(k, V(-0.693145752f), x);  // ln2 high part (exact product)
  r = fma(k, V(-1.42860677e-6f), r);  // ln2 low part
  return ldexp_split(detail::exp_poly(r), n);
}

// 2^x. Max error 1 ulp; exact for integral x in the normal and subnormal range.
template <class V>
LOCKSTEP_HD V exp2(V x) {
  x = select(x > V(129.0f), V(129.0f), x);
  x = select(x < V(-152.0f), V(-152.0f), x);
  V r;
  const auto n = detail::round_split(x, r);
  return ldexp_split(detail::exp2_poly(r), n);
}

// 2^y for softmax weights, y <= 127 (also -inf and NaN), built for the fused tensor-core softmax,
// whose weights are rounded to fp16 for P.V: a degree-5 polynomial (minimax for the relative
// error on [-1/2, 1/2], p(0) = 1 exactly) and one exact scaling. Max error 2.04 ulp (every float
// in [-126, 2], docs/numerics.md); exp2_weight(0) = 1 exactly (a row's rescale by
// exp2_weight((m - m) c) is then exactly 1). Below -126.5 the result is 0 (y is first raised to
// -127, whose scale factor 2^-127 is built as 0), between -126.5 and -126 a subnormal; -inf gives
// 0 and NaN stays NaN. Eleven operations on the GPU (exp2: 16).
template <class V>
LOCKSTEP_HD V exp2_weight(V y) {
  V r;
  const auto n = detail::round_split(max_keep_nan(y, V(-127.0f)), r);
  return detail::exp2_poly5(r) * pow2i(n);  // pow2i(-127) is +0
}

// Natural logarithm. Max error 1 ulp; log(0) = -inf, log(x < 0) = NaN, log(+inf) = +inf,
// subnormal inputs are exact-scaled first.
template <class V>
LOCKSTEP_HD V log(V x) {
  const auto sub = x < V(1.17549435e-38f);                 // subnormal, zero or negative
  const V xs = select(sub, x * V(8388608.0f), x);          // * 2^23, exact
  auto bits = as_int(xs);
  auto e = ((bits >> 23) & 0xff) - 127;
  e = select(sub, e - 23, e);
  V m = as_float((bits & 0x007fffff) | 0x3f800000);        // [1, 2)
  const auto big = m > V(1.41421354f);
  m = select(big, m * V(0.5f), m);                         // [sqrt(1/2), sqrt(2)]
  e = select(big, e + 1, e);
  const V f = m - V(1.0f);                                 // exact (Sterbenz)
  // log1p(f) = f - f^2/2 + f^3 P(f), P fitted (Lawson) on [-0.2929, 0.4143].
  V p = V(0.0674660131f);
  p = fma(p, f, V(-0.116756409f));
  p = fma(p, f, V(0.118881747f));
  p = fma(p, f, V(-0.124055915f));
  p = fma(p, f, V(0.142195508f));
  p = fma(p, f, V(-0.16667996f));
  p = fma(p, f, V(0.200021192f));
  p = fma(p, f, V(-0.250000089f));
  p = fma(p, f, V(0.333333135f));
  const V f2 = f * f;
  const V ef = to_float(e);
  V r = fma(f2 * f, p, f2 * V(-0.5f));
  r = fma(ef, V(1.42860677e-6f), r);
  r = r + f;
  r = fma(ef, V(0.693145752f), r);
  // Special values.
  r = select(x == V(0.0f), V(as_float(static_cast<std::int32_t>(0xff800000u))), r);  // -inf
  r = select(x < V(0.0f), V(as_float(kCanonicalNaN)), r);
  r = select(x == V(as_float(0x7f800000)), x, r);  // +inf
  return select(isnan(x), x, r);
}

// log2(x) = log(x) * (1/ln 2) rounded: within 2 ulp.
template <class V>
LOCKSTEP_HD V log2(V x) {
  return log(x) * V(1.44269502f);
}

namespace detail {
template <class V>
LOCKSTEP_HD V sin_poly(V r) {  // |r| <= pi/4, Taylor to r^9
  const V r2 = r * r;
  V p = V(2.75573188e-6f);
  p = fma(p, r2, V(-1.98412701e-4f));
  p = fma(p, r2, V(8.33333377e-3f));
  p = fma(p, r2, V(-1.66666672e-1f));
  return fma(r2 * r, p, r);
}
template <class V>
LOCKSTEP_HD V cos_poly(V r) {  // |r| <= pi/4, Taylor to r^10
  const V r2 = r * r;
  V p = V(-2.755732e-7f);
  p = fma(p, r2, V(2.48015876e-5f));
  p = fma(p, r2, V(-1.38888892e-3f));
  p = fma(p, r2, V(4.16666679e-2f));
  p = fma(p, r2, V(-0.5f));
  return fma(p, r2, V(1.0f));
}
// Reduces x to r in [-pi/4, pi/4] and the quadrant q in {0,1,2,3} (as a float), with a
// three-part Cody-Waite reduction using fma. Accurate while |x| < 2^17 or so; documented beyond.
template <class V>
LOCKSTEP_HD void reduce_half_pi(V x, V& r, V& q) {
  const V k = rint(x * V(0.636619747f));
  r = fma(k, V(-1.57079637f), x);
  r = fma(k, V(4.37113883e-8f), r);
  r = fma(k, V(1.71512451e-15f), r);
  q = k - V(4.0f) * floor(k * V(0.25f));  // k mod 4, exact
}
}  // namespace detail

template <class V>
LOCKSTEP_HD V sin(V x) {
  V r, q;
  detail::reduce_half_pi(x, r, q);
  const V s = detail::sin_poly(r), c = detail::cos_poly(r);
  const auto odd = (q == V(1.0f)) | (q == V(3.0f));
  V v = select(odd, c, s);
  v = select(q >= V(2.0f), -v, v);
  return select(x == V(0.0f), x, v);  // sin(-0) = -0 (the reduction loses the zero's sign)
}

template <class V>
LOCKSTEP_HD V cos(V x) {
  V r, q;
  detail::reduce_half_pi(x, r, q);
  const V s = detail::sin_poly(r), c = detail::cos_poly(r);
  const auto odd = (q == V(1.0f)) | (q == V(3.0f));
  V v = select(odd, s, c);
  const auto neg = (q == V(1.0f)) | (q == V(2.0f));
  return select(neg, -v, v);
}

// --- fp16 rounding --------------------------------------------------------------------------------
// x rounded to the nearest IEEE binary16 value (ties to even), returned as a float: the input
// rounding of the tensor-core paths (CUDA __float2half_rn). Overflow gives +-inf; values below
// 2^-14 round on the fp16 subnormal grid (2^-24). Written from exact operations so both backends
// share it; DeviceMath.HalfRoundingIsTheCpusOverEveryFloat checks half_bits_rn against CUDA's
// __float2half_rn and __floats2half2_rn over all floats on the GPU (every NaN gives 0x7fff).
template <class V>
LOCKSTEP_HD V round_to_half(V x) {
  const V a = select(abs(x) < V(65536.0f), abs(x), V(65536.0f));  // NaN -> 65536, no overflow
  const V r_sub = rint(a * V(16777216.0f)) * V(5.96046448e-8f);  // grid 2^-24, exact scaling
  const auto b = as_int(a);
  const V r_norm = as_float((b + 0x0fff + ((b >> 13) & 1)) & ~0x1fff);  // 10 mantissa bits, RNE
  V r = select(a < V(6.10351562e-5f), r_sub, r_norm);
  r = select(a >= V(65520.0f), V(as_float(0x7f800000)), r);
  r = as_float(as_int(r) | (as_int(x) & static_cast<std::int32_t>(0x80000000u)));
  return select(isnan(x), x, r);
}

LOCKSTEP_HD float sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// IEEE binary16 bits of x rounded to nearest even (CUDA __float2half_rn, bit for bit: 0x7fff for
// every NaN), and back (exact): the storage format's conversions (lockstep/formats.hpp).
LOCKSTEP_HD std::uint16_t half_bits_rn(float x) { return ::lockstep::to_half(x).bits; }
LOCKSTEP_HD float half_bits_to_float(std::uint16_t h) { return ::lockstep::to_float(::lockstep::half{h}); }

}  // namespace lockstep::math
