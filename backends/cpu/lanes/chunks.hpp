// SIMD chunk values (VF, VI, VM): kL lanes in one Highway register, and the primitives
// kernels/math.hpp is written with.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

namespace hn = hwy::HWY_NAMESPACE;
#define LS_INLINE inline __attribute__((always_inline))

using DF = hn::ScalableTag<float>;
using DI = hn::ScalableTag<std::int32_t>;
inline constexpr int kL = static_cast<int>(hn::MaxLanes(DF()));
inline const char* variant_target_name() { return hwy::TargetName(HWY_TARGET); }

// 0, 1, 2, ... as a vector, loaded from constant memory. (Highway's Iota builds the vector through
// a scalar store and a vector load: a store-forwarding stall on every call.)
alignas(64) inline constexpr std::int32_t kIotaArray[64] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
    44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
static_assert(kL <= 64);
#define LS_IOTA() hn::Load(DI(), kIotaArray)

// ================================================================================================
// Chunk values: kL lanes in one SIMD register. The math library (kernels/math.hpp) is
// instantiated with VF exactly as CUDA instantiates it with float.
// ================================================================================================
struct VM {
  hn::Mask<DI> m;
  LS_INLINE VM() = default;
  LS_INLINE VM(hn::Mask<DI> x) : m(x) {}
  LS_INLINE explicit VM(bool b) : m(hn::FirstN(DI(), b ? kL : 0)) {}
};
struct VI {
  hn::Vec<DI> v;
  LS_INLINE VI() = default;
  LS_INLINE VI(hn::Vec<DI> x) : v(x) {}
  LS_INLINE VI(std::int32_t s) : v(hn::Set(DI(), s)) {}
};
struct VF {
  hn::Vec<DF> v;
  LS_INLINE VF() = default;
  LS_INLINE VF(hn::Vec<DF> x) : v(x) {}
  LS_INLINE VF(float s) : v(hn::Set(DF(), s)) {}
};

LS_INLINE VM fmask(hn::Mask<DF> m) { return VM(hn::RebindMask(DI(), m)); }
LS_INLINE hn::Mask<DF> to_fmask(VM m) { return hn::RebindMask(DF(), m.m); }

// --- VF ---
LS_INLINE VF operator+(VF a, VF b) { return hn::Add(a.v, b.v); }
LS_INLINE VF operator-(VF a, VF b) { return hn::Sub(a.v, b.v); }
LS_INLINE VF operator*(VF a, VF b) { return hn::Mul(a.v, b.v); }
LS_INLINE VF operator/(VF a, VF b) { return hn::Div(a.v, b.v); }
LS_INLINE VF operator-(VF a) { return hn::Neg(a.v); }
LS_INLINE VM operator<(VF a, VF b) { return fmask(hn::Lt(a.v, b.v)); }
LS_INLINE VM operator>(VF a, VF b) { return fmask(hn::Gt(a.v, b.v)); }
LS_INLINE VM operator<=(VF a, VF b) { return fmask(hn::Le(a.v, b.v)); }
LS_INLINE VM operator>=(VF a, VF b) { return fmask(hn::Ge(a.v, b.v)); }
LS_INLINE VM operator==(VF a, VF b) { return fmask(hn::Eq(a.v, b.v)); }
// C++ != is unordered (NaN != NaN is true); Highway's Ne is the ordered compare, so negate Eq.
LS_INLINE VM operator!=(VF a, VF b) { return fmask(hn::Not(hn::Eq(a.v, b.v))); }
// --- VI ---
LS_INLINE VI operator+(VI a, VI b) { return hn::Add(a.v, b.v); }
LS_INLINE VI operator-(VI a, VI b) { return hn::Sub(a.v, b.v); }
LS_INLINE VI operator*(VI a, VI b) { return hn::Mul(a.v, b.v); }
LS_INLINE VI operator&(VI a, VI b) { return hn::And(a.v, b.v); }
LS_INLINE VI operator|(VI a, VI b) { return hn::Or(a.v, b.v); }
LS_INLINE VI operator^(VI a, VI b) { return hn::Xor(a.v, b.v); }
LS_INLINE VI operator~(VI a) { return hn::Not(a.v); }
LS_INLINE VI operator-(VI a) { return hn::Neg(a.v); }
LS_INLINE VI operator<<(VI a, int s) { return hn::ShiftLeftSame(a.v, s); }
LS_INLINE VI operator>>(VI a, int s) { return hn::ShiftRightSame(a.v, s); }  // arithmetic
LS_INLINE VM operator<(VI a, VI b) { return hn::Lt(a.v, b.v); }
LS_INLINE VM operator>(VI a, VI b) { return hn::Gt(a.v, b.v); }
LS_INLINE VM operator<=(VI a, VI b) { return hn::Not(hn::Gt(a.v, b.v)); }
LS_INLINE VM operator>=(VI a, VI b) { return hn::Not(hn::Lt(a.v, b.v)); }
LS_INLINE VM operator==(VI a, VI b) { return hn::Eq(a.v, b.v); }
LS_INLINE VM operator!=(VI a, VI b) { return hn::Not(hn::Eq(a.v, b.v)); }
// --- VM ---
LS_INLINE VM operator&(VM a, VM b) { return hn::And(a.m, b.m); }
LS_INLINE VM operator|(VM a, VM b) { return hn::Or(a.m, b.m); }
LS_INLINE VM operator^(VM a, VM b) { return hn::Xor(a.m, b.m); }
LS_INLINE VM operator!(VM a) { return hn::Not(a.m); }
LS_INLINE VM operator==(VM a, VM b) { return hn::Not(hn::Xor(a.m, b.m)); }
LS_INLINE VM operator!=(VM a, VM b) { return hn::Xor(a.m, b.m); }

// The primitives kernels/math.hpp is written with (same names as its scalar versions).
LS_INLINE VF fma(VF a, VF b, VF c) {
#if HWY_NATIVE_FMA
  return hn::MulAdd(a.v, b.v, c.v);
#else
  // A target without a fused multiply-add must not fall back to multiply + add (two
  // roundings): compute each lane with a correctly rounded std::fma instead.
  alignas(64) float x[kL], y[kL], z[kL];
  hn::Store(a.v, DF(), x);
  hn::Store(b.v, DF(), y);
  hn::Store(c.v, DF(), z);
  for (int i = 0; i < kL; ++i) x[i] = std::fma(x[i], y[i], z[i]);
  return hn::Load(DF(), x);
#endif
}
LS_INLINE VF select(VM m, VF a, VF b) { return hn::IfThenElse(to_fmask(m), a.v, b.v); }
LS_INLINE VI select(VM m, VI a, VI b) { return hn::IfThenElse(m.m, a.v, b.v); }
LS_INLINE VM select(VM m, VM a, VM b) { return hn::Or(hn::And(m.m, a.m), hn::AndNot(m.m, b.m)); }
LS_INLINE VI as_int(VF a) { return hn::BitCast(DI(), a.v); }
LS_INLINE VF as_float(VI a) { return hn::BitCast(DF(), a.v); }
LS_INLINE VF to_float(VI a) { return hn::ConvertTo(DF(), a.v); }
LS_INLINE VF rint(VF a) { return hn::Round(a.v); }
LS_INLINE VF floor(VF a) { return hn::Floor(a.v); }
LS_INLINE VF sqrt(VF a) { return hn::Sqrt(a.v); }
LS_INLINE VM isnan(VF a) { return fmask(hn::Not(hn::Eq(a.v, a.v))); }
LS_INLINE VF abs(VF a) { return hn::Abs(a.v); }

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
