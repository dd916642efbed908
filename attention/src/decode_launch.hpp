#pragma once
// Internal: the decode kernels' launch (shared by incremental_attention and flash_decoding).
#include <cstddef>

#include "lockstep/device.hpp"
#include "lockstep/kernels/decode.hpp"
#include "lockstep/tuning.hpp"

namespace lockstep::detail {

// Floats of workspace launch_decode needs for `rows` query rows of H heads, lengths <= max_len.
std::size_t decode_workspace_floats(std::int64_t rows, std::int64_t H, std::int64_t head_dim,
                                    std::int64_t max_len);

// Launches DecodeChunk + DecodeMerge for p (q, k, v, lengths/length, slots, out, strides, rows,
// H, Hkv, scale set); the partials are carved from `workspace`. With p.k_new set, each row's new
// token is appended as well by the chunk kernel (Note [fused append]; lengths are then
// positions, length_bias 1). The schedule is plan::plan_decode's for the stream's device and
// `tuning` (the call's, tuning_for). Returns the launches enqueued.
// cache: the format of p.k and p.v (Note [decode formats]).
int launch_decode(Stream& s, kernels::DecodeParams p, float* workspace, std::int64_t head_dim,
                  std::int64_t max_len, const Tuning& tuning, Format cache = Format::f32);

void launch_kv_scatter(Stream& s, const kernels::KvScatterParams& p, Format cache = Format::f32);

// Checks the decode geometry: head_dim supported, kv heads divide heads, sizes within the
// kernels' 32-bit lane offsets.
// The names the checks report: incremental_attention's DecodeShape fields by default,
// KvCacheConfig's for the cache.
struct DecodeShapeNames {
  std::string_view heads = "num_heads", kv_heads = "num_kv_heads", max_len = "max_len";
  std::string_view span = "max_len * head_dim";  // max_len's name times head_dim
};
void check_decode_shape(std::string_view where, std::int64_t num_heads, std::int64_t num_kv_heads,
                        std::int64_t head_dim, std::int64_t max_len, const DecodeShapeNames& names = {});

}  // namespace lockstep::detail
