#pragma once
// A batched decode world: a KV cache of `slots` sequences with random lengths (NaN past each
// length), some slots done, and one new token per slot; shared by the Flash-Decoding case and
// the batch-invariance / rollback properties.
#include <vector>

#include "harness.hpp"
#include "lockstep/attention/kv_cache.hpp"

namespace lockstep::harness {

struct DecodeWorldShape {
  std::int64_t slots = 1, heads = 1, kv_heads = 1, dim = 32, max_len = 1;
  std::vector<std::int64_t> lengths;  // optional: fixed lengths (each < max_len)
  std::vector<bool> done;             // optional
  std::uint64_t seed = 0;
};

struct DecodeWorld {
  explicit DecodeWorld(const DecodeWorldShape& s);
  DecodeWorldShape shape;
  std::vector<std::int64_t> lengths;
  std::vector<bool> done;
  std::vector<float> k, v;           // [slots, kv_heads, max_len, dim]
  std::vector<float> q, k_new, v_new;

  KvCacheConfig config() const;
  KvCache make_cache(const std::shared_ptr<Device>& dev) const;
  // flash_decoding of the new tokens at positions = lengths; returns out [slots, heads, dim].
  std::vector<float> decode(const std::shared_ptr<Device>& dev) const;
  OracleReport check(const std::vector<float>& out) const;
};

std::unique_ptr<Case> flash_case(const DecodeWorldShape& s);

struct RopeCaseShape {
  std::int64_t rows = 1, heads = 1, kv_heads = 1, dim = 2;
  float theta = 10000.0f;
  bool neox = false;
  std::int64_t max_pos = 64;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> rope_case(const RopeCaseShape& s);

std::vector<KernelEntry> decode_entries();

}  // namespace lockstep::harness
