#pragma once
// Internal: the kernel launches behind the public calls, on raw device addresses (so that
// per-head and per-batch offsets can be expressed). Each checks the kernel's indexing and grid
// limits, which the public calls have not already implied.

#include <cstdint>

#include <string_view>

#include "lockstep/device.hpp"
#include "lockstep/formats.hpp"

namespace lockstep::detail {

// A grid dimension for v blocks, or InvalidArgument when v exceeds `limit`.
std::uint32_t grid_dim(std::int64_t v, std::string_view where, std::string_view what, std::int64_t limit);

// T: float, half or bfloat16 (instantiated in ops.cpp).
template <class T>
void launch_softmax(Stream& s, const T* in, T* out, std::int64_t rows, std::int64_t n);
void launch_scale(Stream& s, const float* in, float* out, std::int64_t n, float scale);
// out[a*oa + b*ob + c] = in[a*ia + b*ib + c], floats; with in_format / out_format (kernels/act.hpp:
// 0 float, 1 half, 2 bfloat16) each value widened, then rounded once to the output's format.
void launch_copy3d(Stream& s, const void* in, void* out, std::int64_t A, std::int64_t B,
                   std::int64_t C, std::int64_t ia, std::int64_t ib, std::int64_t oa,
                   std::int64_t ob, int in_format = 0, int out_format = 0);
void launch_transpose(Stream& s, const float* in, float* out, std::int64_t batch, std::int64_t R,
                      std::int64_t C);
void launch_gemm(Stream& s, const float* a, const float* b, float* c, std::int64_t batch,
                 std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                 std::int64_t ldb, std::int64_t ldc, std::int64_t stride_a,
                 std::int64_t stride_b, std::int64_t stride_c, float alpha);

// The tensor-core GEMM (same parameters as launch_gemm).
void launch_gemm_tc(Stream& s, const float* a, const float* b, float* c, std::int64_t batch,
                    std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                    std::int64_t ldb, std::int64_t ldc, std::int64_t stride_a,
                    std::int64_t stride_b, std::int64_t stride_c, float alpha);
// out = in * scale with the causal mask when causal, over [batch, rows, cols].
void launch_scale_mask(Stream& s, const float* in, float* out, std::int64_t batch,
                       std::int64_t rows, std::int64_t cols, float scale, bool causal);

}  // namespace lockstep::detail
