#pragma once
// Elementwise scale: out[i] = in[i] * scale (in place allowed).
//
// Each block owns 1024 consecutive elements; a full block moves them as one 16-byte vector per
// thread (float4 on CUDA, de-interleaving vector loads on the CPU), the last block goes element by
// element. One multiply per element, so the result does not depend on the split.

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

}  // namespace lockstep::kernels
