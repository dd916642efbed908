#pragma once
// Layout kernels: strided 3-D copies (interleaved <-> batched head layouts, extract one head,
// copy one head back) and the batched 2-D transpose. Pure data movement: bitwise by construction.

#include "lockstep/kernels/act.hpp"

namespace lockstep::kernels {

// out[a*oa + b*ob + c] = in[a*ia + b*ib + c] for a < A, b < B, c < C (the last dimension is
// contiguous on both sides). Grid: x over B in groups of 8 rows (one warp per row), y and z
// over A (a = y + z * gridDim.y). Elements are floats, or with in_format / out_format
// (kernels/act.hpp) half or bfloat16 on either side: each value widened exactly, then rounded
// once to the output's format (multi-head attention's format copies).
struct Copy3DParams {
  const void* in;
  void* out;
  std::int64_t A, B, C;
  std::int64_t ia, ib;
  std::int64_t oa, ob;
  std::int32_t in_format = kActF32, out_format = kActF32;
};

struct Copy3D {
  static constexpr const char* kName = "copy3d";
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / kWarpSize;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = Copy3DParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t a = std::int64_t{x.block_y()} + std::int64_t{x.block_z()} * x.grid_y();
    if (a >= p.A) return;  // block-uniform
    const std::int64_t b0 = std::int64_t{x.block_x()} * kRowsPerBlock;
    const int live = static_cast<int>(imin(p.B - b0, kRowsPerBlock));
    const int C = static_cast<int>(p.C);
    const I lane = x.lane();
    const B row_ok = x.warp() < live;
    if (p.in_format != kActF32 || p.out_format != kActF32) {  // block-uniform: widen, round once
      const void* in = act_at(p.in, p.in_format, a * p.ia + b0 * p.ib);
      void* out = act_at(p.out, p.out_format, a * p.oa + b0 * p.ob);
      const I in_row = x.warp() * static_cast<int>(p.ib) + lane;
      const I out_row = x.warp() * static_cast<int>(p.ob) + lane;
      for (int c = 0; c < C; c += kWarpSize) {
        const B ok = row_ok & (lane < C - c);
        store_act(x, out, p.out_format, 0, out_row + c, load_act(x, in, p.in_format, in_row + c, ok), ok);
      }
      return;
    }
    const float* in = static_cast<const float*>(p.in) + a * p.ia + b0 * p.ib;
    float* out = static_cast<float*>(p.out) + a * p.oa + b0 * p.ob;
    const bool quads = ((C | p.ia | p.ib | p.oa | p.ob) & 3) == 0 &&
                       ((reinterpret_cast<std::uintptr_t>(in) | reinterpret_cast<std::uintptr_t>(out)) & 15) == 0;
    if (quads) {  // 16-byte vectors: each lane moves 4 consecutive floats
      const I in_row = x.warp() * static_cast<int>(p.ib) + lane * 4;
      const I out_row = x.warp() * static_cast<int>(p.ob) + lane * 4;
      for (int c = 0; c < C; c += 4 * kWarpSize) {
        const B ok = row_ok & (lane * 4 < C - c);
        x.store4(out, out_row + c, x.load4(in, in_row + c, ok), ok);
      }
      return;
    }
    const I in_row = x.warp() * static_cast<int>(p.ib) + lane;
    const I out_row = x.warp() * static_cast<int>(p.ob) + lane;
    for (int c = 0; c < C; c += kWarpSize) {
      const B ok = row_ok & (lane < C - c);
      x.store(out, out_row + c, x.load(in, in_row + c, ok, 0.0f), ok);
    }
  }
};

// out[b][c][r] = in[b][r][c] for in [batch, R, C]; 32x32 tiles through shared memory (one padding
// column, so the transposed reads do not conflict on banks). Grid: (ceil(C/32), ceil(R/32),
// batch).
struct TransposeParams {
  const float* in;
  float* out;
  std::int64_t batch, R, C;
};

struct Transpose {
  static constexpr const char* kName = "transpose";
  static constexpr int kThreads = 256;
  static constexpr int kTile = 32;
  static constexpr std::size_t kSharedBytes = kTile * (kTile + 1) * sizeof(float);
  using Params = TransposeParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    float* tile = x.template shared<float>(kTile * (kTile + 1));
    const std::int64_t c0 = std::int64_t{x.block_x()} * kTile;
    const std::int64_t r0 = std::int64_t{x.block_y()} * kTile;
    const std::int64_t mat = std::int64_t{x.block_z()} * p.R * p.C;
    const float* in = p.in + mat + r0 * p.C + c0;
    float* out = p.out + mat + c0 * p.R + r0;
    const int rows = static_cast<int>(imin(p.R - r0, kTile));
    const int cols = static_cast<int>(imin(p.C - c0, kTile));
    const I tx = x.lane();
    const I ty = x.warp();
    const int C = static_cast<int>(p.C), R = static_cast<int>(p.R);
    for (int k = 0; k < kTile; k += 8) {
      const B ok = (ty + k < rows) & (tx < cols);
      x.store(tile, (ty + k) * (kTile + 1) + tx, x.load(in, (ty + k) * C + tx, ok, 0.0f));
    }
    x.sync();
    for (int k = 0; k < kTile; k += 8) {
      const B ok = (ty + k < cols) & (tx < rows);
      x.store(out, (ty + k) * R + tx, x.load(tile, tx * (kTile + 1) + ty + k), ok);
    }
  }
};

}  // namespace lockstep::kernels
