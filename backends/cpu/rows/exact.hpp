// FusedAttentionExact's CPU row form (kernels/fused/exact_rows.hpp, Note [row-major exact]) as
// CpuExec's x.exact_rows, over this variant's RowSimd.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
struct ExactRows {
  static constexpr bool kRowMajorExact = true;

  template <int D, int KG, int kTile>
  void exact_rows(const float* qb, int q_ss, const float* kb, int k_ss, const float* vb, int v_ss, float* ob,
                  int o_ss, float* lse, int rows, int s0, int shift, int key_begin, int last_key, bool causal,
                  float scale, float* part_o, float* part_ml, int ml_pitch) const {
    kernels::ExactRowForm<RowSimd>::template exact_rows<D, KG, kTile>(qb, q_ss, kb, k_ss, vb, v_ss, ob, o_ss, lse, rows,
                                                                       s0, shift, key_begin, last_key, causal, scale,
                                                                       part_o, part_ml, ml_pitch);
  }
};
#else
struct ExactRows {
  static constexpr bool kRowMajorExact = false;
};
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
