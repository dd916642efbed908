// flash_decoding: a decode step over every slot of a KvCache layer, appending each slot's new
// token and attending its cache in one chunk launch (Note [fused append]).
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/decode.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "checks.hpp"
#include "decode_launch.hpp"
#include "kv_cache_detail.hpp"

namespace lockstep {

namespace {
// The checks both flash_decoding overloads make before anything is enqueued; returns the layer's
// K and V for the overloads' own checks.
template <class T>
detail::LayerKv check_flash_args(std::string_view w, Stream& stream, const KvCache& cache,
                                 std::int64_t layer, const Buffer<T>& q, const Buffer<T>& k_new,
                                 const Buffer<T>& v_new, const Buffer<T>& out, const DecodeOptions& o) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "flash_decoding: q, k_new, v_new and out in float, half or bfloat16");
  LOCKSTEP_CHECK_ARG(cache.valid(), w, "cache", "a moved-from KvCache", "a cache that was not moved from");
  const auto& c = cache.config();
  LOCKSTEP_CHECK_ARG(layer >= 0 && layer < c.num_layers, w, "layer", layer,
            "in [0, num_layers = " + std::to_string(c.num_layers) + ")");
  LOCKSTEP_CHECK_ARG(&stream.device() == &cache.device(), w, "stream.device", stream.device().id().str(),
            "the cache's device " + cache.device().id().str());
  const std::uint64_t head_elems = detail::token_elems(w, c, c.num_heads, detail::kHeadsShape);
  const std::uint64_t kv_elems = detail::token_elems(w, c, c.num_kv_heads, detail::kKvHeadsShape);
  detail::check_token_buffer(w, "q", q, stream, head_elems, detail::kHeadsShape);
  detail::check_token_buffer(w, "out", out, stream, head_elems, detail::kHeadsShape);
  detail::check_token_buffer(w, "k_new", k_new, stream, kv_elems, detail::kKvHeadsShape);
  detail::check_token_buffer(w, "v_new", v_new, stream, kv_elems, detail::kKvHeadsShape);
  detail::check_aligned16(w, "q", q);  // 16-byte loads and copies (not out: scalar stores)
  detail::check_aligned16(w, "k_new", k_new);
  detail::check_aligned16(w, "v_new", v_new);
  const detail::LayerKv cache_kv(cache, layer);
  using namespace std::string_view_literals;
  for (const auto& [name, b] : {std::pair{"q"sv, &q}, std::pair{"k_new"sv, &k_new}, std::pair{"v_new"sv, &v_new}}) {
    detail::check_no_overlap(w, "out", out, name, *b);
    cache_kv.check_not_in(w, name, *b);
  }
  cache_kv.check_not_in(w, "out", out);
  LOCKSTEP_CHECK_ARG(o.kv_scales == nullptr, w, "options.kv_scales", "set",
                     "nullptr (a KvCache holds its own scales: KvCache::set_scales)");
  if (o.tuning != nullptr) o.tuning->check(w);
  if (const auto* ws = o.workspace; ws != nullptr) {
    for (const auto& [name, b] : {std::pair{"q"sv, &q}, std::pair{"k_new"sv, &k_new}, std::pair{"v_new"sv, &v_new},
                                  std::pair{"out"sv, &out}})
      detail::check_workspace_apart(w, ws, name, *b);
    cache_kv.check_not_in(w, "options.workspace", *ws);
  }
  return cache_kv;
}
// Split-K attention of q over every slot of the layer whose K and V are `kv`, `lengths`
// (+ length_bias) tokens per slot, appending k_new and v_new first (Note [fused append]).
template <class T>
kernels::DecodeParams flash_params(const KvCache& cache, std::int64_t layer, const detail::LayerKv& kv,
                                   const Buffer<T>& q, const Buffer<T>& k_new, const Buffer<T>& v_new,
                                   Buffer<T>& out, const std::int32_t* lengths, std::int32_t length_bias,
                                   std::int32_t* status, float scale) {
  const KvCacheConfig& c = cache.config();
  kernels::DecodeParams p{};
  p.q = q.data().get();
  p.k = kv.k.data().get();
  p.v = kv.v.data().get();
  p.lengths = lengths;
  p.length_bias = length_bias;
  p.max_len = static_cast<std::int32_t>(c.max_len);
  p.slots = nullptr;
  p.out = out.data().get();
  p.head_stride = c.max_len * c.head_dim;
  p.slot_stride = c.num_kv_heads * p.head_stride;
  p.rows = static_cast<std::int32_t>(c.slots);
  p.H = static_cast<std::int32_t>(c.num_heads);
  p.Hkv = static_cast<std::int32_t>(c.num_kv_heads);
  p.scale = scale;
  p.k_new = k_new.data().get();
  p.v_new = v_new.data().get();
  p.k_append = const_cast<void*>(p.k);  // the cache's own storage, as scatter_params
  p.v_append = const_cast<void*>(p.v);
  p.status = status;
  p.act_format = static_cast<std::int32_t>(format_of<T>());
  p.kv_scales = cache.scales().empty() ? nullptr : cache.scales().data().get() + layer * 2 * c.num_kv_heads;
  return p;
}
}  // namespace

std::uint64_t flash_decoding_workspace_bytes(const KvCacheConfig& c) {
  constexpr std::string_view w = "flash_decoding_workspace_bytes";
  detail::check_decode_shape(w, c.num_heads, c.num_kv_heads, c.head_dim, c.max_len);
  detail::check_positive(w, "slots", c.slots);
  // The larger of the two calls': the positions staged when they do not travel inline, and the
  // partials for max_len tokens.
  const std::size_t floats = detail::decode_workspace_floats(c.slots, c.num_heads, c.head_dim, c.max_len);
  return detail::positions_staged_bytes(std::size_t(c.slots), floats);
}

template <class T>
void flash_decoding(Stream& stream, KvCache& cache, std::int64_t layer, const Buffer<T>& q,
                    const Buffer<T>& k_new, const Buffer<T>& v_new, std::span<const std::int64_t> positions,
                    Buffer<T>& out, const DecodeOptions& options) {
  constexpr std::string_view w = "flash_decoding";
  const auto& c = cache.config();
  const detail::LayerKv cache_kv = check_flash_args(w, stream, cache, layer, q, k_new, v_new, out, options);
  LOCKSTEP_CHECK_ARG(options.status == nullptr, w, "options.status", "set",
                     "nullptr with host positions (they are checked on the host: a bad one throws)");
  const Tuning& tuning = detail::tuning_for(stream, options.tuning);
  const auto pos = detail::KvCacheAccess::checked_positions(cache, w, layer, positions);
  // The positions (-1 for done slots) in the launch's parameters (Note [inline positions]), or
  // one staging copy when there are more slots; a slot attends position + 1 tokens.
  std::int64_t longest = 1;
  for (std::size_t s = 0; s < pos.size(); ++s) longest = std::max<std::int64_t>(longest, pos[s] + 1);
  const std::size_t ws_floats = detail::decode_workspace_floats(c.slots, c.num_heads, c.head_dim, longest);
  detail::check_workspace(w, options.workspace, stream, detail::positions_staged_bytes(pos.size(), ws_floats));
  const float scale = detail::softmax_scale(w, options.scale, c.head_dim);
  const detail::StagedPositions st = detail::stage_positions(stream, pos, ws_floats, options.workspace);
  // The append and the attention in one chunk launch (Note [fused append]).
  kernels::DecodeParams p = flash_params(cache, layer, cache_kv, q, k_new, v_new, out, st.ints, 1, nullptr, scale);
  p.inline_lengths = st.inline_ints;
  detail::launch_decode(stream, p, st.floats, c.head_dim, longest, tuning, c.format);
  detail::KvCacheAccess::appended(cache, layer, pos);
}

template <class T>
void flash_decoding(Stream& stream, KvCache& cache, std::int64_t layer, const Buffer<T>& q,
                    const Buffer<T>& k_new, const Buffer<T>& v_new, const Buffer<std::int32_t>& positions,
                    Buffer<T>& out, const DecodeOptions& options) {
  constexpr std::string_view w = "flash_decoding";
  const auto& c = cache.config();
  const detail::LayerKv cache_kv = check_flash_args(w, stream, cache, layer, q, k_new, v_new, out, options);
  Buffer<std::int32_t>* const status = options.status;
  detail::check_on(w, "positions", positions, stream);
  detail::check_size(w, "positions", positions, std::uint64_t(c.slots), "slots");
  if (status != nullptr) {
    detail::check_on(w, "options.status", *status, stream);
    detail::check_size(w, "options.status", *status, 1, "one int32");
  }
  detail::check_no_overlap(w, "out", out, "positions", positions);
  cache_kv.check_not_in(w, "positions", positions);
  if (status != nullptr) {
    for (const auto& [name, b] : {std::pair<const char*, const Buffer<T>*>{"q", &q}, {"k_new", &k_new},
                                  {"v_new", &v_new}, {"out", &out}})
      detail::check_no_overlap(w, "options.status", *status, name, *b);
    detail::check_no_overlap(w, "options.status", *status, "positions", positions);
    cache_kv.check_not_in(w, "options.status", *status);
    detail::check_workspace_apart(w, options.workspace, "options.status", *status);
  }
  detail::check_workspace_apart(w, options.workspace, "positions", positions);
  const Tuning& tuning = detail::tuning_for(stream, options.tuning);
  // The workspace for max_len (the lengths are on the device): the same size every call.
  const std::size_t ws_floats = detail::decode_workspace_floats(c.slots, c.num_heads, c.head_dim, c.max_len);
  detail::check_workspace(w, options.workspace, stream, detail::staged_bytes(0, ws_floats));
  const float scale = detail::softmax_scale(w, options.scale, c.head_dim);
  const detail::Staged st = detail::stage(stream, {}, ws_floats, options.workspace);
  // A slot's position p: p + 1 tokens; -1 (done): 0 (Note [device positions]); the append and
  // the attention in one chunk launch (Note [fused append]).
  kernels::DecodeParams p = flash_params(cache, layer, cache_kv, q, k_new, v_new, out, positions.data().get(), 1,
                                         status != nullptr ? status->data().get() : nullptr, scale);
  detail::launch_decode(stream, p, st.floats, c.head_dim, c.max_len, tuning, c.format);
  detail::KvCacheAccess::appended_on_device(cache, layer);
}

#define LOCKSTEP_FLASH_DECODING(T)                                                                       \
  template void flash_decoding(Stream&, KvCache&, std::int64_t, const Buffer<T>&, const Buffer<T>&,     \
                               const Buffer<T>&, std::span<const std::int64_t>, Buffer<T>&,             \
                               const DecodeOptions&);                                                   \
  template void flash_decoding(Stream&, KvCache&, std::int64_t, const Buffer<T>&, const Buffer<T>&,     \
                               const Buffer<T>&, const Buffer<std::int32_t>&, Buffer<T>&, const DecodeOptions&);
LOCKSTEP_FLASH_DECODING(float)
LOCKSTEP_FLASH_DECODING(half)
LOCKSTEP_FLASH_DECODING(bfloat16)
#undef LOCKSTEP_FLASH_DECODING

}  // namespace lockstep
