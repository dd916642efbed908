#include "lockstep/attention/ops.hpp"

#include <algorithm>

#include "checks.hpp"
#include "launchers.hpp"
#include "lockstep/kernels/launch.hpp"

namespace lockstep {
namespace detail {

std::uint32_t grid_dim(std::int64_t v, std::string_view where, std::string_view what,
                       std::int64_t limit) {
  LOCKSTEP_CHECK_ARG(v <= limit, where, what, v, "<= " + std::to_string(limit) + " (launch grid limit)");
  return static_cast<std::uint32_t>(std::max<std::int64_t>(v, 1));
}

template <class T>
void launch_softmax(Stream& s, const T* in, T* out, std::int64_t rows, std::int64_t n) {
  using K = kernels::SoftmaxRows<T>;
  if (rows == 0) return;
  check_fits(std::uint64_t(n) * K::kRowsPerBlock, kMaxLaneOffset, "softmax_rows",
             "8 * n (row length)");
  const auto gx = grid_dim(kernels::ceil_div(rows, K::kRowsPerBlock), "softmax_rows",
                           "ceil(rows / 8)", 0x7fffffff);
  launch<K>(s, Dim3{gx, 1, 1}, 0, typename K::Params{in, out, rows, n});
}
template void launch_softmax(Stream&, const float*, float*, std::int64_t, std::int64_t);
template void launch_softmax(Stream&, const half*, half*, std::int64_t, std::int64_t);
template void launch_softmax(Stream&, const bfloat16*, bfloat16*, std::int64_t, std::int64_t);

void launch_scale(Stream& s, const float* in, float* out, std::int64_t n, float scale) {
  using K = kernels::Scale;
  if (n == 0) return;
  const auto gx = grid_dim(kernels::ceil_div(n, K::kPerBlock), "scale", "ceil(n / 1024)",
                           0x7fffffff);
  launch<K>(s, Dim3{gx, 1, 1}, 0, K::Params{in, out, n, scale});
}

void launch_copy3d(Stream& s, const void* in, void* out, std::int64_t A, std::int64_t B,
                   std::int64_t C, std::int64_t ia, std::int64_t ib, std::int64_t oa,
                   std::int64_t ob, int in_format, int out_format) {
  using K = kernels::Copy3D;
  if (A == 0 || B == 0 || C == 0) return;
  check_fits(std::uint64_t(ib) * K::kRowsPerBlock + std::uint64_t(C), kMaxLaneOffset, "copy3d",
             "8 * input row stride + row length");
  check_fits(std::uint64_t(ob) * K::kRowsPerBlock + std::uint64_t(C), kMaxLaneOffset, "copy3d",
             "8 * output row stride + row length");
  const auto gx = grid_dim(kernels::ceil_div(B, K::kRowsPerBlock), "copy3d", "ceil(rows / 8)",
                           0x7fffffff);
  const std::int64_t gy = std::min<std::int64_t>(A, 65535);
  const auto gz = grid_dim(kernels::ceil_div(A, gy), "copy3d", "ceil(A / 65535)", 65535);
  launch<K>(s, Dim3{gx, static_cast<std::uint32_t>(gy), gz}, 0,
            K::Params{in, out, A, B, C, ia, ib, oa, ob, in_format, out_format});
}

void launch_transpose(Stream& s, const float* in, float* out, std::int64_t batch, std::int64_t R,
                      std::int64_t C) {
  using K = kernels::Transpose;
  if (batch == 0 || R == 0 || C == 0) return;
  check_fits(std::uint64_t(C) * K::kTile, kMaxLaneOffset, "transpose", "32 * cols");
  check_fits(std::uint64_t(R) * K::kTile, kMaxLaneOffset, "transpose", "32 * rows");
  const auto gx = grid_dim(kernels::ceil_div(C, K::kTile), "transpose", "ceil(cols / 32)",
                           0x7fffffff);
  const auto gy = grid_dim(kernels::ceil_div(R, K::kTile), "transpose", "ceil(rows / 32)", 65535);
  const auto gz = grid_dim(batch, "transpose", "batch", 65535);
  launch<K>(s, Dim3{gx, gy, gz}, K::kSharedBytes, K::Params{in, out, batch, R, C});
}

namespace {
// Both GEMM kernels take the same parameters and tile the output in 64 x 64 blocks.
template <class K>
void launch_gemm_kernel(Stream& s, std::string_view name, const float* a, const float* b, float* c,
                        std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                        std::int64_t lda, std::int64_t ldb, std::int64_t ldc, std::int64_t stride_a,
                        std::int64_t stride_b, std::int64_t stride_c, float alpha) {
  if (batch == 0 || m == 0 || n == 0) return;
  check_fits(std::uint64_t(lda) * K::kTile + K::kK, kMaxLaneOffset, name, "64 * lda");
  check_fits(std::uint64_t(ldb) * K::kK + K::kTile, kMaxLaneOffset, name, "k-tile * ldb");
  check_fits(std::uint64_t(ldc) * K::kTile + K::kTile, kMaxLaneOffset, name, "64 * ldc");
  const auto gx = grid_dim(kernels::ceil_div(n, K::kTile), name, "ceil(n / 64)", 0x7fffffff);
  const auto gy = grid_dim(kernels::ceil_div(m, K::kTile), name, "ceil(m / 64)", 65535);
  const auto gz = grid_dim(batch, name, "batch", 65535);
  launch<K>(s, Dim3{gx, gy, gz}, K::kSharedBytes,
            typename K::Params{a, b, c, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha});
}
}  // namespace

void launch_gemm(Stream& s, const float* a, const float* b, float* c, std::int64_t batch,
                 std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                 std::int64_t ldb, std::int64_t ldc, std::int64_t stride_a,
                 std::int64_t stride_b, std::int64_t stride_c, float alpha) {
  launch_gemm_kernel<kernels::Gemm>(s, "gemm", a, b, c, batch, m, n, k, lda, ldb, ldc, stride_a,
                                    stride_b, stride_c, alpha);
}

void launch_gemm_tc(Stream& s, const float* a, const float* b, float* c, std::int64_t batch,
                    std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                    std::int64_t ldb, std::int64_t ldc, std::int64_t stride_a,
                    std::int64_t stride_b, std::int64_t stride_c, float alpha) {
  launch_gemm_kernel<kernels::GemmTensorCore>(s, "gemm_tensor_core", a, b, c, batch, m, n, k, lda,
                                              ldb, ldc, stride_a, stride_b, stride_c, alpha);
}

void launch_scale_mask(Stream& s, const float* in, float* out, std::int64_t batch,
                       std::int64_t rows, std::int64_t cols, float scale, bool causal) {
  using K = kernels::ScaleMask;
  if (batch == 0 || rows == 0 || cols == 0) return;
  const std::int64_t blocks = checked_product(
      {std::uint64_t(batch), std::uint64_t(rows), std::uint64_t(kernels::ceil_div(cols, K::kSegment))},
      "scale_mask", "batch * rows * segments");
  const auto gx = grid_dim(blocks, "scale_mask", "batch * rows * ceil(cols / 1024)", 0x7fffffff);
  launch<K>(s, Dim3{gx, 1, 1}, 0, K::Params{in, out, batch, rows, cols, scale, causal ? 1 : 0});
}

}  // namespace detail

namespace ops {

template <class T>
void softmax_rows(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t rows, std::int64_t n) {
  constexpr std::string_view w = "softmax_rows";
  detail::check_nonneg(w, "rows", rows);
  detail::check_positive(w, "n", n);
  detail::check_on(w, "in", in, stream);
  detail::check_on(w, "out", out, stream);
  const auto total = checked_mul(rows, n, w, "rows * n");
  detail::check_size(w, "in", in, total, "rows * n");
  detail::check_size(w, "out", out, total, "rows * n");
  detail::check_in_place_or_distinct(w, "out", out, "in", in);
  detail::launch_softmax(stream, in.data().get(), out.data().get(), rows, n);
}
template void softmax_rows(Stream&, const Buffer<float>&, Buffer<float>&, std::int64_t, std::int64_t);
template void softmax_rows(Stream&, const Buffer<half>&, Buffer<half>&, std::int64_t, std::int64_t);
template void softmax_rows(Stream&, const Buffer<bfloat16>&, Buffer<bfloat16>&, std::int64_t, std::int64_t);

void scale(Stream& stream, const Buffer<float>& in, Buffer<float>& out, float s) {
  constexpr std::string_view w = "scale";
  detail::check_on(w, "in", in, stream);
  detail::check_on(w, "out", out, stream);
  detail::check_size(w, "out", out, in.size(), "in.size()");
  detail::check_in_place_or_distinct(w, "out", out, "in", in);
  detail::launch_scale(stream, in.data().get(), out.data().get(),
                       static_cast<std::int64_t>(in.size()), s);
}

namespace {
template <class In, class Out>
void convert_elements(Stream& stream, const Buffer<In>& in, Buffer<Out>& out) {
  constexpr std::string_view w = "convert";
  detail::check_on(w, "in", in, stream);
  detail::check_on(w, "out", out, stream);
  detail::check_size(w, "out", out, in.size(), "in.size()");
  detail::check_no_overlap(w, "out", out, "in", in);
  using K = kernels::Convert<In, Out>;
  if (in.empty()) return;
  const auto gx = detail::grid_dim(kernels::ceil_div(std::int64_t(in.size()), K::kPerBlock), w, "ceil(n / 1024)", 0x7fffffff);
  launch<K>(stream, Dim3{gx, 1, 1}, 0, typename K::Params{in.data().get(), out.data().get(), std::int64_t(in.size())});
}
}  // namespace

void convert(Stream& s, const Buffer<float>& in, Buffer<half>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<float>& in, Buffer<bfloat16>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<float>& in, Buffer<fp8_e4m3>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<float>& in, Buffer<fp8_e5m2>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<half>& in, Buffer<float>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<bfloat16>& in, Buffer<float>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<fp8_e4m3>& in, Buffer<float>& out) { convert_elements(s, in, out); }
void convert(Stream& s, const Buffer<fp8_e5m2>& in, Buffer<float>& out) { convert_elements(s, in, out); }

void add(Stream& stream, const Buffer<float>& x, Buffer<float>& y) {
  constexpr std::string_view w = "add";
  detail::check_on(w, "x", x, stream);
  detail::check_on(w, "y", y, stream);
  detail::check_size(w, "y", y, x.size(), "x.size()");
  detail::check_in_place_or_distinct(w, "y", y, "x", x);
  using K = kernels::Add;
  if (x.empty()) return;
  const auto gx = detail::grid_dim(kernels::ceil_div(std::int64_t(x.size()), K::kPerBlock), w, "ceil(n / 1024)", 0x7fffffff);
  launch<K>(stream, Dim3{gx, 1, 1}, 0, K::Params{x.data().get(), y.data().get(), std::int64_t(x.size())});
}

namespace {
template <class T>
void check_layout(std::string_view w, Stream& stream, const Buffer<T>& in, const Buffer<T>& out, std::int64_t seq_len, std::int64_t num_heads,
                  std::int64_t head_dim, std::uint64_t in_elems, std::uint64_t out_elems) {
  detail::check_nonneg(w, "seq_len", seq_len);
  detail::check_positive(w, "num_heads", num_heads);
  detail::check_positive(w, "head_dim", head_dim);
  // The copy's limit (launch_copy3d: 8 rows of num_heads * head_dim per block), by this call's name. With
  // seq_len 0 nothing is copied and num_heads * head_dim need not fit.
  if (seq_len > 0)
    check_fits(checked_add(checked_mul(checked_mul(std::uint64_t(num_heads), std::uint64_t(head_dim), w, "num_heads * head_dim"), 8, w,
                                       "8 * num_heads * head_dim + head_dim"),
                           std::uint64_t(head_dim), w, "8 * num_heads * head_dim + head_dim"),
               kMaxLaneOffset, w, "8 * num_heads * head_dim + head_dim");
  detail::check_on(w, "in", in, stream);
  detail::check_on(w, "out", out, stream);
  detail::check_size(w, "in", in, in_elems, "seq_len * num_heads * head_dim" + std::string(in_elems < out_elems ? " / num_heads" : ""));
  detail::check_size(w, "out", out, out_elems, "seq_len * num_heads * head_dim" + std::string(out_elems < in_elems ? " / num_heads" : ""));
  detail::check_no_overlap(w, "out", out, "in", in);
}
// The copy in 4-byte words: a 16-bit element type moves its codes two at a time (head_dim even),
// so that the bytes are moved as they are (no conversion, NaN payloads kept).
template <class T>
void copy_elems(std::string_view w, Stream& s, const T* in, T* out, std::int64_t A, std::int64_t B, std::int64_t C,
                std::int64_t ia, std::int64_t ib, std::int64_t oa, std::int64_t ob) {
  if constexpr (sizeof(T) == 4) {
    detail::launch_copy3d(s, reinterpret_cast<const float*>(in), reinterpret_cast<float*>(out), A, B, C, ia, ib, oa, ob);
  } else {
    static_assert(sizeof(T) == 2, "float, half or bfloat16");
    if (C % 2 != 0)
      throw Unsupported(w, "head_dim", std::to_string(C), std::string("even for ") + format_name(format_of<T>()) +
                                                             " buffers (the copy moves pairs of codes)");
    detail::launch_copy3d(s, reinterpret_cast<const float*>(in), reinterpret_cast<float*>(out), A, B, C / 2, ia / 2,
                          ib / 2, oa / 2, ob / 2);
  }
}
}  // namespace

template <class T>
void interleaved_to_batched(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                            std::int64_t num_heads, std::int64_t head_dim) {
  constexpr std::string_view w = "interleaved_to_batched";
  const auto n = checked_product({std::uint64_t(std::max<std::int64_t>(seq_len, 0)),
                                  std::uint64_t(std::max<std::int64_t>(num_heads, 0)),
                                  std::uint64_t(std::max<std::int64_t>(head_dim, 0))},
                                 w, "seq_len * num_heads * head_dim");
  check_layout(w, stream, in, out, seq_len, num_heads, head_dim, n, n);
  if (n == 0) return;  // (and num_heads * head_dim below may not fit when seq_len is 0)
  copy_elems(w, stream, in.data().get(), out.data().get(), num_heads, seq_len, head_dim, head_dim,
                        num_heads * head_dim, seq_len * head_dim, head_dim);
}

template <class T>
void batched_to_interleaved(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                            std::int64_t num_heads, std::int64_t head_dim) {
  constexpr std::string_view w = "batched_to_interleaved";
  const auto n = checked_product({std::uint64_t(std::max<std::int64_t>(seq_len, 0)),
                                  std::uint64_t(std::max<std::int64_t>(num_heads, 0)),
                                  std::uint64_t(std::max<std::int64_t>(head_dim, 0))},
                                 w, "seq_len * num_heads * head_dim");
  check_layout(w, stream, in, out, seq_len, num_heads, head_dim, n, n);
  if (n == 0) return;  // (and num_heads * head_dim below may not fit when seq_len is 0)
  copy_elems(w, stream, in.data().get(), out.data().get(), num_heads, seq_len, head_dim, seq_len * head_dim,
                        head_dim, head_dim, num_heads * head_dim);
}

template <class T>
void extract_head(Stream& stream, const Buffer<T>& in, Buffer<T>& out, std::int64_t seq_len,
                  std::int64_t num_heads, std::int64_t head_dim, std::int64_t head) {
  constexpr std::string_view w = "extract_head";
  const auto n = checked_product({std::uint64_t(std::max<std::int64_t>(seq_len, 0)),
                                  std::uint64_t(std::max<std::int64_t>(num_heads, 0)),
                                  std::uint64_t(std::max<std::int64_t>(head_dim, 0))},
                                 w, "seq_len * num_heads * head_dim");
  check_layout(w, stream, in, out, seq_len, num_heads, head_dim, n, n / std::uint64_t(std::max<std::int64_t>(num_heads, 1)));
  LOCKSTEP_CHECK_ARG(head >= 0 && head < num_heads, w, "head", head, "in [0, num_heads) = [0, " + std::to_string(num_heads) + ")");
  if (n == 0) return;  // (and num_heads * head_dim below may not fit when seq_len is 0)
  copy_elems(w, stream, in.data().get() + head * head_dim, out.data().get(), 1, seq_len, head_dim, 0,
                        num_heads * head_dim, 0, head_dim);
}

template <class T>
void copy_head_back(Stream& stream, const Buffer<T>& in, Buffer<T>& out,
                    std::int64_t seq_len, std::int64_t num_heads, std::int64_t head_dim, std::int64_t head) {
  constexpr std::string_view w = "copy_head_back";
  const auto n = checked_product({std::uint64_t(std::max<std::int64_t>(seq_len, 0)),
                                  std::uint64_t(std::max<std::int64_t>(num_heads, 0)),
                                  std::uint64_t(std::max<std::int64_t>(head_dim, 0))},
                                 w, "seq_len * num_heads * head_dim");
  check_layout(w, stream, in, out, seq_len, num_heads, head_dim, n / std::uint64_t(std::max<std::int64_t>(num_heads, 1)), n);
  LOCKSTEP_CHECK_ARG(head >= 0 && head < num_heads, w, "head", head, "in [0, num_heads) = [0, " + std::to_string(num_heads) + ")");
  if (n == 0) return;  // (and num_heads * head_dim below may not fit when seq_len is 0)
  copy_elems(w, stream, in.data().get(), out.data().get() + head * head_dim, 1, seq_len, head_dim, 0,
                        head_dim, 0, num_heads * head_dim);
}

#define LOCKSTEP_LAYOUT(T)                                                                            \
  template void interleaved_to_batched(Stream&, const Buffer<T>&, Buffer<T>&, std::int64_t, std::int64_t,   \
                                       std::int64_t);                                                       \
  template void batched_to_interleaved(Stream&, const Buffer<T>&, Buffer<T>&, std::int64_t, std::int64_t,   \
                                       std::int64_t);                                                       \
  template void extract_head(Stream&, const Buffer<T>&, Buffer<T>&, std::int64_t, std::int64_t, std::int64_t, \
                             std::int64_t);                                                                 \
  template void copy_head_back(Stream&, const Buffer<T>&, Buffer<T>&, std::int64_t, std::int64_t, std::int64_t, \
                               std::int64_t);
LOCKSTEP_LAYOUT(float)
LOCKSTEP_LAYOUT(half)
LOCKSTEP_LAYOUT(bfloat16)
#undef LOCKSTEP_LAYOUT

void transpose(Stream& stream, const Buffer<float>& in, Buffer<float>& out, std::int64_t batch,
               std::int64_t rows, std::int64_t cols) {
  constexpr std::string_view w = "transpose";
  detail::check_nonneg(w, "batch", batch);
  detail::check_positive(w, "rows", rows);
  detail::check_positive(w, "cols", cols);
  detail::check_on(w, "in", in, stream);
  detail::check_on(w, "out", out, stream);
  const auto n = checked_product({std::uint64_t(batch), std::uint64_t(rows), std::uint64_t(cols)},
                                 w, "batch * rows * cols");
  detail::check_size(w, "in", in, n, "batch * rows * cols");
  detail::check_size(w, "out", out, n, "batch * rows * cols");
  detail::check_no_overlap(w, "out", out, "in", in);
  detail::launch_transpose(stream, in.data().get(), out.data().get(), batch, rows, cols);
}

void gemm(Stream& stream, const Buffer<float>& a, const Buffer<float>& b, Buffer<float>& c,
          std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, float alpha) {
  constexpr std::string_view w = "gemm";
  detail::check_nonneg(w, "batch", batch);
  detail::check_positive(w, "m", m);
  detail::check_positive(w, "n", n);
  detail::check_positive(w, "k", k);
  detail::check_on(w, "a", a, stream);
  detail::check_on(w, "b", b, stream);
  detail::check_on(w, "c", c, stream);
  const auto ub = std::uint64_t(batch);
  detail::check_size(w, "a", a, checked_product({ub, std::uint64_t(m), std::uint64_t(k)}, w, "batch * m * k"), "batch * m * k");
  detail::check_size(w, "b", b, checked_product({ub, std::uint64_t(k), std::uint64_t(n)}, w, "batch * k * n"), "batch * k * n");
  detail::check_size(w, "c", c, checked_product({ub, std::uint64_t(m), std::uint64_t(n)}, w, "batch * m * n"), "batch * m * n");
  detail::check_no_overlap(w, "c", c, "a", a);
  detail::check_no_overlap(w, "c", c, "b", b);
  if (batch == 0) return;  // (and m * k below may not fit: only batch * m * k was checked)
  detail::launch_gemm(stream, a.data().get(), b.data().get(), c.data().get(), batch, m, n, k, k, n,
                      n, m * k, k * n, m * n, alpha);
}

}  // namespace ops
}  // namespace lockstep
