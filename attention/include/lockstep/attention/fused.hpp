#pragma once
// Fused attention for prefill (docs/api.md, "Fused attention"): one kernel in the
// FlashAttention-2 schedule, out = softmax(scale * Q K^T [+ causal mask]) V.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "lockstep/buffer.hpp"
#include "lockstep/formats.hpp"
#include "lockstep/tuning.hpp"

namespace lockstep {

// Exact: strict fp32 (SIMT), byte-identical on both backends. TensorCore: Q, K, V and P rounded
// to fp16 for the tile products, fp32 accumulation and fp32 softmax (docs/numerics.md); the CPU
// emulates the tiles, within the documented bound of CUDA. Auto: Exact (bit-faithful).
enum class AttentionPrecision { kAuto, kExact, kTensorCore };
// kHeadsFirst: [batch, heads, seq, head_dim]; kInterleaved: [batch, seq, heads * head_dim].
enum class AttentionLayout { kHeadsFirst, kInterleaved };

struct AttentionShape {
  std::int64_t batch = 1, num_heads = 1, num_kv_heads = 1;  // num_kv_heads divides num_heads (GQA)
  std::int64_t seq_q = 0, seq_kv = 0;
  std::int64_t head_dim = 64;  // 32, 64, 96, 128 or 256
};

struct AttentionOptions {
  bool causal = false;  // bottom-right aligned when seq_q < seq_kv
  AttentionPrecision precision = AttentionPrecision::kAuto;
  AttentionLayout layout = AttentionLayout::kHeadsFirst;
  Buffer<float>* lse = nullptr;  // optional output: [batch, num_heads, seq_q] log-sum-exp
  // true: a row's bytes do not depend on the batch, the number of heads or seq_q (the schedule's
  // sums have one order whatever the grid). false: small grids may split each query tile's keys
  // into ranges merged by the last block (Note [split keys]), faster there, with bytes that depend
  // on the grid's size (within the same bound; Exact still CPU == CUDA bitwise).
  bool batch_invariant = true;
  // The softmax scale: out = softmax(scale * Q K^T [+ mask]) V. Unset: 1 / sqrt(head_dim). A
  // finite float.
  std::optional<float> scale;
  // The schedule (lockstep/tuning.hpp); nullptr: the innermost TuningScope's, else the device's.
  const Tuning* tuning = nullptr;
  // Caller-owned temporaries: at least attention_workspace_bytes(...) for this device, shape and
  // options, 16-byte aligned, on the stream's device, overlapping none of the call's buffers; the
  // call's work must finish before it is reused or freed. nullptr: the stream's scratch.
  Buffer<std::byte>* workspace = nullptr;
};

// The workspace bytes attention(...) needs on `device` for this shape and options (0 for the
// Exact schedules that need none). It follows the Tuning in force as the call does.
std::uint64_t attention_workspace_bytes(const Device& device, const AttentionShape& shape,
                                        const AttentionOptions& options = {});

// q [.., seq_q, ..], k and v [.., seq_kv, ..] with num_kv_heads heads, out like q. A fully masked row
// gives zeros (and log-sum-exp -inf); seq_q == 0 writes nothing.
// T: float, half or bfloat16, one type for q, k, v and out (docs/api.md, "Formats"). In half and
// bfloat16 the arithmetic is float's: the call gives the float call's bytes on the widened inputs,
// rounded once to T (lse stays float). TensorCore takes float or half (bfloat16: Unsupported).
template <class T>
void attention(Stream& stream, const Buffer<T>& q, const Buffer<T>& k, const Buffer<T>& v, Buffer<T>& out,
               const AttentionShape& shape, const AttentionOptions& options = {});

}  // namespace lockstep
