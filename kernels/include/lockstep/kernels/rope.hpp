#pragma once
// Rotary position embedding on the device, NORM (adjacent pairs 2i, 2i+1) and NEOX (split halves
// i, i + d/2) styles, for Q and K of a batch in one launch.
//
// For pair i of a head at position pos: freq = 2^(-(2i/d) log2(theta)), angle = pos * freq,
// (a, b) -> (a cos - b sin, a sin + b cos), with the project's own exp2/sin/cos, so both backends
// give the same bits. The pair arithmetic does not depend on the style: NEOX of a vector equals
// NORM of its interleaved permutation, bit for bit.

#include "lockstep/kernels/decode/params.hpp"
#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

// Positions are below 2^20: the angle pos * freq (freq <= 1) stays where math::sin and math::cos
// are accurate (docs/numerics.md; beyond 2^24 their reduction gives meaningless values). rope()
// refuses larger positions.
inline constexpr std::int64_t kRopeMaxPosition = std::int64_t{1} << 20;

struct RopeParams {
  void* q;                       // [rows, Hq, D] (may be null), in act_format
  void* k;                       // [rows, Hk, D] (may be null)
  std::int32_t act_format;       // float, half or bfloat16 (Note [decode formats]): loads widen, stores round
  const std::int32_t* positions; // [rows]
  std::int32_t rows, Hq, Hk, D;
  std::int32_t neox;             // 0: NORM, 1: NEOX
  float log2_theta;              // log2(theta), computed with math::log2 on the host
  float inv_d;                   // 1 / D
};

// Grid: x = head (max(Hq, Hk)), y = row (loops past 65535), z = 0 for Q, 1 for K.
struct Rope {
  static constexpr const char* kName = "rope";
  static constexpr int kThreads = 128;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = RopeParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const bool is_k = x.block_z() == 1;
    void* base = is_k ? p.k : p.q;
    const int heads = is_k ? p.Hk : p.Hq;
    const int h = x.block_x();
    if (base == nullptr || h >= heads) return;
    const int half = p.D / 2;
    for (int r = x.block_y(); r < p.rows; r += x.grid_y()) {
      const int pos = x.load_uniform(p.positions + r);
      const std::int64_t v0 = (std::int64_t{r} * heads + h) * p.D;
      for (int i0 = 0; i0 < half; i0 += kThreads) {
        const I i = x.thread() + i0;
        const B ok = i < half;
        const I ia = x.select(p.neox != 0, i, i * 2);
        const I ib = x.select(p.neox != 0, i + half, i * 2 + 1);
        const F freq = x.exp2(-(x.to_float(i * 2) * p.inv_d) * p.log2_theta);
        const F angle = freq * static_cast<float>(pos);
        const F c = x.cos(angle), s = x.sin(angle);
        const void* v = act_at(base, p.act_format, v0);
        const F a = load_act(x, v, p.act_format, ia, ok), b = load_act(x, v, p.act_format, ib, ok);
        store_act(x, base, p.act_format, v0, ia, a * c - b * s, ok);
        store_act(x, base, p.act_format, v0, ib, a * s + b * c, ok);
      }
    }
  }
};

// y[i] += x[i] (the residual add of the demo's decode loop).
struct AddParams {
  const float* x;
  float* y;
  std::int64_t n;
};
struct Add {
  static constexpr const char* kName = "add";
  static constexpr int kThreads = 256;
  static constexpr int kPerBlock = 1024;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = AddParams;
  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t start = std::int64_t{x.block_x()} * kPerBlock;
    const int count = static_cast<int>(imin(p.n - start, kPerBlock));
    for (int j = 0; j < kPerBlock; j += kThreads) {
      const I off = x.thread() + j;
      const B ok = off < count;
      x.store(p.y + start, off, x.load(p.y + start, off, ok, 0.0f) + x.load(p.x + start, off, ok, 0.0f), ok);
    }
  }
};

}  // namespace lockstep::kernels
