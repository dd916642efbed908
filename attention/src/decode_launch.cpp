#include "decode_launch.hpp"

#include <algorithm>
#include <type_traits>

#include "checks.hpp"
#include "lockstep/buffer.hpp"
#include "lockstep/kernels/launch.hpp"
#include "decode_plan.hpp"

namespace lockstep::detail {

using kernels::kDecodeChunk;

std::size_t decode_workspace_floats(std::int64_t rows, std::int64_t H, std::int64_t head_dim,
                                    std::int64_t max_len) {
  const auto chunks = std::uint64_t(std::max<std::int64_t>(1, kernels::ceil_div(max_len, kDecodeChunk)));
  return checked_product({std::uint64_t(rows), std::uint64_t(H), chunks, std::uint64_t(head_dim + 2)},
                         "decode", "rows * heads * chunks * (head_dim + 2)");
}

void check_decode_shape(std::string_view where, std::int64_t num_heads, std::int64_t num_kv_heads,
                        std::int64_t head_dim, std::int64_t max_len, const DecodeShapeNames& nm) {
  // Texts are built only for a failing check: this runs on every decode call.
  const std::string_view heads(nm.heads), kv_heads(nm.kv_heads), len(nm.max_len);
  check_positive(where, heads, num_heads);
  check_positive(where, kv_heads, num_kv_heads);
  LOCKSTEP_CHECK_ARG(num_heads % num_kv_heads == 0, where, kv_heads, num_kv_heads,
            "a divisor of " + std::string(heads) + " = " + std::to_string(num_heads));
  check_head_dim(where, head_dim);
  check_nonneg(where, len, max_len);
  LOCKSTEP_CHECK_ARG(num_heads <= 65535, where, heads, num_heads, "<= 65535");
  LOCKSTEP_CHECK_ARG(num_kv_heads <= 65535, where, kv_heads, num_kv_heads, "<= 65535");
  check_fits(checked_mul(std::uint64_t(max_len), std::uint64_t(head_dim), where, nm.span), kMaxLaneOffset, where,
             nm.span);
}

namespace {

static_assert(static_cast<int>(L2Policy::kUnchanged) == kernels::kL2Unchanged &&
                  static_cast<int>(L2Policy::kEvictFirst) == kernels::kL2EvictFirst &&
                  static_cast<int>(L2Policy::kEvictNormal) == kernels::kL2EvictNormal,
              "Tuning's L2Policy is the chunk kernel's policy code");

template <class K>
void launch_with_shared(Stream& s, const kernels::DecodeParams& p, Dim3 grid) {
  launch<K>(s, grid, K::kSharedBytes, p);
}

// Calls f.template operator()<K>() with the chunk kernel the plan chose.
template <int D, class C, class F>
void with_chunk_kernel(const plan::DecodePlan& pl, F&& f) {
  using kernels::DecodeChunk;
  if constexpr (D == 128 && !std::is_same_v<C, float>) {
    constexpr int kW = 4 / int(sizeof(C));  // Note [wide tiles]: the plan's row batch times kW
    if (pl.row_batch == (pl.heads_per_block == 1 ? 2 * kW : kW)) {
      switch (pl.heads_per_block) {
        case 4: return f.template operator()<DecodeChunk<128, 4, kW, 4, C>>();
        case 2: return f.template operator()<DecodeChunk<128, 2, kW, 4, C>>();
        case 1: return f.template operator()<DecodeChunk<128, 1, 2 * kW, 3, C>>();
        default: break;
      }
    }
  }
  switch (pl.heads_per_block) {
    case 8:
      if constexpr (D <= 64) return f.template operator()<DecodeChunk<D, 8, 1, 4, C>>();
      break;
    case 4:
      if constexpr (D <= 128) return f.template operator()<DecodeChunk<D, 4, 1, 4, C>>();
      break;
    case 2: return f.template operator()<DecodeChunk<D, 2, 1, 4, C>>();
    case 1: {
      using One = std::conditional_t<D == 128, DecodeChunk<128, 1, 2, 3, C>, DecodeChunk<D, 1, 1, 4, C>>;
      return f.template operator()<One>();
    }
    default: break;
  }
  LOCKSTEP_ASSERT(false, "decode plan: a chunk kernel that is not registered");
}

// Calls f.template operator()<M>() with the merge kernel the plan chose.
template <int D, class F>
void with_merge_kernel(const plan::DecodePlan& pl, F&& f) {
  if constexpr (D == 128) {
    switch (pl.merge) {
      case plan::DecodeMergeKind::kSliced: return f.template operator()<kernels::DecodeMerge<128, 32, 4, 1>>();
      case plan::DecodeMergeKind::kBatch2: return f.template operator()<kernels::DecodeMerge<128, 2>>();
      case plan::DecodeMergeKind::kBatch4: return f.template operator()<kernels::DecodeMerge<128, 4>>();
      case plan::DecodeMergeKind::kPlain: break;
    }
  }
  return f.template operator()<kernels::DecodeMerge<D>>();
}

// Enqueues the plan's launches: the chunk kernel (merging itself where folded), then the merge,
// or both as one DecodeOneGrid.
template <int D, class C>
void launch_chunk_and_merge(Stream& s, kernels::DecodeParams p, const plan::DecodePlan& pl) {
  with_chunk_kernel<D, C>(pl, [&]<class K>() {
    p.fold = pl.fold_merge ? 1 : 0;
    if (pl.one_grid) {
      with_merge_kernel<D>(pl, [&]<class M>() {
        using One = kernels::DecodeOneGrid<K, M>;
        if constexpr (kernels::registered_v<One>) {
          const std::int64_t blocks = One::chunk_blocks(p) + One::merge_blocks(p);
          LOCKSTEP_ASSERT(blocks <= 0x7fffffff, "decode plan: one grid of more than 2^31 - 1 blocks");
          launch_with_shared<One>(s, p, Dim3{static_cast<std::uint32_t>(blocks), 1, 1});
        } else {
          LOCKSTEP_ASSERT(false, "decode plan: a one-grid pair that is not registered");
        }
      });
      return;
    }
    launch_with_shared<K>(s, p, pl.chunk_grid);
    if (!pl.fold_merge) with_merge_kernel<D>(pl, [&]<class M>() { launch_with_shared<M>(s, p, pl.merge_grid); });
  });
}
}  // namespace

template <class C>
void launch_for_dim(Stream& s, const kernels::DecodeParams& p, const plan::DecodePlan& pl, std::int64_t head_dim) {
  switch (head_dim) {
    case 32: launch_chunk_and_merge<32, C>(s, p, pl); break;
    case 64: launch_chunk_and_merge<64, C>(s, p, pl); break;
    case 96: launch_chunk_and_merge<96, C>(s, p, pl); break;
    case 128: launch_chunk_and_merge<128, C>(s, p, pl); break;
    case 256: launch_chunk_and_merge<256, C>(s, p, pl); break;
    default: check_head_dim("decode", head_dim);
  }
}

int launch_decode(Stream& s, kernels::DecodeParams p, float* workspace, std::int64_t head_dim,
                  std::int64_t max_len, const Tuning& tuning, Format cache) {
  if (p.rows == 0) return 0;
  LOCKSTEP_ASSERT(p.max_len > 0 || (p.lengths == nullptr && p.inline_lengths.count == 0),
                  "DecodeParams::max_len unset");
  LOCKSTEP_ASSERT(p.inline_lengths.count == 0 || p.rows <= p.inline_lengths.count,
                  "inline lengths: one per row");
  // Note [streamed tiles]: the K and V the call may read: each row's length; where the lengths
  // are in device memory, `max_len`, the call's bound on them.
  std::uint64_t tokens = 0;
  if (p.lengths == nullptr && p.inline_lengths.count == 0) {
    tokens = std::uint64_t(p.rows) * std::uint64_t(std::max(0, p.length));
  } else if (p.lengths == nullptr) {  // at most kInlineRows rows
    for (std::int32_t r = 0; r < p.rows; ++r)
      tokens += std::uint64_t(std::clamp<std::int64_t>(std::int64_t{p.inline_lengths.v[r]} + p.length_bias, 0, p.max_len));
  } else {
    tokens = std::uint64_t(p.rows) * std::uint64_t(std::max<std::int64_t>(0, max_len));
  }
  const plan::DecodePlan pl = plan::plan_decode(
      s.device().caps(), plan::DecodeProblem{p.rows, p.H, p.Hkv, head_dim, max_len, tokens, cache},
      tuning);
  p.max_chunks = pl.max_chunks;
  p.kv_l2_policy = static_cast<int>(pl.l2_policy);
  p.part_o = workspace;
  p.part_ml = workspace + std::size_t(p.rows) * p.H * p.max_chunks * head_dim;
  p.heads_per_block = pl.heads_per_block;
  // Note [block signals]: a counter pair per (row, block y of the chunk grid), after Note [one
  // grid]'s ticket, at the same place for every call on the stream (a call's blocks take it
  // before the previous call's grid is done).
  bool fresh = false;
  std::int32_t* const counters = pl.counter_ints > 0 ? StreamAccess::counters(s, pl.counter_ints, &fresh) : nullptr;
  p.ticket = counters;
  p.counters = counters != nullptr ? counters + 1 : nullptr;
  p.ticket_after_wait = fresh ? 1 : 0;  // Note [one grid]: a fill zeroed them just now
  const std::uint64_t launches_before = s.launches();
  try {
    switch (cache) {
      case Format::f32: launch_for_dim<float>(s, p, pl, head_dim); break;
      case Format::f16: launch_for_dim<half>(s, p, pl, head_dim); break;
      case Format::bf16: launch_for_dim<bfloat16>(s, p, pl, head_dim); break;
      case Format::fp8_e4m3: launch_for_dim<fp8_e4m3>(s, p, pl, head_dim); break;
      case Format::fp8_e5m2: launch_for_dim<fp8_e5m2>(s, p, pl, head_dim); break;
    }
  } catch (...) {
    // A chunk kernel enqueued without its merge would leave counts behind that a later merge
    // would pass too early or wait on forever: zero the pairs after it (Note [block signals]).
    // Not the ticket, which no enqueued kernel leaves non-zero and a later DecodeOneGrid may take
    // before its wait for this fill (Note [one grid]).
    if (counters != nullptr) StreamAccess::fill32(s, counters + 1, 0, pl.counter_ints - 1);
    throw;
  }
  LOCKSTEP_ASSERT(s.launches() - launches_before == std::uint64_t(pl.launches), "decode plan: launches");
  return pl.launches;
}

void launch_kv_scatter(Stream& s, const kernels::KvScatterParams& p, Format cache) {
  if (p.rows == 0) return;
  LOCKSTEP_ASSERT(p.max_len > 0, "KvScatterParams::max_len unset");
  LOCKSTEP_ASSERT(p.inline_positions.count == 0 || p.rows <= p.inline_positions.count,
                  "inline positions: one per row");
  const Dim3 grid{static_cast<std::uint32_t>(p.Hkv),
                  static_cast<std::uint32_t>(std::min<std::int32_t>(p.rows, 65535)), 2};
  switch (cache) {
    case Format::f32: launch<kernels::KvScatter<float>>(s, grid, 0, p); break;
    case Format::f16: launch<kernels::KvScatter<half>>(s, grid, 0, p); break;
    case Format::bf16: launch<kernels::KvScatter<bfloat16>>(s, grid, 0, p); break;
    case Format::fp8_e4m3: launch<kernels::KvScatter<fp8_e4m3>>(s, grid, 0, p); break;
    case Format::fp8_e5m2: launch<kernels::KvScatter<fp8_e5m2>>(s, grid, 0, p); break;
  }
}

}  // namespace lockstep::detail
