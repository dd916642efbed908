// Memory: per-chunk loads and stores with fast paths for the patterns SPMD kernels produce, and
// CpuExec's loads, stores and asynchronous copies of lanes.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

// ================================================================================================
// Memory: per-chunk access with fast paths for the patterns SPMD kernels produce.
// ================================================================================================
template <class T>
using mem_tag_t = std::conditional_t<std::is_same_v<T, float>, DF, DI>;

// Each lane's offset and whether it is active (0 or -1), as arrays: the per-lane paths.
LS_INLINE void stage_lanes(const VI& o, const VM& m, std::int32_t* off, std::int32_t* act) {
  hn::Store(o.v, DI(), off);
  hn::Store(hn::VecFromMask(DI(), m.m), DI(), act);
}

// Loads kL lanes from base[o[i]] where m[i]; other lanes get `fallback`. Contiguous offsets
// become one vector load, equal offsets a broadcast; masked-off lanes are never read.
template <class T>
LS_INLINE chunk_t<T> load_chunk(const T* base, const VI& o, const VM& m, T fallback) {
  const mem_tag_t<T> d;
  const std::int32_t o0 = hn::GetLane(o.v);
  if (hn::AllTrue(DI(), m.m)) {
    if (hn::AllTrue(DI(), hn::Eq(o.v, hn::Add(LS_IOTA(), hn::Set(DI(), o0))))) return chunk_t<T>(hn::LoadU(d, base + o0));
    if (hn::AllTrue(DI(), hn::Eq(o.v, hn::Set(DI(), o0)))) return chunk_t<T>(hn::Set(d, base[o0]));
    return chunk_t<T>(hn::GatherIndex(d, base, o.v));
  }
  if (hn::AllFalse(DI(), m.m)) return chunk_t<T>(fallback);
  alignas(64) std::int32_t off[kL], act[kL];
  alignas(64) T out[kL];
  stage_lanes(o, m, off, act);
  for (int i = 0; i < kL; ++i) out[i] = act[i] ? base[off[i]] : fallback;
  return chunk_t<T>(hn::Load(d, out));
}

// Stores kL lanes to base[o[i]] where m[i], in lane order (a later lane wins on equal offsets,
// which a race-free kernel never has).
template <class T>
LS_INLINE void store_chunk(T* base, const VI& o, const chunk_t<T>& v, const VM& m) {
  const mem_tag_t<T> d;
  const std::int32_t o0 = hn::GetLane(o.v);
  const bool contiguous = hn::AllTrue(DI(), hn::Eq(o.v, hn::Add(LS_IOTA(), hn::Set(DI(), o0))));
  if (contiguous && hn::AllTrue(DI(), m.m)) {
    hn::StoreU(v.v, d, base + o0);
    return;
  }
  if (hn::AllFalse(DI(), m.m)) return;
  if (hn::CountTrue(DI(), m.m) == 1) {  // e.g. one lane per row group writes a row's result
    const std::size_t i = static_cast<std::size_t>(hn::FindFirstTrue(DI(), m.m));
    base[hn::ExtractLane(o.v, i)] = hn::ExtractLane(v.v, i);
    return;
  }
  alignas(64) std::int32_t off[kL], act[kL];
  alignas(64) T val[kL];
  stage_lanes(o, m, off, act);
  hn::Store(v.v, d, val);
  for (int i = 0; i < kL; ++i)
    if (act[i]) base[off[i]] = val[i];
}

// True when every lane is active and lane i's quad starts at o0 + 4 i (one dense run).
LS_INLINE bool quads_contiguous(const VI& o, const VM& m, std::int32_t o0) {
  return hn::AllTrue(DI(), m.m) &&
         hn::AllTrue(DI(), hn::Eq(o.v, hn::Add(hn::Set(DI(), o0), hn::ShiftLeft<2>(LS_IOTA()))));
}

// A storage format's codes (lockstep/formats.hpp) as float lanes: each active lane's code through
// the format's own conversion, the code every backend runs.
template <class S, class O, class M>
struct LoadFormatNode {
  static constexpr bool kLaneExpr = true;
  using value_type = float;
  const S* base;
  O off;
  M mask;
  float fallback;
  LS_INLINE chunk_t<float> eval(int c) const {
    alignas(64) std::int32_t o[kL], act[kL];
    alignas(64) float out[kL];
    stage_lanes(off.eval(c), mask.eval(c), o, act);
    for (int i = 0; i < kL; ++i) out[i] = act[i] ? ::lockstep::to_float(base[o[i]]) : fallback;
    return chunk_t<float>(hn::Load(DF(), out));
  }
};

template <class T, class O, class M>
struct LoadNode {
  static constexpr bool kLaneExpr = true;
  using value_type = T;
  const T* base;
  O off;
  M mask;
  T fallback;
  LS_INLINE chunk_t<T> eval(int c) const {
    return load_chunk<T>(base, off.eval(c), mask.eval(c), fallback);
  }
};

// A per-thread group of four consecutive values (CUDA float4/int4).
template <class L>
struct Quad {
  L x, y, z, w;
};

// ================================================================================================
// LaneMemory: CpuExec's loads, stores and asynchronous copies of lanes (x.load, x.store4,
// x.copy4_async, ...).
// ================================================================================================
template <int PW>
class LaneMemory {
  template <class T>
  using Lanes = LaneArray<T, PW>;

 public:
  // --- global and shared memory ---
  // One value every thread reads (a block-uniform scalar, e.g. a sequence length).
  template <class T>
  T load_uniform(const T* p) const {
    return *p;
  }
  template <class T, LaneExpr O>
  LS_INLINE auto load(const T* base, O&& off) const {
    return LoadNode<T, hold_t<O&&>, Scalar<bool>>{base, std::forward<O>(off), {true}, T{}};
  }
  template <class T, LaneExpr O, class M>
  LS_INLINE auto load(const T* base, O&& off, M&& mask, T fallback) const {
    return LoadNode<T, hold_t<O&&>, decltype(wrap<bool>(std::forward<M>(mask)))>{
        base, std::forward<O>(off), wrap<bool>(std::forward<M>(mask)), fallback};
  }
  // Storage formats (lockstep/formats.hpp): a load widens each code to float, a store rounds
  // each float to the format.
  template <class S, LaneExpr O>
    requires is_format_v<S>
  LS_INLINE auto load(const S* base, O&& off) const {
    return LoadFormatNode<S, hold_t<O&&>, Scalar<bool>>{base, std::forward<O>(off), {true}, 0.0f};
  }
  template <class S, LaneExpr O, class M>
    requires is_format_v<S>
  LS_INLINE auto load(const S* base, O&& off, M&& mask, float fallback) const {
    return LoadFormatNode<S, hold_t<O&&>, decltype(wrap<bool>(std::forward<M>(mask)))>{
        base, std::forward<O>(off), wrap<bool>(std::forward<M>(mask)), fallback};
  }
  template <class S, LaneExpr O, class V, class M>
    requires is_format_v<S>
  void store(S* base, O&& off, V&& val, M&& mask) const {
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& v = wrap<float>(std::forward<V>(val));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    for (int c = 0; c < PW / kL; ++c) {
      alignas(64) std::int32_t oo[kL], act[kL];
      alignas(64) float vv[kL];
      stage_lanes(o.eval(c), m.eval(c), oo, act);
      hn::Store(v.eval(c).v, DF(), vv);
      for (int i = 0; i < kL; ++i)
        if (act[i]) base[oo[i]] = ::lockstep::from_float<S>(vv[i]);
    }
  }
  template <class S, LaneExpr O, class V>
    requires is_format_v<S>
  void store(S* base, O&& off, V&& val) const {
    store(base, std::forward<O>(off), std::forward<V>(val), true);
  }
  template <class T, LaneExpr O, class V>
  LS_INLINE void store(T* base, O&& off, V&& val) const {
    store(base, std::forward<O>(off), std::forward<V>(val), true);
  }
  template <class T, LaneExpr O, class V, class M>
  LS_INLINE void store(T* base, O&& off, V&& val, M&& mask) const {
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& v = wrap<T>(std::forward<V>(val));
    const auto& m = wrap<bool>(std::forward<M>(mask));
#pragma GCC unroll 4
    for (int c = 0; c < PW / kL; ++c) store_chunk<T>(base, o.eval(c), v.eval(c), m.eval(c));
  }
  // Four consecutive values per thread from base[off .. off+3] (off a multiple of 4: CUDA's
  // 16-byte vector load). Contiguous quads become de-interleaving vector loads.
  template <class T, LaneExpr O, class M>
  Quad<Lanes<T>> load4(const T* base, O&& off, M&& mask) const {
    Quad<Lanes<T>> q;
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    const mem_tag_t<T> d;
    for (int c = 0; c < PW / kL; ++c) {
      const VI oc = o.eval(c);
      const VM mc = m.eval(c);
      const std::int32_t o0 = hn::GetLane(oc.v);
      // Contiguous quads are de-interleaved straight from memory; gathered ones (e.g. the rows of
      // a swizzled tile) first by one 16-byte copy per lane into a staging array, which is
      // cheaper than four gathers.
      alignas(64) T staged[4 * kL];
      const T* quads = nullptr;
      if (quads_contiguous(oc, mc, o0)) {
        quads = base + o0;
      } else if (hn::AllTrue(DI(), mc.m) && !hn::AllTrue(DI(), hn::Eq(oc.v, hn::Set(DI(), o0)))) {
        alignas(64) std::int32_t offs[kL];
        hn::Store(oc.v, DI(), offs);
        for (int i = 0; i < kL; ++i) std::memcpy(staged + 4 * i, base + offs[i], 4 * sizeof(T));
        quads = staged;
      }
      if (quads != nullptr) {
        hn::Vec<mem_tag_t<T>> a, b, e, f;
        hn::LoadInterleaved4(d, quads, a, b, e, f);
        hn::Store(a, d, q.x.data() + c * kL);
        hn::Store(b, d, q.y.data() + c * kL);
        hn::Store(e, d, q.z.data() + c * kL);
        hn::Store(f, d, q.w.data() + c * kL);
      } else {
        // Each of the four values as a lane load of its own: broadcast or masked (load_chunk's
        // paths; masked-off lanes get zeros and are never read).
        hn::Store(load_chunk<T>(base, oc, mc, T{}).v, d, q.x.data() + c * kL);
        hn::Store(load_chunk<T>(base + 1, oc, mc, T{}).v, d, q.y.data() + c * kL);
        hn::Store(load_chunk<T>(base + 2, oc, mc, T{}).v, d, q.z.data() + c * kL);
        hn::Store(load_chunk<T>(base + 3, oc, mc, T{}).v, d, q.w.data() + c * kL);
      }
    }
    return q;
  }
  template <class T, LaneExpr O>
  Quad<Lanes<T>> load4(const T* base, O&& off) const {
    return load4(base, std::forward<O>(off), true);
  }
  // Four consecutive codes of a storage format per thread, each widened to float by the
  // format's conversion (masked-off lanes: zeros, nothing read).
  template <class S, LaneExpr O, class M>
    requires is_format_v<S>
  Quad<Lanes<float>> load4(const S* base, O&& off, M&& mask) const {
    Quad<Lanes<float>> q;
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    float* out[4] = {q.x.data(), q.y.data(), q.z.data(), q.w.data()};
    for (int c = 0; c < PW / kL; ++c) {
      alignas(64) std::int32_t offs[kL], act[kL];
      stage_lanes(o.eval(c), m.eval(c), offs, act);
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < kL; ++i) out[k][c * kL + i] = act[i] ? ::lockstep::to_float(base[offs[i] + k]) : 0.0f;
    }
    return q;
  }
  template <class S, LaneExpr O>
    requires is_format_v<S>
  Quad<Lanes<float>> load4(const S* base, O&& off) const {
    return load4(base, std::forward<O>(off), true);
  }
  template <class T, LaneExpr O, class M>
  void store4(T* base, O&& off, const Quad<Lanes<T>>& q, M&& mask) const {
    const auto& o = wrap<std::int32_t>(std::forward<O>(off));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    const mem_tag_t<T> d;
    for (int c = 0; c < PW / kL; ++c) {
      const VI oc = o.eval(c);
      const VM mc = m.eval(c);
      const std::int32_t o0 = hn::GetLane(oc.v);
      if (quads_contiguous(oc, mc, o0)) {
        hn::StoreInterleaved4(hn::Load(d, q.x.data() + c * kL), hn::Load(d, q.y.data() + c * kL),
                              hn::Load(d, q.z.data() + c * kL), hn::Load(d, q.w.data() + c * kL),
                              d, base + o0);
      } else {
        // Interleaved into a staging array, then one 16-byte copy per active lane (in lane
        // order: a later lane wins on equal offsets, which a race-free kernel never has).
        alignas(64) std::int32_t off[kL], act[kL];
        alignas(64) T staged[4 * kL];
        stage_lanes(oc, mc, off, act);
        hn::StoreInterleaved4(hn::Load(d, q.x.data() + c * kL), hn::Load(d, q.y.data() + c * kL),
                              hn::Load(d, q.z.data() + c * kL), hn::Load(d, q.w.data() + c * kL),
                              d, staged);
        for (int i = 0; i < kL; ++i)
          if (act[i]) std::memcpy(base + off[i], staged + 4 * i, 4 * sizeof(T));
      }
    }
  }
  template <class T, LaneExpr O>
  void store4(T* base, O&& off, const Quad<Lanes<T>>& q) const {
    store4(base, std::forward<O>(off), q, true);
  }

  // --- asynchronous copies and overlapped launches: done at once / nothing to wait for --------
  // The CPU runs a block's statements in order and a stream's kernels one after another, so an
  // asynchronous copy is an ordinary copy (zeros where the mask is false) and the waits are
  // empty (backends/cuda/exec/memory.cuh has the GPU's meaning). A chunk of lanes whose quads form
  // one dense run at both ends, every lane active (a tile row of the decode ring), is copied as
  // a block, without de-interleaving it into lanes and back.
  template <class T, LaneExpr DO, LaneExpr SO, class M>
  void copy4_async(T* dst, DO&& doff, const T* src, SO&& soff, M&& mask) const {
    const auto& od = wrap<std::int32_t>(std::forward<DO>(doff));
    const auto& os = wrap<std::int32_t>(std::forward<SO>(soff));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    const mem_tag_t<T> d;
    for (int c = 0; c < PW / kL; ++c) {
      const VI dc = od.eval(c), sc = os.eval(c);
      const VM mc = m.eval(c);
      const std::int32_t d0 = hn::GetLane(dc.v), s0 = hn::GetLane(sc.v);
      if (quads_contiguous(dc, mc, d0) && quads_contiguous(sc, mc, s0)) {
        for (int k = 0; k < 4; ++k) hn::StoreU(hn::LoadU(d, src + s0 + k * kL), d, dst + d0 + k * kL);
        continue;
      }
      alignas(64) std::int32_t doffs[kL], soffs[kL], act[kL];
      hn::Store(dc.v, DI(), doffs);
      hn::Store(sc.v, DI(), soffs);
      hn::Store(hn::VecFromMask(DI(), mc.m), DI(), act);
      for (int i = 0; i < kL; ++i)
        for (int k = 0; k < 4; ++k) dst[doffs[i] + k] = act[i] ? src[soffs[i] + k] : T{};
    }
  }
  // As copy4_async: the GPU's L2 policies have no meaning here (backends/cuda/exec/memory.cuh).
  std::uint64_t l2_policy(int /*which*/) const { return 0; }
  template <class T, LaneExpr DO, LaneExpr SO, class M>
  void copy4_async_stream(T* dst, DO&& doff, const T* src, SO&& soff, M&& mask, std::uint64_t /*policy*/) const {
    copy4_async(dst, std::forward<DO>(doff), src, std::forward<SO>(soff), std::forward<M>(mask));
  }
  // As copy4_async, but lanes whose mask is false write nothing (backends/cuda/exec/memory.cuh).
  template <class T, LaneExpr DO, LaneExpr SO, class M>
  void copy4_async_some(T* dst, DO&& doff, const T* src, SO&& soff, M&& mask) const {
    const auto& od = wrap<std::int32_t>(std::forward<DO>(doff));
    const auto& os = wrap<std::int32_t>(std::forward<SO>(soff));
    const auto& m = wrap<bool>(std::forward<M>(mask));
    for (int c = 0; c < PW / kL; ++c) {
      const VM mc = m.eval(c);
      if (hn::AllFalse(DI(), mc.m)) continue;
      alignas(64) std::int32_t doffs[kL], soffs[kL], act[kL];
      hn::Store(od.eval(c).v, DI(), doffs);
      hn::Store(os.eval(c).v, DI(), soffs);
      hn::Store(hn::VecFromMask(DI(), mc.m), DI(), act);
      for (int i = 0; i < kL; ++i)
        if (act[i])
          for (int k = 0; k < 4; ++k) dst[doffs[i] + k] = src[soffs[i] + k];
    }
  }
  void async_commit() const {}
  template <int P>
  void async_wait() const {}
};

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
