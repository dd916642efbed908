#pragma once
// Internal: what the KV cache's calls, flash_decoding and rope share: host ints staged for a
// launch, the layer's K and V, and the checks of per-token buffers.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "checks.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/kernels/decode/params.hpp"

namespace lockstep::detail {

// Copies host ints into the stream's scratch, or the caller's workspace `ws` (Note [caller
// workspace]; ordered before the kernels that read them) and returns the device address; the
// memory also holds `extra_floats` floats after the ints (staged_bytes in all).
struct Staged {
  std::int32_t* ints;
  float* floats;
};
inline std::size_t staged_bytes(std::size_t ints, std::size_t extra_floats) {
  return ((ints * 4 + 255) & ~std::size_t{255}) + extra_floats * sizeof(float);
}
inline Staged stage(Stream& s, const std::vector<std::int32_t>& ints, std::size_t extra_floats,
                    Buffer<std::byte>* ws = nullptr) {
  const std::size_t int_bytes = (ints.size() * 4 + 255) & ~std::size_t{255};
  auto* base = ws != nullptr ? reinterpret_cast<char*>(ws->data().get())
                             : static_cast<char*>(detail::StreamAccess::scratch(s, int_bytes + extra_floats * sizeof(float)));
  if (!ints.empty()) detail::StreamAccess::copy_h2d(s, base, ints.data(), ints.size() * 4);
  return Staged{reinterpret_cast<std::int32_t*>(base), reinterpret_cast<float*>(base + int_bytes)};
}

// A wrapped view of `layer`'s own K or V as an input of a call that writes them is refused. The
// layer's K and V are looked up once per call (k() and v() check the layer each time).
struct LayerKv {
  const Buffer<float>& k;
  const Buffer<float>& v;
  LayerKv(const KvCache& cache, std::int64_t layer) : k(cache.k(layer)), v(cache.v(layer)) {}
  template <class T>
  void check_not_in(std::string_view where, std::string_view name, const Buffer<T>& b) const {
    detail::check_no_overlap(where, name, b, "the cache's K", k);
    detail::check_no_overlap(where, name, b, "the cache's V", v);
  }
};

inline constexpr std::string_view kHeadsShape = "slots * num_heads * head_dim";
inline constexpr std::string_view kKvHeadsShape = "slots * num_kv_heads * head_dim";
// The element count of a per-token buffer: slots * heads * head_dim, `heads` the config's
// num_heads or num_kv_heads, and `shape` the product's text for the message (a literal, so that
// a call that passes builds no string).
inline std::uint64_t token_elems(std::string_view where, const KvCacheConfig& c, std::int64_t heads,
                                 std::string_view shape) {
  return checked_product({std::uint64_t(c.slots), std::uint64_t(heads), std::uint64_t(c.head_dim)}, where, shape);
}
template <class T>
void check_token_buffer(std::string_view where, std::string_view name, const Buffer<T>& b,
                               Stream& s, std::uint64_t elems, std::string_view shape) {
  detail::check_on(where, name, b, s);
  detail::check_size(where, name, b, elems, shape);
}

// flash_decoding's use of the cache's host state (Note [layer lengths] in kv_cache.cpp).
struct KvCacheAccess {
  static std::vector<std::int32_t> checked_positions(const KvCache& c, std::string_view where, std::int64_t layer,
                                                     std::span<const std::int64_t> positions) {
    return c.checked_positions(where, layer, positions);
  }
  static void appended(KvCache& c, std::int64_t layer, const std::vector<std::int32_t>& pos) { c.appended(layer, pos); }
  static void appended_on_device(KvCache& c, std::int64_t layer) { c.appended_on_device(layer); }
};

// Per-slot positions for a launch: in its parameters for up to kInlineRows slots (Note [inline
// positions]; `ints` null), else staged in the stream's scratch or `ws` (`inline_ints.count` 0);
// and `extra_floats` floats of workspace (positions_staged_bytes in all).
struct StagedPositions {
  const std::int32_t* ints;
  kernels::InlineInts inline_ints;
  float* floats;
};
inline bool positions_inline(std::size_t count) { return count > 0 && count <= std::size_t(kernels::kInlineRows); }
inline std::size_t positions_staged_bytes(std::size_t count, std::size_t extra_floats) {
  return staged_bytes(positions_inline(count) ? 0 : count, extra_floats);
}
inline StagedPositions stage_positions(Stream& s, const std::vector<std::int32_t>& pos,
                                       std::size_t extra_floats, Buffer<std::byte>* ws = nullptr) {
  StagedPositions r{};
  if (positions_inline(pos.size())) {
    r.inline_ints.count = static_cast<std::int32_t>(pos.size());
    std::copy(pos.begin(), pos.end(), r.inline_ints.v);
    if (extra_floats > 0) r.floats = stage(s, {}, extra_floats, ws).floats;
  } else {
    const Staged st = stage(s, pos, extra_floats, ws);
    r.ints = st.ints;
    r.floats = st.floats;
  }
  return r;
}

}  // namespace lockstep::detail
