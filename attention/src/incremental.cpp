
#include "checks.hpp"
#include "decode_launch.hpp"
#include "lockstep/attention/decode.hpp"

namespace lockstep {

std::uint64_t incremental_attention_workspace_bytes(const DecodeShape& shape) {
  constexpr std::string_view w = "incremental_attention_workspace_bytes";
  detail::check_decode_shape(w, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.max_len);
  return checked_mul(detail::decode_workspace_floats(1, shape.num_heads, shape.head_dim, shape.max_len),
                     sizeof(float), w, "workspace bytes");
}

void incremental_attention(Stream& stream, const Buffer<float>& q, const Buffer<float>& k_cache,
                           const Buffer<float>& v_cache, std::int64_t seq_len,
                           Buffer<float>& out, const DecodeShape& shape, const DecodeOptions& options) {
  constexpr std::string_view w = "incremental_attention";
  detail::check_decode_shape(w, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.max_len);
  LOCKSTEP_CHECK_ARG(seq_len >= 0 && seq_len <= shape.max_len, w, "seq_len", seq_len,
            "in [0, max_len = " + std::to_string(shape.max_len) + "]");
  detail::check_on(w, "q", q, stream);
  detail::check_on(w, "k_cache", k_cache, stream);
  detail::check_on(w, "v_cache", v_cache, stream);
  detail::check_on(w, "out", out, stream);
  const auto H = std::uint64_t(shape.num_heads), Hk = std::uint64_t(shape.num_kv_heads),
             D = std::uint64_t(shape.head_dim), L = std::uint64_t(shape.max_len);
  detail::check_size(w, "q", q, H * D, "num_heads * head_dim");
  detail::check_size(w, "out", out, H * D, "num_heads * head_dim");
  detail::check_aligned16(w, "q", q);
  detail::check_aligned16(w, "k_cache", k_cache);
  detail::check_aligned16(w, "v_cache", v_cache);
  const auto cache = checked_product({Hk, L, D}, w, "num_kv_heads * max_len * head_dim");
  detail::check_size(w, "k_cache", k_cache, cache, "num_kv_heads * max_len * head_dim");
  detail::check_size(w, "v_cache", v_cache, cache, "num_kv_heads * max_len * head_dim");
  detail::check_no_overlap(w, "out", out, "q", q);
  detail::check_no_overlap(w, "out", out, "k_cache", k_cache);
  detail::check_no_overlap(w, "out", out, "v_cache", v_cache);
  LOCKSTEP_CHECK_ARG(options.status == nullptr, w, "options.status", "set",
                     "nullptr (a status is flash_decoding's with device positions)");
  const float scale = detail::softmax_scale(w, options.scale, shape.head_dim);
  if (options.tuning != nullptr) options.tuning->check(w);
  const Tuning& tuning = detail::tuning_for(stream, options.tuning);
  // The partials for this call's length (the workspace query sizes them for max_len).
  const std::size_t ws_floats = detail::decode_workspace_floats(1, shape.num_heads, shape.head_dim,
                                                                std::max<std::int64_t>(seq_len, 1));
  detail::check_workspace(w, options.workspace, stream, ws_floats * sizeof(float));
  detail::check_workspace_apart(w, options.workspace, "q", q);
  detail::check_workspace_apart(w, options.workspace, "k_cache", k_cache);
  detail::check_workspace_apart(w, options.workspace, "v_cache", v_cache);
  detail::check_workspace_apart(w, options.workspace, "out", out);
  auto* ws = static_cast<float*>(detail::workspace_memory(stream, options.workspace, ws_floats * sizeof(float)));
  kernels::DecodeParams p{};
  p.q = q.data().get();
  p.k = k_cache.data().get();
  p.v = v_cache.data().get();
  p.lengths = nullptr;
  p.slots = nullptr;
  p.out = out.data().get();
  p.slot_stride = 0;
  p.head_stride = shape.max_len * shape.head_dim;
  p.rows = 1;
  p.H = static_cast<std::int32_t>(shape.num_heads);
  p.Hkv = static_cast<std::int32_t>(shape.num_kv_heads);
  p.length = static_cast<std::int32_t>(seq_len);
  p.max_len = static_cast<std::int32_t>(shape.max_len);
  p.scale = scale;
  detail::launch_decode(stream, p, ws, shape.head_dim, std::max<std::int64_t>(seq_len, 1), tuning);
}

void kv_cache_scatter(Stream& stream, const Buffer<float>& src, std::int64_t pos, Buffer<float>& cache,
                      const DecodeShape& shape) {
  constexpr std::string_view w = "kv_cache_scatter";
  detail::check_positive(w, "num_kv_heads", shape.num_kv_heads);
  detail::check_positive(w, "head_dim", shape.head_dim);
  detail::check_positive(w, "max_len", shape.max_len);
  LOCKSTEP_CHECK_ARG(pos >= 0 && pos < shape.max_len, w, "pos", pos,
            "in [0, max_len = " + std::to_string(shape.max_len) + ")");
  detail::check_on(w, "src", src, stream);
  detail::check_on(w, "cache", cache, stream);
  const auto Hk = std::uint64_t(shape.num_kv_heads), D = std::uint64_t(shape.head_dim),
             L = std::uint64_t(shape.max_len);
  detail::check_size(w, "src", src, checked_mul(Hk, D, w, "num_kv_heads * head_dim"), "num_kv_heads * head_dim");
  detail::check_size(w, "cache", cache, checked_product({Hk, L, D}, w, "num_kv_heads * max_len * head_dim"),
                     "num_kv_heads * max_len * head_dim");
  check_fits(L * D, kMaxLaneOffset, w, "max_len * head_dim");
  detail::check_no_overlap(w, "cache", cache, "src", src);
  kernels::KvScatterParams p{};
  p.src_k = src.data().get();
  p.src_v = nullptr;
  p.k = cache.data().get();
  p.v = nullptr;
  p.positions = nullptr;
  p.slots = nullptr;
  p.slot_stride = 0;
  p.head_stride = shape.max_len * shape.head_dim;
  p.rows = 1;
  p.Hkv = static_cast<std::int32_t>(shape.num_kv_heads);
  p.D = static_cast<std::int32_t>(shape.head_dim);
  p.position = static_cast<std::int32_t>(pos);
  p.max_len = static_cast<std::int32_t>(shape.max_len);
  detail::launch_kv_scatter(stream, p);
}

}  // namespace lockstep
