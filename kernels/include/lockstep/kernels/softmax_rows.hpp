#pragma once
// SoftmaxRows's CPU row form (Note [row-major softmax] in softmax.hpp): each row with SIMD loads
// straight from the row, with the lane code's arithmetic and order, over the SIMD vocabulary
// Simd that the CPU backend provides (lockstep/kernels/row_form.hpp).

#include <cstdint>
#include <cstring>

#include "lockstep/kernels/math.hpp"

namespace lockstep::kernels {

// --- Note [row-major softmax] (kernels/softmax.hpp) ----------------------------------------------
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
template <class Simd>
struct SoftmaxRowForm {
  using DF = typename Simd::DF;
  using VF = typename Simd::VF;
  static constexpr int kL = Simd::kL;

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
    for (int j = 0; j < full; j += kL) mv = math::max(mv, VF(Simd::LoadU(d, in + j)));
    if (rest > 0)
      for (int c = 0; c < G; ++c) mv = math::max(mv, VF(Simd::Load(d, tail + c * kL)));
    alignas(64) float lanes[kL];
    Simd::Store(mv.v, d, lanes);
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
        const VF e = math::exp(VF(Simd::LoadU(d, in + j + c * kL)) - mb);
        Simd::StoreU(e.v, d, out + j + c * kL);
        sum[c] = sum[c] + e;
      }
    if (rest > 0) {
      for (int c = 0; c < G; ++c) {
        const VF e = math::exp(VF(Simd::Load(d, tail + c * kL)) - mb);
        Simd::Store(e.v, d, tail + c * kL);
        sum[c] = sum[c] + e;
      }
    }
    alignas(64) float t[32], u[32];
    for (int c = 0; c < G; ++c) Simd::Store(sum[c].v, d, t + c * kL);
    for (int off = 16; off >= 1; off /= 2) {
      for (int l = 0; l < 32; ++l) u[l] = t[l] + t[l ^ off];
      std::memcpy(t, u, sizeof t);
    }
    VF sv[G];
    for (int c = 0; c < G; ++c) sv[c] = VF(Simd::Load(d, t + c * kL));
    for (int j = 0; j < full; j += 32)
      for (int c = 0; c < G; ++c)
        Simd::StoreU((VF(Simd::LoadU(d, out + j + c * kL)) / sv[c]).v, d, out + j + c * kL);
    for (int i = 0; i < rest; ++i) out[full + i] = tail[i] / t[i];
  }
};

}  // namespace lockstep::kernels
