#include "decode_launch.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "checks.hpp"
#include "lockstep/buffer.hpp"
#include "lockstep/kernels/launch.hpp"

namespace lockstep::detail {

using kernels::kDecodeChunk;

std::size_t decode_workspace_floats(std::int64_t rows, std::int64_t H, std::int64_t head_dim,
                                    std::int64_t max_len) {
  const auto chunks = std::uint64_t(std::max<std::int64_t>(1, kernels::ceil_div(max_len, kDecodeChunk)));
  return checked_product({std::uint64_t(rows), std::uint64_t(H), chunks, std::uint64_t(head_dim + 2)},
                         "decode", "rows * heads * chunks * (head_dim + 2)");
}

void check_decode_shape(std::string_view where, std::int64_t n_heads, std::int64_t n_kv_heads,
                        std::int64_t head_dim, std::int64_t max_len, const DecodeShapeNames& nm) {
  // Texts are built only for a failing check: this runs on every decode call.
  const std::string_view heads(nm.heads), kv_heads(nm.kv_heads), len(nm.max_len);
  check_positive(where, heads, n_heads);
  check_positive(where, kv_heads, n_kv_heads);
  LOCKSTEP_CHECK_ARG(n_heads % n_kv_heads == 0, where, kv_heads, n_kv_heads,
            "a divisor of " + std::string(heads) + " = " + std::to_string(n_heads));
  check_head_dim(where, head_dim);
  check_nonneg(where, len, max_len);
  LOCKSTEP_CHECK_ARG(n_heads <= 65535, where, heads, n_heads, "<= 65535");
  LOCKSTEP_CHECK_ARG(n_kv_heads <= 65535, where, kv_heads, n_kv_heads, "<= 65535");
  check_fits(checked_mul(std::uint64_t(max_len), std::uint64_t(head_dim), where, nm.span), kMaxLaneOffset, where,
             nm.span);
}

namespace {
// A decode tuning knob from the environment, read once; `fallback` when unset. Every knob is a
// schedule choice: the results are the same bits for any value.
int env_knob(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}
// Schedule knobs for measurements (every value gives the same bits; Note [async tiles], Note
// [row batches], Note [merge schedule]). At head_dim 128:
//   LOCKSTEP_DECODE_STAGES=0: K and V loaded straight into registers, LOCKSTEP_DECODE_ROW_BATCH
//     = 2|4 row groups in flight (the schedule before the async tiles); =3: 32-row tiles in a
//     ring of 3 with four heads per block.
//   LOCKSTEP_DECODE_MERGE_BATCH=4|8|16: the merge without slices, with that many chunks per
//     thread group in flight (Note [merge schedule]).
int row_batch_knob() {
  static const int rb = env_knob("LOCKSTEP_DECODE_ROW_BATCH", 0);
  return rb;
}
int merge_batch_knob() {
  static const int mb = env_knob("LOCKSTEP_DECODE_MERGE_BATCH", 0);
  return mb;
}
// Measurement only, and it breaks the results: LOCKSTEP_DECODE_DIAG_ONLY=1 launches the chunk
// kernel alone, =2 the merge alone (over stale partials), to split a decode's time between them
// without hardware counters (docs/gpu-results.md, run 33).
int diag_only_knob() {
  static const int d = env_knob("LOCKSTEP_DECODE_DIAG_ONLY", 0);
  return d;
}
// LOCKSTEP_DECODE_SIGNALS=0: the merge waits for the whole chunk kernel (Note [block signals]).
int signals_knob() {
  static const int n = env_knob("LOCKSTEP_DECODE_SIGNALS", 1);
  return n;
}
// LOCKSTEP_DECODE_FOLD=0|1: the merge always in its own kernel, or always folded into the chunk
// kernel (Note [folded merge]); unset: small merges only (fold_merge).
int fold_knob() {
  static const int f = env_knob("LOCKSTEP_DECODE_FOLD", -1);
  return f;
}
// Note [one grid]: the chunk kernel and the merge as one DecodeOneGrid launch instead of two
// where the merge is not folded: half the host time of an eager call; the same bits.
// LOCKSTEP_DECODE_ONE_GRID=0|1 forces either on every device. Unset: the one grid on CUDA devices
// when kOneGridOnCuda, the two launches otherwise (the CPU device has no launch cost to save).
// kOneGridOnCuda is false: run 119 (docs/gpu-results.md) verified the one grid of 0c0a485 (its
// ticket before the prior-grid wait, the L2 policy in its chunk blocks) on the H200, and it took
// 1.5-4.5 us of host time off an eager call but cost device time: 12% on a single-wave graph
// step (B=1 L=4096), about 1% at B=1 L=32768 and B=128.
constexpr bool kOneGridOnCuda = false;
bool one_grid_for(const Stream& s) {
  static const int n = env_knob("LOCKSTEP_DECODE_ONE_GRID", -1);
  return n >= 0 ? n != 0 : kOneGridOnCuda && s.device().id().kind == DeviceKind::kCuda;
}
// LOCKSTEP_DECODE_TIMELINE=<file>: a diagnostic (Note [decode timeline] in kernels/decode/chunk.hpp).
// At head_dim 128 with 4 query heads per block, each call runs the chunk kernel's timeline
// variant, waits for it and appends its blocks' marks to the file.
const std::string& timeline_path() {
  static const std::string path = [] {
    const char* v = std::getenv("LOCKSTEP_DECODE_TIMELINE");
    return std::string(v != nullptr ? v : "");
  }();
  return path;
}
// Note [merge timeline]: the sliced merge's variant that marks (launch_decode picks it with the
// timeline, and only its marks are dumped).
using TimelineMerge = kernels::DecodeMerge<128, 32, 4, 1, true>;
// Appends one call's timeline: a header, then per block "x y sm" and its marks 0-5 in ns from
// the call's first mark 0; then (Note [merge timeline]) a "## merge" header and per merge block
// "x y sm" and its marks 0-3 from the same origin.
void dump_timeline(Stream& s, const Buffer<float>& tl, Dim3 grid, const Buffer<float>& mtl, Dim3 merge_grid,
                   const kernels::DecodeParams& p) {
  const auto words_of = [&](const Buffer<float>& b) {
    const auto words = b.to_vector(s);
    std::vector<std::uint64_t> t(words.size() / 2);
    std::memcpy(t.data(), words.data(), t.size() * sizeof(std::uint64_t));
    return t;
  };
  const auto t = words_of(tl), m = words_of(mtl);
  const std::size_t blocks = std::size_t(grid.x) * grid.y * grid.z;
  std::uint64_t t0 = ~std::uint64_t{0};
  for (std::size_t b = 0; b < blocks; ++b) t0 = std::min(t0, t[b * 8]);
  const auto rel = [&](std::uint64_t v) { return v >= t0 ? v - t0 : 0; };
  std::ofstream f(timeline_path(), std::ios::app);
  if (!f) {  // a diagnostic: said once, and the call's results stand
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr, "lockstep: LOCKSTEP_DECODE_TIMELINE=%s: cannot append to it (%s); no timeline written\n",
                   timeline_path().c_str(), std::strerror(errno));
    return;
  }
  f << "# rows " << p.rows << " H " << p.H << " Hkv " << p.Hkv << " chunks " << p.max_chunks << " grid " << grid.x
    << " " << grid.y << " " << grid.z << "\n";
  for (std::size_t b = 0; b < blocks; ++b) {
    f << b % grid.x << ' ' << (b / grid.x) % grid.y << ' ' << t[b * 8 + 6];
    for (int k = 0; k < 6; ++k) f << ' ' << rel(t[b * 8 + k]);
    f << '\n';
  }
  const std::size_t mblocks = std::size_t(merge_grid.x) * merge_grid.y;
  if (mblocks == 0) return;  // the merge was folded or not launched
  f << "## merge grid " << merge_grid.x << " " << merge_grid.y << "\n";
  for (std::size_t b = 0; b < mblocks && (b + 1) * 8 <= m.size(); ++b) {
    f << b % merge_grid.x << ' ' << b / merge_grid.x << ' ' << m[b * 8 + 6];
    for (int k = 0; k < 4; ++k) f << ' ' << rel(m[b * 8 + k]);
    f << '\n';
  }
}
// Note [tail prefetch] (kernels/decode/chunk.hpp): LOCKSTEP_DECODE_TAIL_PREFETCH=N has the last N
// blocks of the chunk grid prefetch their chunk into the L2, at head_dim 128 with 4 query heads
// per block (the variant registered); 0 (the default): none.
int tail_prefetch_knob() {
  static const int n = std::max(0, env_knob("LOCKSTEP_DECODE_TAIL_PREFETCH", 0));
  return n;
}
int stages_knob() {
  static const int ns = env_knob("LOCKSTEP_DECODE_STAGES", -1);
  return ns;
}
template <class K>
void launch_with_shared(Stream& s, const kernels::DecodeParams& p, Dim3 grid) {
  launch<K>(s, grid, K::kSharedBytes, p);
}
// Calls f.template operator()<K>() with the chunk kernel variant for g query heads per block.
template <int D, class F>
void with_chunk_variant(int g, F&& f) {
  using kernels::DecodeChunk;
  if constexpr (D == 128) {
    if (stages_knob() == 0 && g == 4)
      return row_batch_knob() == 4 ? f.template operator()<DecodeChunk<128, 4, 4>>()
                                   : f.template operator()<DecodeChunk<128, 4, 2>>();
    if (stages_knob() == 0 && g == 1)
      return row_batch_knob() == 2 ? f.template operator()<DecodeChunk<128, 1, 2>>()
                                   : f.template operator()<DecodeChunk<128, 1, 4>>();
    if (stages_knob() == 3 && g == 4) return f.template operator()<DecodeChunk<128, 4, 2, 3>>();
  }
  if constexpr (D <= 64) {
    if (g == 8) return f.template operator()<DecodeChunk<D, 8, 1, 4>>();
  }
  if constexpr (D == 128) {
    if (g == 4 && !timeline_path().empty()) return f.template operator()<DecodeChunk<128, 4, 1, 4, true>>();
    if (g == 4 && tail_prefetch_knob() > 0)  // Note [tail prefetch]
      return f.template operator()<DecodeChunk<128, 4, 1, 4, false, true>>();
  }
  if constexpr (D <= 128) {
    if (g == 4) return f.template operator()<DecodeChunk<D, 4, 1, 4>>();
  }
  if (g == 2) return f.template operator()<DecodeChunk<D, 2, 1, 4>>();
  // One query head per block: at head_dim 128, 32-row tiles in a ring of 3 (measured).
  using One = std::conditional_t<D == 128, DecodeChunk<128, 1, 2, 3>, DecodeChunk<D, 1, 1, 4>>;
  return f.template operator()<One>();
}
// The scatter of p's new tokens (Note [fused append]) as its own launch: positions are the
// lengths with a bias of 1.
kernels::KvScatterParams append_as_scatter(const kernels::DecodeParams& p, int D) {
  LOCKSTEP_ASSERT(p.length_bias == 1 && (p.lengths != nullptr || p.inline_lengths.count > 0),
                  "fused append: lengths are positions + 1");
  kernels::KvScatterParams sp{};
  sp.src_k = p.k_new;
  sp.src_v = p.v_new;
  sp.k = p.k_append;
  sp.v = p.v_append;
  sp.positions = p.lengths;
  sp.inline_positions = p.inline_lengths;
  sp.slots = p.slots;
  sp.slot_stride = p.slot_stride;
  sp.head_stride = p.head_stride;
  sp.rows = p.rows;
  sp.Hkv = p.Hkv;
  sp.D = D;
  sp.max_len = p.max_len;
  sp.status = p.status;
  return sp;
}
// Note [folded merge]: whether the chunk kernel K merges (one launch). It needs the counters and
// the async ring; by default only small merges fold, rows of one merge batch with G heads x
// chunks <= 8 per merging block (whisper-tiny: 1 x 2), since larger folded merges cost device
// time (runs 48, 49). LOCKSTEP_DECODE_FOLD=1 folds every row, =0 none.
template <class K>
bool fold_merge(const kernels::DecodeParams& p) {
  // One row per block (the kernel merges after its row loop): rows within one grid's z.
  if (p.counters == nullptr || K::kStages == 0 || diag_only_knob() != 0 || p.rows > 65535) return false;
  if (fold_knob() >= 0) return fold_knob() != 0;
  return p.max_chunks <= K::FoldMerge::kBatch && K::kHeads * p.max_chunks <= 8;
}
// Calls f.template operator()<M>(grid) with the merge kernel for p's rows and merge_grid (H
// blocks by rows); grid is M's (its slices multiply x).
template <int D, class F>
void with_merge_variant(const Stream& s, const kernels::DecodeParams& p, Dim3 merge_grid, F&& f) {
  if constexpr (D == 128) {
    const int mb = merge_batch_knob();
    if (mb == 4) return f.template operator()<kernels::DecodeMerge<128, 4>>(merge_grid);
    if (mb == 16) return f.template operator()<kernels::DecodeMerge<128, 16>>(merge_grid);
    // Fewer merge blocks than multiprocessors (B = 1): 4 slices per head, a 128-chunk row in
    // one round trip. Otherwise a batch just large enough for the cache's rows, so that few
    // loads are masked off. The bits do not depend on these choices (Note [merge schedule]).
    using Sliced = kernels::DecodeMerge<128, 32, 4, 1>;
    if (mb == 0 && std::int64_t{merge_grid.x} * merge_grid.y < s.device().caps().multiprocessors) {
      const Dim3 sliced{merge_grid.x * Sliced::kSlices, merge_grid.y, 1};
      if (!timeline_path().empty())  // Note [merge timeline]
        return f.template operator()<TimelineMerge>(sliced);
      return f.template operator()<Sliced>(sliced);
    }
    if (mb == 0 && p.max_chunks <= 8) return f.template operator()<kernels::DecodeMerge<128, 2>>(merge_grid);
    if (mb == 0 && p.max_chunks <= 16) return f.template operator()<kernels::DecodeMerge<128, 4>>(merge_grid);
  }
  return f.template operator()<kernels::DecodeMerge<D>>(merge_grid);
}

// Note [one grid]: launches the chunk kernel K and the merge M as one DecodeOneGrid where the
// knob allows; returns whether it did. A pair that is not registered takes K's pair with the
// plain DecodeMerge<D> (every merge variant gives the same bits: Note [merge schedule]).
template <int D, class K, class M>
bool launch_one_grid(Stream& s, kernels::DecodeParams p) {
  using Pair = kernels::DecodeOneGrid<K, M>;
  using Plain = kernels::DecodeOneGrid<K, kernels::DecodeMerge<D>>;
  using One = std::conditional_t<kernels::registered_v<Pair>, Pair, Plain>;
  if constexpr (kernels::registered_v<One>) {
    if (!one_grid_for(s) || p.counters == nullptr || p.ticket == nullptr || diag_only_knob() != 0) return false;
    const std::int64_t blocks = One::chunk_blocks(p) + One::merge_blocks(p);
    if (blocks > 0x7fffffff) return false;
    launch_with_shared<One>(s, p, Dim3{static_cast<std::uint32_t>(blocks), 1, 1});
    return true;
  } else {
    return false;
  }
}

// Enqueues the chunk kernel and the merge; returns the launches.
template <int D>
int launch_chunk_and_merge(Stream& s, kernels::DecodeParams p, int g, Dim3 chunk_grid,
                           Dim3 merge_grid) {
  int launches = 0;
  bool folded = false, one_grid = false;
  // Note [decode timeline]: the marks' buffer, 8 words per chunk block; Note [merge timeline]:
  // 8 per merge block, for up to 4 slices per head.
  std::optional<Buffer<float>> tl, mtl;
  Dim3 merge_used{0, 0, 1};
  if (D == 128 && g == 4 && !timeline_path().empty()) {
    tl.emplace(s.device().shared_from_this(), std::size_t(chunk_grid.x) * chunk_grid.y * chunk_grid.z * 16);
    p.timeline = reinterpret_cast<std::uint64_t*>(tl->data().get());
    StreamAccess::fill32(s, p.timeline, 0, tl->size());  // marks a path never reaches stay 0
    mtl.emplace(s.device().shared_from_this(), std::size_t(merge_grid.x) * TimelineMerge::kSlices * merge_grid.y * 16);
    p.merge_timeline = reinterpret_cast<std::uint64_t*>(mtl->data().get());
    StreamAccess::fill32(s, p.merge_timeline, 0, mtl->size());
  }
  const auto done = [&](int n) {
    if (tl) dump_timeline(s, *tl, chunk_grid, *mtl, merge_used, p);
    return n;
  };
  if (diag_only_knob() != 2) {
    with_chunk_variant<D>(g, [&]<class K>() {
      folded = fold_merge<K>(p);
      p.fold = folded ? 1 : 0;
      if (p.k_new != nullptr && K::kStages == 0) {  // Note [fused append]: no fresh rows
        launch_kv_scatter(s, append_as_scatter(p, D));
        ++launches;
        p.k_new = p.v_new = nullptr;
        p.k_append = p.v_append = nullptr;
        p.status = nullptr;
      }
      if (!folded) {
        with_merge_variant<D>(s, p, merge_grid, [&]<class M>(Dim3) { one_grid = launch_one_grid<D, K, M>(s, p); });
      }
      if (!one_grid) launch_with_shared<K>(s, p, chunk_grid);
      ++launches;
    });
  }
  if (diag_only_knob() == 1 || folded || one_grid) return done(launches);
  ++launches;
  with_merge_variant<D>(s, p, merge_grid, [&]<class M>(Dim3 mg) {
    launch_with_shared<M>(s, p, mg);
    if constexpr (std::is_same_v<M, TimelineMerge>) merge_used = mg;  // the merge that marks
  });
  return done(launches);
}
}  // namespace

// Note [streamed tiles]: the chunk kernel's L2 policy for K and V: evict-first when the K and V
// that the call may read (each row's length; where the lengths are in device memory, `longest`,
// the call's bound on them: the longest host position, or the cache's capacity for device
// positions) are more than the L2 holds, so that no call after it could find them there; else
// unchanged, as without a policy.
static int kv_l2_policy(const Stream& s, const kernels::DecodeParams& p, int D, std::int64_t longest) {
  // LOCKSTEP_DECODE_L2_HINT=0|1|2: always unchanged, evict-first or evict-normal (measurement;
  // the same bits).
  static const int knob = env_knob("LOCKSTEP_DECODE_L2_HINT", -1);
  if (knob >= kernels::kL2Unchanged && knob <= kernels::kL2EvictNormal) return knob;
  const std::uint64_t l2 = s.device().caps().l2_bytes;
  if (l2 == 0) return kernels::kL2Unchanged;
  std::uint64_t tokens = 0;
  if (p.lengths == nullptr && p.inline_lengths.count == 0) {
    tokens = std::uint64_t(p.rows) * std::uint64_t(std::max(0, p.length));
  } else if (p.lengths == nullptr) {  // at most kInlineRows rows
    for (std::int32_t r = 0; r < p.rows; ++r)
      tokens += std::uint64_t(std::clamp<std::int64_t>(std::int64_t{p.inline_lengths.v[r]} + p.length_bias, 0, p.max_len));
  } else {
    tokens = std::uint64_t(p.rows) * std::uint64_t(std::max<std::int64_t>(0, longest));
  }
  return tokens * std::uint64_t(p.Hkv) * std::uint64_t(D) * 2 * sizeof(float) > l2 ? kernels::kL2EvictFirst
                                                                                      : kernels::kL2Unchanged;
}

int launch_decode(Stream& s, kernels::DecodeParams p, float* workspace, std::int64_t head_dim,
                  std::int64_t max_len) {
  if (p.rows == 0) return 0;
  LOCKSTEP_ASSERT(p.max_len > 0 || (p.lengths == nullptr && p.inline_lengths.count == 0),
                  "DecodeParams::max_len unset");
  LOCKSTEP_ASSERT(p.inline_lengths.count == 0 || p.rows <= p.inline_lengths.count,
                  "inline lengths: one per row");
  const int D = static_cast<int>(head_dim);
  const int group = p.H / p.Hkv;
  // Query heads per block: more reuse of each K/V byte against more registers per thread. Each
  // head's arithmetic does not depend on this choice (same bits), so it is a pure tuning knob.
  static const int limit = std::max(32, env_knob("LOCKSTEP_DECODE_HEAD_DIM_PRODUCT", 512));  // G * head_dim cap
  int g = 1;
  for (int cand : {8, 4, 2}) {
    if (group % cand == 0 && cand * D <= std::min(limit, 512)) {
      g = cand;
      break;
    }
  }
  p.max_chunks = static_cast<std::int32_t>(std::max<std::int64_t>(1, kernels::ceil_div(max_len, kDecodeChunk)));
  p.kv_l2_policy = kv_l2_policy(s, p, D, max_len);
  p.part_o = workspace;
  p.part_ml = workspace + std::size_t(p.rows) * p.H * p.max_chunks * D;
  // Note [block signals]: a counter pair per (row, block y of the chunk grid). Off for the
  // measurement-only knob, which launches one kernel without the other.
  p.heads_per_block = g;
  // Note [one grid]: DecodeOneGrid's ticket first, at the same place for every call on the
  // stream (a call's blocks take it before the previous call's grid is done), then the pairs.
  const std::size_t pair_ints = std::size_t(p.rows) * (p.H / g) * 2;
  const std::size_t counter_ints = 1 + pair_ints;
  bool fresh = false;
  std::int32_t* const counters =
      diag_only_knob() == 0 && signals_knob() != 0 ? StreamAccess::counters(s, counter_ints, &fresh) : nullptr;
  p.ticket = counters;
  p.counters = counters != nullptr ? counters + 1 : nullptr;
  p.ticket_after_wait = fresh ? 1 : 0;  // Note [one grid]: a fill zeroed them just now
  p.prefetch_tail = tail_prefetch_knob();  // Note [tail prefetch]: read by its variant only
  const std::uint32_t rows_grid = static_cast<std::uint32_t>(std::min<std::int32_t>(p.rows, 65535));
  const Dim3 chunk_grid{static_cast<std::uint32_t>(p.max_chunks),
                        static_cast<std::uint32_t>(p.Hkv * (group / g)), rows_grid};
  const Dim3 merge_grid{static_cast<std::uint32_t>(p.H), rows_grid, 1};
  int launches = 0;
  try {
    switch (D) {
      case 32: launches = launch_chunk_and_merge<32>(s, p, g, chunk_grid, merge_grid); break;
      case 64: launches = launch_chunk_and_merge<64>(s, p, g, chunk_grid, merge_grid); break;
      case 96: launches = launch_chunk_and_merge<96>(s, p, g, chunk_grid, merge_grid); break;
      case 128: launches = launch_chunk_and_merge<128>(s, p, g, chunk_grid, merge_grid); break;
      case 256: launches = launch_chunk_and_merge<256>(s, p, g, chunk_grid, merge_grid); break;
      default: check_head_dim("decode", D);
    }
  } catch (...) {
    // A chunk kernel enqueued without its merge would leave counts behind that a later merge
    // would pass too early or wait on forever: zero the pairs after it (Note [block signals]).
    // Not the ticket, which no enqueued kernel leaves non-zero and a later DecodeOneGrid may take
    // before its wait for this fill (Note [one grid]).
    if (counters != nullptr) StreamAccess::fill32(s, counters + 1, 0, pair_ints);
    throw;
  }
  return launches;
}

void launch_kv_scatter(Stream& s, const kernels::KvScatterParams& p) {
  if (p.rows == 0) return;
  LOCKSTEP_ASSERT(p.max_len > 0, "KvScatterParams::max_len unset");
  LOCKSTEP_ASSERT(p.inline_positions.count == 0 || p.rows <= p.inline_positions.count,
                  "inline positions: one per row");
  const Dim3 grid{static_cast<std::uint32_t>(p.Hkv),
                  static_cast<std::uint32_t>(std::min<std::int32_t>(p.rows, 65535)), 2};
  launch<kernels::KvScatter>(s, grid, 0, p);
}

}  // namespace lockstep::detail
