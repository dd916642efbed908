// SoftmaxRows's CPU row form (kernels/softmax_rows.hpp, Note [row-major softmax]) as CpuExec's
// softmax_row, over this variant's RowSimd.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
struct SoftmaxRows {
  static constexpr bool kRowMajorSoftmax = true;
  static void softmax_row(const float* in, float* out, int n) {
    kernels::SoftmaxRowForm<RowSimd>::softmax_row(in, out, n);
  }
};
#else
struct SoftmaxRows {
  static constexpr bool kRowMajorSoftmax = false;
};
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
