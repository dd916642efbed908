// Lane expressions: one value per thread (LaneArray), arithmetic on lanes as expression trees
// evaluated one SIMD chunk at a time, and the lane-wise math of CpuExec.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

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
// Lane-wise math: x.exp, x.fma, x.select, ... of CpuExec (kernels/math.hpp, the same source CUDA
// runs), building lane expressions.
// ================================================================================================
struct LaneMath {
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
};

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
