#pragma once
// FusedAttentionTensorCore: fused attention on the tensor cores, the FlashAttention-2 schedule with
// S, P and O in registers and the products as PTX mma.sync.m16n8k16 on register fragments.

#include "lockstep/kernels/fused/common.hpp"

namespace lockstep::kernels {

// Note [register fragments]
// The products are PTX mma.sync.m16n8k16 (fp16 inputs, fp32 accumulation) on fragments whose
// lane layout PTX specifies (backends/cuda/exec/matrix.cuh: lane 4g + t holds rows g and g + 8,
// columns 2t and 2t + 1 of each 16x8 accumulator), so the kernel does the softmax on the
// accumulators where they are: a row's max and sum are reductions over the 4 lanes of a quad,
// the rescale of O is a multiply per register, and the S accumulator becomes the A fragment of
// P.V by packing pairs to fp16, without shared memory. Operands come from shared memory with
// ldmatrix (K as is for Q.K^T, V transposed for P.V); the CPU emulates the same layout exactly
// (backends/cpu/lanes/matrix.hpp), and each mma as in Note [tensor-core emulation].
//
// Note [fused tensor-core rounding points]
// K and V are rounded to fp16 (nearest even) by FusedHalfPack, Q as it enters shared memory;
// s = Q.K^T is accumulated in fp32 over head_dim in steps of 16 (one mma each). The softmax is in
// base 2 on the raw scores, FlashAttention-2's formulation: with m the row's reference max of s
// (Note [lazy rescale]) and c = scale * log2(e) rounded to fp32, mc = m * c (fp32) and the weight
// p = exp2_tc(fma(s, c, -mc)) (Note [hardware exp2 on the tensor-core path]); alpha = exp2_tc((m_old
// - m) * c) where m moved, else 1. The row sum l accumulates the fp32 p, per lane in key order and
// over the 4 lanes of a quad at the end; the output accumulator is first rescaled, o = o * alpha
// (fp32), then P.V adds into it in steps of 16 keys with p rounded to fp16. out = o / l;
// log-sum-exp = m * scale + log(l).
//
// Note [hardware exp2 on the tensor-core path]
// The weights' 2^y is x.exp2_tc: on CUDA one MUFU.EX2 (ex2.approx.ftz.f32: results below 2^-126
// flush to 0), on the CPU device the strict exp2_weight (math.hpp: 2.04 ulp, 0 below 2^-126.5).
// This is the one place where the two backends run different arithmetic on purpose: the
// tensor-core paths are not bitwise across backends anyway (Note [tensor-core emulation]; they are
// held to the tensor-core bound of the float64 oracle and to each other within it), and each weight
// is rounded to fp16 (2^-11) before P.V, so a weight error of a few 2^-24 moves P's bits for about
// one weight in a thousand. The strict polynomial cost 11 instructions per score on the issue-bound
// softmax (the hardware one 1, on the otherwise idle SFU pipe): 12-20% of the kernel.
// Exact and the decode kernels keep the strict exp (bitwise across backends). Bound: 3 ulp on the
// weights' domain [-126, 8] (harness math_ulp_bound, DeviceMath.Exp2TcIsWithinItsBoundOnTheWeightsDomain;
// docs/numerics.md has the measured figure); 2^0 = 1 and 2^-inf = 0 exactly, NaN stays NaN.
//
// Note [softmax max tree]
// A row's max over the tile (16 scores per lane at 64-key tiles) is on the path to every weight
// of the tile, and with three blocks of four warps per SM the kernel is latency-bound (Nsight
// Compute: 36% of issue slots busy, the most frequent stall a fixed-latency dependency). So the
// lane's max is a tree of max_num (depth 5, where the running max was a chain of 16), and the
// quad's a butterfly of max_num (one instruction per step, where math::max took six). Both give the
// same value as before in any order: max_num is exact and skips NaN (the tree has -inf at one
// leaf, so it is never NaN); only the sign of a zero maximum may differ between lanes or orders,
// and m enters the results only through fma(tmax, c, -m_old c), m c, fma(s, c, -m c),
// (m_old - m) c and m scale + log(l), where +0 and -0 give the same bits. So the outputs' bits
// are unchanged.
//
// Note [softmax output]
// ptxas serializes every product when ordinary instructions write a product's accumulator
// registers while another product is in flight (its C7515 advisory), so the wgmma kernel's
// softmax never writes S: its softmax_tile reads the scores from one array and writes the weights
// to another (the masked-tile path first writes the masked scores there). Copying S first (32
// moves per tile at head_dim 64 and 128) and working in place on the copy was 4-5% slower. The
// mma.sync kernel keeps the in-place form, whose accumulators are complete when it runs (the
// two-array form gave it two copies of the weights' code and a spill at head_dim 128, in its
// SASS). The same operations in the same order either way, so the same bits.
//
// Note [lazy rescale]
// FlashAttention-4's conditional rescaling: a row's reference max m moves to the tile's max only
// when the tile's largest weight against m would exceed 2^kLazyLog2 = 2^8 (fma(tmax, c, -m c) > 8,
// the weights' own argument, so the bound is exact; always from -inf, since c > 0: scale is 1 /
// sqrt(head_dim)). Otherwise the tile's weights are taken against the old m and reach up to 2^8
// (fp16 holds them; m never falls, so l stays below 2^8 times the keys seen), and alpha is exactly
// 1, so o and l keep every bit: on the GPU a warp none of whose rows moved skips the rescale (the
// 128 multiplies of o per thread and the weights of alpha) -- the same bits as multiplying by 1,
// which the CPU device does. Rows stay independent of each other (the decision is per row), so 64
// and 128 rows per block still give the same bytes. After the first tiles of a row, whose scores
// are spread by less than 2^8 in weight, the max rarely moves by that much.
//
// Schedule: a block of 4 warps owns 64 query rows of one (batch, head), warp w rows 16w .. 16w +
// 15; tiles of kTile keys (64; 32 at head_dim 256) of fp16 K and V in double buffers: tile j + 1
// arrives by cp.async while tile j is computed, one barrier per tile. M = 2: each warp owns two
// 16-row m-tiles (128 rows per block), which share every K and V fragment it loads. The rows'
// arithmetic is the same for either M (same bits). Grid: x = ceil(Sq / kRows), y = H, z = B.
// (Two groups of 4 warps per block taking turns on the tensor cores, FlashAttention-3's
// ping-pong on mma.sync, gave the same bytes and was slower.)
template <int D, int M = 1, class In = float>
struct FusedAttentionTensorCore {
  static_assert(std::is_same_v<In, float> || std::is_same_v<In, half> || std::is_same_v<In, bfloat16>,
                "inputs in float, half or bfloat16");
  using E = tc_elem_t<In>;  // the products' element format (Note [tensor-core formats])
  static_assert(D % 16 == 0 && D <= 256, "head_dim: a multiple of 16, at most 256");
  static_assert(M == 1 || (M == 2 && D <= 128), "two m-tiles per warp up to head_dim 128");
  static constexpr const char* kName = "fused_attention_tensor_core";
  static constexpr int kWarps = 4;
  static constexpr int kM = M;  // 16-row m-tiles per warp (they share each K and V fragment)
  static constexpr int kRows = 16 * kM * kWarps;  // query rows per block
  static constexpr int kThreads = kWarps * kWarpSize;
  // Blocks per SM that the register allocation must allow (CUDA launch bounds): as many as the
  // shared memory takes (ptxas's own choice at head_dim 128 is 229 registers: two blocks).
  static constexpr int kMinBlocks = M == 2 ? 2 : D <= 64 ? 4 : D <= 128 ? 3 : 1;
  static constexpr int kTile = D <= 128 ? 64 : 32;  // keys per tile
  static constexpr float kLazyLog2 = 8.0f;  // Note [lazy rescale]: weights up to 2^8 (fp16: 65504)
  static constexpr int kLd = D + 8;  // fp16 row pitch: rows 16 bytes apart mod 128, so ldmatrix
                                     // phases hit eight different bank groups
  static constexpr bool kQInRegs = D <= 128 && kM == 1;  // Q's fragments stay in registers
  // ... and then Q's shared tile is K's second buffer, free until tile 1 is issued (a smaller
  // block footprint: three blocks per SM at head_dim 128).
  static constexpr bool kQInKBuffer = kQInRegs && kRows <= kTile;
  static constexpr int kChunks = kTile * D / 8 / kThreads;  // 16-byte copies per thread per tile
  static_assert(kChunks * kThreads * 8 == kTile * D, "tile copies: whole chunks per thread");
  static constexpr std::size_t kSharedBytes =
      ((kQInKBuffer ? 0 : std::size_t(kRows) * kLd) + 4 * std::size_t(kTile) * kLd) * 2 + 3 * 32;
  static_assert(!kQInKBuffer || kRows <= kTile, "Q's tile fits in a K buffer");
  using Params = FusedAttentionParams;

  // Rows [0, keys) of a K or V tile from the packed fp16 operand (row pitch D) into shared memory
  // (pitch kLd); rows past `keys` are zeros (a zero row times p = 0 is 0, garbage could be NaN).
  template <class X, class T>
  LOCKSTEP_HD static void issue_tile(X& x, typename X::half_t* dst, const typename X::half_t* src,
                                     int keys, const T& t) {
    LOCKSTEP_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      const auto q = t + i * kThreads;
      const auto row = x.idiv(q, D / 8);
      const auto c = q - row * (D / 8);
      x.copy8h_async(dst, row * kLd + c * 8, src, row * D + c * 8, row < keys);
    }
  }

  // S = Q.K^T of one tile: 16 kM rows x kTile keys per warp.
  template <class X, class F, class I>
  LOCKSTEP_HD static void qk_tile(X& x, F (&s)[kM][kTile / 8][4], const I (&qf)[kQInRegs ? D / 16 : 1][4],
                                  const typename X::half_t* Qs, const I (&q_off)[kM],
                                  const typename X::half_t* Kt, const I& k_off) {
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int n = 0; n < kTile / 8; ++n)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.0f;
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
      I qa[kM][4];
      LOCKSTEP_UNROLL
      for (int mt = 0; mt < kM; ++mt) {
        if constexpr (kQInRegs) {
          LOCKSTEP_UNROLL
          for (int e = 0; e < 4; ++e) qa[mt][e] = qf[kk][e];
        } else {
          x.ldmatrix_x4(qa[mt], Qs, q_off[mt] + kk * 16);
        }
      }
      LOCKSTEP_UNROLL
      for (int np = 0; np < kTile / 16; ++np) {
        I kb[4];
        x.ldmatrix_x4(kb, Kt, k_off + np * 16 * kLd + kk * 16);
        LOCKSTEP_UNROLL
        for (int mt = 0; mt < kM; ++mt) {
          x.mma_16816(s[mt][2 * np], qa[mt], kb[0], kb[1], E{});
          x.mma_16816(s[mt][2 * np + 1], qa[mt], kb[2], kb[3], E{});
        }
      }
    }
  }

  // Online softmax of tile j (keys j0 .. j0 + keys - 1) on the accumulators (Note [register
  // fragments]), in base 2: a weight is 2^(s c - m c) with c = scale log2(e) (Note [fused
  // tensor-core rounding points]). S becomes the tile's weights (the second form reads the scores
  // from sc and writes the weights to s: Note [softmax output]); m, l and o are updated.
  template <class X, class F, class I>
  LOCKSTEP_HD static void softmax_tile(X& x, const Params& p, F (&s)[kM][kTile / 8][4], F (&m)[kM][2],
                                       F (&l)[kM][2], F (&o)[kM][D / 8][4], const I (&row0)[kM],
                                       const I& tq, int j0, int keys, int s0, int shift, float c2) {
    const bool masked = keys < kTile || (p.causal && j0 + kTile - 1 > s0 + shift);
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt) {
      if (masked) mask_tile(x, p, s[mt], s[mt], row0[mt], tq, j0, keys, s0, shift);
      weights(x, s[mt], s[mt], m[mt], l[mt], o[mt], c2);
    }
  }
  template <class X, class F, class I>
  LOCKSTEP_HD static void softmax_tile(X& x, const Params& p, const F (&sc)[kM][kTile / 8][4],
                                       F (&s)[kM][kTile / 8][4], F (&m)[kM][2], F (&l)[kM][2],
                                       F (&o)[kM][D / 8][4], const I (&row0)[kM], const I& tq, int j0,
                                       int keys, int s0, int shift, float c2) {
    const bool masked = keys < kTile || (p.causal && j0 + kTile - 1 > s0 + shift);
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt) {
      if (masked) {  // one block-uniform branch for the tile, not one per score
        mask_tile(x, p, sc[mt], s[mt], row0[mt], tq, j0, keys, s0, shift);
        weights(x, s[mt], s[mt], m[mt], l[mt], o[mt], c2);
      } else {
        weights(x, s[mt], sc[mt], m[mt], l[mt], o[mt], c2);
      }
    }
  }

  // softmax_tile's two-array form without o (one m-tile): true when o must be rescaled by alpha
  // before the tile's P.V (Note [deferred P.V wait]).
  template <class X, class F, class I>
  LOCKSTEP_HD static bool softmax_tile_alpha(X& x, const Params& p, const F (&sc)[1][kTile / 8][4],
                                             F (&s)[1][kTile / 8][4], F (&m)[1][2], F (&l)[1][2], F (&alpha)[2],
                                             const I (&row0)[1], const I& tq, int j0, int keys, int s0, int shift,
                                             float c2) {
    static_assert(kM == 1, "one m-tile");
    const bool masked = keys < kTile || (p.causal && j0 + kTile - 1 > s0 + shift);
    if (masked) {
      mask_tile(x, p, sc[0], s[0], row0[0], tq, j0, keys, s0, shift);
      return weights_alpha(x, s[0], s[0], m[0], l[0], alpha, c2);
    }
    return weights_alpha(x, s[0], sc[0], m[0], l[0], alpha, c2);
  }

  // A partial or causal tile's scores sc with the keys a row does not see set to -inf, into s.
  template <class X, class F, class I>
  LOCKSTEP_HD static void mask_tile(X& x, const Params& p, const F (&sc)[kTile / 8][4], F (&s)[kTile / 8][4],
                                    const I& row0, const I& tq, int j0, int keys, int s0, int shift) {
    // Key 2 tq + c of the tile is visible to row r when 2 tq + c < keys and (causal)
    // 2 tq + c + j0 <= r + s0 + shift: c < lim, one bound per row and thread.
    I lim[2];
    LOCKSTEP_UNROLL
    for (int h = 0; h < 2; ++h) {
      lim[h] = tq * -2 + keys;
      if (p.causal) {
        const I diag = row0 + (h * 8 + s0 + shift - j0 + 1) - tq * 2;
        lim[h] = x.select(diag < lim[h], diag, lim[h]);
      }
    }
    LOCKSTEP_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) s[n][e] = x.select(lim[e >> 1] > 8 * n + (e & 1), sc[n][e], -kInf);
  }

  // The softmax of one m-tile (softmax_tile): scores sc (masked), weights into w; o rescaled.
  template <class X, class F>
  LOCKSTEP_HD static void weights(X& x, F (&w)[kTile / 8][4], const F (&sc)[kTile / 8][4], F (&m)[2],
                                  F (&l)[2], F (&o)[D / 8][4], float c2) {
    weights_then(x, w, sc, m, l, c2, [&](const F (&alpha)[2]) { rescale_o(o, alpha); });
  }
  // o = o * alpha, the rescale that the softmax asked for.
  template <class F>
  LOCKSTEP_HD static void rescale_o(F (&o)[D / 8][4], const F (&alpha)[2]) {
    LOCKSTEP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) o[n][e] = o[n][e] * alpha[e >> 1];
  }
  // weights without o: true when o must be rescaled by alpha (then set) before the tile's P.V
  // adds to it (Note [deferred P.V wait]); false: alpha is 1 for every row of the warp (GPU only).
  template <class X, class F>
  LOCKSTEP_HD static bool weights_alpha(X& x, F (&w)[kTile / 8][4], const F (&sc)[kTile / 8][4], F (&m)[2],
                                        F (&l)[2], F (&alpha)[2], float c2) {
    return weights_then(x, w, sc, m, l, c2, [&](const F (&a)[2]) {
      alpha[0] = a[0];
      alpha[1] = a[1];
    });
  }
  // The softmax of one m-tile: weights into w, m and l updated; rescaled(alpha) where a row of
  // the warp moved its max (every time on the CPU device); returns whether it was called.
  template <class X, class F, class Rescaled>
  LOCKSTEP_HD static bool weights_then(X& x, F (&w)[kTile / 8][4], const F (&sc)[kTile / 8][4], F (&m)[2],
                                       F (&l)[2], float c2, Rescaled&& rescaled) {
    using B = typename X::template Lanes<bool>;
    // A lane's max of the tile by max_num (one instruction; a NaN score is skipped here and
    // reaches the row through its weight, exp2_tc(NaN) = NaN, so the row's output and
    // log-sum-exp are NaN all the same: FusedNanQueryRowGivesNanOutput), as a tree (Note
    // [softmax max tree]): -inf joins one leaf, so the max is never NaN.
    F mx[2];
    LOCKSTEP_UNROLL
    for (int h = 0; h < 2; ++h) {
      constexpr int kN = kTile / 8;  // the row's values in this lane: sc[n][2h], sc[n][2h + 1]
      F t[kN];
      LOCKSTEP_UNROLL
      for (int n = 0; n < kN; ++n) t[n] = x.max_num(sc[n][2 * h], sc[n][2 * h + 1]);
      t[kN - 1] = x.max_num(t[kN - 1], F(-kInf));
      LOCKSTEP_UNROLL
      for (int v = 1; v < kN; v *= 2)
        LOCKSTEP_UNROLL
        for (int n = 0; n + v < kN; n += 2 * v) t[n] = x.max_num(t[n], t[n + v]);
      mx[h] = t[0];
    }
    // Note [lazy rescale]: m moves only when the tile's max exceeds it by more than kLazyLog2.
    F m_old[2], mc[2];
    B moved[2];
    LOCKSTEP_UNROLL
    for (int h = 0; h < 2; ++h) {
      // Over the quad, by max_num too (never NaN: the lanes' maxima are not).
      F tmax = x.max_num(mx[h], x.shfl_xor(mx[h], 2));
      tmax = x.max_num(tmax, x.shfl_xor(tmax, 1));
      m_old[h] = m[h];
      // From m_old = -inf: +inf > 8, moved; a tile this row sees nothing of (tmax = -inf):
      // NaN or -inf, not moved, so a row that has seen nothing keeps m = -inf.
      moved[h] = x.fma(tmax, c2, -(m_old[h] * c2)) > kLazyLog2;
      m[h] = x.select(moved[h], tmax, m_old[h]);
      const B none = m[h] == -kInf;  // nothing visible yet in this row: every weight 0
      mc[h] = x.select(none, 0.0f, m[h] * c2);
    }
    F ls[2] = {F(0.0f), F(0.0f)};
    LOCKSTEP_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) {
        w[n][e] = x.exp2_tc(x.fma(sc[n][e], c2, -mc[e >> 1]));
        ls[e >> 1] = ls[e >> 1] + w[n][e];
      }
    // alpha = 2^((m_old - m) c) where m moved (0 from -inf), else exactly 1, and l * 1 = l,
    // o * 1 = o: a warp none of whose rows moved skips the rescale on the GPU, the same bits.
    bool rescale = true;
    if constexpr (!X::kIsCpu) rescale = x.warp_any(moved[0] | moved[1]);
    if (rescale) {
      F alpha[2];
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        // (m_old - m) c, not fma(m_old, c, -mc): -inf when m_old is, so alpha = 0 then.
        alpha[h] = x.select(moved[h], x.exp2_tc((m_old[h] - m[h]) * c2), 1.0f);
        l[h] = l[h] * alpha[h] + ls[h];
      }
      rescaled(alpha);
    } else {
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) l[h] = l[h] + ls[h];
    }
    return rescale;
  }

  // O += P.V of one tile: P's A fragments are the S accumulators of two n-tiles, packed to fp16.
  template <class X, class F, class I>
  LOCKSTEP_HD static void pv_tile(X& x, const F (&s)[kM][kTile / 8][4], F (&o)[kM][D / 8][4],
                                  const typename X::half_t* Vt, const I& v_off) {
    LOCKSTEP_UNROLL
    for (int kc = 0; kc < kTile / 16; ++kc) {
      I pa[kM][4];
      LOCKSTEP_UNROLL
      for (int mt = 0; mt < kM; ++mt) {
        pa[mt][0] = x.pack2(s[mt][2 * kc][0], s[mt][2 * kc][1], E{});
        pa[mt][1] = x.pack2(s[mt][2 * kc][2], s[mt][2 * kc][3], E{});
        pa[mt][2] = x.pack2(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1], E{});
        pa[mt][3] = x.pack2(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3], E{});
      }
      LOCKSTEP_UNROLL
      for (int dp = 0; dp < D / 16; ++dp) {
        I vb[4];
        x.ldmatrix_x4_trans(vb, Vt, v_off + kc * 16 * kLd + dp * 16);
        LOCKSTEP_UNROLL
        for (int mt = 0; mt < kM; ++mt) {
          x.mma_16816(o[mt][2 * dp], pa[mt], vb[0], vb[1], E{});
          x.mma_16816(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3], E{});
        }
      }
    }
  }

  // out = o / l; a fully masked row (l == 0) gives zeros and log-sum-exp -inf.
  template <class X, class F, class I>
  LOCKSTEP_HD static void store_rows(X& x, const Params& p, const FusedBlock& fb, const F (&o)[kM][D / 8][4],
                                     const F (&m)[kM][2], const F (&l)[kM][2], const I (&row0)[kM],
                                     const I& tq) {
    using B = typename X::template Lanes<bool>;
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        const F lt = x.template warp_sum<4>(l[mt][h]);
        const I row = row0[mt] + h * 8;
        const B live = row < fb.rows;
        const B empty = lt == 0.0f;
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 2; ++e)
            x.store(static_cast<In*>(fb.oa), row * fb.o_ss + (tq * 2 + (8 * n + e)),
                    x.select(empty, 0.0f, o[mt][n][h * 2 + e] / lt), live);
        if (p.lse != nullptr) {
          float* lrow = p.lse + (std::int64_t{fb.b} * p.H + fb.h) * p.Sq + fb.s0;
          x.store(lrow, row, x.select(empty, -kInf, m[mt][h] * p.scale + x.log(lt)), live & (tq == 0));
        }
      }
  }

  // The block's rows finished: store_rows, or with split keys (Note [split keys]) the block's
  // partial rows (o not divided, m, and the quad's l), then, in the last of the tile's S blocks
  // to arrive, the merge of the S partials in split order into out and lse.
  template <class X, class F, class I>
  LOCKSTEP_HD static void finish(X& x, const Params& p, const FusedBlock& fb, const F (&o)[kM][D / 8][4],
                                 const F (&m)[kM][2], const F (&l)[kM][2], const I (&row0)[kM], const I& tq) {
    if (fb.splits <= 1) return store_rows(x, p, fb, o, m, l, row0, tq);
    using B = typename X::template Lanes<bool>;
    const int S = fb.splits;
    const std::int64_t bh = std::int64_t{fb.b} * p.H + fb.h;
    // Split s's rows of this block: o at part_o(s) + row D, (m, l) at part_ml(s) + row 2.
    auto part_o = [&](int s) { return p.part + ((bh * S + s) * p.Sq + fb.s0) * D; };
    auto part_ml = [&](int s) { return p.part_ml + ((bh * S + s) * p.Sq + fb.s0) * 2; };
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        const F lt = x.template warp_sum<4>(l[mt][h]);
        const I row = row0[mt] + h * 8;
        const B live = row < fb.rows;
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 2; ++e) x.store(part_o(fb.split), row * D + (tq * 2 + (8 * n + e)), o[mt][n][h * 2 + e], live);
        x.store(part_ml(fb.split), row * 2, m[mt][h], live & (tq == 0));
        x.store(part_ml(fb.split), row * 2 + 1, lt, live & (tq == 0));
      }
    // A counter per 64 query rows, whatever the kernel's rows per block (s0 is a multiple of 64).
    const std::int64_t tiles_q = (std::int64_t{p.Sq} + 63) / 64;
    if (!x.signal_last(p.split_counters + bh * tiles_q + fb.s0 / 64, S)) return;
    // The last block: every split's partials are visible. Per row, M = the splits' largest max;
    // split s weighs 2^((m_s - M) c) (0 where it saw nothing: m_s = -inf); out = sum_s w_s o_s /
    // sum_s w_s l_s, summed in split order; a row no split saw anything of gives zeros, -inf.
    const float c2 = p.scale_log2;
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        const I row = row0[mt] + h * 8;
        const B live = row < fb.rows;
        F mx = F(-kInf);
        for (int s = 0; s < S; ++s) mx = x.max_num(mx, x.load(part_ml(s), row * 2, live, -kInf));
        F lt = F(0.0f);
        F acc[D / 8][2];
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n) {
          acc[n][0] = F(0.0f);
          acc[n][1] = F(0.0f);
        }
        for (int s = 0; s < S; ++s) {
          const F ms = x.load(part_ml(s), row * 2, live, -kInf);
          const F w = x.select(ms == -kInf, 0.0f, x.exp2_tc((ms - mx) * c2));
          lt = lt + w * x.load(part_ml(s), row * 2 + 1, live, 0.0f);
          LOCKSTEP_UNROLL
          for (int n = 0; n < D / 8; ++n)
            LOCKSTEP_UNROLL
            for (int e = 0; e < 2; ++e)
              acc[n][e] = acc[n][e] + w * x.load(part_o(s), row * D + (tq * 2 + (8 * n + e)), live, 0.0f);
        }
        const B empty = lt == 0.0f;
        LOCKSTEP_UNROLL
        for (int n = 0; n < D / 8; ++n)
          LOCKSTEP_UNROLL
          for (int e = 0; e < 2; ++e)
            x.store(static_cast<In*>(fb.oa), row * fb.o_ss + (tq * 2 + (8 * n + e)),
                    x.select(empty, 0.0f, acc[n][e] / lt), live);
        if (p.lse != nullptr) {
          float* lrow = p.lse + bh * p.Sq + fb.s0;
          x.store(lrow, row, x.select(empty, -kInf, mx * p.scale + x.log(lt)), live & (tq == 0));
        }
      }
  }

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    using H = typename X::half_t;
    H* Ks = x.template shared<H>(2 * kTile * kLd);
    H* Vs = x.template shared<H>(2 * kTile * kLd);
    H* Qs = kQInKBuffer ? Ks + kTile * kLd : x.template shared<H>(kRows * kLd);

    const FusedBlock fb(x, p, kRows);
    const int s0 = fb.s0, rows = fb.rows, shift = fb.shift;
    const std::int64_t kv_base = (std::int64_t{fb.b} * p.Hkv + fb.hk) * p.Skv * D;
    const H* kh = static_cast<const H*>(p.k_half) + kv_base;
    const H* vh = static_cast<const H*>(p.v_half) + kv_base;

    const I t = x.thread();
    const I lane = x.lane();
    const I w = x.warp();
    const I g = lane >> 2, tq = lane & 3;
    // Warp w owns rows w * 16 kM + 16 mt .. + 15 (m-tile mt); lane 4g + t holds row0[mt] + 8h.
    I row0[kM], q_off[kM];
    // ldmatrix row offsets: lane 8i + r addresses row r of matrix i.
    const I lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt) {
      row0[mt] = w * (16 * kM) + (mt * 16 + g);
      q_off[mt] = (w * (16 * kM) + (mt * 16 + lr)) * kLd + lc;         // Q: A fragments
    }
    const I k_off = ((lane & 7) + (lane >> 4) * 8) * kLd + ((lane >> 3) & 1) * 8;  // K: B, two n-tiles
    const I v_off = lr * kLd + lc;                                      // V: B (transposed), two n-tiles

    const int last_key = fb.last_key(p);
    int t0 = 0, t1 = 0;  // the block's key tiles (Note [split keys]); j below counts from t0
    fb.key_tiles(p, kTile, t0, t1);
    const int tiles = t1 - t0;
    // Keys of tile t0 + j (the last may be partial).
    auto tile_keys = [&](int j) { return static_cast<int>(imin(last_key - std::int64_t{t0 + j} * kTile, kTile)); };
    if (tiles > 0) {
      issue_tile(x, Ks, kh + std::int64_t{t0} * kTile * D, tile_keys(0), t);
      issue_tile(x, Vs, vh + std::int64_t{t0} * kTile * D, tile_keys(0), t);
    }
    x.async_commit();

    // The block's query rows, float or half -> fp16 (rows past Sq are zeros, never stored; one
    // format branch outside the loads, Note [tensor-core formats]).
    const auto q_rows = [&](auto* tag) {
      using S = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
      const S* q = static_cast<const S*>(fb.qa);
      LOCKSTEP_UNROLL
      for (int i = 0; i < kRows * D / kThreads; ++i) {
        const I e = t + i * kThreads;
        const I r = x.idiv(e, D);
        const I c = e - r * D;
        x.store_elem(E{}, Qs, r * kLd + c, x.load(q, r * fb.q_ss + c, r < rows, 0.0f));
      }
    };
    q_rows(static_cast<const In*>(nullptr));

    I qf[kQInRegs ? D / 16 : 1][4];
    F o[kM][D / 8][4];
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int n = 0; n < D / 8; ++n)
        LOCKSTEP_UNROLL
        for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;
    // Rows row0 and row0 + 8: the running max of the raw scores and the lane's part of the sum.
    F m[kM][2], l[kM][2];
    LOCKSTEP_UNROLL
    for (int mt = 0; mt < kM; ++mt)
      LOCKSTEP_UNROLL
      for (int h = 0; h < 2; ++h) {
        m[mt][h] = -kInf;
        l[mt][h] = 0.0f;
      }
    const float c2 = p.scale_log2;  // scale * log2(e)
    F s[kM][kTile / 8][4];          // the scores, then the weights, of the warp's current tile

    for (int j = 0; j < tiles; ++j) {
      const H* Kt = Ks + (j & 1) * (kTile * kLd);
      const H* Vt = Vs + (j & 1) * (kTile * kLd);
      x.template async_wait<0>();  // this tile's K and V (and on the first tile Q's stores)
      x.sync();                    // ... are visible, and every warp is done with tile j - 1
      if (kQInRegs && j == 0) {
        LOCKSTEP_UNROLL
        for (int kk = 0; kk < (kQInRegs ? D / 16 : 0); ++kk) x.ldmatrix_x4(qf[kk], Qs, q_off[0] + kk * 16);
        if (kQInKBuffer) x.sync();  // every warp has its Q before tile 1 overwrites it
      }
      if (j + 1 < tiles) {         // tile j - 1's buffers take tile j + 1, landing during this tile
        issue_tile(x, Ks + ((j + 1) & 1) * (kTile * kLd), kh + std::int64_t{t0 + j + 1} * kTile * D, tile_keys(j + 1), t);
        issue_tile(x, Vs + ((j + 1) & 1) * (kTile * kLd), vh + std::int64_t{t0 + j + 1} * kTile * D, tile_keys(j + 1), t);
      }
      x.async_commit();
      qk_tile(x, s, qf, Qs, q_off, Kt, k_off);
      softmax_tile(x, p, s, m, l, o, row0, tq, (t0 + j) * kTile, tile_keys(j), s0, shift, c2);
      pv_tile(x, s, o, Vt, v_off);
    }

    finish(x, p, fb, o, m, l, row0, tq);
  }
};

}  // namespace lockstep::kernels
