#include "lockstep/attention/fused.hpp"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <string>

#include "checks.hpp"
#include "lockstep/kernels/launch.hpp"

namespace lockstep {

namespace {

// TensorCore at head_dim 64-128 can run 128 query rows per block (two m-tiles per warp sharing
// each K and V fragment, 255 registers, two blocks per SM) instead of 64 (168 registers at
// head_dim 128, three blocks per SM). With run 45's lighter softmax, 128 rows won at head_dim 128
// (B4 H32 L4096: 4.42 vs 5.12-5.18 ms; causal 2.54 vs 2.82-2.87) and lost at head_dim 64 (whisper
// 1x6x1500: 0.0573 vs 0.0557; 16x16x1024 causal: 0.326 vs 0.289-0.296); before it, 64 rows won
// everywhere (run 43). So the default is 128 rows at head_dim 128 when the grid fills two waves of
// 132 SMs x 2 blocks at that size (fewer, larger blocks would idle SMs), else 64; head_dim 96 was
// not measured and keeps 64. LOCKSTEP_FUSED_TC_ROWS=64|128 overrides (a measurement knob). The
// same bits either way (a schedule choice; a unit test holds both to it).
bool use_two_m_tiles(int D, std::int64_t blocks_at_128_rows) {
  if (const char* v = std::getenv("LOCKSTEP_FUSED_TC_ROWS"); v != nullptr) {
    const int rows = std::atoi(v);
    if (rows == 128 || rows == 64) return rows == 128;
  }
  return D == 128 && blocks_at_128_rows >= 2 * 2 * 132;
}

// Exact at head_dim 64 keeps P in K's memory (four blocks per SM) or gives it a buffer of its own
// (three blocks, one barrier fewer per tile and K's copy under the softmax and P x V: Note [exact
// tile pipeline]). The latter where the grid fits in three blocks per SM: whisper-tiny (144
// blocks) 0.241 vs 0.255 ms, 16x16x1024 causal (4096 blocks) 1.34-1.36 vs 1.31-1.34 (run 60).
// LOCKSTEP_FUSED_EXACT_P=0|1 overrides (a measurement knob); the same bits either way (a unit test
// holds both to it).
bool use_separate_p(std::int64_t blocks, std::int64_t multiprocessors) {
  if (const char* v = std::getenv("LOCKSTEP_FUSED_EXACT_P"); v != nullptr) {
    const int sp = std::atoi(v);
    if (sp == 0 || sp == 1) return sp == 1;
  }
  return blocks <= 3 * multiprocessors;
}

// Note [packing blocks] (kernels/fused/wgmma.hpp): the wgmma kernel rounds K and V to fp16
// itself, each kv head's in the blocks of the kv head before it, instead of in a packing launch
// before it. Measured (runs 90 and 92): 16x16x1024x64 causal 0.267-0.272 ms against 0.280-0.281
// with the mma.sync kernel; 0.7-1% slower at B4 H32 L4096 D128 and 5% at whisper-tiny. So: at
// head_dim 64 for grids of at least two waves of 132 SMs at 64 rows per block. LOCKSTEP_FUSED_TC_PACK
// =0|1 overrides (a measurement knob); the same bits either way (a unit test holds them to it).
bool pack_in_kernel(int D, std::int64_t blocks_at_64_rows) {
  if (const char* v = std::getenv("LOCKSTEP_FUSED_TC_PACK"); v != nullptr) {
    const int pk = std::atoi(v);
    if (pk == 0 || pk == 1) return pk == 1;
  }
  return D == 64 && blocks_at_64_rows >= 2 * 132;
}

// A knob taking 1..16 (LOCKSTEP_FUSED_TC_PACK_AHEAD, the split knobs below), or 0 when unset or
// outside that range.
int knob_1_to_16(const char* knob) {
  if (const char* v = std::getenv(knob); v != nullptr) {
    const int n = std::atoi(v);
    if (n >= 1 && n <= 16) return n;
  }
  return 0;
}

// Note [packing blocks]: how many kv heads ahead the blocks pack (the launch before packs the
// first that many, of batch 0; at most the kv heads per batch). 8: run 144 (H100, three rounds of
// 1, 2, 4 and 8) took 2.4-2.9% off 16x16x1024x64 (causal or not) at 8 and changed no other shape
// (the others have the packing launch, or too few kv heads to look ahead); run 160 (H100, the
// default against 1, three rounds): 2.0-2.6% off 16x16x1024x64 causal, 2.2% off it not causal,
// FA2 in the same call 0.1686 ms (0.865-0.874x). LOCKSTEP_FUSED_TC_PACK_AHEAD
// =1..16 overrides (a measurement knob); the same bits whatever it is.
int pack_ahead(std::int64_t kv_heads) {
  const int n = knob_1_to_16("LOCKSTEP_FUSED_TC_PACK_AHEAD");
  return static_cast<int>(std::min<std::int64_t>(n > 0 ? n : 8, kv_heads));
}

// Note [wgmma products] (kernels/fused/wgmma.hpp): the tensor-core kernel on warpgroup
// products. It can run on CUDA devices of compute capability 9.0 when the library was built for
// sm_90a (LOCKSTEP_HAVE_WGMMA: CMAKE_CUDA_ARCHITECTURES containing 90a), at head_dim 64 and 128.
// Measured (run 83, H200, against the mma.sync kernels it replaces): B4 H32 L4096 D128 3.43 ms
// instead of 4.41 (causal 2.02 instead of 2.51), whisper-tiny's 1x6x1500x64 0.0455 (two
// warpgroups) instead of 0.051-0.054; 16x16x1024x64 causal 0.287-0.292 instead of 0.280-0.282. So
// it is the default at head_dim 128, and at 64 for grids under two waves of 132 SMs (64-row blocks);
// at 64 for larger grids too since its packing blocks (Note [packing blocks], runs 90 and 92).
// LOCKSTEP_FUSED_TC_WGMMA=0 never picks it; =1 picks it wherever it can run, the CPU device
// included (whose emulation gives FusedAttentionTensorCore's bytes: a test holds it to them).
bool use_wgmma(const Stream& s, int D, std::int64_t blocks_at_64_rows) {
  if (D != 64 && D != 128) return false;
  const char* v = std::getenv("LOCKSTEP_FUSED_TC_WGMMA");
  const int knob = v != nullptr ? std::atoi(v) : -1;
  if (knob == 0) return false;
  if (s.device().id().kind != DeviceKind::kCuda) return knob == 1;
#if defined(LOCKSTEP_HAVE_WGMMA)
  if (s.device().caps().compute_capability != 90) return false;
  return knob == 1 || D == 128 || blocks_at_64_rows < 2 * 132 || pack_in_kernel(D, blocks_at_64_rows);
#else
  (void)blocks_at_64_rows;
  return false;
#endif
}

// The wgmma kernel's warpgroups per block. At head_dim 128, two (128 rows, sharing each K/V tile)
// where the grid at 64 rows per block is under two waves of 132 SMs (the 512-query chunk over 8192
// keys: 0.2827-0.2829 ms with two, 0.2851-0.2860 with one, run 137), else one (64 rows, two blocks
// per SM: B4 H32 L4096 D128 3.43 ms with one, 3.49-3.51 with two, run 83). At head_dim 64 always
// one, which there is Note [deferred P.V wait]'s kernel at four blocks per SM: whisper-tiny
// 0.0312-0.0314 ms against 0.0341-0.0343 with two warpgroups (causal 0.0290-0.0302 against
// 0.0327-0.0328; run 137, an H100, three rounds each; two had been faster before that kernel
// existed: 0.0455 against 0.0509, run 83). LOCKSTEP_FUSED_TC_WGMMA_WG=1|2 overrides (a measurement
// knob); the same bits either way.
int wgmma_warpgroups(int D, std::int64_t blocks_at_64_rows) {
  if (const char* v = std::getenv("LOCKSTEP_FUSED_TC_WGMMA_WG"); v != nullptr) {
    const int wg = std::atoi(v);
    if (wg == 1 || wg == 2) return wg;
  }
  return D == 128 && blocks_at_64_rows < 2 * 132 ? 2 : 1;
}

// Note [four wgmma blocks per SM] (kernels/fused/wgmma.hpp): the one-warpgroup head_dim 64
// wgmma kernel without its overlap of the next tile's Q.K^T with the softmax, at four blocks per
// SM instead of three: the default wherever the one-warpgroup head_dim 64 kernel runs (grids of
// two waves or more), since run 124 (H100: 16x16x1024x64 causal 0.2026-0.2075 ms against
// 0.2089-0.2172 with the overlap, five rounds each). LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0 keeps the
// overlapping kernel (a measurement knob); the same bits either way (a unit test holds them to it).
bool wgmma_serial() {
  const char* v = std::getenv("LOCKSTEP_FUSED_TC_WGMMA_SERIAL");
  return v == nullptr || *v == '\0' || std::atoi(v) != 0;  // unset or empty: the default
}
// Note [deferred P.V wait] (kernels/fused/wgmma.hpp): the serial kernel with tile j's softmax
// during tile j - 1's P.V, the default where the serial kernel runs since run 126 (H200,
// 16x16x1024x64 causal: 0.1935-0.1958 ms against 0.1947-0.2025, four rounds each; run 130, an
// H100: 1.7% faster at 16x16x1024x64 not causal, 3-4% at 2x16x4096x64 causal).
// LOCKSTEP_FUSED_TC_WGMMA_DEFER=0 keeps the serial kernel's order; the same bits either way (a
// unit test holds them to it).
bool wgmma_deferred() {
  const char* v = std::getenv("LOCKSTEP_FUSED_TC_WGMMA_DEFER");
  return v == nullptr || *v == '\0' || std::atoi(v) != 0;  // unset or empty: the default
}

// Note [split keys] (kernels/fused/common.hpp): with options.batch_invariant = false, Exact's
// small grids split each query tile's key tiles into S ranges, one block each, the last of them
// merging. S depends on the grid's size (batch x heads x query tiles), so the bytes then depend on
// the batch: the design's rule for split-K (a fixed chunk, never a split count from the batch or
// the occupancy) holds only for the default, batch_invariant = true, which never splits. S is a
// function of the shape alone, not of the device, so the CPU device splits where CUDA does (the
// same schedule and bytes); at least 8 key tiles (4 per range). Run 131 (an H100, against no split):
//   - Exact, whose 64-row blocks are 8 warps at head_dim 128 and 4 elsewhere, splits where the
//     grid has fewer than 12 warps per SM of 132, into S = min(8, key tiles / 4, 2 x 528 / blocks)
//     ranges: whisper-tiny's 144 blocks, S = 6: 0.171 ms against 0.236-0.239 (S = 3: 0.166, 2:
//     0.180, 4: 0.186), causal 0.114 against 0.199-0.201 (S = 3: 0.158-0.161); the 512-query
//     chunk over 8192 keys at head_dim 128 (256 blocks of 8 warps) was 0-2% slower with S = 2 to 6.
//   - TensorCore does not split unless LOCKSTEP_FUSED_TC_SPLITS asks, whatever the option. Its
//     split (two ranges at head_dim 64 under two waves) had made whisper-tiny 0.0324 ms against
//     0.0340-0.0343 with the two-warpgroup blocks of then (runs 131-134); with one-warpgroup blocks
//     at head_dim 64 (wgmma_warpgroups) no split is faster: 0.0312-0.0314 against 0.0321-0.0323
//     with two ranges, causal 0.0290-0.0302 against 0.0308-0.0314 (run 137). At head_dim 128 the
//     512-query chunk took 0.309 with S = 2 against 0.282-0.283 (run 131).
std::int64_t key_tiles(int D, std::int64_t skv) { return kernels::ceil_div(skv, std::int64_t{D <= 128 ? 64 : 32}); }
int tensor_core_splits() {
  const int n = knob_1_to_16("LOCKSTEP_FUSED_TC_SPLITS");
  return n > 0 ? n : 1;
}
int exact_splits(int D, std::int64_t blocks_at_64_rows, std::int64_t skv, bool batch_invariant) {
  if (const int n = knob_1_to_16("LOCKSTEP_FUSED_EXACT_SPLITS"); n > 0) return n;
  if (batch_invariant) return 1;
  const std::int64_t warps = D == 128 ? 8 : 4;  // FusedAttentionExact<D>::kThreads / 32
  if (blocks_at_64_rows * warps >= 12 * 132) return 1;
  const std::int64_t n = std::min<std::int64_t>({8, key_tiles(D, skv) / 4, 2 * 528 / blocks_at_64_rows});
  return static_cast<int>(std::max<std::int64_t>(n, 1));
}

template <int D>
void launch_fused(Stream& s, const kernels::FusedAttentionParams& p, std::int64_t seq_q,
                  std::int64_t heads, std::int64_t batch, bool tensor_core, bool batch_invariant) {
  auto go = [&](auto k, const kernels::FusedAttentionParams& kp) {
    using K = decltype(k);
    const std::int64_t splits = kp.kv_splits > 1 ? kp.kv_splits : 1;  // Note [split keys]
    const Dim3 grid{static_cast<std::uint32_t>(kernels::ceil_div(seq_q, K::kRows) * splits),
                    static_cast<std::uint32_t>(heads), static_cast<std::uint32_t>(batch)};
    launch<K>(s, grid, K::kSharedBytes, kp);
  };
  if (!tensor_core) {
    const std::int64_t blocks = kernels::ceil_div(seq_q, std::int64_t{64}) * heads * batch;  // 64 rows each
    kernels::FusedAttentionParams ep = p;
    const int splits = p.Skv > 0 ? exact_splits(D, blocks, p.Skv, batch_invariant) : 1;
    if (splits > 1) {  // Note [split keys]: [B, H, S, Sq, D] o, then [B, H, S, Sq, 1 + KG] (m, l)
      const std::size_t part_rows = std::size_t(batch) * std::size_t(heads) * std::size_t(splits) * std::size_t(seq_q);
      ep.kv_splits = splits;
      ep.part = static_cast<float*>(detail::StreamAccess::scratch(s, part_rows * (std::size_t(D) + 17) * sizeof(float)));
      ep.part_ml = ep.part + part_rows * std::size_t(D);
      ep.split_counters = detail::StreamAccess::counters(s, std::size_t(1 + blocks)) + 1;
    }
    if constexpr (D == 64) {
      using SeparateP = kernels::FusedAttentionExact<64, 8, 1>;
      if (use_separate_p(blocks * splits, s.device().caps().multiprocessors)) return go(SeparateP{}, ep);
    }
    return go(kernels::FusedAttentionExact<D>{}, ep);
  }
  // K and V rounded to fp16 once, packed in the stream's scratch (Note [fused tensor-core
  // rounding points]), then the fused kernel: the wgmma kernel's packing is tiled (Note [wgmma
  // products]).
  kernels::FusedAttentionParams tp = p;
  const std::int64_t blocks64 = kernels::ceil_div(seq_q, std::int64_t{64}) * heads * batch;
  const bool wgmma = use_wgmma(s, D, blocks64);  // false at other head_dims
  // Note [split keys]: not with the packing blocks (grids of two waves or more).
  const bool packing_blocks = (D == 64 || D == 128) && wgmma && pack_in_kernel(D, blocks64);
  const int splits = p.Skv > 0 && !packing_blocks ? tensor_core_splits() : 1;
  if (p.Skv > 0) {
    const std::int64_t skv_packed = wgmma ? kernels::ceil_div(p.Skv, 64) * 64 : p.Skv;
    const std::size_t half_bytes =
        std::size_t(batch) * std::size_t(p.Hkv) * std::size_t(skv_packed) * std::size_t(D) * 2;
    // With split keys, the partials after K and V: [B, H, S, Sq, D] o, then [B, H, S, Sq, 2] (m, l).
    const std::size_t part_rows = splits > 1 ? std::size_t(batch) * std::size_t(heads) * std::size_t(splits) *
                                                   std::size_t(seq_q)
                                             : 0;
    auto* ws = static_cast<char*>(
        detail::StreamAccess::scratch(s, 2 * half_bytes + part_rows * (std::size_t(D) + 2) * sizeof(float)));
    tp.k_half = ws;
    tp.v_half = ws + half_bytes;
    if (splits > 1) {
      tp.kv_splits = splits;
      tp.part = reinterpret_cast<float*>(ws + 2 * half_bytes);
      tp.part_ml = tp.part + part_rows * std::size_t(D);
      // A zero per 64 query rows of every (batch, head), after the stream's first counter (Note
      // [one grid]); the last block of each query tile resets its own.
      tp.split_counters = detail::StreamAccess::counters(s, std::size_t(1 + blocks64)) + 1;
    }
    auto pack = [&](auto k, std::int64_t rows) {
      using P = decltype(k);
      const Dim3 grid{static_cast<std::uint32_t>(kernels::ceil_div(p.Skv, rows)),
                      static_cast<std::uint32_t>(p.Hkv), static_cast<std::uint32_t>(batch)};
      launch<P>(s, grid, P::kSharedBytes, tp);
    };
    if constexpr (D == 64 || D == 128) {
      if (packing_blocks) {
        // Note [packing blocks]: kv heads 0 .. pack_ahead - 1 of batch 0 here, the others by the
        // attention's blocks.
        const auto packing = [&](auto k) {
          using K = decltype(k);
          const std::int64_t tiles_q = kernels::ceil_div(seq_q, std::int64_t{K::kRows});
          if (tiles_q * heads * batch > 0x7fffffff) return false;
          // After the stream's first counter, which only DecodeOneGrid uses (Note [one grid]).
          std::int32_t* c = detail::StreamAccess::counters(s, std::size_t(2 + 2 * batch * p.Hkv)) + 1;
          tp.ticket = c;
          tp.pack_counters = c + 1;
          tp.pack_ahead = pack_ahead(p.Hkv);
          const Dim3 first{static_cast<std::uint32_t>(kernels::ceil_div(p.Skv, 64)),
                           static_cast<std::uint32_t>(tp.pack_ahead), 1};
          launch<kernels::FusedHalfPackTiled<D>>(s, first, 0, tp);
          launch<K>(s, Dim3{static_cast<std::uint32_t>(tiles_q * heads * batch), 1, 1}, K::kSharedBytes, tp);
          return true;
        };
        const int wg = wgmma_warpgroups(D, blocks64);
        bool launched = false;
        if constexpr (D == 64)
          if (wg == 1 && wgmma_serial())
            launched = wgmma_deferred() ? packing(kernels::FusedAttentionWgmma<64, 1, true, false, true>{})
                                        : packing(kernels::FusedAttentionWgmma<64, 1, true, false>{});
        if (!launched)
          launched = wg == 2 ? packing(kernels::FusedAttentionWgmma<D, 2, true>{})
                             : packing(kernels::FusedAttentionWgmma<D, 1, true>{});
        if (launched) return;
      }
      if (wgmma) pack(kernels::FusedHalfPackTiled<D>{}, 64);
    }
    if (!wgmma) pack(kernels::FusedHalfPack<D>{}, kernels::FusedHalfPack<D>::kRows);
  }
  if constexpr (D == 64 || D == 128) {
    if (wgmma) {
      if (wgmma_warpgroups(D, blocks64 * splits) == 2) return go(kernels::FusedAttentionWgmma<D, 2>{}, tp);
      if constexpr (D == 64)
        if (wgmma_serial())
          return wgmma_deferred() ? go(kernels::FusedAttentionWgmma<64, 1, false, false, true>{}, tp)
                                  : go(kernels::FusedAttentionWgmma<64, 1, false, false>{}, tp);
      return go(kernels::FusedAttentionWgmma<D, 1>{}, tp);
    }
  }
  if constexpr (D >= 64 && D <= 128) {
    const std::int64_t blocks128 = kernels::ceil_div(seq_q, std::int64_t{128}) * heads * batch * splits;
    if (use_two_m_tiles(D, blocks128)) return go(kernels::FusedAttentionTensorCore<D, 2>{}, tp);
  }
  go(kernels::FusedAttentionTensorCore<D>{}, tp);
}
}  // namespace

void attention(Stream& stream, const Buffer<float>& q, const Buffer<float>& k,
               const Buffer<float>& v, Buffer<float>& out, const AttentionShape& sh,
               const AttentionOptions& o) {
  constexpr std::string_view w = "attention";
  detail::check_positive(w, "batch", sh.batch);
  detail::check_positive(w, "heads", sh.heads);
  detail::check_positive(w, "kv_heads", sh.kv_heads);
  LOCKSTEP_CHECK_ARG(sh.heads % sh.kv_heads == 0, w, "kv_heads", sh.kv_heads,
                     "a divisor of heads = " + std::to_string(sh.heads));
  detail::check_nonneg(w, "seq_q", sh.seq_q);
  detail::check_nonneg(w, "seq_kv", sh.seq_kv);
  const std::int64_t D = sh.head_dim;
  detail::check_head_dim(w, D);
  detail::check_enum(w, "options.precision", o.precision,
                     {AttentionPrecision::kAuto, AttentionPrecision::kExact, AttentionPrecision::kTensorCore},
                     "AttentionPrecision::kAuto, kExact or kTensorCore");
  detail::check_enum(w, "options.layout", o.layout, {AttentionLayout::kHeadsFirst, AttentionLayout::kInterleaved},
                     "AttentionLayout::kHeadsFirst or kInterleaved");
  const bool tensor_core = o.precision == AttentionPrecision::kTensorCore;
  if (tensor_core && !stream.device().caps().tensor_cores &&
      stream.device().id().kind == DeviceKind::kCuda)
    throw Unsupported(w, "precision", "TensorCore", "a CUDA device with tensor cores (this build targets sm_90)");
  LOCKSTEP_CHECK_ARG(sh.batch <= 65535, w, "batch", sh.batch, "<= 65535");
  LOCKSTEP_CHECK_ARG(sh.heads <= 65535, w, "heads", sh.heads, "<= 65535");
  LOCKSTEP_CHECK_ARG(sh.seq_q <= 0x7fffffff, w, "seq_q", sh.seq_q, "<= 2147483647");
  LOCKSTEP_CHECK_ARG(sh.seq_kv <= 0x7fffffff, w, "seq_kv", sh.seq_kv, "<= 2147483647");
  detail::check_on(w, "q", q, stream);
  detail::check_on(w, "k", k, stream);
  detail::check_on(w, "v", v, stream);
  detail::check_on(w, "out", out, stream);
  const auto B = std::uint64_t(sh.batch), H = std::uint64_t(sh.heads), Hk = std::uint64_t(sh.kv_heads),
             Sq = std::uint64_t(sh.seq_q), Sk = std::uint64_t(sh.seq_kv), UD = std::uint64_t(D);
  const auto nq = checked_product({B, H, Sq, UD}, w, "batch * heads * seq_q * head_dim");
  const auto nk = checked_product({B, Hk, Sk, UD}, w, "batch * kv_heads * seq_kv * head_dim");
  detail::check_size(w, "q", q, nq, "batch * heads * seq_q * head_dim");
  detail::check_size(w, "out", out, nq, "batch * heads * seq_q * head_dim");
  detail::check_size(w, "k", k, nk, "batch * kv_heads * seq_kv * head_dim");
  detail::check_size(w, "v", v, nk, "batch * kv_heads * seq_kv * head_dim");
  if (tensor_core) {  // K and V are read as 16-byte vectors (FusedHalfPack)
    detail::check_aligned16(w, "k", k);
    detail::check_aligned16(w, "v", v);
  }
  if (o.lse != nullptr) {
    detail::check_on(w, "lse", *o.lse, stream);
    detail::check_size(w, "lse", *o.lse, B * H * Sq, "batch * heads * seq_q");
  }
  detail::check_no_overlap(w, "out", out, "q", q);
  detail::check_no_overlap(w, "out", out, "k", k);
  detail::check_no_overlap(w, "out", out, "v", v);
  if (o.lse != nullptr) {
    detail::check_no_overlap(w, "lse", *o.lse, "q", q);
    detail::check_no_overlap(w, "lse", *o.lse, "k", k);
    detail::check_no_overlap(w, "lse", *o.lse, "v", v);
    detail::check_no_overlap(w, "lse", *o.lse, "out", out);
  }
  kernels::FusedAttentionParams p{};
  const bool heads_first = o.layout == AttentionLayout::kHeadsFirst;
  auto strides = [&](std::int64_t heads, std::int64_t seq, std::int64_t& sb, std::int64_t& ss,
                     std::int64_t& shd) {
    sb = heads * seq * D;
    ss = heads_first ? D : heads * D;
    shd = heads_first ? seq * D : D;
  };
  strides(sh.heads, sh.seq_q, p.q_sb, p.q_ss, p.q_sh);
  strides(sh.kv_heads, sh.seq_kv, p.k_sb, p.k_ss, p.k_sh);
  strides(sh.kv_heads, sh.seq_kv, p.v_sb, p.v_ss, p.v_sh);
  strides(sh.heads, sh.seq_q, p.o_sb, p.o_ss, p.o_sh);
  // Lane offsets inside a block: the rows of a query or key tile (at most 64).
  check_fits(std::uint64_t(std::max({p.q_ss, p.k_ss, p.v_ss, p.o_ss})) * 64 + UD, kMaxLaneOffset, w,
             "64 * row stride");
  if (sh.seq_q == 0) return;
  p.q = q.data().get();
  p.k = k.data().get();
  p.v = v.data().get();
  p.out = out.data().get();
  p.lse = o.lse ? o.lse->data().get() : nullptr;
  p.B = static_cast<std::int32_t>(sh.batch);
  p.H = static_cast<std::int32_t>(sh.heads);
  p.Hkv = static_cast<std::int32_t>(sh.kv_heads);
  p.Sq = static_cast<std::int32_t>(sh.seq_q);
  p.Skv = static_cast<std::int32_t>(sh.seq_kv);
  p.causal = o.causal ? 1 : 0;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.scale_log2 = static_cast<float>(static_cast<double>(p.scale) * 1.4426950408889634);
  switch (D) {
    case 32: launch_fused<32>(stream, p, sh.seq_q, sh.heads, sh.batch, tensor_core, o.batch_invariant); break;
    case 64: launch_fused<64>(stream, p, sh.seq_q, sh.heads, sh.batch, tensor_core, o.batch_invariant); break;
    case 96: launch_fused<96>(stream, p, sh.seq_q, sh.heads, sh.batch, tensor_core, o.batch_invariant); break;
    case 128: launch_fused<128>(stream, p, sh.seq_q, sh.heads, sh.batch, tensor_core, o.batch_invariant); break;
    default: launch_fused<256>(stream, p, sh.seq_q, sh.heads, sh.batch, tensor_core, o.batch_invariant); break;
  }
}

}  // namespace lockstep
