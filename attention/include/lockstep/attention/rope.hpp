#pragma once
// Rotary position embedding (docs/api.md, "RoPE").

#include <cstdint>
#include <span>

#include "lockstep/buffer.hpp"
#include "lockstep/formats.hpp"

namespace lockstep {

// Rotary position embedding in place on q [rows, num_heads, head_dim] and k [rows, num_kv_heads,
// head_dim] (either may be nullptr), row r at positions[r], in one launch.
enum class RopeStyle { kNorm, kNeox };
struct RopeConfig {
  std::int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::kNorm;
};
// q and k in float, half or bfloat16 (one type for both): each value widened, rotated in float,
// and rounded once to the buffer's format.
void rope(Stream& stream, Buffer<float>* q, Buffer<float>* k, std::span<const std::int64_t> positions,
          const RopeConfig& config);
void rope(Stream& stream, Buffer<half>* q, Buffer<half>* k, std::span<const std::int64_t> positions,
          const RopeConfig& config);
void rope(Stream& stream, Buffer<bfloat16>* q, Buffer<bfloat16>* k, std::span<const std::int64_t> positions,
          const RopeConfig& config);

}  // namespace lockstep
