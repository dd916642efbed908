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

  // Lanes of d from p, widened from a storage format by its conversion (lockstep/formats.hpp):
  // F16C's for half, with a NaN code giving the canonical NaN as the format's own conversion
  // does; a shift for bfloat16; a table of the 256 codes for fp8.
  template <class D>
  static LS_INLINE hn::Vec<D> LoadWiden(D d, const float* p) {
    return hn::LoadU(d, p);
  }
  template <class D>
  static LS_INLINE hn::Vec<D> LoadWiden(D d, const ::lockstep::bfloat16* p) {
    const hn::Rebind<std::uint16_t, D> d16;
    const hn::RebindToUnsigned<D> du;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p)))));
  }
  template <class D>
  static LS_INLINE hn::Vec<D> LoadWiden(D d, const ::lockstep::half* p) {
    const hn::Rebind<hwy::float16_t, D> dh;
    const auto v = hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
    return hn::IfThenElse(hn::IsNaN(v), hn::BitCast(d, hn::Set(hn::RebindToUnsigned<D>(), 0x7fffffffu)), v);
  }
  template <class D, class S>
    requires(sizeof(S) == 1)
  static LS_INLINE hn::Vec<D> LoadWiden(D d, const S* p) {
    const hn::Rebind<std::uint8_t, D> d8;
    const hn::RebindToSigned<D> di;
    const auto idx = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<D>(), hn::LoadU(d8, reinterpret_cast<const std::uint8_t*>(p))));
    return hn::GatherIndex(d, code_table<S>(), idx);
  }
  // The 256 codes of an 8-bit format as floats.
  template <class S>
  static const float* code_table() {
    struct Table {
      alignas(64) float v[256];
      Table() {
        for (int c = 0; c < 256; ++c) v[c] = ::lockstep::to_float(S{static_cast<std::uint8_t>(c)});
      }
    };
    static const Table t;
    return t.v;
  }

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
