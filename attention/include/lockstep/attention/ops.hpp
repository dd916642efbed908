#pragma once
// The building blocks of batched attention as host calls (docs/api.md, "Primitive ops"). Each call
// checks its arguments (typed errors; nothing is enqueued on error), enqueues one kernel launch
// on `stream` and returns without synchronizing. Buffers must live on the stream's device.

#include <cstdint>

#include "lockstep/buffer.hpp"
#include "lockstep/formats.hpp"

namespace lockstep::ops {

// out[r, :] = softmax(in[r, :]) for `rows` rows of length n (row-major, in == out allowed). T:
// float, half or bfloat16; with half and bfloat16 each value is widened, the arithmetic is the
// float softmax's, and each output rounded once.
template <class T>
void softmax_rows(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t rows, std::int64_t n);

// out[i] = in[i] * scale for every element (same size; in == out allowed).
void scale(Stream& stream, const Buffer<float>& in, Buffer<float>& out, float scale);

// out[i] = in[i] converted between float and a storage format (lockstep/formats.hpp; the rules
// are docs/numerics.md's "Formats"): float to the format rounds to nearest even (fp8
// saturating), the format to float is exact. Same size; the bytes are the formats' conversions'
// on every backend; out must not overlap in.
void convert(Stream& stream, const Buffer<float>& in, Buffer<half>& out);
void convert(Stream& stream, const Buffer<float>& in, Buffer<bfloat16>& out);
void convert(Stream& stream, const Buffer<float>& in, Buffer<fp8_e4m3>& out);
void convert(Stream& stream, const Buffer<float>& in, Buffer<fp8_e5m2>& out);
void convert(Stream& stream, const Buffer<half>& in, Buffer<float>& out);
void convert(Stream& stream, const Buffer<bfloat16>& in, Buffer<float>& out);
void convert(Stream& stream, const Buffer<fp8_e4m3>& in, Buffer<float>& out);
void convert(Stream& stream, const Buffer<fp8_e5m2>& in, Buffer<float>& out);

// y[i] += x[i] for every element (same size).
void add(Stream& stream, const Buffer<float>& x, Buffer<float>& y);

// The layout calls move elements of T = float, half or bfloat16 as they are (the bytes; a 16-bit T
// needs an even head_dim).
// [seq_len, num_heads * head_dim] (interleaved) -> [num_heads, seq_len, head_dim] (batched).
template <class T>
void interleaved_to_batched(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                            std::int64_t num_heads, std::int64_t head_dim);
// [num_heads, seq_len, head_dim] -> [seq_len, num_heads * head_dim].
template <class T>
void batched_to_interleaved(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                            std::int64_t num_heads, std::int64_t head_dim);
// out [seq_len, head_dim] = head `head` of in [seq_len, num_heads * head_dim].
template <class T>
void extract_head(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                  std::int64_t num_heads, std::int64_t head_dim, std::int64_t head);
// Head `head` of out [seq_len, num_heads * head_dim] = in [seq_len, head_dim]; the other heads are untouched.
template <class T>
void copy_head_back(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                    std::int64_t num_heads, std::int64_t head_dim, std::int64_t head);
// out[b] = in[b]^T for in [batch, rows, cols] -> out [batch, cols, rows].
void transpose(Stream& stream, const Buffer<float>& in, Buffer<float>& out, std::int64_t batch,
               std::int64_t rows, std::int64_t cols);

// c[b] = alpha * a[b] x b[b]: a [batch, m, k], b [batch, k, n], c [batch, m, n], row-major,
// strict fp32 (SIMT). c must not overlap a or b.
void gemm(Stream& stream, const Buffer<float>& a, const Buffer<float>& b, Buffer<float>& c,
          std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha = 1.0f);

}  // namespace lockstep::ops
