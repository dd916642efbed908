// Cross-lane operations: CpuExec's shuffles and butterfly reductions within a warp, the same
// fixed trees as the CUDA instructions they stand for.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

template <int PW>
class CrossLane {
  template <class T>
  using Lanes = LaneArray<T, PW>;
  static constexpr int kWarps = PW / 32;

 public:
  // --- cross-lane operations --------------------------------------------------------------------
  // out[i] = v[i ^ k] for 0 < k < 32 (CUDA __shfl_xor_sync over the full warp).
  template <class E>
  Lanes<value_t<E>> shfl_xor(const E& e, int k) const {
    using T = value_t<E>;
    Lanes<T> in(e), out;
    xor_permute(in, out, k);
    return out;
  }
  // out[i] = v[warp_base(i) + src] (CUDA __shfl_sync with a uniform source lane).
  template <class E>
  Lanes<value_t<E>> shfl(const E& e, int src) const {
    using T = value_t<E>;
    Lanes<T> in(e), out;
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 32; ++i) out.set(w * 32 + i, in[w * 32 + src]);
    return out;
  }
  // Butterfly reductions over groups of W lanes (W = 32: the whole warp), the fixed tree:
  // offsets W/2, W/4, ..., 1, every lane combining its value with lane i ^ offset — exactly the
  // CUDA loop `v = op(v, __shfl_xor_sync(~0u, v, off))`.
  template <int W = 32, class E>
  Lanes<float> warp_sum(const E& e) const {
    return butterfly<W, OpAdd>(e);
  }
  template <int W = 32, class E>
  Lanes<float> warp_max(const E& e) const {
    return butterfly<W, OpMax>(e);
  }
  template <int W = 32, class E>
  Lanes<float> warp_min(const E& e) const {
    return butterfly<W, OpMin>(e);
  }

 private:
  template <int W, class Op, class E>
  Lanes<float> butterfly(const E& e) const {
    static_assert(W >= 2 && W <= 32 && (W & (W - 1)) == 0, "group width: a power of two <= 32");
    Lanes<float> v(e), t;
    for (int k = W / 2; k >= 1; k /= 2) {
      xor_permute(v, t, k);
      v = make_node<Op>(v, t);
    }
    return v;
  }
  template <class T>
  static void xor_permute(const Lanes<T>& in, Lanes<T>& out, int k) {
    using Tag = mem_tag_t<T>;
    const Tag d;
    if (k >= kL) {
      const int kc = k / kL;  // whole chunks swap places
      for (int c = 0; c < PW / kL; ++c)
        hn::Store(hn::Load(d, in.data() + (c ^ kc) * kL), d, out.data() + c * kL);
    } else {
      alignas(64) std::int32_t idx[kL];
      for (int i = 0; i < kL; ++i) idx[i] = i ^ k;
      const auto ind = hn::SetTableIndices(d, idx);
      for (int c = 0; c < PW / kL; ++c)
        hn::Store(hn::TableLookupLanes(hn::Load(d, in.data() + c * kL), ind), d,
                  out.data() + c * kL);
    }
  }
};

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
