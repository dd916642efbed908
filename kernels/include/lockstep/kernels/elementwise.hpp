#pragma once
// Elementwise scale: out[i] = in[i] * scale (in place allowed).
//
// Each block owns 1024 consecutive elements; a full block moves them as one 16-byte vector per
// thread (float4 on CUDA, de-interleaving vector loads on the CPU), the last block goes element by
// element. One multiply per element, so the result does not depend on the split.

#include <type_traits>

#include "lockstep/formats.hpp"
#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

struct ScaleParams {
  const float* in;
  float* out;
  std::int64_t n;
  float scale;
};

struct Scale {
  static constexpr const char* kName = "scale";
  static constexpr int kThreads = 256;
  static constexpr int kPerBlock = kThreads * 4;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = ScaleParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t start = std::int64_t{x.block_x()} * kPerBlock;
    const int count = static_cast<int>(imin(p.n - start, kPerBlock));
    const float* in = p.in + start;
    float* out = p.out + start;
    // Vector path: needs 16-byte aligned rows (allocation bases are, start is a multiple of 1024).
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(in) | reinterpret_cast<std::uintptr_t>(out)) & 15) == 0;
    if (count == kPerBlock && aligned) {
      const I off = x.thread() * 4;
      auto q = x.load4(in, off);
      q.x = q.x * p.scale;
      q.y = q.y * p.scale;
      q.z = q.z * p.scale;
      q.w = q.w * p.scale;
      x.store4(out, off, q);
    } else {
      for (int j = 0; j < kPerBlock; j += kThreads) {
        const I off = x.thread() + j;
        const B ok = off < count;
        x.store(out, off, x.load(in, off, ok, 0.0f) * p.scale, ok);
      }
    }
  }
};

// out[i] = in[i] converted between float and a storage format (lockstep/formats.hpp): In or Out
// is float, the other a format. Each element through the format's conversion (loads widen, stores
// round), so the bytes are the same on every backend. 1024 elements per block.
template <class In, class Out>
struct ConvertParams {
  const In* in;
  Out* out;
  std::int64_t n;
};
template <class In, class Out>
struct Convert {
  static_assert((std::is_same_v<In, float> && is_format_v<Out>) || (is_format_v<In> && std::is_same_v<Out, float>),
                "Convert: float to a storage format or back");
  static constexpr const char* kName = "convert";
  static constexpr int kThreads = 256;
  static constexpr int kPerBlock = kThreads * 4;
  static constexpr bool kWarpIndependent = true;
  using Params = ConvertParams<In, Out>;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t start = std::int64_t{x.block_x()} * kPerBlock;
    const int count = static_cast<int>(imin(p.n - start, kPerBlock));
    const In* in = p.in + start;
    Out* out = p.out + start;
    for (int j = 0; j < kPerBlock; j += kThreads) {
      const I off = x.thread() + j;
      const B ok = off < count;
      x.store(out, off, x.load(in, off, ok, 0.0f), ok);
    }
  }
};

// out[i] = pattern (any 4-byte type, as bits): how the CUDA backend implements Buffer::fill.
struct Fill32Params {
  std::int32_t* out;
  std::int64_t n;
  std::int32_t pattern;
};

struct Fill32 {
  static constexpr const char* kName = "fill32";
  static constexpr int kThreads = 256;
  static constexpr int kPerBlock = kThreads * 8;
  using Params = Fill32Params;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    const std::int64_t start = std::int64_t{x.block_x()} * kPerBlock;
    const int count = static_cast<int>(imin(p.n - start, kPerBlock));
    std::int32_t* out = p.out + start;
    for (int j = 0; j < kPerBlock; j += kThreads) {
      const I off = x.thread() + j;
      x.store(out, off, p.pattern, off < count);
    }
  }
};

// Attention score scaling with an optional causal mask, for [batch, rows, cols] score matrices:
// out = in * scale, and -inf where causal and col > row + (cols - rows) (bottom-right aligned).
// Grid: x = batch * rows * segments of 1024 columns.
struct ScaleMaskParams {
  const float* in;
  float* out;
  std::int64_t batch, rows, cols;
  float scale;
  std::int32_t causal;
};

struct ScaleMask {
  static constexpr const char* kName = "scale_mask";
  static constexpr int kThreads = 256;
  static constexpr int kSegment = 1024;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = ScaleMaskParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t segs = ceil_div(p.cols, kSegment);
    const std::int64_t row = std::int64_t{x.block_x()} / segs;   // over batch * rows
    const int seg = static_cast<int>(std::int64_t{x.block_x()} % segs);
    const std::int64_t i = row % p.rows;
    const int cols = static_cast<int>(p.cols);
    const int limit = static_cast<int>(i + (p.cols - p.rows));  // last visible column
    const float* in = p.in + row * p.cols;
    float* out = p.out + row * p.cols;
    for (int j = 0; j < kSegment; j += kThreads) {
      const I c = x.thread() + (seg * kSegment + j);
      const B ok = c < cols;
      const F v = x.load(in, c, ok, 0.0f) * p.scale;
      x.store(out, c, x.select((c > limit) & (p.causal != 0), -kInf, v), ok);
    }
  }
};

}  // namespace lockstep::kernels
