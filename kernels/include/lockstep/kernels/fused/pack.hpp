#pragma once
// The packing kernels: K and V rounded to fp16 (nearest even) as the tensor-core kernels read them.
//
// Note [tensor-core formats]
// The tensor-core kernels take q, k, v and out of one type In, a template parameter of each kernel
// (float, half or bfloat16; the host instantiates the call's), so no format branch runs in them.
// Their products are in the element format E = tc_elem_t<In> (common.hpp). E = half for float and
// half inputs: Q and the packed K and V are fp16 either way (a half input's round trip through
// float and back is its own code), so a half call gives the float call's bytes on the widened
// inputs, rounded. E = bfloat16 for bfloat16 inputs: the products are the tensor cores' bfloat16
// instructions (mma.sync and wgmma .bf16, the same fragment and shared-memory layouts), Q, K and V
// enter as given (widened and rounded back: their own codes; a NaN becomes 0x7fff), and P is
// rounded to bfloat16; the packing is then a copy into the kernels' layout. Every other step
// (softmax, rescale, output) is the same code in float, and the output is rounded once to In.
// (With the input format read at run time instead -- a branch in the Q loads, the packing and
// every output store -- the float kernels measured 2-6% slower on an H100 than before the formats
// existed; this form has not yet been timed.)

#include "lockstep/kernels/fused/common.hpp"

namespace lockstep::kernels {

// What a block of either packing kernel reads and writes: rows [s0, s0 + rows) of K and V for kv
// head hk of batch b (fp32, by their strides), and the int32 words of their fp16 copies from
// dst_words on (two halves per word).
struct HalfPackRows {
  const void* ks;  // in p.act_format: float or half
  const void* vs;
  std::int32_t* kd;
  std::int32_t* vd;
  int rows;
  LOCKSTEP_HD HalfPackRows(const FusedAttentionParams& p, int b, int hk, int s0, int block_rows, std::int64_t dst_words)
      : ks(act_at(p.k, p.act_format, b * p.k_sb + hk * p.k_sh + std::int64_t{s0} * p.k_ss)),
        vs(act_at(p.v, p.act_format, b * p.v_sb + hk * p.v_sh + std::int64_t{s0} * p.v_ss)),
        kd(static_cast<std::int32_t*>(p.k_half) + dst_words),
        vd(static_cast<std::int32_t*>(p.v_half) + dst_words),
        rows(static_cast<int>(imin(p.Skv - s0, block_rows))) {}
  // Four consecutive values of K (kv 0) or V (kv 1) at element off, widened from S (the kernels'
  // input type).
  template <class S, class X, class I, class B>
  LOCKSTEP_HD auto load4(X& x, int kv, const I& off, const B& ok) const {
    return x.load4(static_cast<const S*>(kv == 0 ? ks : vs), off, ok);
  }
};

// K and V rounded to fp16 (nearest even) into FusedAttentionWgmma's tiles (Note [wgmma products]):
// [B, Hkv, ceil(Skv / 64), 64 D] with each tile in the core-matrix layout, zeros past Skv. Grid:
// x = tile, y = Hkv, z = B; thread t writes 16-byte chunks t, t + 256, ... of the tile (16-byte
// chunk q holds key (q / D) 8 + q % 8, columns 8 ((q / 8) % (D / 8)) ..., eight halves), each
// with one 16-byte store.
template <int D, class In = float>
struct FusedHalfPackTiled {
  using E = tc_elem_t<In>;
  static constexpr const char* kName = "fused_attention_half_pack_tiled";
  static constexpr int kThreads = 256;
  static constexpr int kTile = 64;
  static constexpr std::size_t kSharedBytes = 0;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    pack_tile<kThreads>(x, p, x.block_z(), x.block_y(), x.block_x(), x.grid_x());
  }

  // Tile `tile` of the `tiles` of kv head hk in batch b, by a block of NT threads (also the
  // packing blocks of FusedAttentionWgmma: Note [packing blocks]).
  template <int NT, class X>
  LOCKSTEP_HD static void pack_tile(X& x, const Params& p, int b, int hk, int tile, int tiles) {
    const std::int64_t dst = ((std::int64_t{b} * p.Hkv + hk) * tiles + tile) * (kTile * D / 2);
    const HalfPackRows pr(p, b, hk, tile * kTile, kTile, dst);
    pack_tile_as<NT, In>(x, p, pr);
  }
  template <int NT, class S, class X>
  LOCKSTEP_HD static void pack_tile_as(X& x, const Params& p, const HalfPackRows& pr) {
    using I = typename X::template Lanes<lane_int>;
    constexpr int kChunks = kTile * D / 8 / NT;  // per thread
    static_assert(kChunks * NT * 8 == kTile * D, "whole chunks per thread");
    const int k_ss = static_cast<int>(p.k_ss), v_ss = static_cast<int>(p.v_ss);
    const I t = x.thread();
    // Every chunk's loads are issued before the first store (which the compiler may not move
    // loads past: the buffers could alias), so that the tile takes one round trip, not kChunks.
    using Q4 = decltype(pr.template load4<S>(x, 0, t, t < 0));
    Q4 kv[kChunks][4];
    LOCKSTEP_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const I q = t + i * NT;
      const I r = x.idiv(q, D) * 8 + (q & 7);
      const I c = ((q >> 3) - x.idiv(q >> 3, D / 8) * (D / 8)) * 8;
      const auto ok = r < pr.rows;
      kv[i][0] = pr.template load4<S>(x, 0, r * k_ss + c, ok);
      kv[i][1] = pr.template load4<S>(x, 0, r * k_ss + (c + 4), ok);
      kv[i][2] = pr.template load4<S>(x, 1, r * v_ss + c, ok);
      kv[i][3] = pr.template load4<S>(x, 1, r * v_ss + (c + 4), ok);
    }
    LOCKSTEP_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const I q = t + i * NT;
      x.store_words4(pr.kd, q * 4, x.pack2(kv[i][0].x, kv[i][0].y, E{}), x.pack2(kv[i][0].z, kv[i][0].w, E{}),
                     x.pack2(kv[i][1].x, kv[i][1].y, E{}), x.pack2(kv[i][1].z, kv[i][1].w, E{}));
      x.store_words4(pr.vd, q * 4, x.pack2(kv[i][2].x, kv[i][2].y, E{}), x.pack2(kv[i][2].z, kv[i][2].w, E{}),
                     x.pack2(kv[i][3].x, kv[i][3].y, E{}), x.pack2(kv[i][3].z, kv[i][3].w, E{}));
    }
  }
};

// K and V rounded to fp16 (nearest even) into the packed operands of FusedAttentionTensorCore:
// [B, Hkv, Skv, D] contiguous (p.k_half, p.v_half), read from p.k and p.v by their strides.
// Grid: x = ceil(Skv / 32), y = Hkv, z = B; a block converts 32 rows of K and of V.
template <int D, class In = float>
struct FusedHalfPack {
  using E = tc_elem_t<In>;
  static constexpr const char* kName = "fused_attention_half_pack";
  static constexpr int kThreads = 256;
  static constexpr int kRows = 32;
  static constexpr int kQuads = kRows * D / 4 / kThreads;  // per thread
  static_assert(kQuads * kThreads * 4 == kRows * D, "whole quads per thread");
  static constexpr std::size_t kSharedBytes = 0;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    const int b = x.block_z(), hk = x.block_y(), s0 = x.block_x() * kRows;
    const HalfPackRows pr(p, b, hk, s0, kRows, ((std::int64_t{b} * p.Hkv + hk) * p.Skv + s0) * (D / 2));
    run_as<In>(x, p, pr);
  }
  template <class S, class X>
  LOCKSTEP_HD static void run_as(X& x, const Params& p, const HalfPackRows& pr) {
    using I = typename X::template Lanes<lane_int>;
    const int rows = pr.rows;
    std::int32_t *kd = pr.kd, *vd = pr.vd;
    const I t = x.thread();
    LOCKSTEP_UNROLL
    for (int i = 0; i < kQuads; ++i) {
      const I q = t + i * kThreads;
      const I r = x.idiv(q, D / 4);
      const I c = (q - r * (D / 4)) * 4;
      const auto ok = r < rows;
      const auto kq = pr.template load4<S>(x, 0, r * static_cast<int>(p.k_ss) + c, ok);
      const auto vq = pr.template load4<S>(x, 1, r * static_cast<int>(p.v_ss) + c, ok);
      const I o = r * (D / 2) + (c >> 1);
      x.store(kd, o, x.pack2(kq.x, kq.y, E{}), ok);
      x.store(kd, o + 1, x.pack2(kq.z, kq.w, E{}), ok);
      x.store(vd, o, x.pack2(vq.x, vq.y, E{}), ok);
      x.store(vd, o + 1, x.pack2(vq.z, vq.w, E{}), ok);
    }
  }
};

}  // namespace lockstep::kernels
