#pragma once
// Single-token (incremental) decode attention against a head-first KV cache, and the KV-cache
// scatter (docs/api.md, "Decode"). Both enqueue on the caller's stream, create no stream and do
// not synchronize. Temporaries live in the stream's scratch memory (Note [stream scratch]).

#include <cstdint>

#include "lockstep/buffer.hpp"

namespace lockstep {

struct DecodeShape {
  std::int64_t num_heads = 0;      // query heads
  std::int64_t num_kv_heads = 0;   // must divide num_heads (== num_heads: MHA)
  std::int64_t head_dim = 0;     // 32, 64, 96, 128 or 256
  std::int64_t max_len = 0;  // cache capacity in tokens
};

// out[h, :] = softmax(q[h] . K[h / g, t, :] / sqrt(d), t < seq_len) . V[h / g, t, :], g =
// num_heads / num_kv_heads. q [num_heads, head_dim]; caches [num_kv_heads, max_len, head_dim]; out
// [num_heads, head_dim]. seq_len == 0 gives zeros. Tokens at or after seq_len are never read.
// Bitwise equal to flash_decoding of the same sequence (Note [fixed split size]).
void incremental_attention(Stream& stream, const Buffer<float>& q, const Buffer<float>& k_cache,
                           const Buffer<float>& v_cache, std::int64_t seq_len,
                           Buffer<float>& out, const DecodeShape& shape);

// cache[h, pos, :] = src[h * head_dim .. +head_dim) for every kv head: one position's K or V,
// src interleaved [num_kv_heads * head_dim], cache [num_kv_heads, max_len, head_dim].
void kv_cache_scatter(Stream& stream, const Buffer<float>& src, Buffer<float>& cache,
                      std::int64_t pos, const DecodeShape& shape);

}  // namespace lockstep
