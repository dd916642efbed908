#pragma once
// Decode attention (docs/api.md, "Decode", "The KV cache"): single-token (incremental) attention
// against a head-first cache, the KV-cache scatter, and Flash-Decoding over a KvCache. Each call
// enqueues on the caller's stream, creates no stream and does not synchronize. Temporaries live
// in options.workspace when given, else in the stream's scratch memory (docs/api.md, "Workspace").

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/buffer.hpp"
#include "lockstep/tuning.hpp"

namespace lockstep {

struct DecodeShape {
  std::int64_t num_heads = 0;      // query heads
  std::int64_t num_kv_heads = 0;   // must divide num_heads (== num_heads: MHA)
  std::int64_t head_dim = 0;     // 32, 64, 96, 128 or 256
  std::int64_t max_len = 0;  // cache capacity in tokens
};

struct DecodeOptions {
  // The softmax scale: scores q . k * scale. Unset: 1 / sqrt(head_dim). A finite float.
  std::optional<float> scale;
  // The schedule (lockstep/tuning.hpp); nullptr: the innermost TuningScope's, else the device's.
  const Tuning* tuning = nullptr;
  // Caller-owned temporaries: at least the call's *_workspace_bytes, 16-byte aligned, on the
  // stream's device, overlapping none of the call's other buffers; the call's work must finish
  // before the workspace is reused or freed. nullptr: the stream's scratch.
  Buffer<std::byte>* workspace = nullptr;
  // flash_decoding with device positions only: one int32 on the device that a skipped slot
  // raises (see that call); nullptr: not reported.
  Buffer<std::int32_t>* status = nullptr;
  // incremental_attention over fp8 caches only: [2, num_kv_heads] floats on the stream's device,
  // K's scales then V's (the cache holds x / scale; Note [decode formats]). Required there,
  // refused elsewhere (a KvCache holds its own).
  const Buffer<float>* kv_scales = nullptr;
};

// The workspace bytes incremental_attention needs for any seq_len of `shape`.
std::uint64_t incremental_attention_workspace_bytes(const DecodeShape& shape);
// The workspace bytes either flash_decoding call needs on a cache of this configuration.
std::uint64_t flash_decoding_workspace_bytes(const KvCacheConfig& config);

// out[h, :] = softmax(q[h] . K[h / g, t, :] * scale, t < seq_len) . V[h / g, t, :], g =
// num_heads / num_kv_heads. q [num_heads, head_dim]; caches [num_kv_heads, max_len, head_dim]; out
// [num_heads, head_dim]. seq_len == 0 gives zeros. Tokens at or after seq_len are never read.
// Bitwise equal to flash_decoding of the same sequence (Note [fixed split size]).
// Formats (docs/api.md, "Formats"): q and out T (float, half or bfloat16), the caches C (float,
// half, bfloat16, fp8_e4m3 or fp8_e5m2; fp8 with options.kv_scales). Defined for every such pair.
template <class T, class C>
void incremental_attention(Stream& stream, const Buffer<T>& q, const Buffer<C>& k_cache,
                           const Buffer<C>& v_cache, std::int64_t seq_len, Buffer<T>& out,
                           const DecodeShape& shape, const DecodeOptions& options = {});

// cache[h, pos, :] = src[h * head_dim .. +head_dim) for every kv head: one position's K or V,
// src interleaved [num_kv_heads * head_dim], cache [num_kv_heads, max_len, head_dim]. src T
// (float, half or bfloat16), the cache C (any cache format), each value stored as
// from_float<C>(x / scale[h]) with `scale` ([num_kv_heads] on the device: fp8 caches only, and
// required there), x rounded to C without.
template <class T, class C>
void kv_cache_scatter(Stream& stream, const Buffer<T>& src, std::int64_t pos, Buffer<C>& cache,
                      const DecodeShape& shape, const Buffer<float>* scale = nullptr);

// Flash-Decoding over every slot of `cache` (docs/api.md): writes k_new / v_new into `layer` at
// `positions` (as KvCache::append), then out = split-K attention of q over each slot's tokens.
// q [slots, num_heads, head_dim], k_new / v_new [slots, num_kv_heads, head_dim], out [slots,
// num_heads, head_dim]. Done slots give zeros (a slot of length 0 appends its token and attends it). The split size is fixed
// (Note [fixed split size]), so each slot's output is bitwise independent of the others. Two
// launches, the chunk kernel, which also appends (Note [fused append]), and the merge; one where
// the merge is small and the chunk kernel does it (Note [folded merge]); up to 128
// slots' positions travel in the kernel parameters (Note [inline positions]), more are copied
// to the device first.
// q, k_new, v_new and out: T, float, half or bfloat16, over a cache of any format.
template <class T>
void flash_decoding(Stream& stream, KvCache& cache, std::int64_t layer, const Buffer<T>& q,
                    const Buffer<T>& k_new, const Buffer<T>& v_new, std::span<const std::int64_t> positions,
                    Buffer<T>& out, const DecodeOptions& options = {});

// Flash-Decoding with the positions in device memory (Note [device positions] in
// kernels/decode.hpp): the same kernels and bits as the call above, enqueued as the same one or two
// launches with no host-to-device copy, so that a whole decode step can be captured in a CUDA graph and
// replayed after writing new positions into `positions`. positions: [slots] int32 on the
// stream's device; slot s's new K/V go to token positions[s] and its query attends
// positions[s] + 1 tokens; -1 skips the slot (zeros out, nothing written). The host never reads
// the values, so (1) the cache's host-side lengths are not updated (KvCache::set_length), and
// (2) a position outside [-1, max_len) is not an exception: the kernels skip that slot (nothing
// written, zeros out) and, if options.status is given (one int32 on the device), raise it to
// max(status, 1 + slot): with several such slots it holds the highest, on every run and
// backend; lockstep never clears it. Shapes, devices and sizes are checked on the host as above
// (InvalidArgument, nothing enqueued). The first call on a stream sizes the stream's scratch for
// max_len (none with options.workspace), and the stream's counters; later calls allocate
// nothing: run one call on a stream before capturing it (docs/api.md, "Workspace").
template <class T>
void flash_decoding(Stream& stream, KvCache& cache, std::int64_t layer, const Buffer<T>& q,
                    const Buffer<T>& k_new, const Buffer<T>& v_new, const Buffer<std::int32_t>& positions,
                    Buffer<T>& out, const DecodeOptions& options = {});

}  // namespace lockstep
