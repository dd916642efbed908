// The decode chunk kernel's CPU row form (kernels/decode/rows.hpp, Note [row-major decode]) as
// CpuExec's x.decode_scores, x.decode_softmax and x.decode_values, over this variant's RowSimd.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
template <int PW>
struct DecodeRows {
  static constexpr bool kRowMajorDecode = true;
  using Form = kernels::DecodeRowForm<RowSimd, PW / 32>;

  template <int G, int D, int kChunk, class R>
  void decode_scores(float* S, const R* rows, int nrow, const float* fresh, int live,
                     const float* const (&q)[G], float scale, const R* vrows) const {
    Form::template decode_scores<G, D, kChunk>(S, rows, nrow, fresh, live, q, scale, vrows);
  }
  template <int G, int kChunk>
  void decode_softmax(const float* S, float* P, float* const (&ml)[G]) const {
    Form::template decode_softmax<G, kChunk>(S, P, ml);
  }
  template <int G, int D, int kChunk, class R>
  void decode_values(const float* P, const R* rows, int nrow, const float* fresh, int live,
                     float* const (&out)[G], const R* next) const {
    Form::template decode_values<G, D, kChunk>(P, rows, nrow, fresh, live, out, next);
  }
};
#else
template <int PW>
struct DecodeRows {
  static constexpr bool kRowMajorDecode = false;
};
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
