#include "decode_launch.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "checks.hpp"
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
                        std::int64_t head_dim, std::int64_t max_len) {
  check_positive(where, "n_heads", n_heads);
  check_positive(where, "n_kv_heads", n_kv_heads);
  LOCKSTEP_CHECK_ARG(n_heads % n_kv_heads == 0, where, "n_kv_heads", n_kv_heads,
            "a divisor of n_heads = " + std::to_string(n_heads));
  if (head_dim != 32 && head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 256)
    throw Unsupported(where, "head_dim", std::to_string(head_dim), "32, 64, 96, 128, 256");
  check_nonneg(where, "max_seq_len", max_len);
  LOCKSTEP_CHECK_ARG(n_heads <= 65535 && n_kv_heads <= 65535, where, "n_heads", n_heads, "<= 65535");
  check_fits(checked_mul(std::uint64_t(max_len), std::uint64_t(head_dim), where,
                         "max_seq_len * head_dim"),
             kMaxLaneOffset, where, "max_seq_len * head_dim");
}

namespace {
template <int D, int G>
void launch_chunk(Stream& s, const kernels::DecodeParams& p, Dim3 grid) {
  using K = kernels::DecodeChunk<D, G>;
  launch<K>(s, grid, K::kSharedBytes, p);
}
// LOCKSTEP_DECODE_ROW_BATCH=2|4: at head_dim 128 the number of 16-row groups whose loads are in
// flight together (defaults: 2 with 4 query heads per block, 4 with one; Note [row batches]).
// A schedule choice: the same bits.
int row_batch_knob() {
  static const int rb = [] {
    const char* v = std::getenv("LOCKSTEP_DECODE_ROW_BATCH");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  return rb;
}
// LOCKSTEP_DECODE_MERGE_BATCH=4: the merge at head_dim 128 keeps 4 (instead of 8) chunks per
// thread group in flight. A schedule choice: the same bits.
int merge_batch_knob() {
  static const int mb = [] {
    const char* v = std::getenv("LOCKSTEP_DECODE_MERGE_BATCH");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  return mb;
}
template <int D>
void launch_chunk_g(Stream& s, const kernels::DecodeParams& p, int g, Dim3 grid) {
  if constexpr (D == 128) {
    if (row_batch_knob() == 4 && g == 4) {
      using K = kernels::DecodeChunk<128, 4, 4>;
      return launch<K>(s, grid, K::kSharedBytes, p);
    }
    if (row_batch_knob() == 2 && g == 1) {
      using K = kernels::DecodeChunk<128, 1, 2>;
      return launch<K>(s, grid, K::kSharedBytes, p);
    }
  }
  if constexpr (D <= 64) {
    if (g == 8) return launch_chunk<D, 8>(s, p, grid);
  }
  if constexpr (D <= 128) {
    if (g == 4) return launch_chunk<D, 4>(s, p, grid);
  }
  if (g == 2) return launch_chunk<D, 2>(s, p, grid);
  return launch_chunk<D, 1>(s, p, grid);
}
}  // namespace

int launch_decode(Stream& s, kernels::DecodeParams p, float* workspace, std::int64_t head_dim,
                  std::int64_t max_len) {
  if (p.rows == 0) return 0;
  const int D = static_cast<int>(head_dim);
  const int group = p.H / p.Hkv;
  // Query heads per block: more reuse of each K/V byte against more registers per thread. Each
  // head's arithmetic does not depend on this choice (same bits), so it is a pure tuning knob.
  static const int limit = [] {
    const char* v = std::getenv("LOCKSTEP_DECODE_HEAD_DIM_PRODUCT");  // G * head_dim cap
    return v != nullptr ? std::max(32, std::atoi(v)) : 512;
  }();
  int g = 1;
  for (int cand : {8, 4, 2}) {
    if (group % cand == 0 && cand * D <= std::min(limit, 512)) {
      g = cand;
      break;
    }
  }
  p.max_chunks = static_cast<std::int32_t>(std::max<std::int64_t>(1, kernels::ceil_div(max_len, kDecodeChunk)));
  p.part_o = workspace;
  p.part_ml = workspace + std::size_t(p.rows) * p.H * p.max_chunks * D;
  const std::uint32_t rows_grid = static_cast<std::uint32_t>(std::min<std::int32_t>(p.rows, 65535));
  const Dim3 chunk_grid{static_cast<std::uint32_t>(p.max_chunks),
                        static_cast<std::uint32_t>(p.Hkv * (group / g)), rows_grid};
  const Dim3 merge_grid{static_cast<std::uint32_t>(p.H), rows_grid, 1};
  switch (D) {
    case 32: launch_chunk_g<32>(s, p, g, chunk_grid); launch<kernels::DecodeMerge<32>>(s, merge_grid, kernels::DecodeMerge<32>::kSharedBytes, p); break;
    case 64: launch_chunk_g<64>(s, p, g, chunk_grid); launch<kernels::DecodeMerge<64>>(s, merge_grid, kernels::DecodeMerge<64>::kSharedBytes, p); break;
    case 96: launch_chunk_g<96>(s, p, g, chunk_grid); launch<kernels::DecodeMerge<96>>(s, merge_grid, kernels::DecodeMerge<96>::kSharedBytes, p); break;
    case 128:
      launch_chunk_g<128>(s, p, g, chunk_grid);
      if (merge_batch_knob() == 4)
        launch<kernels::DecodeMerge<128, 4>>(s, merge_grid, kernels::DecodeMerge<128, 4>::kSharedBytes, p);
      else
        launch<kernels::DecodeMerge<128>>(s, merge_grid, kernels::DecodeMerge<128>::kSharedBytes, p);
      break;
    case 256: launch_chunk_g<256>(s, p, g, chunk_grid); launch<kernels::DecodeMerge<256>>(s, merge_grid, kernels::DecodeMerge<256>::kSharedBytes, p); break;
    default: throw Unsupported("decode", "head_dim", std::to_string(D), "32, 64, 96, 128, 256");
  }
  return 2;
}

void launch_kv_scatter(Stream& s, const kernels::KvScatterParams& p) {
  if (p.rows == 0) return;
  const Dim3 grid{static_cast<std::uint32_t>(p.Hkv),
                  static_cast<std::uint32_t>(std::min<std::int32_t>(p.rows, 65535)), 2};
  launch<kernels::KvScatter>(s, grid, 0, p);
}

}  // namespace lockstep::detail
