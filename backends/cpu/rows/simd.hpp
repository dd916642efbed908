// The SIMD vocabulary that the kernels' CPU row forms are written over (Note [row forms] in
// kernels/row_form.hpp): this variant's Highway types and the operations the forms use.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
struct RowSimd {
  using DF = ::lockstep::cpu::LOCKSTEP_CPU_NS::DF;
  using VF = ::lockstep::cpu::LOCKSTEP_CPU_NS::VF;
  static constexpr int kL = ::lockstep::cpu::LOCKSTEP_CPU_NS::kL;
  template <class T, int N>
  using FixedTag = hn::FixedTag<T, N>;
  template <class T, int N>
  using CappedTag = hn::CappedTag<T, N>;
  template <class T, class D>
  using Repartition = hn::Repartition<T, D>;
  template <class D>
  using Vec = hn::Vec<D>;

  // 0, 1, 2, ... as int lanes (LS_IOTA).
  static LS_INLINE hn::Vec<DI> Iota() { return LS_IOTA(); }

#define LS_ROW_OP(Name)                                  \
  template <class... A>                                  \
  static LS_INLINE auto Name(A&&... a) {                 \
    return hn::Name(std::forward<A>(a)...);              \
  }
  LS_ROW_OP(Load)
  LS_ROW_OP(LoadU)
  LS_ROW_OP(Store)
  LS_ROW_OP(StoreU)
  LS_ROW_OP(LoadInterleaved4)
  LS_ROW_OP(Zero)
  LS_ROW_OP(Set)
  LS_ROW_OP(GetLane)
  LS_ROW_OP(Add)
  LS_ROW_OP(Mul)
  LS_ROW_OP(MulAdd)
  LS_ROW_OP(Lt)
  LS_ROW_OP(IfThenElse)
  LS_ROW_OP(ConvertTo)
  LS_ROW_OP(BitCast)
  LS_ROW_OP(InterleaveLower)
  LS_ROW_OP(InterleaveUpper)
  LS_ROW_OP(ConcatLowerLower)
  LS_ROW_OP(ConcatUpperUpper)
  LS_ROW_OP(ConcatLowerUpper)
  LS_ROW_OP(SwapAdjacentBlocks)
  LS_ROW_OP(Shuffle1032)
  LS_ROW_OP(Shuffle2301)
#undef LS_ROW_OP
};
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
