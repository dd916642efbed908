#pragma once
// A device-resident KV cache for batched decoding (docs/api.md, "The KV cache"). Attention over
// it, flash_decoding, is declared in lockstep/attention/decode.hpp.
//
// Per layer, K and V are [slots, num_kv_heads, max_len, head_dim] in the cache's format (float,
// half, bfloat16, fp8 e4m3 or e5m2; docs/api.md, "Formats"). Every slot holds one
// sequence with its own length (shared by all layers). Lengths, done flags and the slot count are
// host state, updated when an operation is enqueued (the device work itself is ordered on the
// stream). Every operation validates first: on any error nothing is enqueued and no state
// changes.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/buffer.hpp"
#include "lockstep/formats.hpp"

namespace lockstep {

struct DecodeOptions;  // lockstep/attention/decode.hpp
namespace detail {
struct KvCacheAccess;  // attention/src/kv_cache_detail.hpp
}

struct KvCacheConfig {
  std::int64_t num_layers = 1;
  std::int64_t num_heads = 1;     // query heads (for attention; the cache stores kv heads)
  std::int64_t num_kv_heads = 1;  // must divide num_heads
  std::int64_t head_dim = 128;    // 32, 64, 96, 128 or 256
  std::int64_t max_len = 1;       // tokens per slot
  std::int64_t slots = 1;         // sequences (any number in [1, 2^31 - 1] that fits in memory)
  // What K and V are stored as. An fp8 cache stores x / scale per (layer, kv head), for K and
  // for V (Note [decode formats]): k_scales and v_scales [num_layers * num_kv_heads], each finite
  // and > 0; empty: every scale 1. Other formats take no scales (both empty).
  Format format = Format::f32;
  std::vector<float> k_scales, v_scales;
};


class KvCache {
 public:
  KvCache(std::shared_ptr<Device> device, const KvCacheConfig& config);
  // A moved-from cache holds nothing: valid() is false, slots() and config().num_layers are 0,
  // bytes() is 0, lengths() is empty (max_len(), bytes_per_token_per_layer() and the rest of
  // config() keep the shape it had), and every other operation on it (as the cache or as
  // copy_slot_from's source) is InvalidArgument naming `cache` (or `src`).
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  bool valid() const noexcept { return device_ != nullptr; }

  const KvCacheConfig& config() const noexcept { return cfg_; }
  Device& device() const;
  std::int64_t slots() const noexcept { return cfg_.slots; }
  std::int64_t max_len() const noexcept { return cfg_.max_len; }
  std::int64_t length(std::int64_t slot) const;
  const std::vector<std::int64_t>& lengths() const noexcept { return len_; }
  bool done(std::int64_t slot) const;
  // Tokens of the slot that `layer` holds, at most the slot's length: one less while the step's
  // token is not yet in this layer, fewer while an import has not reached it (Note [layer
  // lengths] in kv_cache.cpp; docs/api.md).
  std::int64_t length(std::int64_t slot, std::int64_t layer) const;

  Format format() const noexcept { return cfg_.format; }
  // Device memory held: exactly 2 * layers * slots * kv_heads * max_len * head_dim * e bytes, e
  // the format's bytes per element, and for an fp8 cache its scales: 2 * layers * kv_heads * 4.
  std::uint64_t bytes() const noexcept;
  // 2 * kv_heads * head_dim * e: what one token costs in one layer.
  std::uint64_t bytes_per_token_per_layer() const noexcept;
  // An fp8 cache's scales of `layer` ([num_kv_heads] each, finite and > 0), enqueued on `stream`:
  // the calls after it read the new scales (tokens already stored keep their codes, which the new
  // scales then scale). Not fp8: InvalidArgument.
  void set_scales(Stream& stream, std::int64_t layer, std::span<const float> k_scales,
                  std::span<const float> v_scales);

  // Writes one token's K and V, [rows, kv_heads, head_dim] with rows == slots(), into `layer` at
  // positions[s] of every slot s that is not done, in one launch. A position is either the slot's
  // length (a new token, when every layer holds the slot's tokens; the length grows by one) or
  // length - 1 in a layer that does not hold it yet (length(s, layer) == length - 1: another
  // layer appended it in this step). Past max_len, or out of order (a token written twice in a
  // layer, a layer left behind): InvalidArgument, nothing written.
  // k_new and v_new: float, half or bfloat16 (T), stored in the cache's format.
  template <class T>
  void append(Stream& stream, std::int64_t layer, const Buffer<T>& k_new, const Buffer<T>& v_new,
              std::span<const std::int64_t> positions);

  // Copies slot `src_slot` of `src` (all layers, its tokens) into slot `slot` with its length and
  // each layer's, not done (device to device; e.g. a prefill cache into a batch slot).
  // Geometry and format (with an fp8 cache's scales) must match except max_len and slots.
  void copy_slot_from(Stream& stream, std::int64_t slot, const KvCache& src,
                      std::int64_t src_slot = 0);

  // Writes tokens [0, count) of `layer` in `slot` from host memory [kv_heads, count, head_dim]
  // (k and v, floats stored in the cache's format as an append stores them) and sets the slot's
  // length to count, not done (e.g. importing a prefill). Import
  // every layer with the same count, one call after another: the first call of such a run makes
  // the other layers hold nothing (their tokens were another sequence's), and a layer left with
  // fewer tokens refuses the next append until it is written. A call after a complete run (every
  // layer holds the slot's length) starts a new run: the next sequence's import.
  void write_from_host(Stream& stream, std::int64_t slot, std::int64_t layer,
                       std::span<const float> k, std::span<const float> v, std::int64_t count);
  // The same from device buffers on the cache's device (k and v [kv_heads, count, head_dim], e.g.
  // a heads-first prefill's K and V of one sequence): device-to-device copies, no host round trip.
  // The buffers hold the cache's format (float for an f32 cache; another element type is
  // InvalidArgument naming it).
  template <class T>
  void write_from_device(Stream& stream, std::int64_t slot, std::int64_t layer, const Buffer<T>& k,
                         const Buffer<T>& v, std::int64_t count);

  // Forgets a slot's tokens (length 0, not done) / every slot's.
  void reset(std::int64_t slot);
  void reset_all();
  // Sets the host-side length of a slot and of each of its layers (0 <= n <= max_len; the slot is
  // no longer done), e.g. at a step boundary after steps run with device-side positions, which
  // the host does not see. Nothing is enqueued.
  void set_length(std::int64_t slot, std::int64_t n);
  // Speculative decoding: the slot's length becomes `position` (<= length), and no layer holds
  // more. Entries past it are never read again and are overwritten by the next appends.
  void rollback(std::int64_t slot, std::int64_t position);
  // A done slot costs nothing in attention (its output is zeros) and appends skip it.
  void mark_done(std::int64_t slot, bool done = true);

  // More slots, keeping every existing slot's contents and length (device to device copies on
  // `stream`). new_slots >= slots().
  void grow(Stream& stream, std::int64_t new_slots);

  // The layer's K and V storage (for kernels and tests): floats for an f32 cache; for another
  // format its codes, packed into 4-byte words (k_as and v_as give them typed).
  const Buffer<float>& k(std::int64_t layer) const;
  const Buffer<float>& v(std::int64_t layer) const;
  // The layer's K and V as codes of C, which must be the cache's format (InvalidArgument
  // otherwise): a view that does not own the memory.
  template <class C>
  Buffer<C> k_as(std::int64_t layer) const {
    return view_as<C>(k(layer), "KvCache::k_as");
  }
  template <class C>
  Buffer<C> v_as(std::int64_t layer) const {
    return view_as<C>(v(layer), "KvCache::v_as");
  }
  // An fp8 cache's scales on the device, [num_layers, 2, num_kv_heads] (K's, then V's, per
  // layer); empty for other formats.
  const Buffer<float>& scales() const noexcept { return scales_; }

 private:
  friend struct detail::KvCacheAccess;  // flash_decoding's positions and host state
  template <class C>
  Buffer<C> view_as(const Buffer<float>& words, std::string_view where) const {
    if (format_of<C>() != cfg_.format) throw_bad_view(where, format_name(format_of<C>()));
    return Buffer<C>::wrap(device_, reinterpret_cast<C*>(words.data().get()),
                           words.size_bytes() / sizeof(C));
  }
  [[noreturn]] void throw_bad_view(std::string_view where, std::string_view asked) const;
  // The checks every call makes (inline: k() and v() run them several times per decode call);
  // the errors are thrown out of line.
  void check_valid(std::string_view where, std::string_view name = "cache") const {
    if (device_ == nullptr) throw_moved_from(where, name);
  }
  void check_slot(std::string_view where, std::int64_t slot) const {
    if (device_ == nullptr || slot < 0 || slot >= cfg_.slots) throw_bad_slot(where, slot);
  }
  void check_layer(std::string_view where, std::int64_t layer) const {
    if (device_ == nullptr || layer < 0 || layer >= cfg_.num_layers) throw_bad_layer(where, layer);
  }
  [[noreturn]] static void throw_moved_from(std::string_view where, std::string_view name);
  [[noreturn]] void throw_bad_slot(std::string_view where, std::int64_t slot) const;
  [[noreturn]] void throw_bad_layer(std::string_view where, std::int64_t layer) const;
  void forget() noexcept;  // the moved-from state
  void allocate_layers(std::uint64_t per_layer, std::vector<Buffer<float>>& k,
                       std::vector<Buffer<float>>& v, const std::string& what);
  // Note [layer lengths] (kv_cache.cpp): the host state after an append into `layer` at `pos`
  // (-1: skipped), after a device-position call, and when an operation sets a slot's length.
  void appended(std::int64_t layer, const std::vector<std::int32_t>& pos);
  void appended_on_device(std::int64_t layer);
  void set_layers(std::int64_t slot, std::int64_t n);
  void recount(std::int64_t slot);
  void check_import(std::string_view where, Stream& stream, std::int64_t slot, std::int64_t layer,
                           std::size_t k_size, std::size_t v_size, std::int64_t count) const;
  void imported(std::int64_t slot, std::int64_t layer, std::int64_t count);
  // The positions of an append into `layer`, validated (-1: a done slot), and the text of the
  // position a slot expects when one is refused.
  std::vector<std::int32_t> checked_positions(std::string_view where, std::int64_t layer,
                                              std::span<const std::int64_t> positions) const;
  std::string expected_position_text(std::int64_t slot, std::int64_t layer) const;

  std::shared_ptr<Device> device_;
  KvCacheConfig cfg_;
  std::vector<Buffer<float>> k_, v_;  // 4-byte words of the format's codes
  Buffer<float> scales_;              // fp8: [layers, 2, kv_heads]
  std::vector<std::int64_t> len_;
  std::vector<bool> done_;
  std::vector<std::int64_t> layer_len_;  // [slots, num_layers]: tokens each layer holds
  std::vector<std::int32_t> behind_;     // [slots]: layers holding fewer than the slot's length
  std::vector<std::uint8_t> importing_;  // [slots]: the last operation was an import (write_from_*)
};

}  // namespace lockstep
