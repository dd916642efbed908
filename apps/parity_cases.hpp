#pragma once
// Parity cases that live with the `lockstep` tool (apps/parity_cases.cpp): the KV-cache
// operations the harness in proptests/harness has no case for (append, copy_slot_from, grow),
// Flash-Decoding with the cache bytes of its fused append compared too and with device-side
// positions, and RoPE; each fills every column of the parity table (the relative error to the
// float64 oracle included).

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "harness/harness.hpp"
#include "harness/harness_decode.hpp"

namespace lockstep::parity {

// KvCache::append over `layers` layers and `steps` steps, every slot of a cache whose every
// byte was written first (so stray writes show); the whole cache is compared.
struct AppendShape {
  std::int64_t layers = 1, slots = 1, kv_heads = 1, dim = 32, max_len = 2, steps = 1;
  std::uint64_t seed = 0;
};
std::unique_ptr<harness::Case> append_case(const AppendShape& s);

// KvCache::copy_slot_from: `copies` random (dst slot <- src slot) copies between two caches of
// the same geometry but different slots and max_len; the whole destination is compared.
struct CopySlotShape {
  std::int64_t layers = 1, kv_heads = 1, dim = 32, src_slots = 1, src_max_len = 1, dst_slots = 1,
               dst_max_len = 1, copies = 1;
  std::uint64_t seed = 0;
};
std::unique_ptr<harness::Case> copy_slot_case(const CopySlotShape& s);

// KvCache::grow from `slots` to `new_slots`, then one append into every live slot (the new ones
// at position 0): the old slots' every byte and the new slots' first token are compared.
struct GrowShape {
  std::int64_t layers = 1, slots = 1, new_slots = 1, kv_heads = 1, dim = 32, max_len = 2;
  std::uint64_t seed = 0;
};
std::unique_ptr<harness::Case> grow_case(const GrowShape& s);

// flash_decoding with host positions (a harness::DecodeWorld): out, then the cache tokens the
// call may have written or must have kept (each slot's tokens below its new length).
std::unique_ptr<harness::Case> flash_cache_case(const harness::DecodeWorldShape& s);

// flash_decoding with device positions (Buffer<std::int32_t>) and a status buffer: per slot a
// position that is the slot's length, an earlier one (a device-side rollback), -1 (skipped), or
// at most one outside [-1, max_len) (skipped, reported in status). out, status, and the cache
// tokens below each slot's new length are compared.
struct DevicePositionsShape {
  harness::DecodeWorldShape world;
  bool with_skip = true, with_out_of_range = true, with_rewind = true;
};
std::unique_ptr<harness::Case> device_positions_case(const DevicePositionsShape& s);

// rope, the same draws as the harness's rope case, with the relative error filled.
std::unique_ptr<harness::Case> rope_rel_case(const harness::RopeCaseShape& s);

}  // namespace lockstep::parity
