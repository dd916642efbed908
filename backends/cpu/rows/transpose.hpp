// An 8 x 8 transpose of floats in registers, which the row forms of decode and Exact attention
// share.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
// An 8 x 8 transpose in registers, moves only: col[j] holds element j of rows[0] .. rows[7].
using V8 = hn::Vec<hn::FixedTag<float, 8>>;
inline void transpose8(const V8 (&rows)[8], V8 (&col)[8]) {
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
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
