#pragma once
// Applies one math function elementwise: out[i] = f(in[i]), or f(bits(first + i)) when `in` is
// null (exhaustive sweeps over float bit patterns without an input buffer). Used by the accuracy
// tool (docs/numerics.md) and the cross-backend harness. Every function is the strict math of
// math.hpp except kExp2Tc, the tensor-core softmax's exp2, whose bits differ between backends by
// design (Note [hardware exp2 on the tensor-core path]): never compared bitwise. kHalfPair and
// kStoreHalf are not math.hpp's: they run the context's own fp16 rounding of the tensor-core
// paths (CUDA: __floats2half2_rn for P, __float2half_rn for K and V; the CPU: math::half_bits_rn),
// each x rounded twice into one word, (h << 16) | h as a float's bits, so that tests compare the
// CUDA intrinsics with math::half_bits_rn over every float (docs/numerics.md).

#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

enum class MathFn : std::int32_t {
  kExp = 0, kExp2, kLog, kSin, kCos, kRoundHalf, kExp2Weight, kExp2Tc, kHalfPair, kStoreHalf, kCount
};

struct MathEvalParams {
  const float* in;  // may be null
  float* out;
  std::int64_t n;
  std::uint32_t first_bits;
  MathFn fn;
};

struct MathEval {
  static constexpr const char* kName = "math_eval";
  static constexpr int kThreads = 256;
  static constexpr int kPerBlock = kThreads * 4;
  using Params = MathEvalParams;

  template <class X, class V>
  LOCKSTEP_HD static auto apply(X& x, MathFn fn, const V& v) {
    using F = typename X::template Lanes<float>;
    F r;
    switch (fn) {  // block-uniform
      case MathFn::kExp: r = x.exp(v); break;
      case MathFn::kExp2: r = x.exp2(v); break;
      case MathFn::kLog: r = x.log(v); break;
      case MathFn::kSin: r = x.sin(v); break;
      case MathFn::kCos: r = x.cos(v); break;
      case MathFn::kExp2Weight: r = x.exp2_weight(v); break;
      case MathFn::kExp2Tc: r = x.exp2_tc(v); break;  // not strict on CUDA (fused/mma_sync.hpp)
      case MathFn::kHalfPair: r = x.as_float(x.pack_half2(v, v)); break;
      default: r = x.round_to_half(v); break;
    }
    return r;
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t start = std::int64_t{x.block_x()} * kPerBlock;
    const int count = static_cast<int>(imin(p.n - start, kPerBlock));
    float* out = p.out + start;
    for (int j = 0; j < kPerBlock; j += kThreads) {
      const I off = x.thread() + j;
      const B ok = off < count;
      F v;
      if (p.in != nullptr) {
        v = x.load(p.in + start, off, ok, 0.0f);
      } else {
        const auto first = static_cast<std::int32_t>(p.first_bits + static_cast<std::uint32_t>(start));
        v = x.as_float(off + first);
      }
      if (p.fn == MathFn::kStoreHalf) {  // block-uniform: both halves of out[i] by store_half
        auto* h = reinterpret_cast<typename X::half_t*>(out);
        x.store_half(h, off * 2, v, ok);
        x.store_half(h, off * 2 + 1, v, ok);
      } else {
        x.store(out, off, apply(x, p.fn, v), ok);
      }
    }
  }
};

}  // namespace lockstep::kernels
