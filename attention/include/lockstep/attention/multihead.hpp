#pragma once
// Multi-head attention from the building blocks (docs/api.md, "Multi-head attention"):
// out = softmax(scale * Q K^T [+ causal mask]) V per head, inputs and output interleaved
// [seq_len, num_heads * head_dim].

#include <cstddef>
#include <cstdint>
#include <optional>

#include "lockstep/buffer.hpp"
#include "lockstep/formats.hpp"

namespace lockstep {

// PerHead: extract -> transpose -> GEMM -> scale -> softmax -> GEMM -> copy back, head by head
// (the reference path, 9 launches per head). Batched: every head in each launch (9 launches).
enum class MhaImpl { kAuto, kPerHead, kBatched };
// Exact: the strict fp32 SIMT GEMM (bit-identical on both backends). TensorCore: fp16 inputs, fp32
// accumulation (WMMA; emulated on the CPU, within the bound of docs/numerics.md). Auto: tensor
// cores when m, n >= 16 and k >= 64.
enum class GemmKind { kAuto, kExact, kTensorCore };

struct MhaShape {
  std::int64_t seq_len = 0;
  std::int64_t num_heads = 0;
  std::int64_t head_dim = 0;
};

// What a call ran (MhaOptions::report).
struct MhaReport {
  int launches = 0;             // kernel launches this call enqueued
  MhaImpl impl = MhaImpl::kBatched;
  GemmKind score_gemm = GemmKind::kExact;  // what each GEMM ran on
  GemmKind value_gemm = GemmKind::kExact;
};

struct MhaOptions {
  bool causal = false;
  MhaImpl impl = MhaImpl::kAuto;  // Auto: Batched
  GemmKind gemm = GemmKind::kAuto;
  // The softmax scale. Unset: 1 / sqrt(head_dim). A finite float.
  std::optional<float> scale;
  // Caller-owned temporaries: at least multihead_attention_workspace_bytes(shape, options),
  // 16-byte aligned, on the stream's device, overlapping none of the call's buffers. nullptr:
  // the stream's scratch.
  Buffer<std::byte>* workspace = nullptr;
  // Optional output: what the call ran, written when the call returns (also for seq_len 0).
  MhaReport* report = nullptr;
};

// The workspace bytes multihead_attention needs for this shape and options.
std::uint64_t multihead_attention_workspace_bytes(const MhaShape& shape, const MhaOptions& options = {});

// T: float, half or bfloat16, one type for q, k, v and out. The products, the softmax and every
// temporary are float's (the workspace's bytes do not depend on T): the first copies widen q, k
// and v exactly, the last rounds out once, so a 16-bit call gives the float call's bytes on the
// widened inputs, rounded.
template <class T>
void multihead_attention(Stream& stream, const Buffer<T>& q, const Buffer<T>& k, const Buffer<T>& v, Buffer<T>& out,
                         const MhaShape& shape, const MhaOptions& options = {});

}  // namespace lockstep
