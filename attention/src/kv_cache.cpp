// KvCache: the cache's K and V storage, the host's record of each slot's and layer's length, and
// the cache's own calls (append, copies, imports, growth). flash_decoding and rope have files of
// their own.
#include "lockstep/attention/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "checks.hpp"
#include "decode_launch.hpp"
#include "kv_cache_detail.hpp"
#include "launchers.hpp"

namespace lockstep {

namespace {
std::uint64_t layer_elems(const KvCacheConfig& c, std::string_view where) {
  return checked_product({std::uint64_t(c.slots), std::uint64_t(c.num_kv_heads),
                          std::uint64_t(c.max_len), std::uint64_t(c.head_dim)},
                         where, "slots * num_kv_heads * max_len * head_dim");
}

// 4-byte words of `elems` codes of format f (elems is a multiple of 32: head_dim is).
std::uint64_t words_of(std::uint64_t elems, Format f) { return elems * format_bytes(f) / 4; }

// x stored in format f with scale s (0: none), as the kernels store it (Note [decode formats]),
// into dst[i] of the codes' storage.
void store_code(void* dst, std::size_t i, Format f, float x, float s) {
  const float v = s != 0.0f ? x / s : x;
  switch (f) {
    case Format::f32: static_cast<float*>(dst)[i] = v; break;
    case Format::f16: static_cast<half*>(dst)[i] = to_half(v); break;
    case Format::bf16: static_cast<bfloat16*>(dst)[i] = to_bfloat16(v); break;
    case Format::fp8_e4m3: static_cast<fp8_e4m3*>(dst)[i] = to_fp8_e4m3(v); break;
    case Format::fp8_e5m2: static_cast<fp8_e5m2*>(dst)[i] = to_fp8_e5m2(v); break;
  }
}

void check_scales(std::string_view w, std::string_view name, std::span<const float> s, std::size_t n) {
  LOCKSTEP_CHECK_ARG(s.size() == n, w, std::string(name) + ".size()", s.size(),
                     std::to_string(n) + " (one per kv head" + (n > 0 ? std::string(" and layer)") : std::string(")")));
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto nm = [&] { return std::string(name) + "[" + std::to_string(i) + "]"; };
    LOCKSTEP_CHECK_ARG(std::isfinite(s[i]) && s[i] > 0.0f, w, nm(), s[i], "finite and > 0");
  }
}

}  // namespace

KvCache::KvCache(std::shared_ptr<Device> device, const KvCacheConfig& c) : device_(std::move(device)), cfg_(c) {
  constexpr std::string_view w = "KvCache";
  LOCKSTEP_CHECK_ARG(device_ != nullptr, w, "device", "null", "an open device");
  detail::check_positive(w, "num_layers", c.num_layers);
  detail::check_positive(w, "slots", c.slots);
  detail::check_positive(w, "max_len", c.max_len);
  detail::check_decode_shape(w, c.num_heads, c.num_kv_heads, c.head_dim, c.max_len,
                             {"num_heads", "num_kv_heads", "max_len", "max_len * head_dim"});
  LOCKSTEP_CHECK_ARG(c.slots <= 0x7fffffff, w, "slots", c.slots, "<= 2147483647");
  LOCKSTEP_CHECK_ARG(static_cast<unsigned>(c.format) <= static_cast<unsigned>(Format::fp8_e5m2), w, "format",
                     static_cast<unsigned>(c.format), "a lockstep::Format");
  const std::size_t nscales = std::size_t(c.num_layers) * std::size_t(c.num_kv_heads);
  if (is_fp8(c.format)) {
    if (!c.k_scales.empty()) check_scales(w, "k_scales", c.k_scales, nscales);
    if (!c.v_scales.empty()) check_scales(w, "v_scales", c.v_scales, nscales);
  } else {
    LOCKSTEP_CHECK_ARG(c.k_scales.empty() && c.v_scales.empty(), w, "k_scales / v_scales",
                       std::to_string(c.k_scales.size()) + " / " + std::to_string(c.v_scales.size()) + " values",
                       std::string("empty: scales are for fp8 caches, not ") + format_name(c.format));
  }
  const auto per_layer = words_of(layer_elems(c, w), c.format);
  checked_mul(checked_mul(per_layer, 8, w, "bytes"), std::uint64_t(c.num_layers), w, "bytes");
  allocate_layers(per_layer, k_, v_, "a KvCache: K and V of " + std::to_string(c.num_layers) +
                                         " layers, " + std::to_string(per_layer * 4) + " bytes each");
  if (is_fp8(c.format)) {
    // Empty scales are 1; the device holds them as [layers, 2, kv_heads] (K's, then V's).
    if (cfg_.k_scales.empty()) cfg_.k_scales.assign(nscales, 1.0f);
    if (cfg_.v_scales.empty()) cfg_.v_scales.assign(nscales, 1.0f);
    const std::size_t Hk = std::size_t(c.num_kv_heads);
    std::vector<float> host(2 * nscales);
    for (std::size_t l = 0; l < std::size_t(c.num_layers); ++l) {
      std::copy_n(cfg_.k_scales.begin() + std::ptrdiff_t(l * Hk), Hk, host.begin() + std::ptrdiff_t(l * 2 * Hk));
      std::copy_n(cfg_.v_scales.begin() + std::ptrdiff_t(l * Hk), Hk, host.begin() + std::ptrdiff_t(l * 2 * Hk + Hk));
    }
    scales_ = Buffer<float>(device_, host.size());
    Stream& s = device_->default_stream();
    scales_.copy_from_host(s, host);
    s.synchronize();
  }
  try {  // the host state: slots x layers entries
    len_.assign(std::size_t(c.slots), 0);
    done_.assign(std::size_t(c.slots), false);
    layer_len_.assign(std::size_t(c.slots * c.num_layers), 0);
    behind_.assign(std::size_t(c.slots), 0);
    importing_.assign(std::size_t(c.slots), 0);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("host", std::uint64_t(c.slots) * std::uint64_t(c.num_layers) * 9, 0,
                      "a KvCache's host state: " + std::to_string(c.slots * c.num_layers) + " (slot, layer) entries");
  }
}

KvCache::KvCache(KvCache&& o) noexcept
    : device_(std::move(o.device_)),
      cfg_(o.cfg_),
      k_(std::move(o.k_)),
      v_(std::move(o.v_)),
      scales_(std::move(o.scales_)),
      len_(std::move(o.len_)),
      done_(std::move(o.done_)),
      layer_len_(std::move(o.layer_len_)),
      behind_(std::move(o.behind_)),
      importing_(std::move(o.importing_)) {
  o.forget();
}
KvCache& KvCache::operator=(KvCache&& o) noexcept {
  if (this != &o) {
    device_ = std::move(o.device_);
    cfg_ = o.cfg_;
    k_ = std::move(o.k_);
    v_ = std::move(o.v_);
    scales_ = std::move(o.scales_);
    len_ = std::move(o.len_);
    done_ = std::move(o.done_);
    layer_len_ = std::move(o.layer_len_);
    behind_ = std::move(o.behind_);
    importing_ = std::move(o.importing_);
    o.forget();
  }
  return *this;
}
void KvCache::forget() noexcept {
  device_.reset();
  cfg_.slots = 0;
  cfg_.num_layers = 0;
  k_.clear();
  v_.clear();
  scales_ = Buffer<float>();
  len_.clear();
  done_.clear();
  layer_len_.clear();
  behind_.clear();
  importing_.clear();
}
void KvCache::throw_moved_from(std::string_view where, std::string_view name) {
  throw InvalidArgument(where, name, "a moved-from KvCache", "a cache that was not moved from");
}
Device& KvCache::device() const {
  check_valid("KvCache::device");
  return *device_;
}

// Note [layer lengths]
// A slot's length is shared by the layers' attention, but each layer writes its own K and V: in
// a decode step, one layer appends the step's token at p = length (a new token: the length
// becomes p + 1) and every other layer appends the same position, p = length - 1. So that a
// mistake here is an error and not a cache that silently holds garbage, the cache keeps, per
// (slot, layer), the number of tokens that layer holds (length(slot, layer)), and per slot how
// many layers are behind the slot's length:
// - a new token (p = length) is accepted only in a slot where every layer holds every token: a
//   layer that has not yet appended the previous step's token, a positions array re-read after
//   the first layer (which would skip a token in the later layers), or a token written twice in
//   one layer is refused, with nothing written;
// - p = length - 1 is accepted only in a layer that holds length - 1 tokens;
// - write_from_host (and write_from_device) sets its layer's count and the slot's length; the
//   first call of a run of them on a slot drops the other layers to 0 (their tokens are another sequence's), the next
//   ones keep what the run wrote (once every layer holds the slot's length the run is complete,
//   and the next call starts a new one); rollback cuts every layer to the new length; set_length and
//   reset set every layer to the length; copy_slot_from takes the source's layers; a
//   flash_decoding call with device positions marks its layer complete for every slot (the host
//   does not know what it wrote).
// Any layer order works within a step.
void KvCache::appended(std::int64_t layer, const std::vector<std::int32_t>& pos) {
  const std::size_t L = std::size_t(cfg_.num_layers);
  for (std::size_t s = 0; s < pos.size(); ++s) {
    if (pos[s] < 0) continue;
    std::int64_t* ll = layer_len_.data() + s * L;
    importing_[s] = 0;
    if (pos[s] == len_[s]) {  // a new token: every other layer is now one behind
      len_[s] = pos[s] + 1;
      behind_[s] = static_cast<std::int32_t>(L - 1);
    } else {  // the step's token in one more layer
      --behind_[s];
    }
    ll[std::size_t(layer)] = pos[s] + 1;
  }
}
void KvCache::appended_on_device(std::int64_t layer) {
  const std::size_t L = std::size_t(cfg_.num_layers);
  for (std::size_t s = 0; s < len_.size(); ++s) {
    importing_[s] = 0;
    std::int64_t& ll = layer_len_[s * L + std::size_t(layer)];
    if (ll < len_[s]) {
      ll = len_[s];
      --behind_[s];
    }
  }
}
void KvCache::set_layers(std::int64_t slot, std::int64_t n) {
  const std::size_t L = std::size_t(cfg_.num_layers);
  std::fill_n(layer_len_.begin() + std::ptrdiff_t(std::size_t(slot) * L), L, n);
  behind_[std::size_t(slot)] = 0;
  importing_[std::size_t(slot)] = 0;
}
void KvCache::recount(std::int64_t slot) {
  const std::size_t L = std::size_t(cfg_.num_layers);
  const std::int64_t* ll = layer_len_.data() + std::size_t(slot) * L;
  std::int32_t n = 0;
  for (std::size_t l = 0; l < L; ++l) n += ll[l] < len_[std::size_t(slot)] ? 1 : 0;
  behind_[std::size_t(slot)] = n;
}
std::string KvCache::expected_position_text(std::int64_t slot, std::int64_t layer) const {
  // Read after "must be " (Note [layer lengths]).
  const std::size_t L = std::size_t(cfg_.num_layers);
  const std::int64_t* ll = layer_len_.data() + std::size_t(slot) * L;
  const std::int64_t len = len_[std::size_t(slot)], have = ll[layer];
  const std::string holds = "layer " + std::to_string(layer) + " holds " + std::to_string(have) +
                            " of the slot's " + std::to_string(len) + " tokens";
  if (have == len - 1)
    return std::to_string(len - 1) + ", the step's token, which this layer does not hold yet (" + holds + ")";
  if (have == len && behind_[std::size_t(slot)] == 0)
    return std::to_string(len) + ", a new token (" + holds + "; each layer appends a token once)";
  if (have == len) {
    std::size_t j = 0;
    while (j < L && ll[j] >= len) ++j;
    if (ll[j] < len - 1)  // not a step's token: tokens an import has not written yet
      return "preceded by layer " + std::to_string(j) + "'s missing tokens: it holds " + std::to_string(ll[j]) +
             " of the slot's " + std::to_string(len) +
             " (an import not finished? write every layer with the same count (write_from_host or "
             "write_from_device), or use copy_slot_from or set_length; " + holds + ")";
    return "preceded by the step's token in every layer, and layer " + std::to_string(j) + " holds " +
           std::to_string(ll[j]) + " of the slot's " + std::to_string(len) +
           " tokens: no new token yet (take a step's positions once, before its first layer; " + holds + ")";
  }
  return "preceded by this layer's missing tokens (" + holds +
         "): write every layer with the same count (write_from_host or write_from_device), or use "
         "copy_slot_from or set_length";
}
std::int64_t KvCache::length(std::int64_t slot, std::int64_t layer) const {
  check_slot("KvCache::length", slot);
  check_layer("KvCache::length", layer);
  return layer_len_[std::size_t(slot * cfg_.num_layers + layer)];
}

// K and V buffers of `per_layer` floats for every layer. An allocation that fails is reported
// for the whole request: its total bytes, and the bytes available before it (the buffers already
// allocated are released as the exception leaves). A request larger than a capped device's free
// memory fails before the first buffer, and host memory for the list of buffers (a cache of
// 2^40 tiny layers) is an OutOfMemory too, not a std::bad_alloc.
void KvCache::allocate_layers(std::uint64_t per_layer, std::vector<Buffer<float>>& k,
                              std::vector<Buffer<float>>& v, const std::string& what) {
  const std::uint64_t total = 2 * std::uint64_t(cfg_.num_layers) * per_layer * 4;
  const MemoryStats m = device_->memory_stats();
  const std::uint64_t free = m.capacity - std::min(m.capacity, m.in_use);
  if (m.capacity != 0 && total > free) throw OutOfMemory(device_->id().str(), total, free, what);
  std::uint64_t done = 0;
  try {
    k.reserve(std::size_t(cfg_.num_layers));
    v.reserve(std::size_t(cfg_.num_layers));
    for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
      k.emplace_back(device_, per_layer);
      done += per_layer * 4;
      v.emplace_back(device_, per_layer);
      done += per_layer * 4;
    }
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(device_->id().str(), total, e.available() + done,
                      what + (e.purpose().empty() ? std::string() : "; " + e.purpose()));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(device_->id().str(), total, done, what + "; host memory for the list of layers");
  }
}

void KvCache::throw_bad_slot(std::string_view where, std::int64_t slot) const {
  check_valid(where);
  throw InvalidArgument(where, "slot", std::to_string(slot), "in [0, slots = " + std::to_string(cfg_.slots) + ")");
}
void KvCache::throw_bad_layer(std::string_view where, std::int64_t layer) const {
  check_valid(where);
  throw InvalidArgument(where, "layer", std::to_string(layer),
                        "in [0, num_layers = " + std::to_string(cfg_.num_layers) + ")");
}

std::int64_t KvCache::length(std::int64_t slot) const {
  check_slot("KvCache::length", slot);
  return len_[std::size_t(slot)];
}
bool KvCache::done(std::int64_t slot) const {
  check_slot("KvCache::done", slot);
  return done_[std::size_t(slot)];
}
std::uint64_t KvCache::bytes() const noexcept {
  return 2ull * std::uint64_t(cfg_.num_layers) * layer_elems(cfg_, "KvCache") * format_bytes(cfg_.format) +
         scales_.size_bytes();
}
std::uint64_t KvCache::bytes_per_token_per_layer() const noexcept {
  return 2ull * std::uint64_t(cfg_.num_kv_heads) * std::uint64_t(cfg_.head_dim) * format_bytes(cfg_.format);
}
void KvCache::throw_bad_view(std::string_view where, std::string_view asked) const {
  check_valid(where);
  throw InvalidArgument(where, "C", asked, std::string("the cache's format, ") + format_name(cfg_.format));
}
void KvCache::set_scales(Stream& stream, std::int64_t layer, std::span<const float> k, std::span<const float> v) {
  constexpr std::string_view w = "KvCache::set_scales";
  check_layer(w, layer);
  LOCKSTEP_CHECK_ARG(is_fp8(cfg_.format), w, "cache format", format_name(cfg_.format), "fp8_e4m3 or fp8_e5m2");
  LOCKSTEP_CHECK_ARG(&stream.device() == device_.get(), w, "stream.device", stream.device().id().str(),
                     "the cache's device " + device_->id().str());
  const std::size_t Hk = std::size_t(cfg_.num_kv_heads);
  check_scales(w, "k_scales", k, Hk);
  check_scales(w, "v_scales", v, Hk);
  std::vector<float> host(2 * Hk);
  std::copy(k.begin(), k.end(), host.begin());
  std::copy(v.begin(), v.end(), host.begin() + std::ptrdiff_t(Hk));
  scales_.copy_from_host(stream, host, std::size_t(layer) * 2 * Hk);
  std::copy(k.begin(), k.end(), cfg_.k_scales.begin() + std::ptrdiff_t(std::size_t(layer) * Hk));
  std::copy(v.begin(), v.end(), cfg_.v_scales.begin() + std::ptrdiff_t(std::size_t(layer) * Hk));
}
const Buffer<float>& KvCache::k(std::int64_t layer) const {
  check_layer("KvCache::k", layer);
  return k_[std::size_t(layer)];
}
const Buffer<float>& KvCache::v(std::int64_t layer) const {
  check_layer("KvCache::v", layer);
  return v_[std::size_t(layer)];
}

void KvCache::reset(std::int64_t slot) {
  check_slot("KvCache::reset", slot);
  len_[std::size_t(slot)] = 0;
  done_[std::size_t(slot)] = false;
  set_layers(slot, 0);
}
void KvCache::reset_all() {
  check_valid("KvCache::reset_all");
  std::fill(len_.begin(), len_.end(), 0);
  std::fill(done_.begin(), done_.end(), false);
  std::fill(layer_len_.begin(), layer_len_.end(), 0);
  std::fill(behind_.begin(), behind_.end(), 0);
  std::fill(importing_.begin(), importing_.end(), 0);
}
void KvCache::rollback(std::int64_t slot, std::int64_t position) {
  check_slot("KvCache::rollback", slot);
  LOCKSTEP_CHECK_ARG(position >= 0 && position <= len_[std::size_t(slot)], "KvCache::rollback", "position",
            position, "in [0, length = " + std::to_string(len_[std::size_t(slot)]) + "]");
  len_[std::size_t(slot)] = position;
  const std::size_t L = std::size_t(cfg_.num_layers);
  for (std::size_t l = 0; l < L; ++l) {
    std::int64_t& ll = layer_len_[std::size_t(slot) * L + l];
    ll = std::min(ll, position);
  }
  importing_[std::size_t(slot)] = 0;
  recount(slot);
}
void KvCache::set_length(std::int64_t slot, std::int64_t n) {
  check_slot("KvCache::set_length", slot);
  LOCKSTEP_CHECK_ARG(n >= 0 && n <= cfg_.max_len, "KvCache::set_length", "n", n,
            "in [0, max_len = " + std::to_string(cfg_.max_len) + "]");
  len_[std::size_t(slot)] = n;
  done_[std::size_t(slot)] = false;
  set_layers(slot, n);
}
void KvCache::mark_done(std::int64_t slot, bool d) {
  check_slot("KvCache::mark_done", slot);
  done_[std::size_t(slot)] = d;
}

// Validates positions for an append into `layer` of every slot; returns them as int32 (-1: done
// slot). A position is the slot's length (a new token, when every layer holds the slot's
// tokens), or length - 1 in a layer that holds length - 1 tokens (Note [layer lengths]).
std::vector<std::int32_t> KvCache::checked_positions(std::string_view where, std::int64_t layer,
                                                     std::span<const std::int64_t> positions) const {
  LOCKSTEP_CHECK_ARG(std::int64_t(positions.size()) == cfg_.slots, where, "positions.size()",
            positions.size(), "slots = " + std::to_string(cfg_.slots));
  const std::size_t L = std::size_t(cfg_.num_layers);
  std::vector<std::int32_t> out(positions.size());
  for (std::size_t s = 0; s < positions.size(); ++s) {
    if (done_[s]) {
      out[s] = -1;
      continue;
    }
    const std::int64_t p = positions[s], len = len_[s];
    // Built only when a check fails (LOCKSTEP_CHECK_ARG evaluates its message lazily): a
    // string per slot and call would cost microseconds of host time at 128 slots.
    const auto name = [s] { return "positions[" + std::to_string(s) + "]"; };
    LOCKSTEP_CHECK_ARG(p < cfg_.max_len, where, name(), p,
              "< max_len = " + std::to_string(cfg_.max_len) + " (the slot is full)");
    const std::int64_t have = layer_len_[s * L + std::size_t(layer)];
    const bool ok = (p == len && behind_[s] == 0) || (p == len - 1 && have == len - 1);
    LOCKSTEP_CHECK_ARG(ok, where, name(), p, expected_position_text(std::int64_t(s), layer));
    out[s] = static_cast<std::int32_t>(p);
  }
  return out;
}


template <class T>
static kernels::KvScatterParams scatter_params(const KvCache& c, std::int64_t layer,
                                               const Buffer<T>& kn, const Buffer<T>& vn,
                                               const std::int32_t* positions) {
  const auto& cfg = c.config();
  kernels::KvScatterParams p{};
  p.src_k = kn.data().get();
  p.src_v = vn.data().get();
  p.act_format = static_cast<std::int32_t>(format_of<T>());
  p.kv_scales = c.scales().empty() ? nullptr : c.scales().data().get() + layer * 2 * cfg.num_kv_heads;
  p.k = const_cast<float*>(c.k(layer).data().get());
  p.v = const_cast<float*>(c.v(layer).data().get());
  p.positions = positions;
  p.slots = nullptr;
  p.head_stride = cfg.max_len * cfg.head_dim;
  p.slot_stride = cfg.num_kv_heads * p.head_stride;
  p.rows = static_cast<std::int32_t>(cfg.slots);
  p.Hkv = static_cast<std::int32_t>(cfg.num_kv_heads);
  p.D = static_cast<std::int32_t>(cfg.head_dim);
  p.max_len = static_cast<std::int32_t>(cfg.max_len);
  return p;
}

template <class T>
void KvCache::append(Stream& stream, std::int64_t layer, const Buffer<T>& k_new, const Buffer<T>& v_new,
                     std::span<const std::int64_t> positions) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "KvCache::append: float, half or bfloat16 tokens");
  constexpr std::string_view w = "KvCache::append";
  check_layer(w, layer);
  LOCKSTEP_CHECK_ARG(&stream.device() == device_.get(), w, "stream.device", stream.device().id().str(),
            "the cache's device " + device_->id().str());
  const std::uint64_t kv_elems = detail::token_elems(w, cfg_, cfg_.num_kv_heads, detail::kKvHeadsShape);
  detail::check_token_buffer(w, "k_new", k_new, stream, kv_elems, detail::kKvHeadsShape);
  detail::check_token_buffer(w, "v_new", v_new, stream, kv_elems, detail::kKvHeadsShape);
  const detail::LayerKv cache_kv(*this, layer);
  cache_kv.check_not_in(w, "k_new", k_new);
  cache_kv.check_not_in(w, "v_new", v_new);
  const auto pos = checked_positions(w, layer, positions);
  const detail::StagedPositions st = detail::stage_positions(stream, pos, 0);
  kernels::KvScatterParams p = scatter_params(*this, layer, k_new, v_new, st.ints);
  p.inline_positions = st.inline_ints;
  detail::launch_kv_scatter(stream, p, cfg_.format);
  appended(layer, pos);
}
template void KvCache::append(Stream&, std::int64_t, const Buffer<float>&, const Buffer<float>&,
                              std::span<const std::int64_t>);
template void KvCache::append(Stream&, std::int64_t, const Buffer<half>&, const Buffer<half>&,
                              std::span<const std::int64_t>);
template void KvCache::append(Stream&, std::int64_t, const Buffer<bfloat16>&, const Buffer<bfloat16>&,
                              std::span<const std::int64_t>);

void KvCache::copy_slot_from(Stream& stream, std::int64_t slot, const KvCache& src,
                             std::int64_t src_slot) {
  constexpr std::string_view w = "KvCache::copy_slot_from";
  check_slot(w, slot);
  src.check_valid(w, "src");
  LOCKSTEP_CHECK_ARG(src_slot >= 0 && src_slot < src.slots(), w, "src_slot", src_slot,
            "in [0, src.slots() = " + std::to_string(src.slots()) + ")");
  const auto& sc = src.config();
  LOCKSTEP_CHECK_ARG(sc.num_layers == cfg_.num_layers && sc.num_kv_heads == cfg_.num_kv_heads &&
                sc.head_dim == cfg_.head_dim,
            w, "src geometry",
            "layers " + std::to_string(sc.num_layers) + ", kv heads " + std::to_string(sc.num_kv_heads) +
                ", head_dim " + std::to_string(sc.head_dim),
            "equal to this cache's (layers " + std::to_string(cfg_.num_layers) + ", kv heads " +
                std::to_string(cfg_.num_kv_heads) + ", head_dim " + std::to_string(cfg_.head_dim) + ")");
  LOCKSTEP_CHECK_ARG(sc.format == cfg_.format, w, "src format", format_name(sc.format),
                     std::string("this cache's, ") + format_name(cfg_.format));
  LOCKSTEP_CHECK_ARG(sc.k_scales == cfg_.k_scales && sc.v_scales == cfg_.v_scales, w, "src scales",
                     "other scales than this cache's", "equal scales (the codes are copied as they are)");
  LOCKSTEP_CHECK_ARG(&src.device() == device_.get(), w, "src.device", src.device().id().str(),
            "this cache's device " + detail::device_limit(*device_, src.device()));
  LOCKSTEP_CHECK_ARG(&stream.device() == device_.get(), w, "stream.device", stream.device().id().str(),
            "this cache's device " + detail::device_limit(*device_, stream.device()));
  const std::int64_t n = src.length(src_slot);
  LOCKSTEP_CHECK_ARG(n <= cfg_.max_len, w, "src length", n, "<= max_len = " + std::to_string(cfg_.max_len));
  // In 4-byte words of the codes (a row's codes are whole words).
  const std::int64_t D = std::int64_t(words_of(std::uint64_t(cfg_.head_dim), cfg_.format)), Hk = cfg_.num_kv_heads;
  for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::int64_t so = src_slot * Hk * sc.max_len * D, dso = slot * Hk * cfg_.max_len * D;
    detail::launch_copy3d(stream, src.k(l).data().get() + so, k_[std::size_t(l)].data().get() + dso,
                          Hk, n, D, sc.max_len * D, D, cfg_.max_len * D, D);
    detail::launch_copy3d(stream, src.v(l).data().get() + so, v_[std::size_t(l)].data().get() + dso,
                          Hk, n, D, sc.max_len * D, D, cfg_.max_len * D, D);
  }
  len_[std::size_t(slot)] = n;
  done_[std::size_t(slot)] = false;
  // Each layer holds what it held in the source (a source in the middle of a step, or with a
  // layer imported short, stays so here: Note [layer lengths]).
  const std::size_t L = std::size_t(cfg_.num_layers);
  for (std::size_t l = 0; l < L; ++l)
    layer_len_[std::size_t(slot) * L + l] = src.layer_len_[std::size_t(src_slot) * L + l];
  importing_[std::size_t(slot)] = 0;
  recount(slot);
}

// The checks write_from_host and write_from_device share.
void KvCache::check_import(std::string_view w, Stream& stream, std::int64_t slot, std::int64_t layer,
                                  std::size_t k_size, std::size_t v_size, std::int64_t count) const {
  check_slot(w, slot);
  check_layer(w, layer);
  LOCKSTEP_CHECK_ARG(&stream.device() == device_.get(), w, "stream.device", stream.device().id().str(),
            "the cache's device " + device_->id().str());
  LOCKSTEP_CHECK_ARG(count >= 0 && count <= cfg_.max_len, w, "count", count,
            "in [0, max_len = " + std::to_string(cfg_.max_len) + "]");
  const std::size_t n = std::size_t(cfg_.num_kv_heads * count * cfg_.head_dim);
  LOCKSTEP_CHECK_ARG(k_size == n, w, "k.size()", k_size, std::to_string(n) + " (kv_heads * count * head_dim)");
  LOCKSTEP_CHECK_ARG(v_size == n, w, "v.size()", v_size, std::to_string(n) + " (kv_heads * count * head_dim)");
}

void KvCache::write_from_host(Stream& stream, std::int64_t slot, std::int64_t layer,
                              std::span<const float> k, std::span<const float> v, std::int64_t count) {
  check_import("KvCache::write_from_host", stream, slot, layer, k.size(), v.size(), count);
  const std::size_t row = std::size_t(count * cfg_.head_dim);
  if (cfg_.format == Format::f32) {
    for (std::int64_t h = 0; h < cfg_.num_kv_heads; ++h) {
      const std::size_t off = std::size_t(((slot * cfg_.num_kv_heads) + h) * cfg_.max_len * cfg_.head_dim);
      k_[std::size_t(layer)].copy_from_host(stream, k.subspan(std::size_t(h) * row, row), off);
      v_[std::size_t(layer)].copy_from_host(stream, v.subspan(std::size_t(h) * row, row), off);
    }
  } else {
    // Stored as an append stores them (Note [decode formats]), a head's rows at a time; the
    // copies read the staging vector before this returns (Buffer::copy_from_host).
    const std::size_t Hk = std::size_t(cfg_.num_kv_heads), words = std::size_t(words_of(row, cfg_.format));
    const std::size_t head_words = std::size_t(words_of(std::uint64_t(cfg_.max_len * cfg_.head_dim), cfg_.format));
    std::vector<float> staged(words);
    for (int kv = 0; kv < 2; ++kv) {
      const std::span<const float> src = kv == 0 ? k : v;
      const std::vector<float>& sc = kv == 0 ? cfg_.k_scales : cfg_.v_scales;
      for (std::size_t h = 0; h < Hk; ++h) {
        const float s = is_fp8(cfg_.format) ? sc[std::size_t(layer) * Hk + h] : 0.0f;
        for (std::size_t i = 0; i < row; ++i) store_code(staged.data(), i, cfg_.format, src[h * row + i], s);
        (kv == 0 ? k_ : v_)[std::size_t(layer)].copy_from_host(stream, staged, (std::size_t(slot) * Hk + h) * head_words);
      }
    }
  }
  imported(slot, layer, count);
}

template <class T>
void KvCache::write_from_device(Stream& stream, std::int64_t slot, std::int64_t layer,
                                const Buffer<T>& k, const Buffer<T>& v, std::int64_t count) {
  constexpr std::string_view w = "KvCache::write_from_device";
  check_valid(w);
  LOCKSTEP_CHECK_ARG(format_of<T>() == cfg_.format, w, "k, v element type", format_name(format_of<T>()),
                     std::string("the cache's format, ") + format_name(cfg_.format) +
                         " (the codes are copied as they are)");
  detail::check_on(w, "k", k, stream);
  detail::check_on(w, "v", v, stream);
  check_import(w, stream, slot, layer, k.size(), v.size(), count);
  const std::size_t row = std::size_t(count * cfg_.head_dim);
  T* kd = reinterpret_cast<T*>(const_cast<float*>(k_[std::size_t(layer)].data().get()));
  T* vd = reinterpret_cast<T*>(const_cast<float*>(v_[std::size_t(layer)].data().get()));
  auto head_offset = [&](std::int64_t h) {  // kv head h's first row in the slot
    return std::size_t(((slot * cfg_.num_kv_heads) + h) * cfg_.max_len * cfg_.head_dim);
  };
  // A source (a wrapped view of the cache, say) over the rows the copies write is refused; one
  // elsewhere in the cache is a plain copy. Everything is checked before the first copy.
  for (std::int64_t h = 0; h < cfg_.num_kv_heads && row > 0; ++h) {
    for (T* base : {kd, vd}) {
      const auto dest = Buffer<T>::wrap(device_, base + head_offset(h), row);
      for (const auto& [name, src] : {std::pair<const char*, const Buffer<T>*>{"k", &k}, {"v", &v}})
        LOCKSTEP_CHECK_ARG(!detail::overlaps(*src, dest), w, name, "memory that overlaps the rows it is written to",
                           "a buffer outside slot " + std::to_string(slot) + "'s rows [0, count) of layer " +
                               std::to_string(layer));
    }
  }
  for (std::int64_t h = 0; h < cfg_.num_kv_heads && row > 0; ++h) {
    const std::size_t off = head_offset(h);
    detail::StreamAccess::copy_d2d(stream, kd + off, k.data().get() + std::size_t(h) * row, row * sizeof(T));
    detail::StreamAccess::copy_d2d(stream, vd + off, v.data().get() + std::size_t(h) * row, row * sizeof(T));
  }
  imported(slot, layer, count);
}
template void KvCache::write_from_device(Stream&, std::int64_t, std::int64_t, const Buffer<float>&,
                                         const Buffer<float>&, std::int64_t);
template void KvCache::write_from_device(Stream&, std::int64_t, std::int64_t, const Buffer<half>&,
                                         const Buffer<half>&, std::int64_t);
template void KvCache::write_from_device(Stream&, std::int64_t, std::int64_t, const Buffer<bfloat16>&,
                                         const Buffer<bfloat16>&, std::int64_t);
template void KvCache::write_from_device(Stream&, std::int64_t, std::int64_t, const Buffer<fp8_e4m3>&,
                                         const Buffer<fp8_e4m3>&, std::int64_t);
template void KvCache::write_from_device(Stream&, std::int64_t, std::int64_t, const Buffer<fp8_e5m2>&,
                                         const Buffer<fp8_e5m2>&, std::int64_t);

// The host state after an import of `count` tokens into `layer` of `slot`.
void KvCache::imported(std::int64_t slot, std::int64_t layer, std::int64_t count) {
  // The slot's length becomes count; the layer holds count tokens, the others at most that many
  // (Note [layer lengths]: a layer imported with fewer is behind, and the next token is refused
  // until every layer holds the length).
  // An import is a run of write_from_host calls on the slot: the first one starts a new sequence
  // (the other layers' tokens are another sequence's: they hold none), the next ones keep what
  // the run's earlier calls wrote (at most count), a layer written again with another count
  // included. Any other operation that writes the slot or sets its lengths ends the run (not
  // mark_done, which only sets the flag that this call clears), and so does the run's completion
  // (every layer holds the slot's length): a call after that is the next sequence's first, which
  // must not leave the other layers looking like its tokens.
  len_[std::size_t(slot)] = count;
  done_[std::size_t(slot)] = false;
  const std::size_t L = std::size_t(cfg_.num_layers), base = std::size_t(slot) * L;
  const bool continuing = importing_[std::size_t(slot)] != 0 && behind_[std::size_t(slot)] != 0;
  for (std::size_t l = 0; l < L; ++l) {
    std::int64_t& ll = layer_len_[base + l];
    ll = std::int64_t(l) == layer ? count : continuing ? std::min(ll, count) : 0;
  }
  importing_[std::size_t(slot)] = 1;
  recount(slot);
}

void KvCache::grow(Stream& stream, std::int64_t new_slots) {
  constexpr std::string_view w = "KvCache::grow";
  check_valid(w);
  LOCKSTEP_CHECK_ARG(new_slots >= cfg_.slots && new_slots <= 0x7fffffff, w, "new_slots", new_slots,
            "in [slots = " + std::to_string(cfg_.slots) + ", 2147483647]");
  LOCKSTEP_CHECK_ARG(&stream.device() == device_.get(), w, "stream.device", stream.device().id().str(),
            "the cache's device " + device_->id().str());
  if (new_slots == cfg_.slots) return;
  KvCacheConfig nc = cfg_;
  nc.slots = new_slots;
  const auto per_layer = words_of(layer_elems(nc, w), nc.format);
  std::vector<Buffer<float>> nk, nv;  // allocate everything first: an OOM changes nothing
  allocate_layers(per_layer, nk, nv, "growing a KvCache to " + std::to_string(new_slots) + " slots: K and V of " +
                                         std::to_string(cfg_.num_layers) + " layers, " +
                                         std::to_string(per_layer * 4) + " bytes each");
  // Slots are the outermost dimension: the old contents are a prefix of the new layout.
  for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
    detail::StreamAccess::copy_d2d(stream, nk[std::size_t(l)].data().get(), k_[std::size_t(l)].data().get(),
                                   k_[std::size_t(l)].size_bytes());
    detail::StreamAccess::copy_d2d(stream, nv[std::size_t(l)].data().get(), v_[std::size_t(l)].data().get(),
                                   v_[std::size_t(l)].size_bytes());
  }
  k_ = std::move(nk);  // the old buffers' release waits for the copies (Note [buffer release])
  v_ = std::move(nv);
  cfg_ = nc;
  len_.resize(std::size_t(new_slots), 0);
  done_.resize(std::size_t(new_slots), false);
  layer_len_.resize(std::size_t(new_slots * cfg_.num_layers), 0);
  behind_.resize(std::size_t(new_slots), 0);
  importing_.resize(std::size_t(new_slots), 0);
}

}  // namespace lockstep
