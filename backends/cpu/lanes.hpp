// The CPU execution model: lanes, lane expressions and CpuExec<N>, the context a kernel template
// is instantiated with on the simulated device (../shared/design.md §3, beside the repository;
// docs/kernels.md).
//
// Deliberately no #pragma once: this header is compiled once per SIMD variant (cpu_variant.cpp is
// built with -mavx512*, -mavx2 -mfma, or baseline flags) inside the namespace LOCKSTEP_CPU_NS, so
// every variant gets its own types and no inline function is shared between variants.
//
// A block of N threads runs in lockstep, statement by statement. A per-thread value is a
// LaneArray<T, N>: N values in memory. Arithmetic on lanes builds a small expression tree that is
// evaluated, when assigned, one SIMD chunk (kL lanes) at a time, so a statement such as
//   s = s + x.exp(v - m);
// runs as one loop with everything in registers. Every operation maps to an IEEE-exact
// Highway operation, and fma is a real fused multiply-add (never multiply + add, see fma below).

#ifndef LOCKSTEP_CPU_NS
#error "define LOCKSTEP_CPU_NS (the SIMD variant namespace) before including lanes.hpp"
#endif

#include <hwy/highway.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <string>
#include <thread>
#include <utility>

#include "lockstep/error.hpp"
#include "lockstep/kernels/math.hpp"

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


// ================================================================================================
// Lane expressions
// ================================================================================================
template <class C>
struct value_of;
template <>
struct value_of<VF> {
  using type = float;
};
template <>
struct value_of<VI> {
  using type = std::int32_t;
};
template <>
struct value_of<VM> {
  using type = bool;
};
template <class T>
struct chunk_of;
template <>
struct chunk_of<float> {
  using type = VF;
};
template <>
struct chunk_of<std::int32_t> {
  using type = VI;
};
template <>
struct chunk_of<bool> {
  using type = VM;
};
template <class T>
using chunk_t = typename chunk_of<T>::type;

template <class E>
concept LaneExpr = requires { std::remove_cvref_t<E>::kLaneExpr; };
template <class T>
concept Arith = std::is_arithmetic_v<std::remove_cvref_t<T>>;
template <class E>
concept LaneOrArith = LaneExpr<E> || Arith<E>;

template <class T, int N>
class LaneArray;
template <class E>
struct is_lane_array : std::false_type {};
template <class T, int N>
struct is_lane_array<LaneArray<T, N>> : std::true_type {};

// How an expression holds an operand: a named LaneArray by reference (it outlives the statement),
// anything else (temporaries, nodes, scalars) by value.
template <class E>
using hold_t = std::conditional_t<std::is_lvalue_reference_v<E> &&
                                      is_lane_array<std::remove_cvref_t<E>>::value,
                                  const std::remove_cvref_t<E>&, std::remove_cvref_t<E>>;

template <class T>
struct Scalar {
  static constexpr bool kLaneExpr = true;
  using value_type = T;
  T s;
  LS_INLINE chunk_t<T> eval(int) const {
    if constexpr (std::is_same_v<T, bool>)
      return VM(s);
    else
      return chunk_t<T>(s);
  }
};

// A scalar next to lanes of value type T. An integral scalar may meet float lanes (converted as
// CUDA converts it); a floating scalar next to integer lanes is refused, because CUDA would then
// compute in float.
template <class T, class S>
LS_INLINE Scalar<T> scalar_as(S s) {
  if constexpr (std::is_same_v<T, std::int32_t>) {
    static_assert(std::is_integral_v<S> && sizeof(S) <= 4,
                  "int lanes mix only with 32-bit integral scalars (cast 64-bit values explicitly)");
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(!std::is_same_v<S, double>, "double scalar next to float lanes: write 1.0f");
    static_assert(!std::is_integral_v<S> || sizeof(S) <= 4, "64-bit integer next to float lanes");
  }
  return Scalar<T>{static_cast<T>(s)};
}

template <class F, class... A>
struct Node {
  static constexpr bool kLaneExpr = true;
  std::tuple<A...> args;
  template <std::size_t... I>
  LS_INLINE auto eval_impl(int c, std::index_sequence<I...>) const {
    return F::apply(std::get<I>(args).eval(c)...);
  }
  LS_INLINE auto eval(int c) const { return eval_impl(c, std::index_sequence_for<A...>{}); }
  using chunk_type = decltype(F::apply(std::declval<const std::remove_cvref_t<A>&>().eval(0)...));
  using value_type = typename value_of<chunk_type>::type;
};

template <class E>
using value_t = typename std::remove_cvref_t<E>::value_type;

// Wraps an operand: expressions are held, scalars become Scalar<T>.
template <class T, class E>
LS_INLINE decltype(auto) wrap(E&& e) {
  if constexpr (LaneExpr<E>)
    return static_cast<hold_t<E&&>>(std::forward<E>(e));
  else
    return scalar_as<T>(e);
}
template <class F, class... E>
LS_INLINE auto make_node(E&&... e) {
  return Node<F, hold_t<E&&>...>{{std::forward<E>(e)...}};
}

// The value type of the lane operands among A, B (they must agree).
template <class A, class B>
struct lane_type {
  using type = std::conditional_t<LaneExpr<A>, value_t<std::conditional_t<LaneExpr<A>, A, B>>,
                                  value_t<std::conditional_t<LaneExpr<B>, B, A>>>;
};

#define LS_FUNCTOR(Name, expr)                     \
  struct Name {                                    \
    template <class... C>                          \
    static LS_INLINE auto apply(const C&... c) {   \
      return expr;                                 \
    }                                              \
  };

#define LS_BINOP(op, Name)                                                                    \
  struct Name {                                                                               \
    template <class X, class Y>                                                               \
    static LS_INLINE auto apply(const X& x, const Y& y) {                                     \
      return x op y;                                                                          \
    }                                                                                         \
  };                                                                                          \
  template <class A, class B>                                                                 \
    requires(LaneExpr<A> || LaneExpr<B>) && LaneOrArith<A> && LaneOrArith<B>                  \
  LS_INLINE auto operator op(A&& a, B&& b) {                                                  \
    using T = typename lane_type<A, B>::type;                                                 \
    if constexpr (LaneExpr<A> && LaneExpr<B>)                                                 \
      static_assert(std::is_same_v<value_t<A>, value_t<B>>,                                   \
                    "lanes of different types: convert explicitly (to_float, as_int)");       \
    return make_node<Name>(wrap<T>(std::forward<A>(a)), wrap<T>(std::forward<B>(b)));         \
  }

LS_BINOP(+, OpAdd)
LS_BINOP(-, OpSub)
LS_BINOP(*, OpMul)
LS_BINOP(/, OpDiv)
LS_BINOP(&, OpAnd)
LS_BINOP(|, OpOr)
LS_BINOP(^, OpXor)
LS_BINOP(<, OpLt)
LS_BINOP(>, OpGt)
LS_BINOP(<=, OpLe)
LS_BINOP(>=, OpGe)
LS_BINOP(==, OpEq)
LS_BINOP(!=, OpNe)
#undef LS_BINOP

struct OpNeg {
  template <class X>
  static LS_INLINE auto apply(const X& x) {
    return -x;
  }
};
struct OpNot {
  static LS_INLINE VM apply(const VM& x) { return !x; }
  static LS_INLINE VI apply(const VI& x) { return ~x; }
};
template <LaneExpr A>
LS_INLINE auto operator-(A&& a) {
  return make_node<OpNeg>(std::forward<A>(a));
}
template <LaneExpr A>
LS_INLINE auto operator!(A&& a) {
  return make_node<OpNot>(std::forward<A>(a));
}
template <LaneExpr A>
LS_INLINE auto operator~(A&& a) {
  return make_node<OpNot>(std::forward<A>(a));
}

template <int S>
struct OpShl {
  static LS_INLINE VI apply(const VI& x) { return hn::ShiftLeft<S>(x.v); }
};
template <int S>
struct OpShr {
  static LS_INLINE VI apply(const VI& x) { return hn::ShiftRight<S>(x.v); }
};
struct OpShlVar {
  static LS_INLINE VI apply(const VI& x, const VI& s) { return x << hn::GetLane(s.v); }
};
struct OpShrVar {
  static LS_INLINE VI apply(const VI& x, const VI& s) { return x >> hn::GetLane(s.v); }
};
// Shifts by a block-uniform count.
template <LaneExpr A>
LS_INLINE auto operator<<(A&& a, int s) {
  return make_node<OpShlVar>(std::forward<A>(a), Scalar<std::int32_t>{s});
}
template <LaneExpr A>
LS_INLINE auto operator>>(A&& a, int s) {
  return make_node<OpShrVar>(std::forward<A>(a), Scalar<std::int32_t>{s});
}

// Integer division and remainder by a uniform or lane divisor: per lane (rare in kernels;
// prefer shifts and masks by powers of two).
struct OpIDiv {
  static LS_INLINE VI apply(const VI& a, const VI& b) {
    alignas(64) std::int32_t x[kL], y[kL];
    hn::Store(a.v, DI(), x);
    hn::Store(b.v, DI(), y);
    for (int i = 0; i < kL; ++i) x[i] = x[i] / y[i];
    return hn::Load(DI(), x);
  }
};
struct OpIRem {
  static LS_INLINE VI apply(const VI& a, const VI& b) {
    alignas(64) std::int32_t x[kL], y[kL];
    hn::Store(a.v, DI(), x);
    hn::Store(b.v, DI(), y);
    for (int i = 0; i < kL; ++i) x[i] = x[i] % y[i];
    return hn::Load(DI(), x);
  }
};
template <class A, class B>
  requires(LaneExpr<A> || LaneExpr<B>) && LaneOrArith<A> && LaneOrArith<B>
LS_INLINE auto operator%(A&& a, B&& b) {
  return make_node<OpIRem>(wrap<std::int32_t>(std::forward<A>(a)),
                           wrap<std::int32_t>(std::forward<B>(b)));
}

LS_FUNCTOR(OpFma, fma(c...))
LS_FUNCTOR(OpSelect, select(c...))
LS_FUNCTOR(OpExp, math::exp(c...))
LS_FUNCTOR(OpExp2, math::exp2(c...))
LS_FUNCTOR(OpExp2Weight, math::exp2_weight(c...))
LS_FUNCTOR(OpLog, math::log(c...))
LS_FUNCTOR(OpSin, math::sin(c...))
LS_FUNCTOR(OpCos, math::cos(c...))
LS_FUNCTOR(OpMax, math::max(c...))
LS_FUNCTOR(OpMaxNum, math::max_num(c...))
LS_FUNCTOR(OpMin, math::min(c...))
LS_FUNCTOR(OpSqrt, sqrt(c...))
LS_FUNCTOR(OpAbs, abs(c...))
LS_FUNCTOR(OpToFloat, to_float(c...))
LS_FUNCTOR(OpAsInt, as_int(c...))
LS_FUNCTOR(OpAsFloat, as_float(c...))
LS_FUNCTOR(OpRint, rint(c...))
LS_FUNCTOR(OpFloor, floor(c...))
LS_FUNCTOR(OpIsNan, isnan(c...))
LS_FUNCTOR(OpRoundHalf, math::round_to_half(c...))
#undef LS_FUNCTOR

struct ThreadIdx {
  static constexpr bool kLaneExpr = true;
  using value_type = std::int32_t;
  std::int32_t base = 0;  // the first thread of the pass (Note [warp passes])
  LS_INLINE VI eval(int c) const { return hn::Add(LS_IOTA(), hn::Set(DI(), c * kL + base)); }
};

// ================================================================================================
// LaneArray: one value per thread of the block, materialized.
// ================================================================================================
template <class T, int N>
class LaneArray {
  static_assert(N % kL == 0 || kL % N == 0, "block size must be a multiple of the SIMD width");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, std::int32_t> ||
                std::is_same_v<T, bool>, "lanes hold float, int32_t or bool");
  using storage_t = std::conditional_t<std::is_same_v<T, bool>, std::int32_t, T>;
  using tag_t = std::conditional_t<std::is_same_v<T, float>, DF, DI>;

 public:
  static constexpr bool kLaneExpr = true;
  static constexpr int kChunks = N / kL;
  using value_type = T;

  LS_INLINE LaneArray() = default;
  LS_INLINE LaneArray(T s) { *this = s; }
  template <LaneExpr E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, LaneArray>)
  LS_INLINE LaneArray(const E& e) {
    assign(e);
  }
  LaneArray(const LaneArray&) = default;
  LaneArray& operator=(const LaneArray&) = default;
  template <LaneExpr E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, LaneArray>)
  LS_INLINE LaneArray& operator=(const E& e) {
    assign(e);
    return *this;
  }
  LS_INLINE LaneArray& operator=(T s) {
    assign(Scalar<T>{s});
    return *this;
  }
  template <class E>
  LS_INLINE LaneArray& operator+=(E&& e) {
    return *this = *this + std::forward<E>(e);
  }
  template <class E>
  LS_INLINE LaneArray& operator-=(E&& e) {
    return *this = *this - std::forward<E>(e);
  }
  template <class E>
  LS_INLINE LaneArray& operator*=(E&& e) {
    return *this = *this * std::forward<E>(e);
  }

  LS_INLINE chunk_t<T> eval(int c) const {
    if constexpr (std::is_same_v<T, bool>)
      return VM(hn::Ne(hn::Load(DI(), v_ + c * kL), hn::Zero(DI())));
    else
      return chunk_t<T>(hn::Load(tag_t(), v_ + c * kL));
  }
  LS_INLINE void store_chunk(int c, const chunk_t<T>& x) {
    if constexpr (std::is_same_v<T, bool>)
      hn::Store(hn::VecFromMask(DI(), x.m), DI(), v_ + c * kL);
    else
      hn::Store(x.v, tag_t(), v_ + c * kL);
  }

  template <class E>
  LS_INLINE void assign(const E& e) {
    static_assert(std::is_same_v<typename std::remove_cvref_t<E>::value_type, T>,
                  "assigning lanes of another type: convert explicitly (to_float, as_int)");
#pragma GCC unroll 4
    for (int c = 0; c < kChunks; ++c) store_chunk(c, e.eval(c));
  }

  storage_t* data() { return v_; }
  const storage_t* data() const { return v_; }
  T operator[](int i) const { return static_cast<T>(v_[i]); }
  void set(int i, T v) { v_[i] = static_cast<storage_t>(v); }

 private:
  alignas(64) storage_t v_[N];
};

// ================================================================================================
// Memory: per-chunk access with fast paths for the patterns SPMD kernels produce.
// ================================================================================================
template <class T>
using mem_tag_t = std::conditional_t<std::is_same_v<T, float>, DF, DI>;

// Loads kL lanes from base[o[i]] where m[i]; other lanes get `fallback`. Contiguous offsets
// become one vector load, equal offsets a broadcast; masked-off lanes are never read.
template <class T>
LS_INLINE chunk_t<T> load_chunk(const T* base, const VI& o, const VM& m, T fallback) {
  const mem_tag_t<T> d;
  const std::int32_t o0 = hn::GetLane(o.v);
  if (hn::AllTrue(DI(), m.m)) {
    if (hn::AllTrue(DI(), hn::Eq(o.v, hn::Add(LS_IOTA(), hn::Set(DI(), o0))))) return chunk_t<T>(hn::LoadU(d, base + o0));
    if (hn::AllTrue(DI(), hn::Eq(o.v, hn::Set(DI(), o0)))) return chunk_t<T>(hn::Set(d, base[o0]));
    return chunk_t<T>(hn::GatherIndex(d, base, o.v));
  }
  if (hn::AllFalse(DI(), m.m)) return chunk_t<T>(fallback);
  alignas(64) std::int32_t off[kL], act[kL];
  alignas(64) T out[kL];
  hn::Store(o.v, DI(), off);
  hn::Store(hn::VecFromMask(DI(), m.m), DI(), act);
  for (int i = 0; i < kL; ++i) out[i] = act[i] ? base[off[i]] : fallback;
  return chunk_t<T>(hn::Load(d, out));
}

// Stores kL lanes to base[o[i]] where m[i], in lane order (a later lane wins on equal offsets,
// which a race-free kernel never has).
template <class T>
LS_INLINE void store_chunk(T* base, const VI& o, const chunk_t<T>& v, const VM& m) {
  const mem_tag_t<T> d;
  const std::int32_t o0 = hn::GetLane(o.v);
  const bool contiguous = hn::AllTrue(DI(), hn::Eq(o.v, hn::Add(LS_IOTA(), hn::Set(DI(), o0))));
  if (contiguous && hn::AllTrue(DI(), m.m)) {
    hn::StoreU(v.v, d, base + o0);
    return;
  }
  if (hn::AllFalse(DI(), m.m)) return;
  if (hn::CountTrue(DI(), m.m) == 1) {  // e.g. one lane per row group writes a row's result
    const std::size_t i = static_cast<std::size_t>(hn::FindFirstTrue(DI(), m.m));
    base[hn::ExtractLane(o.v, i)] = hn::ExtractLane(v.v, i);
    return;
  }
  alignas(64) std::int32_t off[kL], act[kL];
  alignas(64) T val[kL];
  hn::Store(o.v, DI(), off);
  hn::Store(hn::VecFromMask(DI(), m.m), DI(), act);
  hn::Store(v.v, d, val);
  for (int i = 0; i < kL; ++i)
    if (act[i]) base[off[i]] = val[i];
}

// True when every lane is active and lane i's quad starts at o0 + 4 i (one dense run).
LS_INLINE bool quads_contiguous(const VI& o, const VM& m, std::int32_t o0) {
  return hn::AllTrue(DI(), m.m) &&
         hn::AllTrue(DI(), hn::Eq(o.v, hn::Add(hn::Set(DI(), o0), hn::ShiftLeft<2>(LS_IOTA()))));
}

template <class T, class O, class M>
struct LoadNode {
  static constexpr bool kLaneExpr = true;
  using value_type = T;
  const T* base;
  O off;
  M mask;
  T fallback;
  LS_INLINE chunk_t<T> eval(int c) const {
    return load_chunk<T>(base, off.eval(c), mask.eval(c), fallback);
  }
};

// A per-thread group of four consecutive values (CUDA float4/int4).
template <class L>
struct Quad {
  L x, y, z, w;
};

// ================================================================================================
// CpuExec<N>: the execution context of one block of N threads.
// ================================================================================================
struct BlockCoords {
  std::uint32_t bx = 0, by = 0, bz = 0;
  std::uint32_t gx = 1, gy = 1, gz = 1;
};

// Note [warp passes]
// CpuExec<N> runs a block's N threads statement by statement, each lane value an array of N in
// memory. A kernel whose warps never meet (no sync, no shared memory, no block-wide operation,
// no global memory that one warp writes and another reads: kernels::warp_independent_v) may
// instead run as N / 32 passes of one warp each, CpuExec<N, 32>: lane values of 32 elements,
// which the compiler can keep in registers across statements. Every lane computes the same
// operations in the same order, so the bits do not change (tested against block-wide passes,
// LOCKSTEP_CPU_BLOCK_PASSES=1); only the order in which a block's warps run does, which such a
// kernel cannot observe.
template <int N, int PW = N>
class CpuExec {
  static_assert(N % 32 == 0 && N >= 32 && N <= 1024, "threads per block: a multiple of 32");
  static_assert(PW == N || PW == 32, "a pass is the whole block or one warp");

 public:
  static constexpr int kThreads = N;
  static constexpr int kPassLanes = PW;     // threads per pass (Note [warp passes])
  static constexpr int kWarps = PW / 32;    // warps per pass
  static constexpr bool kIsCpu = true;
  template <class T>
  using Lanes = LaneArray<T, PW>;

  CpuExec(char* shared, std::size_t shared_bytes) : smem_(shared), smem_cap_(shared_bytes) {
    const char* lanes = std::getenv("LOCKSTEP_CPU_DECODE_LANES");  // Note [row-major decode]
    row_major_decode_ = lanes == nullptr || std::atoi(lanes) == 0;
    const char* exact_lanes = std::getenv("LOCKSTEP_CPU_EXACT_LANES");  // Note [row-major exact]
    row_major_exact_ = exact_lanes == nullptr || std::atoi(exact_lanes) == 0;
    const char* softmax_lanes = std::getenv("LOCKSTEP_CPU_SOFTMAX_LANES");  // Note [row-major softmax]
    row_major_softmax_ = softmax_lanes == nullptr || std::atoi(softmax_lanes) == 0;
  }
  void begin_block(const BlockCoords& b) {
    blk_ = b;
    smem_off_ = 0;
    base_ = 0;
  }
  // Warp passes (Note [warp passes]): the pass runs threads 32 w .. 32 w + 31.
  void begin_warp(int w) {
    static_assert(PW == 32, "warp passes only");
    base_ = 32 * w;
  }
  // Called by every block-wide operation (sync, shared memory, votes, signals, tickets): it does
  // not compile in a warp pass (instantiated only where a kernel uses one of them).
  void block_wide() const {
    static_assert(PW == N, "block-wide operation in a warp pass: the kernel is not warp-independent");
  }
  // Diagnostics (Note [decode timeline] in kernels/decode.hpp): a steady clock, and one
  // "multiprocessor".
  std::uint64_t timestamp_ns() const {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }
  int sm_id() const { return 0; }

  // --- indices (block-uniform ones are plain ints) ---
  int block_x() const { return static_cast<int>(blk_.bx); }
  int block_y() const { return static_cast<int>(blk_.by); }
  int block_z() const { return static_cast<int>(blk_.bz); }
  int grid_x() const { return static_cast<int>(blk_.gx); }
  int grid_y() const { return static_cast<int>(blk_.gy); }
  int grid_z() const { return static_cast<int>(blk_.gz); }
  ThreadIdx thread() const { return {base_}; }
  auto lane() const { return ThreadIdx{base_} & 31; }
  auto warp() const { return ThreadIdx{base_} >> 5; }

  // --- shared memory: carved in call order from the launch's dynamic shared bytes ---
  template <class T>
  T* shared(std::size_t count) {
    block_wide();
    smem_off_ = (smem_off_ + 31) & ~std::size_t{31};
    T* p = reinterpret_cast<T*>(smem_ + smem_off_);
    smem_off_ += count * sizeof(T);
    if (smem_off_ > smem_cap_) shared_overflow(smem_off_, smem_cap_);
    return p;
  }
  void sync() const { block_wide(); }  // lockstep: every thread already reached this statement

  // --- global and shared memory ---
  // One value every thread reads (a block-uniform scalar, e.g. a sequence length).
  template <class T>
  T load_uniform(const T* p) const {
    return *p;
  }
  template <class T, LaneExpr O>
  LS_INLINE auto load(const T* base, O&& off) const {
    return LoadNode<T, hold_t<O&&>, Scalar<bool>>{base, std::forward<O>(off), {true}, T{}};
  }
  template <class T, LaneExpr O, class M>
  LS_INLINE auto load(const T* base, O&& off, M&& mask, T fallback) const {
    return LoadNode<T, hold_t<O&&>, decltype(wrap<bool>(std::forward<M>(mask)))>{
        base, std::forward<O>(off), wrap<bool>(std::forward<M>(mask)), fallback};
  }
  template <class T, LaneExpr O, class V>
  LS_INLINE void store(T* base, O&& off, V&& val) const {
    store(base, std::forward<O>(off), std::forward<V>(val), true);
  }
  template <class T, LaneExpr O, class V, class M>
  LS_INLINE void store(T* base, O&& off, V&& val, M&& mask) const {
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& v = wrap<T>(std::forward<V>(val));
    const auto& m = wrap<bool>(std::forward<M>(mask));
#pragma GCC unroll 4
    for (int c = 0; c < PW / kL; ++c) store_chunk<T>(base, o.eval(c), v.eval(c), m.eval(c));
  }
  // Four consecutive values per thread from base[off .. off+3] (off a multiple of 4: CUDA's
  // 16-byte vector load). Contiguous quads become de-interleaving vector loads.
  template <class T, LaneExpr O, class M>
  Quad<Lanes<T>> load4(const T* base, O&& off, M&& mask) const {
    Quad<Lanes<T>> q;
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    const mem_tag_t<T> d;
    for (int c = 0; c < PW / kL; ++c) {
      const VI oc = o.eval(c);
      const VM mc = m.eval(c);
      const std::int32_t o0 = hn::GetLane(oc.v);
      // Contiguous quads are de-interleaved straight from memory; gathered ones (e.g. the rows of
      // a swizzled tile) first by one 16-byte copy per lane into a staging array, which is
      // cheaper than four gathers.
      alignas(64) T staged[4 * kL];
      const T* quads = nullptr;
      if (quads_contiguous(oc, mc, o0)) {
        quads = base + o0;
      } else if (hn::AllTrue(DI(), mc.m) && !hn::AllTrue(DI(), hn::Eq(oc.v, hn::Set(DI(), o0)))) {
        alignas(64) std::int32_t offs[kL];
        hn::Store(oc.v, DI(), offs);
        for (int i = 0; i < kL; ++i) std::memcpy(staged + 4 * i, base + offs[i], 4 * sizeof(T));
        quads = staged;
      }
      if (quads != nullptr) {
        hn::Vec<mem_tag_t<T>> a, b, e, f;
        hn::LoadInterleaved4(d, quads, a, b, e, f);
        hn::Store(a, d, q.x.data() + c * kL);
        hn::Store(b, d, q.y.data() + c * kL);
        hn::Store(e, d, q.z.data() + c * kL);
        hn::Store(f, d, q.w.data() + c * kL);
      } else {
        // Each of the four values as a lane load of its own: broadcast or masked (load_chunk's
        // paths; masked-off lanes get zeros and are never read).
        hn::Store(load_chunk<T>(base, oc, mc, T{}).v, d, q.x.data() + c * kL);
        hn::Store(load_chunk<T>(base + 1, oc, mc, T{}).v, d, q.y.data() + c * kL);
        hn::Store(load_chunk<T>(base + 2, oc, mc, T{}).v, d, q.z.data() + c * kL);
        hn::Store(load_chunk<T>(base + 3, oc, mc, T{}).v, d, q.w.data() + c * kL);
      }
    }
    return q;
  }
  template <class T, LaneExpr O>
  Quad<Lanes<T>> load4(const T* base, O&& off) const {
    return load4(base, std::forward<O>(off), true);
  }
  template <class T, LaneExpr O, class M>
  void store4(T* base, O&& off, const Quad<Lanes<T>>& q, M&& mask) const {
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    const mem_tag_t<T> d;
    for (int c = 0; c < PW / kL; ++c) {
      const VI oc = o.eval(c);
      const VM mc = m.eval(c);
      const std::int32_t o0 = hn::GetLane(oc.v);
      if (quads_contiguous(oc, mc, o0)) {
        hn::StoreInterleaved4(hn::Load(d, q.x.data() + c * kL), hn::Load(d, q.y.data() + c * kL),
                              hn::Load(d, q.z.data() + c * kL), hn::Load(d, q.w.data() + c * kL),
                              d, base + o0);
      } else {
        // Interleaved into a staging array, then one 16-byte copy per active lane (in lane
        // order: a later lane wins on equal offsets, which a race-free kernel never has).
        alignas(64) std::int32_t off[kL], act[kL];
        alignas(64) T staged[4 * kL];
        hn::Store(oc.v, DI(), off);
        hn::Store(hn::VecFromMask(DI(), mc.m), DI(), act);
        hn::StoreInterleaved4(hn::Load(d, q.x.data() + c * kL), hn::Load(d, q.y.data() + c * kL),
                              hn::Load(d, q.z.data() + c * kL), hn::Load(d, q.w.data() + c * kL),
                              d, staged);
        for (int i = 0; i < kL; ++i)
          if (act[i]) std::memcpy(base + off[i], staged + 4 * i, 4 * sizeof(T));
      }
    }
  }
  template <class T, LaneExpr O>
  void store4(T* base, O&& off, const Quad<Lanes<T>>& q) const {
    store4(base, std::forward<O>(off), q, true);
  }

  // --- asynchronous copies and overlapped launches: done at once / nothing to wait for --------
  // The CPU runs a block's statements in order and a stream's kernels one after another, so an
  // asynchronous copy is an ordinary copy (zeros where the mask is false) and the waits are
  // empty (backends/cuda/cuda_exec.cuh has the GPU's meaning). A chunk of lanes whose quads form
  // one dense run at both ends, every lane active (a tile row of the decode ring), is copied as
  // a block, without de-interleaving it into lanes and back.
  template <class T, LaneExpr DO, LaneExpr SO, class M>
  void copy4_async(T* dst, DO&& doff, const T* src, SO&& soff, M&& mask) const {
    const auto& od = wrap<std::int32_t>(std::forward<DO>(doff));
    const auto& os = wrap<std::int32_t>(std::forward<SO>(soff));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    const mem_tag_t<T> d;
    for (int c = 0; c < PW / kL; ++c) {
      const VI dc = od.eval(c), sc = os.eval(c);
      const VM mc = m.eval(c);
      const std::int32_t d0 = hn::GetLane(dc.v), s0 = hn::GetLane(sc.v);
      if (quads_contiguous(dc, mc, d0) && quads_contiguous(sc, mc, s0)) {
        for (int k = 0; k < 4; ++k) hn::StoreU(hn::LoadU(d, src + s0 + k * kL), d, dst + d0 + k * kL);
        continue;
      }
      alignas(64) std::int32_t doffs[kL], soffs[kL], act[kL];
      hn::Store(dc.v, DI(), doffs);
      hn::Store(sc.v, DI(), soffs);
      hn::Store(hn::VecFromMask(DI(), mc.m), DI(), act);
      for (int i = 0; i < kL; ++i)
        for (int k = 0; k < 4; ++k) dst[doffs[i] + k] = act[i] ? src[soffs[i] + k] : T{};
    }
  }
  // As copy4_async: the GPU's L2 policies have no meaning here (backends/cuda/cuda_exec.cuh).
  std::uint64_t l2_policy(int /*which*/) const { return 0; }
  // Note [tail prefetch]: a hint for the GPU's L2, so nothing is loaded here; but the request is
  // checked as the GPU's instruction needs it (a 16-byte aligned address, a size that is a
  // multiple of 16; 0: none), so that a wrong one fails on the CPU device first.
  void prefetch_l2(const float* p, int bytes) const {
    LOCKSTEP_ASSERT(reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && bytes >= 0 && bytes % 16 == 0,
                    "prefetch_l2: a 16-byte aligned address and a size that is a multiple of 16");
  }
  template <class T, LaneExpr DO, LaneExpr SO, class M>
  void copy4_async_stream(T* dst, DO&& doff, const T* src, SO&& soff, M&& mask, std::uint64_t /*policy*/) const {
    copy4_async(dst, std::forward<DO>(doff), src, std::forward<SO>(soff), std::forward<M>(mask));
  }
  // As copy4_async, but lanes whose mask is false write nothing (backends/cuda/cuda_exec.cuh).
  template <class T, LaneExpr DO, LaneExpr SO, class M>
  void copy4_async_some(T* dst, DO&& doff, const T* src, SO&& soff, M&& mask) const {
    const auto& od = wrap<std::int32_t>(std::forward<DO>(doff));
    const auto& os = wrap<std::int32_t>(std::forward<SO>(soff));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    for (int c = 0; c < PW / kL; ++c) {
      const VM mc = m.eval(c);
      if (hn::AllFalse(DI(), mc.m)) continue;
      alignas(64) std::int32_t doffs[kL], soffs[kL], act[kL];
      hn::Store(od.eval(c).v, DI(), doffs);
      hn::Store(os.eval(c).v, DI(), soffs);
      hn::Store(hn::VecFromMask(DI(), mc.m), DI(), act);
      for (int i = 0; i < kL; ++i)
        if (act[i])
          for (int k = 0; k < 4; ++k) dst[doffs[i] + k] = src[soffs[i] + k];
    }
  }
  void async_commit() const {}
  template <int P>
  void async_wait() const {}
  void wait_prior_grids() const {}
  void allow_dependent_grids() const {}
  // Block signals (Note [block signals] in kernels/decode.hpp). Kernels run one after another here,
  // so a wait on an earlier kernel finds its signals already given (a wait within one grid,
  // Note [one grid], may yield for them); the atomics order blocks of one launch, which run in
  // parallel.
  void signal(std::int32_t* c) const {
    block_wide();
    std::atomic_ref<std::int32_t>(*c).fetch_add(1, std::memory_order_acq_rel);
  }
  // Note [device positions] (kernels/decode.hpp): *c = max(*c, v); blocks of one launch run on
  // several threads here too, so the update is atomic. Idempotent, so a warp pass (which runs a
  // block's scalar code once per warp) may call it.
  void status_max(std::int32_t* c, int v) const {
    std::atomic_ref<std::int32_t> a(*c);
    std::int32_t cur = a.load(std::memory_order_relaxed);
    while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
  bool signal_last(std::int32_t* c, int target) const {  // Note [folded merge]
    block_wide();
    std::atomic_ref<std::int32_t> a(*c);
    const bool last = a.fetch_add(1, std::memory_order_acq_rel) == target - 1;
    if (last) a.store(0, std::memory_order_relaxed);
    return last;
  }
  // The signalling kernel has finished here, so the count is final: anything but the target is
  // a counter left over by an interrupted call, which the GPU could only wait on forever (or pass
  // too early); it is reported as a bug instead. same_grid (Note [one grid]): the signalling
  // blocks are in this launch and may still run on other threads; the wait yields until they
  // have signalled (they hold lower tickets and never wait, so they finish), and a count that is
  // still short after a minute is reported as the same bug.
  int wait_signals(std::int32_t* c, int target, bool same_grid = false) const {
    block_wide();
    std::atomic_ref<std::int32_t> a(c[0]);
    std::int32_t count = a.load(std::memory_order_acquire);
    if (same_grid && count < target) count = wait_for_count(a, target);
    if (count != target) signals_mismatch(count, target);
    return std::atomic_ref<std::int32_t>(c[1]).fetch_add(1, std::memory_order_acq_rel);
  }
  // Note [packing blocks]: copies are plain reads here, ordered by the signals' atomics.
  void proxy_fence_global() const {}
  // Note [one grid]: the block's ticket (*c before the add); ticket total - 1 resets *c.
  int block_ticket(std::int32_t* c, int total) const {
    block_wide();
    std::atomic_ref<std::int32_t> a(*c);
    const std::int32_t t = a.fetch_add(1, std::memory_order_acq_rel);
    if (t == total - 1) a.store(0, std::memory_order_relaxed);
    return t;
  }
  // The CPU device runs kernels one after another: no grid overlaps the next.
  int block_ticket_before_wait(std::int32_t* c, int total) const { return block_ticket(c, total); }
  void release_signals(std::int32_t* c, int ticket, int readers) const {
    block_wide();
    if (ticket != readers - 1) return;
    std::atomic_ref<std::int32_t>(c[1]).store(0, std::memory_order_release);
    std::atomic_ref<std::int32_t>(c[0]).store(0, std::memory_order_release);
  }

  // --- fp16 storage and warp-level 16x16x16 matrix tiles (the tensor-core operations) ---------
  // half_t is fp16 storage (bits). A tile operation is executed by every warp of the block; the
  // offsets are lane values that are uniform within each warp (each warp's tile).
  using half_t = std::uint16_t;
  struct AccTile {
    alignas(64) float v[kWarps][256];
  };
  template <LaneExpr O, class V, class M>
  void store_half(half_t* base, O&& off, V&& val, M&& mask) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    const Lanes<float> v(wrap<float>(std::forward<V>(val)));
    const Lanes<bool> m(wrap<bool>(std::forward<M>(mask)));
    for (int i = 0; i < PW; ++i)
      if (m[i]) base[o[i]] = math::half_bits_rn(v[i]);
  }
  template <LaneExpr O, class V>
  void store_half(half_t* base, O&& off, V&& val) const {
    store_half(base, std::forward<O>(off), std::forward<V>(val), true);
  }
  void tile_zero(AccTile& t) const {
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 256; ++i) t.v[w][i] = 0.0f;
  }
  // acc += A x B for the warp's 16x16 row-major fp16 tiles A (at a_off, leading dimension lda)
  // and B. Note [tensor-core emulation]: every product of two fp16 values is exact; the 16
  // products and the accumulator are summed in float64 and rounded once to fp32 per 16x16x16
  // step: the same tiles and rounding points as the hardware, whose internal summation is not
  // IEEE-specified (docs/numerics.md gives the measured difference).
  template <class OA, class OB>
  void tile_mma(AccTile& acc, const half_t* A, const OA& a_off, int lda, const half_t* B,
                const OB& b_off, int ldb) const {
    const Lanes<std::int32_t> ao(a_off), bo(b_off);
    for (int w = 0; w < kWarps; ++w) {
      const half_t* a = A + ao[w * 32];
      const half_t* b = B + bo[w * 32];
      double af[16][16], bf[16][16];
      for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 16; ++k) {
          af[i][k] = math::half_bits_to_float(a[i * lda + k]);
          bf[i][k] = math::half_bits_to_float(b[i * ldb + k]);
        }
      float* c = acc.v[w];
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
          double sum = c[i * 16 + j];
          for (int k = 0; k < 16; ++k) sum += af[i][k] * bf[k][j];
          c[i * 16 + j] = static_cast<float>(sum);
        }
    }
  }
  template <class O>
  void tile_store(float* C, const O& c_off, int ldc, const AccTile& acc) const {
    const Lanes<std::int32_t> co(c_off);
    for (int w = 0; w < kWarps; ++w) {
      float* c = C + co[w * 32];
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) c[i * ldc + j] = acc.v[w][i * 16 + j];
    }
  }
  template <class O>
  void tile_load(AccTile& acc, const float* C, const O& c_off, int ldc) const {
    const Lanes<std::int32_t> co(c_off);
    for (int w = 0; w < kWarps; ++w) {
      const float* c = C + co[w * 32];
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) acc.v[w][i * 16 + j] = c[i * ldc + j];
    }
  }

  // --- register fragments of mma.sync.m16n8k16 (backends/cuda/cuda_exec.cuh has the layout) ---
  // A fragment register is an int32 lane value holding two fp16 bit patterns (low half first).
  // ldmatrix_x4: lane 8i + r of each warp gives the offset of row r of 8x8 matrix i; lane 4g + t
  // receives row g, columns 2t and 2t + 1 of matrix i in r[i] (_trans: column g, rows 2t, 2t + 1).
  template <LaneExpr O>
  void ldmatrix_x4(Lanes<std::int32_t> (&r)[4], const half_t* base, O&& off) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < 32; ++l) {
          const half_t* row = base + o[w * 32 + 8 * i + (l >> 2)] + 2 * (l & 3);
          r[i].set(w * 32 + l, pack_bits(row[0], row[1]));
        }
  }
  template <LaneExpr O>
  void ldmatrix_x4_trans(Lanes<std::int32_t> (&r)[4], const half_t* base, O&& off) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < 32; ++l) {
          const int c = l >> 2, r0 = 2 * (l & 3);
          r[i].set(w * 32 + l, pack_bits(base[o[w * 32 + 8 * i + r0] + c], base[o[w * 32 + 8 * i + r0 + 1] + c]));
        }
  }
  // Two floats rounded to fp16 (nearest even), lo in the low half (CUDA __floats2half2_rn).
  template <class A, class B>
  Lanes<std::int32_t> pack_half2(const A& lo, const B& hi) const {
    const Lanes<float> a(wrap<float>(lo)), b(wrap<float>(hi));
    Lanes<std::int32_t> r;
    for (int i = 0; i < PW; ++i) r.set(i, pack_bits(math::half_bits_rn(a[i]), math::half_bits_rn(b[i])));
    return r;
  }
  // c += A (16x16) x B (16x8) for each warp, Note [tensor-core emulation]: the 16 exact products
  // of a row and column and the accumulator are summed in float64 and rounded once to fp32.
  void mma_16816(Lanes<float> (&c)[4], const Lanes<std::int32_t> (&a)[4], const Lanes<std::int32_t>& b0,
                 const Lanes<std::int32_t>& b1) const {
    for (int w = 0; w < kWarps; ++w) {
      double A[16][16], Bm[16][8];
      float C[16][8];
      for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = 2 * (l & 3), i = w * 32 + l;
        auto lo = [](std::int32_t v) { return double(math::half_bits_to_float(half_t(std::uint32_t(v) & 0xffffu))); };
        auto hi = [](std::int32_t v) { return double(math::half_bits_to_float(half_t(std::uint32_t(v) >> 16))); };
        A[g][t] = lo(a[0][i]), A[g][t + 1] = hi(a[0][i]);
        A[g + 8][t] = lo(a[1][i]), A[g + 8][t + 1] = hi(a[1][i]);
        A[g][t + 8] = lo(a[2][i]), A[g][t + 9] = hi(a[2][i]);
        A[g + 8][t + 8] = lo(a[3][i]), A[g + 8][t + 9] = hi(a[3][i]);
        Bm[t][g] = lo(b0[i]), Bm[t + 1][g] = hi(b0[i]);
        Bm[t + 8][g] = lo(b1[i]), Bm[t + 9][g] = hi(b1[i]);
        C[g][t] = c[0][i], C[g][t + 1] = c[1][i], C[g + 8][t] = c[2][i], C[g + 8][t + 1] = c[3][i];
      }
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
          double sum = C[r][n];
          for (int k = 0; k < 16; ++k) sum += A[r][k] * Bm[k][n];
          C[r][n] = static_cast<float>(sum);
        }
      for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = 2 * (l & 3), i = w * 32 + l;
        c[0].set(i, C[g][t]), c[1].set(i, C[g][t + 1]), c[2].set(i, C[g + 8][t]), c[3].set(i, C[g + 8][t + 1]);
      }
    }
  }
  // Warpgroup products (backends/cuda/cuda_exec.cuh has the layouts; Note [wgmma products]): the
  // kernels that use them give every warpgroup of the block the same B, so each warp's 16 rows
  // are its A fragment times that B, n-tile by n-tile, each as mma_16816 (Note [tensor-core
  // emulation]): the same bits as the mma.sync schedule over the same operands. The fences and
  // waits order nothing here (a block runs its statements in order).
  template <int NB, bool kTransB>
  void wgmma(Lanes<float> (&c)[NB / 8][4], const Lanes<std::int32_t> (&a)[4], const half_t* base, int off,
             int lbo, int sbo, bool accumulate) const {
    auto b_at = [&](int k, int n) -> half_t {
      return base[off + (kTransB ? n % 8 + (n / 8) * sbo + (k % 8) * 8 + (k / 8) * lbo
                                 : (n % 8) * 8 + (n / 8) * sbo + k % 8 + (k / 8) * lbo)];
    };
    if (!accumulate)
      for (int n8 = 0; n8 < NB / 8; ++n8)
        for (int e = 0; e < 4; ++e) c[n8][e] = Lanes<float>(0.0f);
    for (int n8 = 0; n8 < NB / 8; ++n8) {
      Lanes<std::int32_t> b0, b1;
      for (int i = 0; i < PW; ++i) {
        const int l = i & 31, n = 8 * n8 + (l >> 2), t = 2 * (l & 3);
        b0.set(i, pack_bits(b_at(t, n), b_at(t + 1, n)));
        b1.set(i, pack_bits(b_at(t + 8, n), b_at(t + 9, n)));
      }
      mma_16816(c[n8], a, b0, b1);
    }
  }
  void wgmma_fence() const {}
  void wgmma_commit() const {}
  template <int P>
  void wgmma_wait() const {}
  template <int K>
  void wgmma_hold(Lanes<float> (&)[K][4]) const {}
  template <int K>
  void wgmma_keep(Lanes<std::int32_t> (&)[K][4], int) const {}
  template <int K>
  void wgmma_ready(Lanes<std::int32_t> (&)[K][4]) const {}
  // Bulk tiles (backends/cuda/cuda_exec.cuh): the copies happen where they are issued, and every
  // wait is already satisfied (a block runs its statements in order).
  void mbar_init(std::uint64_t*, int) const {}
  void mbar_wait(std::uint64_t*, int) const {}
  void mbar_arrive_warp(std::uint64_t*) const {}
  void bulk_tiles(std::uint64_t*, std::uint64_t*, int, bool, half_t* dst0, const half_t* src0, half_t* dst1,
                  const half_t* src1, int bytes) const {
    std::memcpy(dst0, src0, std::size_t(bytes));
    std::memcpy(dst1, src1, std::size_t(bytes));
  }
  // Four 32-bit words per lane to base[off .. off + 3] (CUDA: one 16-byte store).
  template <LaneExpr O, class W0, class W1, class W2, class W3>
  void store_words4(std::int32_t* base, O&& off, const W0& w0, const W1& w1, const W2& w2, const W3& w3) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    const Lanes<std::int32_t> a(wrap<std::int32_t>(w0)), b(wrap<std::int32_t>(w1)), c(wrap<std::int32_t>(w2)),
        d(wrap<std::int32_t>(w3));
    for (int i = 0; i < PW; ++i) {
      std::int32_t* p = base + o[i];
      p[0] = a[i], p[1] = b[i], p[2] = c[i], p[3] = d[i];
    }
  }
  // 16 bytes (8 halves) per active lane into shared memory, zeros where the mask is false.
  template <LaneExpr DO, LaneExpr SO, class M>
  void copy8h_async(half_t* dst, DO&& doff, const half_t* src, SO&& soff, M&& mask) const {
    const Lanes<std::int32_t> od(wrap<std::int32_t>(std::forward<DO>(doff)));
    const Lanes<std::int32_t> os(wrap<std::int32_t>(std::forward<SO>(soff)));
    const Lanes<bool> m(wrap<bool>(std::forward<M>(mask)));
    for (int i = 0; i < PW; ++i) {
      if (m[i])
        std::memcpy(dst + od[i], src + os[i], 16);
      else
        std::memset(dst + od[i], 0, 16);
    }
  }

  // --- lane-wise math (kernels/math.hpp, the same source CUDA runs) ---
#define LS_UNARY(fn, Op)                                  \
  template <LaneExpr A>                                   \
  LS_INLINE auto fn(A&& a) const {                        \
    return make_node<Op>(std::forward<A>(a));             \
  }
  LS_UNARY(exp, OpExp)
  LS_UNARY(exp2, OpExp2)
  LS_UNARY(exp2_weight, OpExp2Weight)
  LS_UNARY(exp2_tc, OpExp2Weight)  // Note [hardware exp2 on the tensor-core path]: the CPU's is exp2_weight
  LS_UNARY(log, OpLog)
  LS_UNARY(sin, OpSin)
  LS_UNARY(cos, OpCos)
  LS_UNARY(sqrt, OpSqrt)
  LS_UNARY(abs, OpAbs)
  LS_UNARY(to_float, OpToFloat)
  LS_UNARY(as_int, OpAsInt)
  LS_UNARY(as_float, OpAsFloat)
  LS_UNARY(rint, OpRint)
  LS_UNARY(floor, OpFloor)
  LS_UNARY(isnan, OpIsNan)
  LS_UNARY(round_to_half, OpRoundHalf)
#undef LS_UNARY
  template <class A, class B, class C>
  LS_INLINE auto fma(A&& a, B&& b, C&& c) const {
    return make_node<OpFma>(wrap<float>(std::forward<A>(a)), wrap<float>(std::forward<B>(b)),
                            wrap<float>(std::forward<C>(c)));
  }
  template <class A, class B>
  LS_INLINE auto max(A&& a, B&& b) const {
    return make_node<OpMax>(wrap<float>(std::forward<A>(a)), wrap<float>(std::forward<B>(b)));
  }
  template <class A, class B>
  LS_INLINE auto max_num(A&& a, B&& b) const {
    return make_node<OpMaxNum>(wrap<float>(std::forward<A>(a)), wrap<float>(std::forward<B>(b)));
  }
  template <class A, class B>
  LS_INLINE auto min(A&& a, B&& b) const {
    return make_node<OpMin>(wrap<float>(std::forward<A>(a)), wrap<float>(std::forward<B>(b)));
  }
  template <class M, class A, class B>
  LS_INLINE auto select(M&& m, A&& a, B&& b) const {
    using T = typename lane_type<A, B>::type;
    return make_node<OpSelect>(wrap<bool>(std::forward<M>(m)), wrap<T>(std::forward<A>(a)),
                               wrap<T>(std::forward<B>(b)));
  }
  // Integer quotient (truncating, as C++ and CUDA).
  template <class A, class B>
  LS_INLINE auto idiv(A&& a, B&& b) const {
    return make_node<OpIDiv>(wrap<std::int32_t>(std::forward<A>(a)),
                             wrap<std::int32_t>(std::forward<B>(b)));
  }

  // --- cross-lane operations --------------------------------------------------------------------
  // out[i] = v[i ^ k] for 0 < k < 32 (CUDA __shfl_xor_sync over the full warp).
  template <class E>
  Lanes<value_t<E>> shfl_xor(const E& e, int k) const {
    using T = value_t<E>;
    Lanes<T> in(e), out;
    xor_permute(in, out, k);
    return out;
  }
  // out[i] = v[warp_base(i) + src] (CUDA __shfl_sync with a uniform source lane).
  template <class E>
  Lanes<value_t<E>> shfl(const E& e, int src) const {
    using T = value_t<E>;
    Lanes<T> in(e), out;
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 32; ++i) out.set(w * 32 + i, in[w * 32 + src]);
    return out;
  }
  // Butterfly reductions over groups of W lanes (W = 32: the whole warp), the fixed tree:
  // offsets W/2, W/4, ..., 1, every lane combining its value with lane i ^ offset — exactly the
  // CUDA loop `v = op(v, __shfl_xor_sync(~0u, v, off))`.
  template <int W = 32, class E>
  Lanes<float> warp_sum(const E& e) const {
    return butterfly<W, OpAdd>(e);
  }
  template <int W = 32, class E>
  Lanes<float> warp_max(const E& e) const {
    return butterfly<W, OpMax>(e);
  }
  template <int W = 32, class E>
  Lanes<float> warp_min(const E& e) const {
    return butterfly<W, OpMin>(e);
  }
  // Block-wide vote (CUDA __syncthreads_or / __syncthreads_and); also a barrier.
  template <class M>
  bool any(const M& m) const {
    block_wide();
    const auto& w = wrap<bool>(m);
    for (int c = 0; c < PW / kL; ++c)
      if (!hn::AllFalse(DI(), w.eval(c).m)) return true;
    return false;
  }
  template <class M>
  bool all(const M& m) const {
    block_wide();
    const auto& w = wrap<bool>(m);
    for (int c = 0; c < PW / kL; ++c)
      if (!hn::AllTrue(DI(), w.eval(c).m)) return false;
    return true;
  }

  // --- Note [row-major decode] (kernels/include/lockstep/kernels/decode.hpp) -----------------
  // The decode chunk kernel's phases, computed row by row with the arithmetic and order of the
  // lane that stores each value, instead of statement by statement over the block's lanes.
  // On (avx2, avx3) unless LOCKSTEP_CPU_DECODE_LANES=1 (the lane path: a check, tested to give
  // the same bytes). Rows: row t is fresh when t == nrow, else rows + t * D; rows at or past
  // live are never read.
  bool row_major_decode() const { return row_major_decode_; }
#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
  static constexpr bool kRowMajorDecode = true;

  // An 8 x 8 transpose in registers, moves only: col[j] holds element j of rows[0] .. rows[7].
  using V8 = hn::Vec<hn::FixedTag<float, 8>>;
  static void transpose8(const V8 (&rows)[8], V8 (&col)[8]) {
    const hn::FixedTag<float, 8> d8;
    const hn::Repartition<double, decltype(d8)> dd;
    V8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = hn::InterleaveLower(d8, rows[i], rows[i + 1]);      // r0[0] r1[0] r0[1] r1[1] | r0[4] ...
      t[i + 1] = hn::InterleaveUpper(d8, rows[i], rows[i + 1]);  // r0[2] r1[2] r0[3] r1[3] | r0[6] ...
    }
    for (int h = 0; h < 8; h += 4) {  // rows h .. h + 3: columns j | j + 4
      const auto a = hn::BitCast(dd, t[h]), c = hn::BitCast(dd, t[h + 2]);
      const auto a1 = hn::BitCast(dd, t[h + 1]), c1 = hn::BitCast(dd, t[h + 3]);
      u[h] = hn::BitCast(d8, hn::InterleaveLower(dd, a, c));
      u[h + 1] = hn::BitCast(d8, hn::InterleaveUpper(dd, a, c));
      u[h + 2] = hn::BitCast(d8, hn::InterleaveLower(dd, a1, c1));
      u[h + 3] = hn::BitCast(d8, hn::InterleaveUpper(dd, a1, c1));
    }
    for (int j = 0; j < 4; ++j) {
      col[j] = hn::ConcatLowerLower(d8, u[4 + j], u[j]);
      col[j + 4] = hn::ConcatUpperUpper(d8, u[4 + j], u[j]);
    }
  }

  // Phase 1: S[g * kChunk + t] = the score of row t for head g, as lane l8 == 0 of DecodeChunk's
  // score loop writes it: lane l8 (0..7) chains fma over its elements (qd * 8 + l8) * 4 + j, qd
  // then j ascending, from 0; warp_sum<8> (offsets 4, 2, 1, each lane's own value first) then the
  // scale. Rows at or past live: -inf.
  // Also prefetches rows [0, live) of vrows (the chunk's V) into the L2 cache as it goes, so
  // that decode_values, which visits them 16 rows apart, does not wait on the DRAM (without it
  // the GQA-4 decode at L=16384 took 19.4 ms instead of 9.9; prefetching K 16 KB ahead as well
  // made it 5% slower).
  template <int G, int D, int kChunk>
  void decode_scores(float* S, const float* rows, int nrow, const float* fresh, int live,
                     const float* const (&q)[G], float scale, const float* vrows) const {
    static_assert(D % 32 == 0);
    constexpr int kQ = D / 32;
    const hn::FixedTag<float, 8> d8;
    using V8 = hn::Vec<decltype(d8)>;
    const hn::Repartition<double, decltype(d8)> dd;
    // One row's 8-lane quads qd (floats qd * 32 .. + 31; lane l8 holds 4 * l8 .. + 3): k[j] holds
    // element j of every lane, in the slot order 0, 2, 4, 6 | 1, 3, 5, 7, which in-block
    // shuffles reach (a de-interleave into lane order would cross the 128-bit blocks). The
    // butterflies below read the lanes in this order.
    const auto quads = [&](const float* p, V8 (&k)[4]) {
      const V8 a0 = hn::LoadU(d8, p), a1 = hn::LoadU(d8, p + 8), a2 = hn::LoadU(d8, p + 16),
               a3 = hn::LoadU(d8, p + 24);
      const auto x0 = hn::BitCast(dd, hn::InterleaveLower(d8, a0, a1));  // l0 l2 (j0 j1) | l1 l3
      const auto x1 = hn::BitCast(dd, hn::InterleaveUpper(d8, a0, a1));  // (j2 j3)
      const auto y0 = hn::BitCast(dd, hn::InterleaveLower(d8, a2, a3));  // l4 l6 | l5 l7
      const auto y1 = hn::BitCast(dd, hn::InterleaveUpper(d8, a2, a3));
      k[0] = hn::BitCast(d8, hn::InterleaveLower(dd, x0, y0));
      k[1] = hn::BitCast(d8, hn::InterleaveUpper(dd, x0, y0));
      k[2] = hn::BitCast(d8, hn::InterleaveLower(dd, x1, y1));
      k[3] = hn::BitCast(d8, hn::InterleaveUpper(dd, x1, y1));
    };
    const auto lo64 = [&](V8 a, V8 b) { return hn::BitCast(d8, hn::InterleaveLower(dd, hn::BitCast(dd, a), hn::BitCast(dd, b))); };
    const auto hi64 = [&](V8 a, V8 b) { return hn::BitCast(d8, hn::InterleaveUpper(dd, hn::BitCast(dd, a), hn::BitCast(dd, b))); };
    V8 qt[G][kQ][4];
    for (int g = 0; g < G; ++g)
      for (int qd = 0; qd < kQ; ++qd) quads(q[g] + qd * 32, qt[g][qd]);
    for (int t = 0; t < live; ++t) {
      const float* kr = t == nrow ? fresh : rows + std::int64_t{t} * D;
      for (int b = 0; b < D; b += 16) __builtin_prefetch(vrows + std::int64_t{t} * D + b, 0, 2);
      V8 dot[G];
      for (int g = 0; g < G; ++g) dot[g] = hn::Zero(d8);
      for (int qd = 0; qd < kQ; ++qd) {
        V8 k[4];
        quads(kr + qd * 32, k);
        for (int g = 0; g < G; ++g)
          dot[g] = hn::MulAdd(qt[g][qd][3], k[3],
                              hn::MulAdd(qt[g][qd][2], k[2],
                                         hn::MulAdd(qt[g][qd][1], k[1], hn::MulAdd(qt[g][qd][0], k[0], dot[g]))));
      }
      // warp_sum<8> in slot order: slot 0 (lane 0) + slot 2 (lane 4), then + slot 1 (lane 2's
      // sum), then + slot 4 (lane 1's): each step with the lane's own value first.
      if constexpr (G == 1) {
        V8 v = dot[0];
        v = hn::Add(v, hn::Shuffle1032(v));         // lane 0: p0 + p4
        v = hn::Add(v, hn::Shuffle2301(v));         // (p0 + p4) + (p2 + p6)
        v = hn::Add(v, hn::SwapAdjacentBlocks(v));  // ... + ((p1 + p5) + (p3 + p7))
        S[t] = hn::GetLane(v) * scale;
      } else {
        // Four heads a, b, c, d (two when G == 2) at once, each sum with the same operands in
        // the same order.
        for (int g = 0; g < G; g += 4) {
          const int gb = g + 1, gc = G > 2 ? g + 2 : g, gd = G > 2 ? g + 3 : g + 1;
          // Offset 4: [a0+a4, a2+a6, c0+c4, c2+c6 | a1+a5, a3+a7, c1+c5, c3+c7] (lane numbers).
          const V8 ac = hn::Add(lo64(dot[g], dot[gc]), hi64(dot[g], dot[gc]));
          const V8 bd = hn::Add(lo64(dot[gb], dot[gd]), hi64(dot[gb], dot[gd]));
          // Offset 2: lanes 0 and 1 of a, b in slots 0, 1 | 4, 5, of c, d in the second.
          V8 u = hn::InterleaveLower(d8, ac, bd), w = hn::InterleaveUpper(d8, ac, bd);
          u = hn::Add(u, hn::Shuffle1032(u));
          w = hn::Add(w, hn::Shuffle1032(w));
          // Offset 1: lane 0's sum of a, b, c, d in slots 0 .. 3.
          V8 z = lo64(u, w);
          z = hn::Mul(hn::Add(z, hn::SwapAdjacentBlocks(z)), hn::Set(d8, scale));
          alignas(32) float o[8];
          hn::Store(z, d8, o);
          S[g * kChunk + t] = o[0];
          S[gb * kChunk + t] = o[1];
          if constexpr (G > 2) {
            S[gc * kChunk + t] = o[2];
            S[gd * kChunk + t] = o[3];
          }
        }
      }
    }
    for (int g = 0; g < G; ++g)
      for (int t = live; t < kChunk; ++t) S[g * kChunk + t] = -__builtin_huge_valf();
  }

  // Phase 2: P[g * kChunk + i] = exp(S - m) (0 when every score is -inf) and ml[g] = {m, l}, as
  // the warp of DecodeChunk that owns head g computes them (Note [softmax per warp]; with fewer
  // heads than warps every warp computes every head and warp 0 stores):
  // lane ln (0..31) takes the max and then the sum of its scores ln * 8 .. ln * 8 + 7 in order,
  // reduced by the 32-lane butterflies; m is lane 0's, l lane 1's (thread 1 stores it), each
  // lane's own value first in every sum.
  template <int G, int kChunk>
  void decode_softmax(const float* S, float* P, float* const (&ml)[G]) const {
    static_assert(kChunk == 256 && kChunk % kL == 0, "32 lanes of 8 scores (kDecodeChunk)");
    const DF d;
    for (int g = 0; g < G; ++g) {
      const float* sg = S + g * kChunk;
      float* pg = P + g * kChunk;
      // math::max is commutative and associative including NaN and signed zeros (Note [max is
      // commutative]): the lanes' maxima and their butterfly give the max of the 256 scores in
      // any order.
      VF mv(-__builtin_huge_valf());
      for (int i = 0; i < kChunk; i += kL) mv = math::max(mv, VF(hn::LoadU(d, sg + i)));
      alignas(64) float mc[kL];
      hn::Store(mv.v, d, mc);
      float m = mc[0];
      for (int i = 1; i < kL; ++i) m = math::max(m, mc[i]);
      const bool empty = m == -__builtin_huge_valf();
      for (int i = 0; i < kChunk; i += kL) {
        const VF e = math::exp(VF(hn::LoadU(d, sg + i)) - VF(m));
        hn::StoreU(empty ? hn::Zero(d) : e.v, d, pg + i);
      }
      ml[g][0] = m;
      // Lane ln's sum of its 8 probabilities, 8 lanes at a time: the 8 rows of lanes 8 b ..
      // 8 b + 7 (8 values each) transposed, then the columns added in order, from 0.
      const hn::FixedTag<float, 8> d8;
      V8 lanes[4];
      for (int b = 0; b < 4; ++b) {
        const float* r = pg + b * 64;
        V8 rows[8], col[8];
        for (int i = 0; i < 8; ++i) rows[i] = hn::LoadU(d8, r + i * 8);
        transpose8(rows, col);
        V8 l = hn::Zero(d8);
        for (int i = 0; i < 8; ++i) l = hn::Add(l, col[i]);
        lanes[b] = l;
      }
      // The butterflies on lane 1's path (offsets 16, 8, 4, 2, 1), the lane's own value first
      // in each; only lane 1's result is stored.
      V8 x = hn::Add(hn::Add(lanes[0], lanes[2]), hn::Add(lanes[1], lanes[3]));
      x = hn::Add(x, hn::SwapAdjacentBlocks(x));
      x = hn::Add(x, hn::Shuffle1032(x));
      x = hn::Add(x, hn::Shuffle2301(x));
      alignas(32) float o[8];
      hn::Store(x, d8, o);
      ml[g][1] = o[1];
    }
  }

  // Phase 3: out[g][e] for e < D, as DecodeChunk's value loop and its reduction compute them:
  // row group rg (0..15: warp rg / 4, lane group rg % 4) chains fma(P[g][t], v[t][e], acc) over
  // rows t = rg, rg + 16, ... < kChunk from 0 (a row at or past live contributes fma(P, 0, acc));
  // a warp's value is (acc[4w] + acc[4w + 1]) + (acc[4w + 2] + acc[4w + 3]) and the output
  // ((O0 + O1) + O2) + O3.
  // Also prefetches `next` (the K of the chunk after this one, which this thread most likely
  // runs next: blocks are taken in order, chunk fastest) into the L2 cache, one 64-byte line per
  // step, so that the DRAM is busy while these products run from the L2 (without it the GQA-4
  // decode at L=16384 took 13-15% longer, alternating in one process).
  template <int G, int D, int kChunk>
  void decode_values(const float* P, const float* rows, int nrow, const float* fresh, int live,
                     float* const (&out)[G], const float* next) const {
    static_assert(kChunk % 16 == 0 && kWarps == 4, "16 row groups: 4 per warp of 4 warps");
    constexpr int kW = kL < D ? kL : D;  // D is a multiple of 32 and kL a power of two <= 16
    constexpr int kV = kW < 16 ? 16 / kW : 1;  // vectors per step: a 64-byte line of each row
    const hn::CappedTag<float, kW> d;
    using V = hn::Vec<decltype(d)>;
    for (int e0 = 0; e0 < D; e0 += kW * kV) {
      V a[16][G][kV];
      for (int rg = 0; rg < 16; ++rg) {
        V acc[G][kV];  // in registers: the loops over g and u are unrolled
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
          for (int u = 0; u < kV; ++u) acc[g][u] = hn::Zero(d);
        for (int t = rg; t < kChunk; t += 16) {
          __builtin_prefetch(next, 0, 2);  // never faults
          next += 16;
          V v[kV];
          if (t < live) {
            const float* row = (t == nrow ? fresh : rows + std::int64_t{t} * D) + e0;
            for (int u = 0; u < kV; ++u) v[u] = hn::LoadU(d, row + u * kW);
          } else {
            for (int u = 0; u < kV; ++u) v[u] = hn::Zero(d);
          }
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) {
            const V pg = hn::Set(d, P[g * kChunk + t]);
#pragma GCC unroll 4
            for (int u = 0; u < kV; ++u) acc[g][u] = hn::MulAdd(pg, v[u], acc[g][u]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int u = 0; u < kV; ++u) a[rg][g][u] = acc[g][u];
      }
      for (int g = 0; g < G; ++g)
        for (int u = 0; u < kV; ++u) {
          const auto w = [&](int k) {
            return hn::Add(hn::Add(a[4 * k][g][u], a[4 * k + 1][g][u]), hn::Add(a[4 * k + 2][g][u], a[4 * k + 3][g][u]));
          };
          V o = w(0);
          for (int k = 1; k < 4; ++k) o = hn::Add(o, w(k));
          hn::StoreU(o, d, out[g] + e0 + u * kW);
        }
    }
  }

  // --- Note [row-major exact] (kernels/include/lockstep/kernels/fused_attention.hpp) ----------
  // FusedAttentionExact's block of 64 query rows, computed row by row with the arithmetic and
  // order of the lanes that store each value (Note [exact register tiles]): per key tile of
  // kTile keys, in order,
  //   score(r, key) = fma chain over d = 0 .. D-1 from 0, then times scale; -inf where the key
  //     is not visible to the row (past the tile's keys, a dead row, causal);
  //   m_new = max(m, the tile's max); none = m_new == -inf; w = none ? 0 : exp(score - m_new);
  //   the row group's thread kg sums its keys kg * 4 + 4 KG (j / 4) + j % 4, j = 0 .. kTile / KG
  //     - 1 in order from 0, then the butterfly over the KG threads (offsets KG / 2 .. 1, each
  //     thread's own value first); alpha = none ? 1 : exp(m - m_new); l = l * alpha + that sum
  //     (thread kg's own l: the threads' sums differ only in NaN payloads);
  //   acc = acc * alpha, then fma(w, v, acc) over the tile's kTile keys in order, V's rows past
  //     the tile's keys being zeros (masked keys included: their weight 0 times an inf in V is
  //     NaN here as on the GPU);
  // out = l == 0 ? 0 : acc / l (column c's l is thread (c / 4) % KG's), log-sum-exp m + log(l)
  // (-inf when l == 0, thread 0's l). Q, K and V are read where they are (no shared memory).
  // Where NaNs from two sources meet (a NaN input and inf - inf, say), which payload survives an
  // x86 operation depends on the instruction form the compiler picked, so the two paths may give
  // NaNs with different payloads there (outside the contract: tests/support/backends.hpp).
  bool row_major_exact() const { return row_major_exact_; }
  static constexpr bool kRowMajorExact = true;
  // The thread's scratch for exact_rows, 64-byte aligned, grown on demand: on the heap (thread_local
  // arrays of this size would be thread-local storage that every thread of a program linking the
  // library gets, whether it runs lockstep or not).
  static float* exact_scratch(std::size_t floats) {
    struct Scratch {
      float* p = nullptr;
      std::size_t n = 0;
      ~Scratch() { std::free(p); }
    };
    thread_local Scratch s;
    if (s.n < floats) {
      std::free(s.p);
      s.p = static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64));
      s.n = s.p != nullptr ? floats : 0;
      if (s.p == nullptr) throw std::bad_alloc();
    }
    return s.p;
  }
  // Keys [key_begin, last_key); with part_o (Note [split keys] in kernels/fused_attention.hpp) the
  // rows' partials instead of out and lse: o not divided at part_o + r D, the row's max and each
  // lane's sum at part_ml + r ml_pitch (FusedAttentionExact::kMlPitch).
  template <int D, int KG, int kTile>
  void exact_rows(const float* qb, int q_ss, const float* kb, int k_ss, const float* vb, int v_ss, float* ob,
                  int o_ss, float* lse, int rows, int s0, int shift, int key_begin, int last_key, bool causal,
                  float scale, float* part_o, float* part_ml, int ml_pitch) const {
    constexpr int kRows = 64;
    constexpr int kKeys = kTile / KG;  // keys per thread and tile
    static_assert(kKeys % 4 == 0, "whole key quads per lane (kTile a multiple of 4 KG)");
    static_assert(kTile % (2 * kL) == 0 && D % (2 * kL) == 0, "whole vector pairs of keys and columns");
    // Vectors of keys (scores) and of columns (P x V) per register block of rows: four with
    // 32 vector registers (avx3) where they divide the tile, else two.
    constexpr int kNK = kL == 16 && (kTile / kL) % 4 == 0 ? 4 : 2;
    constexpr int kNC = kL == 16 && (D / kL) % 4 == 0 ? 4 : 2;
    const DF d;
    using V = hn::Vec<DF>;
    constexpr float kNegInf = -__builtin_huge_valf();
    // K^T of the tile, the scores (then the weights), the accumulators and a row of zeros, in the
    // thread's scratch (each a multiple of 64 bytes).
    float* const Kt = exact_scratch(std::size_t(D) * kTile + kRows * kTile + kRows * D + D);
    float* const S = Kt + D * kTile;
    float* const acc = S + kRows * kTile;
    float* const zeros = acc + kRows * D;
    static_assert(KG == 8 || KG == 16, "row groups of 8 or 16 lanes");
    const hn::FixedTag<float, 8> d8;
    // Each lane's sum, 8 lanes at a time: lane kg's keys h 4 KG + 4 kg + e de-interleaved
    // (e = 0 .. 3), added in the order (h, e) from 0; then the butterfly, each lane's own value
    // first (offsets 4, 2, 1: block swap, 64-bit swap, 32-bit swap within 8 lanes).
    const auto lane_sums = [&](const float* w) {  // 8 consecutive lanes whose first key is w[0]
      V8 a = hn::Zero(d8);
      for (int h = 0; h < kKeys / 4; ++h) {
        V8 e0, e1, e2, e3;
        hn::LoadInterleaved4(d8, w + h * 4 * KG, e0, e1, e2, e3);
        a = hn::Add(hn::Add(hn::Add(hn::Add(a, e0), e1), e2), e3);
      }
      return a;
    };
    const auto butterfly8 = [](V8 a) {
      a = hn::Add(a, hn::SwapAdjacentBlocks(a));
      a = hn::Add(a, hn::Shuffle1032(a));
      return hn::Add(a, hn::Shuffle2301(a));
    };
    float m[kRows], alpha[kRows];
    alignas(32) float l[kRows][KG];
    alignas(64) float tile_max[kRows * kL];  // each row's max over the tile, per lane (the scores)
    const V iota = hn::ConvertTo(d, LS_IOTA());
    static_assert(kL == 8 || kL == 16, "the tile max's lane reduction");
    const int rows4 = (rows + 3) / 4 * 4;  // rows padded to a multiple of four; rows at or past `rows` are dead
    // The products' register blocks of rows: kNR rows at a time (six with avx2's 16 vector
    // registers: 12 accumulators, the fma chains' latency covered with fewer loads per fma; four
    // with avx3's 32), then fours and twos (rows4 is a multiple of 4). Each accumulator's chain is
    // the same whatever the block: the same bytes.
    constexpr int kNR = kL == 8 ? 6 : 4;
    const auto by_row_blocks = [rows4](const auto& f) {
      int r = 0;
      for (; r + kNR <= rows4; r += kNR) f.template operator()<kNR>(r);
      for (; r + 4 <= rows4; r += 4) f.template operator()<4>(r);
      for (; r < rows4; r += 2) f.template operator()<2>(r);
    };
    for (int r = 0; r < rows4; ++r) {
      m[r] = kNegInf;
      for (int g = 0; g < KG; ++g) l[r][g] = 0.0f;
      for (int c = 0; c < D; c += kL) hn::Store(hn::Zero(d), d, acc + r * D + c);
    }
    for (int c = 0; c < D; c += kL) hn::Store(hn::Zero(d), d, zeros + c);
    for (int j0 = key_begin; j0 < last_key; j0 += kTile) {
      const int keys = std::min(last_key - j0, kTile);
      // K^T: Kt[dd * kTile + key], zeros past the tile's keys, in 8 x 8 blocks (transpose8).
      for (int k8 = 0; k8 < kTile; k8 += 8) {
        const float* kr[8];
        for (int i = 0; i < 8; ++i) kr[i] = k8 + i < keys ? kb + std::int64_t(j0 + k8 + i) * k_ss : zeros;
        for (int c8 = 0; c8 < D; c8 += 8) {
          V8 rows[8], col[8];
          for (int i = 0; i < 8; ++i) rows[i] = hn::LoadU(d8, kr[i] + c8);
          transpose8(rows, col);
          for (int j = 0; j < 8; ++j) hn::StoreU(col[j], d8, Kt + (c8 + j) * kTile + k8);
        }
      }
      // Scores of NR rows and kNK vectors of keys at a time: each an fma chain over dd in order,
      // then times scale, -inf where the key is not visible to the row, and the row's running
      // max over the tile (math::max: any order gives the same, Note [max is commutative]).
      by_row_blocks([&]<int NR>(int r) {
        const float* qr[NR];
        int vis[NR];  // keys visible to the row: key < keys, and causal: key + j0 <= s0 + r + shift
        for (int i = 0; i < NR; ++i) {
          qr[i] = r + i < rows ? qb + std::int64_t(r + i) * q_ss : zeros;
          vis[i] = causal ? std::min(keys, s0 + r + i + shift - j0 + 1) : keys;
        }
        VF mx[NR];
        for (int i = 0; i < NR; ++i) mx[i] = VF(kNegInf);
        for (int k0 = 0; k0 < kTile; k0 += kNK * kL) {
          V a[NR][kNK];
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNK; ++u) a[i][u] = hn::Zero(d);
          for (int dd = 0; dd < D; ++dd) {
            V kv[kNK];
            for (int u = 0; u < kNK; ++u) kv[u] = hn::Load(d, Kt + dd * kTile + k0 + u * kL);
            for (int i = 0; i < NR; ++i) {
              const V qv = hn::Set(d, qr[i][dd]);
              for (int u = 0; u < kNK; ++u) a[i][u] = hn::MulAdd(qv, kv[u], a[i][u]);
            }
          }
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNK; ++u) {
              const auto visible = hn::Lt(iota, hn::Set(d, float(vis[i] - (k0 + u * kL))));
              const V sc = hn::IfThenElse(visible, hn::Mul(a[i][u], hn::Set(d, scale)), hn::Set(d, kNegInf));
              hn::Store(sc, d, S + (r + i) * kTile + k0 + u * kL);
              mx[i] = math::max(mx[i], VF(sc));
            }
        }
        for (int i = 0; i < NR; ++i) hn::Store(mx[i].v, d, tile_max + (r + i) * kL);
      });
      // The online softmax of each row; the weights replace the scores.
      for (int r = 0; r < rows4; ++r) {
        float* sr = S + r * kTile;
        if (r >= rows) {  // dead: every key invisible, nothing stored
          for (int k0 = 0; k0 < kTile; k0 += kL) hn::Store(hn::Zero(d), d, sr + k0);
          alpha[r] = 1.0f;
          continue;
        }
        // The tile's max of the row's scores: its vector from the scores, then across lanes.
        VF mv(hn::Load(d, tile_max + r * kL));
        if constexpr (kL == 16) mv = math::max(mv, VF(hn::ConcatLowerUpper(d, mv.v, mv.v)));
        mv = math::max(mv, VF(hn::SwapAdjacentBlocks(mv.v)));
        mv = math::max(mv, VF(hn::Shuffle1032(mv.v)));
        mv = math::max(mv, VF(hn::Shuffle2301(mv.v)));
        const float tmax = hn::GetLane(mv.v);
        const float m_new = math::max(m[r], tmax);
        const bool none = m_new == kNegInf;
        for (int k0 = 0; k0 < kTile; k0 += kL) {
          const VF e = math::exp(VF(hn::Load(d, sr + k0)) - VF(m_new));
          hn::Store(none ? hn::Zero(d) : e.v, d, sr + k0);
        }
        alpha[r] = none ? 1.0f : math::exp(m[r] - m_new);
        const V8 av = hn::Set(d8, alpha[r]);
        if constexpr (KG == 8) {
          const V8 ps = butterfly8(lane_sums(sr));
          hn::Store(hn::Add(hn::Mul(hn::Load(d8, l[r]), av), ps), d8, l[r]);
        } else {  // lanes 0-7 and 8-15: offset 8 first (each lane's own value first), then 4, 2, 1
          const V8 a = lane_sums(sr), b = lane_sums(sr + 32);
          const V8 pa = butterfly8(hn::Add(a, b)), pb = butterfly8(hn::Add(b, a));
          hn::Store(hn::Add(hn::Mul(hn::Load(d8, l[r]), av), pa), d8, l[r]);
          hn::Store(hn::Add(hn::Mul(hn::Load(d8, l[r] + 8), av), pb), d8, l[r] + 8);
        }
        m[r] = m_new;
      }
      // P x V: NR rows and kNC vectors of columns at a time: acc times the row's alpha, then fma
      // over the tile's keys in order (the keys past the tile's end with V's rows as zeros, as on
      // the GPU).
      by_row_blocks([&]<int NR>(int r) {
        for (int c0 = 0; c0 < D; c0 += kNC * kL) {
          V a[NR][kNC];
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNC; ++u)
              a[i][u] = hn::Mul(hn::Load(d, acc + (r + i) * D + c0 + u * kL), hn::Set(d, alpha[r + i]));
          const auto step = [&](const float* vr, int key) {
            V vv[kNC];
            for (int u = 0; u < kNC; ++u) vv[u] = hn::LoadU(d, vr + c0 + u * kL);
            for (int i = 0; i < NR; ++i) {
              const V w = hn::Set(d, S[(r + i) * kTile + key]);
              for (int u = 0; u < kNC; ++u) a[i][u] = hn::MulAdd(w, vv[u], a[i][u]);
            }
          };
          const float* vr = vb + std::int64_t(j0) * v_ss;
          for (int key = 0; key < keys; ++key, vr += v_ss) step(vr, key);
          for (int key = keys; key < kTile; ++key) step(zeros, key);
          for (int i = 0; i < NR; ++i)
            for (int u = 0; u < kNC; ++u) hn::Store(a[i][u], d, acc + (r + i) * D + c0 + u * kL);
        }
      });
    }
    if (part_o != nullptr) {
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < D; ++c) part_o[std::int64_t(r) * D + c] = acc[r * D + c];
        part_ml[std::int64_t(r) * ml_pitch] = m[r];
        for (int g = 0; g < KG; ++g) part_ml[std::int64_t(r) * ml_pitch + 1 + g] = l[r][g];
      }
      return;
    }
    for (int r = 0; r < rows; ++r) {
      float* orow = ob + std::int64_t(r) * o_ss;
      for (int c = 0; c < D; ++c) {
        const float lc = l[r][(c / 4) % KG];
        orow[c] = lc == 0.0f ? 0.0f : acc[r * D + c] / lc;
      }
      if (lse != nullptr) lse[r] = l[r][0] == 0.0f ? kNegInf : m[r] + math::log(l[r][0]);
    }
  }

  // --- Note [row-major softmax] (kernels/include/lockstep/kernels/softmax.hpp) ----------------
  // SoftmaxRows's warps, each row computed with SIMD loads straight from the row instead of
  // through the lane machinery (2.3x fewer instructions per element: the lane code checks each
  // chunk's offsets for contiguity and its mask on every load and store; docs/performance.md,
  // tools/host/softmax_instructions.sh); on (avx2, avx3) unless
  // LOCKSTEP_CPU_SOFTMAX_LANES=1 (the lane path: a check, tested to give the same bytes). Lane
  // l of the warp holds elements l, l + 32, l + 64, ...: here lane l is element l % kL of the
  // vector for its 32-element group's (l / kL)-th kL elements, so every value is computed by
  // the same operations in the same order as the lane that computes it:
  //   m = the max of the row's elements and of the tail lanes' -inf (math::max: any order gives
  //     the same, Note [max is commutative]);
  //   e = exp(x - m), stored in out (as the lane path's CPU branch does, Note [softmax
  //     exponentials once]), each lane's sum from 0 over its elements in row order, the tail
  //     lanes adding exp(-inf - m) as theirs do;
  //   the warp_sum butterfly over the 32 lane sums (offsets 16 .. 1, each lane's own first);
  //   out = m == -inf ? 0 : e / (the lane's sum).
  bool row_major_softmax() const { return row_major_softmax_; }
  static constexpr bool kRowMajorSoftmax = true;
  // The rows of this pass's warps (warp w: row w of the block, `in` and `out` at the block's
  // first row); warps at or past `live` have no row and touch nothing.
  void softmax_rows(const float* in, float* out, int n, int live) const {
    for (int w = base_ / 32; w < base_ / 32 + kWarps && w < live; ++w)
      softmax_row(in + std::int64_t(w) * n, out + std::int64_t(w) * n, n);
  }
  static void softmax_row(const float* in, float* out, int n) {
    constexpr float kNegInf = -__builtin_huge_valf();
    constexpr int G = 32 / kL;  // vectors per 32 lanes
    const DF d;
    const int full = n - n % 32, rest = n - full;
    // The last, partial group of 32 (lanes past the row hold -inf, as the lane path's masked
    // loads give them), copied before `out` (which may be `in`) is written.
    alignas(64) float tail[32];
    for (int i = 0; i < 32; ++i) tail[i] = i < rest ? in[full + i] : kNegInf;
    VF mv(kNegInf);
    for (int j = 0; j < full; j += kL) mv = math::max(mv, VF(hn::LoadU(d, in + j)));
    if (rest > 0)
      for (int c = 0; c < G; ++c) mv = math::max(mv, VF(hn::Load(d, tail + c * kL)));
    alignas(64) float lanes[kL];
    hn::Store(mv.v, d, lanes);
    float m = lanes[0];
    for (int i = 1; i < kL; ++i) m = math::max(m, lanes[i]);
    if (m == kNegInf) {  // a row of only -inf: zeros (exp(-inf - -inf) is NaN)
      std::memset(out, 0, sizeof(float) * std::size_t(n));
      return;
    }
    const VF mb(m);
    VF sum[G];
    for (int c = 0; c < G; ++c) sum[c] = VF(0.0f);
    for (int j = 0; j < full; j += 32)
      for (int c = 0; c < G; ++c) {
        const VF e = math::exp(VF(hn::LoadU(d, in + j + c * kL)) - mb);
        hn::StoreU(e.v, d, out + j + c * kL);
        sum[c] = sum[c] + e;
      }
    if (rest > 0) {
      for (int c = 0; c < G; ++c) {
        const VF e = math::exp(VF(hn::Load(d, tail + c * kL)) - mb);
        hn::Store(e.v, d, tail + c * kL);
        sum[c] = sum[c] + e;
      }
    }
    alignas(64) float t[32], u[32];
    for (int c = 0; c < G; ++c) hn::Store(sum[c].v, d, t + c * kL);
    for (int off = 16; off >= 1; off /= 2) {
      for (int l = 0; l < 32; ++l) u[l] = t[l] + t[l ^ off];
      std::memcpy(t, u, sizeof t);
    }
    VF sv[G];
    for (int c = 0; c < G; ++c) sv[c] = VF(hn::Load(d, t + c * kL));
    for (int j = 0; j < full; j += 32)
      for (int c = 0; c < G; ++c)
        hn::StoreU((VF(hn::LoadU(d, out + j + c * kL)) / sv[c]).v, d, out + j + c * kL);
    for (int i = 0; i < rest; ++i) out[full + i] = tail[i] / t[i];
  }
#else
  static constexpr bool kRowMajorDecode = false;
  static constexpr bool kRowMajorExact = false;
  static constexpr bool kRowMajorSoftmax = false;
#endif

 private:
  static std::int32_t pack_bits(half_t lo, half_t hi) {
    return static_cast<std::int32_t>(std::uint32_t(lo) | (std::uint32_t(hi) << 16));
  }
  template <int W, class Op, class E>
  Lanes<float> butterfly(const E& e) const {
    static_assert(W >= 2 && W <= 32 && (W & (W - 1)) == 0, "group width: a power of two <= 32");
    Lanes<float> v(e), t;
    for (int k = W / 2; k >= 1; k /= 2) {
      xor_permute(v, t, k);
      v = make_node<Op>(v, t);
    }
    return v;
  }
  template <class T>
  static void xor_permute(const Lanes<T>& in, Lanes<T>& out, int k) {
    using Tag = mem_tag_t<T>;
    const Tag d;
    if (k >= kL) {
      const int kc = k / kL;  // whole chunks swap places
      for (int c = 0; c < PW / kL; ++c)
        hn::Store(hn::Load(d, in.data() + (c ^ kc) * kL), d, out.data() + c * kL);
    } else {
      alignas(64) std::int32_t idx[kL];
      for (int i = 0; i < kL; ++i) idx[i] = i ^ k;
      const auto ind = hn::SetTableIndices(d, idx);
      for (int c = 0; c < PW / kL; ++c)
        hn::Store(hn::TableLookupLanes(hn::Load(d, in.data() + c * kL), ind), d,
                  out.data() + c * kL);
    }
  }
  [[noreturn]] static void shared_overflow(std::size_t need, std::size_t have);
  [[noreturn]] static void signals_mismatch(int count, int target);
  static std::int32_t wait_for_count(std::atomic_ref<std::int32_t> a, int target);

  BlockCoords blk_;
  char* smem_;
  std::size_t smem_cap_;
  bool row_major_decode_ = true;
  bool row_major_exact_ = true;
  bool row_major_softmax_ = true;
  std::size_t smem_off_ = 0;
  std::int32_t base_ = 0;  // the pass's first thread (Note [warp passes])
};

template <int N, int PW>
void CpuExec<N, PW>::shared_overflow(std::size_t need, std::size_t have) {
  ::lockstep::detail::assertion_failed("shared memory carved <= launch shared_bytes", __FILE__,
                                       __LINE__,
                                       ("kernel carved " + std::to_string(need) +
                                        " bytes of shared memory but was launched with " +
                                        std::to_string(have))
                                           .c_str());
}

template <int N, int PW>
void CpuExec<N, PW>::signals_mismatch(int count, int target) {
  ::lockstep::detail::assertion_failed("block signals == target when the waiting kernel runs",
                                       __FILE__, __LINE__,
                                       ("counter at " + std::to_string(count) + ", expected " +
                                        std::to_string(target) + " (Note [block signals])")
                                           .c_str());
}

template <int N, int PW>
std::int32_t CpuExec<N, PW>::wait_for_count(std::atomic_ref<std::int32_t> a, int target) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  std::int32_t count = a.load(std::memory_order_acquire);
  while (count < target && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
    count = a.load(std::memory_order_acquire);
  }
  return count;
}

#undef LS_INLINE
}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
