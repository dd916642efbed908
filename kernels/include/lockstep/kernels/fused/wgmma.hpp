#pragma once
// FusedAttentionWgmma: FusedAttentionTensorCore's arithmetic with the products as warpgroup
// instructions (wgmma, sm_90a), and its packing blocks.

#include "lockstep/kernels/fused/mma_sync.hpp"
#include "lockstep/kernels/fused/pack.hpp"

namespace lockstep::kernels {

// Note [packing blocks]
// FusedAttentionWgmma<D, WG, true> rounds K and V to fp16 in its own blocks instead of reading
// tiles that FusedHalfPackTiled wrote in a launch of its own before it. Blocks take tickets
// (x.block_ticket) in the order they start; ticket t owns a query tile of flattened kv head
// i = t / A (A: the blocks of one kv head, its query heads' tiles; kv heads of every batch in
// order, then query heads, then tiles), u = t % A. Blocks u < P of kv head i (P = min(A, key
// tiles)) first pack tiles u, u + P, ... of kv head i + N (N = p.pack_ahead >= 1;
// FusedHalfPackTiled::pack_tile: the same rounding and layout, every load in flight before the
// first store) and signal that kv head's counter (x.signal: a release); then every block of kv
// head i >= N waits for its own counter to reach P (x.wait_signals: an acquire) and runs the
// attention. Kv heads 0 .. N - 1 of batch 0 are packed by FusedHalfPackTiled in the launch before
// (N is at most the kv heads per batch). No deadlock whatever the scheduler does: a block waits
// only for blocks with lower tickets, which have started and never wait before they pack. (Packing
// after the wait chained every kv head's packing behind the one before: 1.5-5x slower at head_dim
// 64.) The packing blocks' stores are generic-proxy writes that the bulk copies (async
// proxy) read: each side fences the proxies (x.proxy_fence_global). The last reader of a counter
// resets it, and the ticket resets itself, so the stream's counters are zeros again for the next
// call (Note [block signals]). Which block rounds a tile, and when, changes; the rounding does not:
// the same bits (tested with the scratch first filled with another call's tiles). On the CPU
// device the waits yield to the threads that run the lower tickets.
// Measured on an H200: 16x16x1024x64 causal 0.267-0.272 ms against the mma.sync kernel's
// 0.280-0.281 (and the wgmma kernel's with its own packing launch, 0.287-0.292), so it
// is the default at head_dim 64 for grids of two waves or more; at B4 H32 L4096 D128 it was
// 0.7-1% slower than the packing launch (causal 0.5-1%), and at whisper-tiny (72 blocks) 5%, so
// those keep the launch. Packing inside the attention loop instead (a piece of a tile per key
// tile, cp.async into shared memory, rounded a step later, a few kv heads ahead) was 2.5% slower
// at head_dim 128 with a double-buffered stage and 1.7-11% with a single one: the
// loop is at 255 registers and issue-bound, and each piece adds to it.
//
// Note [early query loads]
// With the softmax on the SFU (Note [hardware exp2 on the tensor-core path]), Nsight Compute at
// 16x16x1024x64 causal put 38% of the packing kernel's warp samples before the first
// product: the packing loads' round trip (F2FP waiting on them: 11%), the wait for the kv head's
// counter (6%), then Q's loads' round trip (11.5%), one after the other, with three blocks (12
// warps) per SM to hide them. At head_dim 64 the block therefore issues Q's loads (fp32, kept
// in 32 registers) before the packing loads, and rounds them to fp16 after its wait: one round
// trip for both. (At head_dim 128 Q's 64 registers and the packing tile's 128 would not fit.)

// Note [wgmma products]
// FusedAttentionWgmma is FusedAttentionTensorCore's arithmetic with the products as warpgroup
// instructions (PTX wgmma.mma_async, sm_90a): one instruction multiplies a warpgroup's 64 rows by
// a 16 x N operand that the tensor cores read from shared memory themselves, where mma.sync needs
// one instruction per 16 x 8 tile and an ldmatrix per two. Per tile of 64 keys and warp at
// head_dim 128: 12 product instructions instead of 128 mma.sync and 64 ldmatrix; and the products
// run asynchronously to the warps that issue them. What is computed does not change:
//   - the accumulator layout of wgmma is mma_16816's per warp (warp w of a warpgroup holds its
//     rows 16 w .. 16 w + 15, c[n8] being columns 8 n8 .. 8 n8 + 7), and A from registers is each
//     warp's mma_16816 A fragment, so Q's fragments, the softmax on S (softmax_tile), P's packing
//     and the output (store_rows) are FusedAttentionTensorCore<D, 1>'s own;
//   - S accumulates over head_dim in steps of 16 and O over the tile's keys in steps of 16, in the
//     same order; the CPU device emulates each product n-tile by n-tile with mma_16816's
//     emulation, so there this kernel and FusedAttentionTensorCore give the same bytes (tested),
//     and CUDA's differ from the CPU's only as the hardware's products do (Note [tensor-core
//     emulation]; the same documented bound).
// Shared memory: K and V tiles of 64 keys as 8 x 8 core matrices (16-byte rows of 8 halves, no
// swizzle): element (key r, column k) at ((r / 8) (D / 8) + k / 8) 64 + (r % 8) 8 + k % 8 halves.
// K is B of Q.K^T in K-major order (leading byte offset 128 between core matrices along head_dim,
// stride 16 D between groups of 8 keys); V is B of P.V in MN-major order (the same memory: leading
// 16 D between groups of 8 keys, stride 128 between groups of 8 columns). FusedHalfPackTiled
// writes K and V in that layout tile by tile, so a tile is one contiguous 64 D halves in global
// memory too, and one thread moves it with one bulk copy (cp.async.bulk) that completes on the
// slot's transaction barrier. Rows past Skv in the last tile are zeros; rows of a tile past the
// block's last visible key (causal) are the keys' own values, weighted 0 (FusedAttentionTensorCore
// zero-fills those rows instead: a V entry there beyond fp16's range, inf after rounding, would
// make 0 x inf = NaN here only). Q's fragments come straight from global memory into registers
// (rounded to fp16 as FusedAttentionTensorCore rounds them).
// ptxas (CUDA 13.0) does not keep a product's register operand live across the loop's back edge:
// it reused Q's registers inside the loop (wrong scores from the second tile on). So each
// tile first rewrites Q's fragments with an ordinary instruction (x.wgmma_keep: xor with p.zero,
// a zero ptxas cannot see), whose reads keep them live.
// Schedule (FlashAttention-3's overlap within a warpgroup; no block-wide barrier in the loop):
// WG warpgroups per block (64 WG query rows) share a ring of 3 K/V tiles. Thread 0 issues tile
// j + 2 into slot (j + 2) % 3 once every warp has released tile j - 1 there (the slot's `empty`
// barrier); each warpgroup, per tile j: waits for tile j + 1 (the slot's `full` barrier) and
// issues S' = Q.K^T of it, runs the softmax of tile j on S (already complete) while S' is
// computed, issues O += P.V of tile j, waits for S' and for P.V, and releases tile j. S and S'
// alternate (the loop is unrolled by two). The warpgroups are never more than a tile apart and
// otherwise run freely, so one's softmax overlaps the other's products.
// Built only for sm_90a (the host picks it on compute capability 9.0 when the library was built
// with it: CMAKE_CUDA_ARCHITECTURES containing 90a); elsewhere its products trap.
// OV = false: the schedule of Note [four wgmma blocks per SM] instead.
//
// Note [four wgmma blocks per SM]
// At 16x16x1024x64 causal the head_dim 64 kernel is latency-bound (Nsight Compute: 36% of issue
// slots busy) with three blocks (12 warps) per SM, the most its 168 registers allow; under
// __launch_bounds__(128, 4) the schedule above spills inside the loop. Its
// registers in the loop: O (32), S and S' (32 each: S' is written by the next tile's Q.K^T while
// the softmax reads S), the softmax's weights (up to 32, dying into P's 16 as they are packed) and
// Q's fragments (16). FusedAttentionWgmma<D, WG, PK, false> gives up the overlap of tile j + 1's
// Q.K^T with tile j's softmax, which needs S': per tile j, the softmax of S (complete), O += P.V
// of tile j issued, then tile j + 1's Q.K^T issued into S while P.V runs (both products in flight
// together, no ordinary instruction touching an accumulator meanwhile), and one wait for both. At
// head_dim 64 that leaves room for four blocks (16 warps) per SM within 128 registers
// (kMinBlocks 4), the other blocks' softmaxes overlapping a block's products instead; their
// shared memory, 4 x (49,264 + 2,048 reserved and static) bytes, needs the SM's largest carveout,
// which the launch asks for (kMaxSharedCarveout). The same
// products in the same order on the same operands: the same bits as OV = true (tested on the CPU
// device, where both are emulated, and on the GPU). The default where the one-warpgroup
// head_dim 64 kernel would run (attention/src/fused.cpp): at 16x16x1024x64 causal
// on an H100 its four blocks per SM (ncu: 128 registers, no stack; three blocks with the overlap,
// at 168) took 0.2026-0.2075 ms against 0.2089-0.2172 (five rounds each, same call), and the
// kernel alone 194 us against 205. The Tuning fused.wgmma_serial = 0 picks the overlapping kernel.
//
// Note [deferred P.V wait]
// FusedAttentionWgmma<64, 1, PK, false, true>: Note [four wgmma blocks per SM]'s kernel (128
// registers, four blocks per SM) with FlashAttention-3's order inside a warpgroup, where the
// serial schedule waits for tile j - 1's P.V before tile j's softmax. Per tile j >= 1: Q.K^T of
// tile j issued; o rescaled by tile j - 1's alpha (no product on o in flight); P.V of tile j - 1
// issued; a wait for Q.K^T only (committed first: wgmma_wait<1>); tile j's softmax, which writes
// m, l, its weights and its alpha but not o (softmax_tile_alpha), while P.V of tile j - 1 runs on
// the tensor cores; a wait for that P.V (wgmma_wait<0>); tile j - 1 released; tile j's weights
// packed into P. Both products of a step are waited for within the step (no product in flight
// across the loop's back edge, which ptxas does not follow: Note [wgmma products]). The registers
// this adds to the serial kernel are P's 16 of tile j - 1 during tile j's softmax. The K/V ring
// (3 tiles: j - 1 in P.V, j in Q.K^T, j + 1 in flight) issues tile j + 1 at step j, a step ahead
// of its use (the serial kernel: a step and a half). Per element of o the same operations in the
// same order as the serial kernel -- o * alpha_j, then tile j's P.V -- so the same bits (tested on
// the CPU device, where every product completes at once, and on the GPU). ptxas keeps the
// products asynchronous (SASS: one WARPGROUP.DEPBAR.LE gsb0 0x1 and one 0x0 per tile) at 123-124
// registers, no stack. The default where the serial kernel runs (H200,
// 16x16x1024x64 causal, four rounds each: 0.1935-0.1958 ms against the serial order's
// 0.1947-0.2025); the Tuning fused.wgmma_deferred = 0 keeps the serial order.
template <int D, int WG = 2, bool PK = false, bool OV = true, bool DP = false, class In = float>
struct FusedAttentionWgmma {
  static_assert(D == 64 || D == 128, "wgmma attention: head_dim 64 or 128");
  static_assert(WG == 1 || WG == 2, "one or two warpgroups per block");
  static_assert(OV || (D == 64 && WG == 1), "the serial schedule: head_dim 64, one warpgroup");
  static_assert(!DP || !OV, "the deferred P.V wait is a form of the serial schedule");
  using Tc = FusedAttentionTensorCore<D, 1, In>;
  using E = typename Tc::E;  // the products' element format (Note [tensor-core formats])
  static constexpr const char* kName =
      PK ? (OV ? "fused_attention_wgmma_packing"
               : DP ? "fused_attention_wgmma_packing_deferred" : "fused_attention_wgmma_packing_serial")
         : (OV ? "fused_attention_wgmma" : DP ? "fused_attention_wgmma_deferred" : "fused_attention_wgmma_serial");
  static constexpr int kWarps = 4 * WG;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kRows = 64 * WG;          // query rows per block
  static constexpr int kTile = Tc::kTile;        // keys per tile (64)
  static_assert(kTile == 64, "the Q.K^T product is 64 x 64 per warpgroup");
  static constexpr int kStages = 3;              // tiles j (P.V), j + 1 (Q.K^T), j + 2 (loading)
  // Blocks per SM the registers must allow (S twice, O, Q: up to 255 registers at head_dim 128
  // with one warpgroup and two blocks, or two warpgroups and one block).
  static constexpr int kMinBlocks = !OV ? 4 : WG == 1 ? (D == 128 ? 2 : 3) : 1;
  // Four blocks of kSharedBytes (49 KB) need the SM's 228 KB shared-memory configuration, which the
  // driver need not pick unasked (Note [four wgmma blocks per SM]).
  static constexpr bool kMaxSharedCarveout = !OV;
  static constexpr int kTileHalves = kTile * D;  // one K or V tile, no padding
  static constexpr std::size_t kSharedBytes = std::size_t(2) * kStages * kTileHalves * 2 + 2 * kStages * 8 + 64;
  // Core-matrix strides (halves): along head_dim 64 (one core matrix), along keys 8 D.
  static constexpr int kCoreStep = 64;
  static constexpr int kKeyGroupStep = 8 * D;
  using Params = FusedAttentionParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    if constexpr (PK) {
      // Note [packing blocks]: the ticket gives the block its query tile and kv head (kv heads of
      // every batch in order, then query heads of its group, then tiles).
      const int tiles_q = static_cast<int>(ceil_div(p.Sq, kRows));
      const int group = p.H / p.Hkv;
      const int per_kv = group * tiles_q;  // blocks of one kv head
      const int t = x.block_ticket(p.ticket, p.B * p.H * tiles_q);
      const int kvi = t / per_kv, u = t - kvi * per_kv;
      const int b = kvi / p.Hkv, hk = kvi - b * p.Hkv;
      const int tiles_kv = static_cast<int>(ceil_div(p.Skv, kTile));
      const int parts = static_cast<int>(imin(per_kv, tiles_kv));  // packing blocks per kv head
      // First the tiles of a later kv head (never behind a wait: a chain of waits and packs from
      // kv head to kv head made the kernel 1.5-5x slower at head_dim 64): pack_ahead kv
      // heads on, so that its blocks, which start pack_ahead x per_kv tickets later, find it done.
      const int ahead = p.pack_ahead > 0 ? p.pack_ahead : 1;
      const int next = kvi + ahead;
      // Note [early query loads]: at head_dim 64, Q's loads are in flight during the packing
      // loads, so the block waits for memory once where it waited twice.
      const FusedBlock fb(p, b, hk * group + u / tiles_q, u % tiles_q, kRows);
      constexpr bool kEarlyQ = D == 64;
      F qv[D / 16][4][2];
      if constexpr (kEarlyQ) load_q(x, fb, qv);
      if (u < parts && next < p.B * p.Hkv) {  // block-uniform
        const int nb = next / p.Hkv, nhk = next - nb * p.Hkv;
        for (int j = u; j < tiles_kv; j += parts)
          FusedHalfPackTiled<D, In>::template pack_tile<kThreads>(x, p, nb, nhk, j, tiles_kv);
        x.proxy_fence_global();
        x.signal(p.pack_counters + 2 * std::int64_t{next});
      }
      if (kvi >= ahead) {  // kv heads 0 .. ahead - 1 were packed by the kernel before
        std::int32_t* c = p.pack_counters + 2 * std::int64_t{kvi};
        const int reader = x.wait_signals(c, parts, true);
        x.release_signals(c, reader, per_kv);
        x.proxy_fence_global();  // the packing blocks' generic stores, then the bulk copies' reads
      }
      body<kEarlyQ>(x, p, fb, qv);
    } else {
      F qv[D / 16][4][2];
      body<false>(x, p, FusedBlock(x, p, kRows), qv);
    }
  }

  // Q's fp32 values for the block's A fragments (rows past the block's are zeros): pair e of
  // k-step kk is row row0 + (e & 1) 8, columns tq 2 + kk 16 + (e >> 1) 8 and the next.
  // Q in float or half (Note [tensor-core formats]): one branch, outside the loads.
  template <class X, class F>
  LOCKSTEP_HD static void load_q(X& x, const FusedBlock& fb, F (&qv)[D / 16][4][2]) {
    load_q_as<In>(x, fb, qv);
  }
  template <class S, class X, class F>
  LOCKSTEP_HD static void load_q_as(X& x, const FusedBlock& fb, F (&qv)[D / 16][4][2]) {
    using I = typename X::template Lanes<lane_int>;
    const S* q = static_cast<const S*>(fb.qa);
    const I lane = x.lane();
    const I row0 = x.warp() * 16 + (lane >> 2), tq = lane & 3;
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) {
        const I r = row0 + (e & 1) * 8;
        const I c = tq * 2 + (kk * 16 + (e >> 1) * 8);
        const auto live = r < fb.rows;
        qv[kk][e][0] = x.load(q, r * fb.q_ss + c, live, 0.0f);
        qv[kk][e][1] = x.load(q, r * fb.q_ss + (c + 1), live, 0.0f);
      }
  }

  // The block's attention; qv holds Q's values already when kQLoaded (else body loads them).
  template <bool kQLoaded, class X, class QF>
  LOCKSTEP_HD static void body(X& x, const Params& p, const FusedBlock& fb, QF (&qv)[D / 16][4][2]) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using H = typename X::half_t;
    H* Ks = x.template shared<H>(kStages * kTileHalves);
    H* Vs = x.template shared<H>(kStages * kTileHalves);
    std::uint64_t* full = x.template shared<std::uint64_t>(kStages);   // tile landed in the slot
    std::uint64_t* empty = x.template shared<std::uint64_t>(kStages);  // every warp done with it

    const int s0 = fb.s0, shift = fb.shift;
    // FusedHalfPackTiled's layout: [B, Hkv, tiles of Skv, 64 D halves].
    const std::int64_t kv_base = (std::int64_t{fb.b} * p.Hkv + fb.hk) * ceil_div(p.Skv, kTile) * kTileHalves;
    const H* kh = static_cast<const H*>(p.k_half) + kv_base;
    const H* vh = static_cast<const H*>(p.v_half) + kv_base;
    LOCKSTEP_UNROLL
    for (int i = 0; i < kStages; ++i) {
      x.mbar_init(full + i, 1);
      x.mbar_init(empty + i, kWarps);
    }
    x.sync();

    const I lane = x.lane();
    const I w = x.warp();
    const I g = lane >> 2, tq = lane & 3;
    I row0[1];
    row0[0] = w * 16 + g;  // lane 4g + t of warp w holds rows row0 and row0 + 8

    const int last_key = fb.last_key(p);
    // The block's key tiles t0 .. t1 - 1 (Note [split keys]); j below is t0 + j's place in the
    // ring's order: slots and phases count from the block's first tile, keys and data from t0.
    int t0 = 0, t1 = 0;
    fb.key_tiles(p, kTile, t0, t1);
    const int tiles = t1 - t0;
    auto tile_keys = [&](int j) { return static_cast<int>(imin(last_key - std::int64_t{t0 + j} * kTile, kTile)); };
    // Tile j into its ring slot (thread 0; from the fourth tile on, once the slot's previous tile,
    // j - 3, has been released by every warp).
    auto issue = [&](int j) {
      if (j < tiles) {
        const int b = j % kStages;
        x.bulk_tiles(full + b, empty + b, (j / kStages + 1) & 1, j >= kStages, Ks + b * kTileHalves,
                     kh + std::int64_t{t0 + j} * kTileHalves, Vs + b * kTileHalves,
                     vh + std::int64_t{t0 + j} * kTileHalves, kTileHalves * 2);
      }
    };
    issue(0);
    issue(1);

    // Q's A fragments, rounded to fp16 (rows past the block's are zeros).
    if constexpr (!kQLoaded) load_q(x, fb, qv);
    I qf[D / 16][4];
    LOCKSTEP_UNROLL
    for (int kk = 0; kk < D / 16; ++kk)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) qf[kk][e] = x.pack2(qv[kk][e][0], qv[kk][e][1], E{});

    F o[1][D / 8][4];
    LOCKSTEP_UNROLL
    for (int n = 0; n < D / 8; ++n)
      LOCKSTEP_UNROLL
      for (int e = 0; e < 4; ++e) o[0][n][e] = 0.0f;
    F m[1][2] = {{F(-kInf), F(-kInf)}}, l[1][2] = {{F(0.0f), F(0.0f)}};
    const float c2 = p.scale_log2;
    // Descriptor strides (Note [wgmma products]; as the PTX canonical layouts give them, verified
    // on the GPU).
    constexpr int k_lbo = kCoreStep, k_sbo = kKeyGroupStep, v_lbo = kKeyGroupStep, v_sbo = kCoreStep;
    // S = Q.K^T of tile j into sj, issued (64 x 64 per warpgroup, head_dim in steps of 16).
    auto issue_qk = [&](int j, F (&sj)[1][kTile / 8][4]) {
      x.wgmma_keep(qf, p.zero);
      x.wgmma_fence();
      LOCKSTEP_UNROLL
      for (int kk = 0; kk < D / 16; ++kk)
        x.template wgmma<kTile, false>(sj[0], qf[kk], Ks, (j % kStages) * kTileHalves + kk * 2 * kCoreStep,
                                       k_lbo, k_sbo, kk > 0, E{});
      x.wgmma_commit();
    };
    // P's A fragments from the weights s, fp16.
    auto pack_p = [&](F (&s)[1][kTile / 8][4], I (&pa)[kTile / 16][4]) {
      LOCKSTEP_UNROLL
      for (int kc = 0; kc < kTile / 16; ++kc) {
        pa[kc][0] = x.pack2(s[0][2 * kc][0], s[0][2 * kc][1], E{});
        pa[kc][1] = x.pack2(s[0][2 * kc][2], s[0][2 * kc][3], E{});
        pa[kc][2] = x.pack2(s[0][2 * kc + 1][0], s[0][2 * kc + 1][1], E{});
        pa[kc][3] = x.pack2(s[0][2 * kc + 1][2], s[0][2 * kc + 1][3], E{});
      }
    };
    // O += P.V of tile j from P's packed fragments pa, issued: the tile's keys in steps of 16,
    // back to back after one fence.
    auto issue_pv_packed = [&](int j, I (&pa)[kTile / 16][4]) {
      x.wgmma_ready(pa);
      x.wgmma_fence();
      LOCKSTEP_UNROLL
      for (int kc = 0; kc < kTile / 16; ++kc)
        x.template wgmma<D, true>(o[0], pa[kc], Vs, (j % kStages) * kTileHalves + kc * 2 * kKeyGroupStep,
                                  v_lbo, v_sbo, true, E{});
      x.wgmma_commit();
    };
    // O += P.V of tile j from its weights s (every A fragment packed into pa first).
    auto issue_pv = [&](int j, F (&s)[1][kTile / 8][4], I (&pa)[kTile / 16][4]) {
      pack_p(s, pa);
      issue_pv_packed(j, pa);
    };
    // Tile 0's scores into s0t, complete.
    auto first_scores = [&](F (&s0t)[1][kTile / 8][4]) {
      if (tiles > 0) {
        x.mbar_wait(full, 0);  // tile 0
        issue_qk(0, s0t);
        x.template wgmma_wait<0>();
        x.wgmma_hold(s0t[0]);
      }
    };
    // Tile j: its scores in s_in (complete); the next tile's products into s_next meanwhile. The
    // softmax reads s_in and writes its weights to s (Note [softmax output]).
    auto step = [&](int j, F (&s_in)[1][kTile / 8][4], F (&s_next)[1][kTile / 8][4]) {
      F s[1][kTile / 8][4];
      issue(j + 2);  // into tile j - 1's slot
      if (j + 1 < tiles) {
        x.mbar_wait(full + (j + 1) % kStages, ((j + 1) / kStages) & 1);  // tile j + 1 has landed
        issue_qk(j + 1, s_next);
      }
      Tc::softmax_tile(x, p, s_in, s, m, l, o, row0, tq, (t0 + j) * kTile, tile_keys(j), s0, shift, c2);
      I pa[kTile / 16][4];
      issue_pv(j, s, pa);
      x.template wgmma_wait<1>();  // S' (committed first) is complete
      x.wgmma_hold(s_next[0]);
      x.template wgmma_wait<0>();  // and P.V
      x.wgmma_hold(o[0]);
      x.mbar_arrive_warp(empty + j % kStages);  // this warp is done with tile j
    };

    if constexpr (DP) {  // Note [deferred P.V wait]
      F sc[1][kTile / 8][4], s[1][kTile / 8][4], alpha[2];
      I pa[kTile / 16][4];
      // P.V of tile j from pa, issued (o's pending rescale first).
      auto rescale_then_pv = [&](int j, bool rescale) {
        if (rescale) Tc::rescale_o(o[0], alpha);
        issue_pv_packed(j, pa);
      };
      bool rescale = false;
      first_scores(sc);
      if (tiles > 0) {
        rescale = Tc::softmax_tile_alpha(x, p, sc, s, m, l, alpha, row0, tq, t0 * kTile, tile_keys(0), s0, shift, c2);
        pack_p(s, pa);
      }
      for (int j = 1; j < tiles; ++j) {
        issue(j + 1);  // into tile j - 2's slot
        x.mbar_wait(full + j % kStages, (j / kStages) & 1);  // tile j has landed
        issue_qk(j, sc);
        rescale_then_pv(j - 1, rescale);
        x.template wgmma_wait<1>();  // Q.K^T of tile j (committed first) is complete
        x.wgmma_hold(sc[0]);
        rescale = Tc::softmax_tile_alpha(x, p, sc, s, m, l, alpha, row0, tq, (t0 + j) * kTile, tile_keys(j), s0,
                                          shift, c2);
        x.template wgmma_wait<0>();  // P.V of tile j - 1
        x.wgmma_hold(o[0]);
        x.wgmma_ready(pa);  // P's registers live up to here (an operand of the P.V in flight)
        x.mbar_arrive_warp(empty + (j - 1) % kStages);  // this warp is done with tile j - 1
        pack_p(s, pa);
      }
      if (tiles > 0) {
        rescale_then_pv(tiles - 1, rescale);
        x.template wgmma_wait<0>();
        x.wgmma_hold(o[0]);
        x.wgmma_ready(pa);
        x.mbar_arrive_warp(empty + (tiles - 1) % kStages);
      }
      Tc::finish(x, p, fb, o, m, l, row0, tq);
      return;
    }
    if constexpr (!OV) {  // Note [four wgmma blocks per SM]
      F sc[1][kTile / 8][4];
      first_scores(sc);
      for (int j = 0; j < tiles; ++j) {
        F s[1][kTile / 8][4];
        issue(j + 2);  // into tile j - 1's slot
        Tc::softmax_tile(x, p, sc, s, m, l, o, row0, tq, (t0 + j) * kTile, tile_keys(j), s0, shift, c2);
        I pa[kTile / 16][4];
        issue_pv(j, s, pa);
        if (j + 1 < tiles) {
          x.mbar_wait(full + (j + 1) % kStages, ((j + 1) / kStages) & 1);  // tile j + 1 has landed
          issue_qk(j + 1, sc);  // while P.V of tile j runs
        }
        x.template wgmma_wait<0>();  // P.V of tile j and S of tile j + 1
        x.wgmma_hold(o[0]);
        x.wgmma_hold(sc[0]);
        // P's registers live up to here (an operand of the P.V in flight: the barrier wait and Q.K^T
        // above must not take them; Note [wgmma products]: ptxas keeps an operand live only up to
        // its product).
        x.wgmma_ready(pa);
        x.mbar_arrive_warp(empty + j % kStages);  // this warp is done with tile j
      }
      Tc::finish(x, p, fb, o, m, l, row0, tq);
      return;
    }
    F sa[1][kTile / 8][4], sb[1][kTile / 8][4];
    first_scores(sa);
    for (int j = 0; j < tiles; j += 2) {
      step(j, sa, sb);
      if (j + 1 < tiles) step(j + 1, sb, sa);
    }
    Tc::finish(x, p, fb, o, m, l, row0, tq);  // every issued tile was waited for
  }
};

}  // namespace lockstep::kernels
