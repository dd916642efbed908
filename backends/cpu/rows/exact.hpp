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
  // Half or bfloat16 operands (Note [exact formats] in kernels/fused/exact.hpp): the block's query
  // rows and its keys' K and V rows widened (exactly, as the lanes' loads do) into the thread's
  // scratch, the float form over them, its rows rounded once into ob (as the lanes' stores do).
  template <int D, int KG, int kTile, class T>
  void exact_rows(const T* qb, int q_ss, const T* kb, int k_ss, const T* vb, int v_ss, T* ob, int o_ss, float* lse,
                  int rows, int s0, int shift, int key_begin, int last_key, bool causal, float scale, float* part_o,
                  float* part_ml, int ml_pitch) const {
    static_assert(is_format_v<T>, "float operands take the overload above");
    thread_local std::vector<float> scratch;  // q and out: 64 rows; k and v: last_key rows
    const std::size_t keys = static_cast<std::size_t>(last_key > 0 ? last_key : 0);
    scratch.resize((2 * 64 + 2 * keys) * D);
    float* const q = scratch.data();
    float* const o = q + 64 * D;
    float* const k = o + 64 * D;
    float* const v = k + keys * D;
    const auto widen = [](float* dst, const T* src, int ss, int r0, int r1) {  // RowSimd's: F16C, a shift
      const DF d;
      for (int r = r0; r < r1; ++r)
        for (int c = 0; c < D; c += kL)
          hn::StoreU(RowSimd::LoadWiden(d, src + std::int64_t(r) * ss + c), d, dst + std::size_t(r) * D + c);
    };
    widen(q, qb, q_ss, 0, rows);
    widen(k, kb, k_ss, key_begin, last_key);
    widen(v, vb, v_ss, key_begin, last_key);
    exact_rows<D, KG, kTile>(static_cast<const float*>(q), D, static_cast<const float*>(k), D,
                             static_cast<const float*>(v), D, o, D, lse, rows, s0, shift, key_begin, last_key, causal,
                             scale, part_o, part_ml, ml_pitch);
    if (part_o != nullptr) return;  // the partials are float
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < D; ++c) ob[std::int64_t(r) * o_ss + c] = ::lockstep::from_float<T>(o[std::size_t(r) * D + c]);
  }
};
#else
struct ExactRows {
  static constexpr bool kRowMajorExact = false;
};
#endif

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
