#pragma once
// Harness cases of the KV-cache operations (KvCache::append, copy_slot_from, grow), and the
// helpers that read a cache's tokens back (also used by the Flash-Decoding cases, whose chunk
// kernel appends the new tokens).
#include <cstdint>
#include <memory>
#include <vector>

#include "harness.hpp"
#include "lockstep/attention/kv_cache.hpp"

namespace lockstep::harness {

// A [slots, kv_heads, max_len, dim] layer: where token t of kv head h of slot s starts.
struct CacheGeometry {
  std::int64_t Hk = 1, L = 1, D = 1;
  std::size_t at(std::int64_t s, std::int64_t h, std::int64_t t) const {
    return std::size_t(((s * Hk + h) * L + t) * D);
  }
  std::size_t slot_elems() const { return std::size_t(Hk * L * D); }
};

// The layer's tokens [0, n[s]) of every slot and kv head, K then V.
std::vector<float> cache_tokens(Stream& st, const KvCache& c, const std::vector<std::int64_t>& n,
                                std::int64_t layer = 0);

// KvCache::append over `layers` layers and `steps` steps, every slot of a cache whose every
// byte was written first (so stray writes show); the whole cache is compared.
struct AppendShape {
  std::int64_t layers = 1, slots = 1, kv_heads = 1, dim = 32, max_len = 2, steps = 1;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> append_case(const AppendShape& s);

// KvCache::copy_slot_from: `copies` random (dst slot <- src slot) copies between two caches of
// the same geometry but different slots and max_len; the whole destination is compared.
struct CopySlotShape {
  std::int64_t layers = 1, kv_heads = 1, dim = 32, src_slots = 1, src_max_len = 1, dst_slots = 1,
               dst_max_len = 1, copies = 1;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> copy_slot_case(const CopySlotShape& s);

// KvCache::grow from `slots` to `new_slots`, then one append into every live slot (the new ones
// at position 0): the old slots' every byte and the new slots' first token are compared.
struct GrowShape {
  std::int64_t layers = 1, slots = 1, new_slots = 1, kv_heads = 1, dim = 32, max_len = 2;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> grow_case(const GrowShape& s);

std::vector<KernelEntry> cache_entries();

}  // namespace lockstep::harness
