#pragma once
// A batched decode world: a KV cache of `slots` sequences with random lengths (NaN past each
// length), some slots done, and one new token per slot; shared by the Flash-Decoding cases and
// the batch-invariance / rollback properties.
#include <vector>

#include "harness.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"

namespace lockstep::harness {

struct DecodeWorldShape {
  std::int64_t slots = 1, heads = 1, kv_heads = 1, dim = 32, max_len = 1;
  // The cache's layers, and the one decoded; the others hold other tokens (K and V uniform in
  // [-1, 1] from their own seeds), which the decode must neither read nor write.
  std::int64_t layers = 1, layer = 0;
  // q uniform in [-q_scale, q_scale]: 300 gives scores of about +-100 (past exp's range of 88),
  // which a softmax or merge that forgot to subtract its running max turns into inf or NaN.
  float q_scale = 1.0f;
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
  float scale;  // DecodeOptions::scale (0: unset): softmax_scale_of(shape.seed)
  DecodeOptions options() const;
  // What make_cache writes into `layer` (the world's k or v for shape.layer); kv: 0 K, 1 V.
  std::vector<float> layer_data(std::int64_t layer, int kv) const;

  // "slots=... heads=... kv_heads=... dim=... max_len=... seed=..."
  std::string text() const;
  KvCacheConfig config() const;
  KvCache make_cache(const std::shared_ptr<Device>& dev) const;
  // q, k_new and v_new on `dev`, and out [slots, heads, dim] poisoned.
  struct Inputs {
    Buffer<float> q, k_new, v_new, out;
  };
  Inputs upload(const std::shared_ptr<Device>& dev) const;
  // flash_decoding of the new tokens at positions = lengths into shape.layer; returns out [slots,
  // heads, dim].
  std::vector<float> decode(const std::shared_ptr<Device>& dev) const;
  // The same into `cache` (a make_cache), which then holds the appended tokens.
  std::vector<float> decode(const std::shared_ptr<Device>& dev, KvCache& cache) const;
  // out [slots, heads, dim] of decode() against the float64 oracle (done slots: zeros).
  OracleReport check(const std::vector<float>& out) const;
  // Slot s's rows of out [slots, heads, dim]: the query heads against tokens [0, pos) of the
  // world's cache and the new token at pos; pos < 0: no token (done or skipped), all zeros.
  void check_slot(OracleReport& rep, std::int64_t s, std::int64_t pos, const float* out) const;
  // The cache tokens [0, n[s]) of every slot and kv head, K then V, after the new token of slot s
  // was written at pos[s] (< 0: none).
  std::vector<float> expected_tokens(const std::vector<std::int64_t>& n, const std::vector<std::int64_t>& pos) const;
};

// flash_decoding with host positions: out, then the cache tokens below each slot's new length
// (Note [fused append]: the chunk kernel appends the new tokens), the lengths, each layer's
// lengths, and every other layer's whole K and V (as make_cache wrote them).
std::unique_ptr<Case> flash_case(const DecodeWorldShape& s);

// flash_decoding with device positions (Buffer<std::int32_t>) and a status buffer: per slot a
// position that is the slot's length, an earlier one (a device-side rollback), -1 (skipped), or
// for one to three slots, a position outside [-1, max_len) (skipped, reported in status: the
// highest such slot + 1). out, status, and the cache
// tokens below each slot's new length are compared. Done flags are ignored (none drawn).
struct DevicePositionsShape {
  DecodeWorldShape world;
  bool with_skip = true, with_out_of_range = true, with_rewind = true;
};
std::unique_ptr<Case> device_positions_case(const DevicePositionsShape& s);

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
