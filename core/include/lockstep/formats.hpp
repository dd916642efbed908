#pragma once
// Storage formats beside float (docs/numerics.md, "Formats"): half (IEEE binary16), bfloat16,
// and the two 8-bit formats of FP8 (OCP, as CUDA's __nv_fp8_e4m3 and __nv_fp8_e5m2). Each is a
// trivially copyable struct holding its bits; arithmetic is done in float. The conversions are
// written once, from bit operations, for the host, the CPU device's kernels and CUDA kernels
// alike:
//
//   float -> half, bfloat16: round to nearest even; overflow gives an infinity; NaN gives the
//                            canonical NaN 0x7fff (CUDA's __float2half_rn, __float2bfloat16_rn).
//   float -> fp8_e4m3, fp8_e5m2: round to nearest even, saturating to the largest finite value
//                            (+-448, +-57344; infinities too), as CUDA's __NV_SATFINITE; NaN
//                            gives 0x7f whatever its sign (CUDA's __nv_cvt_float_to_fp8).
//   each format -> float:    exact (every code is a float); a NaN code gives the canonical
//                            0x7fffffff (CUDA's conversions), except bfloat16's, whose bits are
//                            the float's upper half (__bfloat162float keeps them).
//
// tools/gpu/formats.cu compares every conversion with CUDA's own over all 2^32 floats and every
// code, bit for bit (tools/gpu/verify.sh formats).

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define LOCKSTEP_FORMAT_HD __host__ __device__ __forceinline__
#else
#define LOCKSTEP_FORMAT_HD inline __attribute__((always_inline))
#endif

namespace lockstep {

struct half {
  std::uint16_t bits;
};
struct bfloat16 {
  std::uint16_t bits;
};
struct fp8_e4m3 {
  std::uint8_t bits;
};
struct fp8_e5m2 {
  std::uint8_t bits;
};

namespace formats {

LOCKSTEP_FORMAT_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
LOCKSTEP_FORMAT_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// |x| (bits a, below the format's normal range) as a multiple of the format's subnormal unit,
// rounded to nearest even: the significand m = 1.xxx * 2^23 shifted right by `shift` (1..24).
LOCKSTEP_FORMAT_HD std::uint32_t round_shift(std::uint32_t a, int shift) {
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t r = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  return r + ((rem > halfway || (rem == halfway && (r & 1u))) ? 1u : 0u);
}

// A normal float's bits a, rebiased (a - rebias) and cut to `drop` fewer mantissa bits, rounded
// to nearest even (a carry into the exponent is the next binade, as it should be).
LOCKSTEP_FORMAT_HD std::uint32_t round_normal(std::uint32_t a, std::uint32_t rebias, int drop) {
  const std::uint32_t r = a - rebias;
  return (r + ((1u << (drop - 1)) - 1u) + ((r >> drop) & 1u)) >> drop;
}

// The narrow formats' shared rounding: a finite |x| (bits a, not past the format's range) to the
// code of a format with Man mantissa bits and exponent bias Bias, nearest even; the callers
// handle the sign, NaN and overflow. Below 2^(1 - Bias) the grid is the subnormal unit
// 2^(1 - Bias - Man); half a unit and less rounds to zero.
template <int Man, int Bias>
LOCKSTEP_FORMAT_HD std::uint32_t round_magnitude(std::uint32_t a) {
  if (a >= (std::uint32_t(128 - Bias) << 23)) return round_normal(a, std::uint32_t(127 - Bias) << 23, 23 - Man);
  if (a < (std::uint32_t(127 - Bias - Man) << 23)) return 0;
  return round_shift(a, 151 - Bias - Man - int(a >> 23));
}

// The float bits of a finite code's magnitude (exponent field e, mantissa m) of the same format.
template <int Man, int Bias>
LOCKSTEP_FORMAT_HD std::uint32_t widen_magnitude(std::uint32_t e, std::uint32_t m) {
  if (e != 0) return ((e + std::uint32_t(127 - Bias)) << 23) | (m << (23 - Man));
  if (m == 0) return 0;
  int shift = 0;  // a subnormal m * 2^(1 - Bias - Man): normalize
  while ((m & (1u << Man)) == 0) {
    m <<= 1;
    ++shift;
  }
  return (std::uint32_t(128 - Bias - shift) << 23) | ((m & ((1u << Man) - 1u)) << (23 - Man));
}

}  // namespace formats

// --- half: bias 15, 10 mantissa bits, largest finite 65504 ---------------------------------
LOCKSTEP_FORMAT_HD half to_half(float f) {
  const std::uint32_t u = formats::float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return half{0x7fff};
  if (a >= 0x477ff000u) return half{static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520: inf
  return half{static_cast<std::uint16_t>(sign | formats::round_magnitude<10, 15>(a))};
}
LOCKSTEP_FORMAT_HD float to_float(half h) {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  const std::uint32_t e = (h.bits >> 10) & 0x1fu, m = h.bits & 0x3ffu;
  if (e == 0x1f) return formats::bits_float(m != 0 ? 0x7fffffffu : sign | 0x7f800000u);
  return formats::bits_float(sign | formats::widen_magnitude<10, 15>(e, m));
}

// --- bfloat16 ------------------------------------------------------------------------------
LOCKSTEP_FORMAT_HD bfloat16 to_bfloat16(float f) {
  const std::uint32_t u = formats::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{0x7fff};
  return bfloat16{static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
LOCKSTEP_FORMAT_HD float to_float(bfloat16 b) { return formats::bits_float(std::uint32_t(b.bits) << 16); }

// --- fp8 e4m3: bias 7, 3 mantissa bits, no infinity, NaN 0x7f / 0xff, largest 448 ------------
LOCKSTEP_FORMAT_HD fp8_e4m3 to_fp8_e4m3(float f) {
  const std::uint32_t u = formats::float_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp8_e4m3{0x7f};
  if (a > 0x43e00000u) return fp8_e4m3{static_cast<std::uint8_t>(sign | 0x7eu)};  // past 448: 448
  return fp8_e4m3{static_cast<std::uint8_t>(sign | formats::round_magnitude<3, 7>(a))};
}
LOCKSTEP_FORMAT_HD float to_float(fp8_e4m3 v) {
  const std::uint32_t sign = std::uint32_t(v.bits & 0x80u) << 24;
  const std::uint32_t e = (v.bits >> 3) & 0xfu, m = v.bits & 0x7u;
  if (e == 0xf && m == 0x7) return formats::bits_float(0x7fffffffu);
  return formats::bits_float(sign | formats::widen_magnitude<3, 7>(e, m));
}

// --- fp8 e5m2: bias 15, 2 mantissa bits (the top byte of a half), largest finite 57344 ----------
LOCKSTEP_FORMAT_HD fp8_e5m2 to_fp8_e5m2(float f) {
  const std::uint32_t u = formats::float_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp8_e5m2{0x7f};
  if (a > 0x47600000u) return fp8_e5m2{static_cast<std::uint8_t>(sign | 0x7bu)};  // past 57344
  return fp8_e5m2{static_cast<std::uint8_t>(sign | formats::round_magnitude<2, 15>(a))};
}
LOCKSTEP_FORMAT_HD float to_float(fp8_e5m2 v) { return to_float(half{static_cast<std::uint16_t>(v.bits << 8)}); }

// --- generic forms, for code written once over the formats ----------------------------------
template <class S>
inline constexpr bool is_format_v = std::is_same_v<S, half> || std::is_same_v<S, bfloat16> ||
                                    std::is_same_v<S, fp8_e4m3> || std::is_same_v<S, fp8_e5m2>;
// f rounded to format S (one of the four above).
template <class S>
LOCKSTEP_FORMAT_HD S from_float(float f) {
  static_assert(is_format_v<S>, "from_float: half, bfloat16, fp8_e4m3 or fp8_e5m2");
  if constexpr (std::is_same_v<S, half>) return to_half(f);
  else if constexpr (std::is_same_v<S, bfloat16>) return to_bfloat16(f);
  else if constexpr (std::is_same_v<S, fp8_e4m3>) return to_fp8_e4m3(f);
  else return to_fp8_e5m2(f);
}
// A format as a value, for what is chosen at run time (a KV cache's storage, a call's tensors).
// The codes are the kernels' (DecodeParams::act_format and the like).
enum class Format : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2, fp8_e4m3 = 3, fp8_e5m2 = 4 };
template <class S>
constexpr Format format_of() {
  if constexpr (std::is_same_v<S, half>) return Format::f16;
  else if constexpr (std::is_same_v<S, bfloat16>) return Format::bf16;
  else if constexpr (std::is_same_v<S, fp8_e4m3>) return Format::fp8_e4m3;
  else if constexpr (std::is_same_v<S, fp8_e5m2>) return Format::fp8_e5m2;
  else {
    static_assert(std::is_same_v<S, float>, "format_of: float or a storage format");
    return Format::f32;
  }
}
// Bytes per element.
constexpr unsigned format_bytes(Format f) {
  return f == Format::f32 ? 4u : (f == Format::f16 || f == Format::bf16) ? 2u : 1u;
}
// The name in messages: "float", "half", "bfloat16", "fp8_e4m3", "fp8_e5m2".
constexpr const char* format_name(Format f) {
  switch (f) {
    case Format::f16: return "half";
    case Format::bf16: return "bfloat16";
    case Format::fp8_e4m3: return "fp8_e4m3";
    case Format::fp8_e5m2: return "fp8_e5m2";
    default: return "float";
  }
}
constexpr bool is_fp8(Format f) { return f == Format::fp8_e4m3 || f == Format::fp8_e5m2; }

// The format's name in messages ("half", "bfloat16", "fp8_e4m3", "fp8_e5m2"; "float").
template <class S>
constexpr const char* format_name() {
  if constexpr (std::is_same_v<S, half>) return "half";
  else if constexpr (std::is_same_v<S, bfloat16>) return "bfloat16";
  else if constexpr (std::is_same_v<S, fp8_e4m3>) return "fp8_e4m3";
  else if constexpr (std::is_same_v<S, fp8_e5m2>) return "fp8_e5m2";
  else return "float";
}

}  // namespace lockstep
