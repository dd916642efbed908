
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

namespace {
template <class T>
constexpr bool is_act_v = std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;
template <class C>
constexpr bool is_cache_v = std::is_same_v<C, float> || is_format_v<C>;

// The kv scales an fp8 cache needs (required) and other formats refuse; `n` floats on the stream's
// device.
const float* check_scales(std::string_view w, std::string_view name, Format cache, const Buffer<float>* s,
                          std::uint64_t n, Stream& stream) {
  if (!is_fp8(cache)) {
    LOCKSTEP_CHECK_ARG(s == nullptr, w, name, "set", std::string("nullptr: scales are for fp8 caches, not ") + format_name(cache));
    return nullptr;
  }
  LOCKSTEP_CHECK_ARG(s != nullptr, w, name, "nullptr", std::string("the scales of the ") + format_name(cache) + " cache");
  detail::check_on(w, name, *s, stream);
  detail::check_size(w, name, *s, n, n == 1 ? "1" : "the scales' count");
  return s->data().get();
}
}  // namespace

template <class T, class C>
void incremental_attention(Stream& stream, const Buffer<T>& q, const Buffer<C>& k_cache,
                           const Buffer<C>& v_cache, std::int64_t seq_len, Buffer<T>& out,
                           const DecodeShape& shape, const DecodeOptions& options) {
  static_assert(is_act_v<T> && is_cache_v<C>, "incremental_attention: q, out float/half/bfloat16, caches any format");
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
  const float* scales = check_scales(w, "options.kv_scales", format_of<C>(), options.kv_scales,
                                     2 * std::uint64_t(shape.num_kv_heads), stream);
  if (options.kv_scales != nullptr) {
    detail::check_no_overlap(w, "out", out, "options.kv_scales", *options.kv_scales);
    detail::check_workspace_apart(w, options.workspace, "options.kv_scales", *options.kv_scales);
  }
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
  p.act_format = static_cast<std::int32_t>(format_of<T>());
  p.kv_scales = scales;
  detail::launch_decode(stream, p, ws, shape.head_dim, std::max<std::int64_t>(seq_len, 1), tuning, format_of<C>());
}

template <class T, class C>
void kv_cache_scatter(Stream& stream, const Buffer<T>& src, std::int64_t pos, Buffer<C>& cache,
                      const DecodeShape& shape, const Buffer<float>* scale) {
  static_assert(is_act_v<T> && is_cache_v<C>, "kv_cache_scatter: src float/half/bfloat16, the cache any format");
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
  const float* scales = check_scales(w, "scale", format_of<C>(), scale, Hk, stream);
  if (scale != nullptr) detail::check_no_overlap(w, "cache", cache, "scale", *scale);
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
  p.act_format = static_cast<std::int32_t>(format_of<T>());
  p.kv_scales = scales;  // K's scales: the kernel's block z is 0 (src_v is null)
  detail::launch_kv_scatter(stream, p, format_of<C>());
}

#define LOCKSTEP_DECODE_PAIR(T, C)                                                                      \
  template void incremental_attention(Stream&, const Buffer<T>&, const Buffer<C>&, const Buffer<C>&,   \
                                      std::int64_t, Buffer<T>&, const DecodeShape&, const DecodeOptions&); \
  template void kv_cache_scatter(Stream&, const Buffer<T>&, std::int64_t, Buffer<C>&, const DecodeShape&, \
                                 const Buffer<float>*);
#define LOCKSTEP_DECODE_CACHES(T)                                                                       \
  LOCKSTEP_DECODE_PAIR(T, float)                                                                        \
  LOCKSTEP_DECODE_PAIR(T, half)                                                                         \
  LOCKSTEP_DECODE_PAIR(T, bfloat16)                                                                     \
  LOCKSTEP_DECODE_PAIR(T, fp8_e4m3)                                                                     \
  LOCKSTEP_DECODE_PAIR(T, fp8_e5m2)
LOCKSTEP_DECODE_CACHES(float)
LOCKSTEP_DECODE_CACHES(half)
LOCKSTEP_DECODE_CACHES(bfloat16)
#undef LOCKSTEP_DECODE_CACHES
#undef LOCKSTEP_DECODE_PAIR

}  // namespace lockstep
