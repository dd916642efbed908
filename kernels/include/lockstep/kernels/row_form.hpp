#pragma once
// What the CPU row forms (decode/rows.hpp, fused/exact_rows.hpp, softmax_rows.hpp) share: the SIMD
// vocabulary they are written over, and an 8 x 8 transpose.
//
// Note [row forms]
// A kernel's row form computes the values that its lanes store, row by row with SIMD vectors,
// by the same operations in the same order as the lanes (so the same bits; each form's test
// holds it to the lane code's bytes). The forms are host code that only the CPU backend
// instantiates, with Simd its vocabulary (backends/cpu/rows/simd.hpp): the types DF (its native
// float vectors' tag), VF (a native vector that kernels/math.hpp evaluates, .v its vector), the
// lane count kL, the tags FixedTag<float, 8>, CappedTag<float, N>, Repartition<double, D> and
// vectors Vec<D>; Iota() (int lanes 0, 1, ...); and these Highway operations, with Highway's
// meaning: Load, LoadU, Store, StoreU, LoadInterleaved4, Zero, Set, GetLane, Add, Mul, MulAdd,
// Lt, IfThenElse, ConvertTo, BitCast, InterleaveLower, InterleaveUpper, ConcatLowerLower,
// ConcatUpperUpper, ConcatLowerUpper, SwapAdjacentBlocks, Shuffle1032, Shuffle2301.

namespace lockstep::kernels {

// An 8 x 8 transpose in registers, moves only: col[j] holds element j of rows[0] .. rows[7].
template <class Simd>
inline void transpose8(const typename Simd::template Vec<typename Simd::template FixedTag<float, 8>> (&rows)[8],
                       typename Simd::template Vec<typename Simd::template FixedTag<float, 8>> (&col)[8]) {
  using V8 = typename Simd::template Vec<typename Simd::template FixedTag<float, 8>>;
  const typename Simd::template FixedTag<float, 8> d8;
  const typename Simd::template Repartition<double, decltype(d8)> dd;
  V8 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = Simd::InterleaveLower(d8, rows[i], rows[i + 1]);      // r0[0] r1[0] r0[1] r1[1] | r0[4] ...
    t[i + 1] = Simd::InterleaveUpper(d8, rows[i], rows[i + 1]);  // r0[2] r1[2] r0[3] r1[3] | r0[6] ...
  }
  for (int h = 0; h < 8; h += 4) {  // rows h .. h + 3: columns j | j + 4
    const auto a = Simd::BitCast(dd, t[h]), c = Simd::BitCast(dd, t[h + 2]);
    const auto a1 = Simd::BitCast(dd, t[h + 1]), c1 = Simd::BitCast(dd, t[h + 3]);
    u[h] = Simd::BitCast(d8, Simd::InterleaveLower(dd, a, c));
    u[h + 1] = Simd::BitCast(d8, Simd::InterleaveUpper(dd, a, c));
    u[h + 2] = Simd::BitCast(d8, Simd::InterleaveLower(dd, a1, c1));
    u[h + 3] = Simd::BitCast(d8, Simd::InterleaveUpper(dd, a1, c1));
  }
  for (int j = 0; j < 4; ++j) {
    col[j] = Simd::ConcatLowerLower(d8, u[4 + j], u[j]);
    col[j + 4] = Simd::ConcatUpperUpper(d8, u[4 + j], u[j]);
  }
}

}  // namespace lockstep::kernels
