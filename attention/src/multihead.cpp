#include "lockstep/attention/multihead.hpp"

#include <cmath>
#include <string>

#include "checks.hpp"
#include "lockstep/formats.hpp"
#include "launchers.hpp"

namespace lockstep {

namespace {

// The seed's rule: tensor cores when m, n >= 16 and k >= 64.
GemmKind pick(GemmKind want, std::int64_t m, std::int64_t n, std::int64_t k) {
  if (want == GemmKind::kExact) return GemmKind::kExact;
  if (want == GemmKind::kTensorCore) return GemmKind::kTensorCore;
  return (m >= 16 && n >= 16 && k >= 64) ? GemmKind::kTensorCore : GemmKind::kExact;
}

void gemm(Stream& s, GemmKind kind, const float* a, const float* b, float* c, std::int64_t batch,
          std::int64_t m, std::int64_t n, std::int64_t k) {
  if (kind == GemmKind::kTensorCore)
    detail::launch_gemm_tc(s, a, b, c, batch, m, n, k, k, n, n, m * k, k * n, m * n, 1.0f);
  else
    detail::launch_gemm(s, a, b, c, batch, m, n, k, k, n, n, m * k, k * n, m * n, 1.0f);
}

}  // namespace

std::uint64_t multihead_attention_workspace_bytes(const MhaShape& shape, const MhaOptions& options) {
  constexpr std::string_view w = "multihead_attention_workspace_bytes";
  detail::check_nonneg(w, "seq_len", shape.seq_len);
  detail::check_positive(w, "num_heads", shape.num_heads);
  detail::check_positive(w, "head_dim", shape.head_dim);
  // Batched: Q, K, V, K^T, O batched [H, S, D] and the scores [H, S, S]; PerHead: one head's.
  const auto S = std::uint64_t(shape.seq_len), D = std::uint64_t(shape.head_dim);
  const std::uint64_t heads = options.impl == MhaImpl::kPerHead ? 1 : std::uint64_t(shape.num_heads);
  const auto n = checked_product({S, heads, D}, w, "seq_len * num_heads * head_dim");
  const auto scores = checked_product({heads, S, S}, w, "num_heads * seq_len * seq_len");
  return checked_mul(checked_add(checked_mul(n, 5, w, "workspace"), scores, w, "workspace"), 4, w,
                     "workspace bytes");
}

template <class T>
void multihead_attention(Stream& stream, const Buffer<T>& q, const Buffer<T>& k, const Buffer<T>& v, Buffer<T>& out,
                         const MhaShape& shape, const MhaOptions& options) {
  constexpr std::string_view w = "multihead_attention";
  // q, k and v are widened by the first copies, out rounded once by the last (kernels/act.hpp).
  const int act = static_cast<int>(format_of<T>());
  detail::check_nonneg(w, "seq_len", shape.seq_len);
  detail::check_positive(w, "num_heads", shape.num_heads);
  detail::check_positive(w, "head_dim", shape.head_dim);
  detail::check_enum(w, "options.impl", options.impl, {MhaImpl::kAuto, MhaImpl::kPerHead, MhaImpl::kBatched},
                     "MhaImpl::kAuto, kPerHead or kBatched");
  detail::check_enum(w, "options.gemm", options.gemm, {GemmKind::kAuto, GemmKind::kExact, GemmKind::kTensorCore},
                     "GemmKind::kAuto, kExact or kTensorCore");
  detail::check_on(w, "q", q, stream);
  detail::check_on(w, "k", k, stream);
  detail::check_on(w, "v", v, stream);
  detail::check_on(w, "out", out, stream);
  const std::int64_t S = shape.seq_len, H = shape.num_heads, D = shape.head_dim;
  const auto n = checked_product({std::uint64_t(S), std::uint64_t(H), std::uint64_t(D)}, w,
                                 "seq_len * num_heads * head_dim");
  for (auto* b : {&q, &k, &v})
    detail::check_size(w, b == &q ? "q" : b == &k ? "k" : "v", *b, n, "seq_len * num_heads * head_dim");
  detail::check_size(w, "out", out, n, "seq_len * num_heads * head_dim");
  detail::check_no_overlap(w, "out", out, "q", q);
  detail::check_no_overlap(w, "out", out, "k", k);
  detail::check_no_overlap(w, "out", out, "v", v);
  const float scale = detail::softmax_scale(w, options.scale, shape.head_dim);
  detail::check_workspace(w, options.workspace, stream, 0);
  for (const auto& [name, b] : {std::pair<const char*, const Buffer<T>*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    detail::check_workspace_apart(w, options.workspace, name, *b);
  [[maybe_unused]] const auto scores = checked_product({std::uint64_t(H), std::uint64_t(S), std::uint64_t(S)}, w,
                                      "num_heads * seq_len * seq_len");
  check_fits(std::uint64_t(S) * 64 + 64, kMaxLaneOffset, w, "64 * seq_len + 64");  // the GEMMs' lda and ldc
  // num_heads * head_dim on its own: with seq_len 0 the products above do not bound it.
  const std::uint64_t hd = checked_mul(std::uint64_t(H), std::uint64_t(D), w, "num_heads * head_dim");
  check_fits(checked_add(checked_mul(hd, 8, w, "8 * num_heads * head_dim"), std::uint64_t(D), w, "8 * num_heads * head_dim"),
             kMaxLaneOffset, w, "8 * num_heads * head_dim");

  MhaReport rep;
  rep.impl = options.impl == MhaImpl::kPerHead ? MhaImpl::kPerHead : MhaImpl::kBatched;
  // The batched kernels take the heads as a grid dimension (the transpose's and the GEMMs').
  LOCKSTEP_CHECK_ARG(rep.impl != MhaImpl::kBatched || H <= 65535, w, "num_heads", H,
                     "<= 65535 with MhaImpl::kBatched (a launch grid dimension; kPerHead has no such limit)");
  rep.score_gemm = pick(options.gemm, S, S, D);
  rep.value_gemm = pick(options.gemm, S, D, S);
  if (S == 0) {
    if (options.report != nullptr) *options.report = rep;
    return;
  }
  // The limits of every launch below (the launchers in ops.cpp check them again), here, so that a
  // call that one of them would refuse enqueues nothing: the GEMMs' 64 * lda + k-tile and
  // 64 * ldc + 64 (lda and ldc are head_dim, or seq_len: checked above), the transpose's 32 * head_dim and its
  // grid of ceil(seq_len / 32) rows of tiles, the batched output copy's 8 * seq_len * head_dim
  // + head_dim, and the scale-and-mask's blocks, rows * ceil(seq_len / 1024).
  check_fits(std::uint64_t(D) * 64 + 64, kMaxLaneOffset, w, "64 * head_dim + 64");
  LOCKSTEP_CHECK_ARG((S + 31) / 32 <= 65535, w, "seq_len", S,
                     "<= 2097120 (the transpose's grid: ceil(seq_len / 32) <= 65535)");
  if (rep.impl == MhaImpl::kBatched)
    check_fits(checked_add(checked_mul(std::uint64_t(S) * std::uint64_t(D), 8, w, "8 * seq_len * head_dim"),
                           std::uint64_t(D), w, "8 * seq_len * head_dim + head_dim"),
               kMaxLaneOffset, w, "8 * seq_len * head_dim + head_dim");
  const std::uint64_t softmax_rows = std::uint64_t(rep.impl == MhaImpl::kBatched ? H : 1) * std::uint64_t(S);
  check_fits(checked_mul(softmax_rows, std::uint64_t((S + 1023) / 1024), w,
                         "num_heads * seq_len * ceil(seq_len / 1024)"),
             0x7fffffff, w, "num_heads * seq_len * ceil(seq_len / 1024)");
  MhaOptions sized = options;
  sized.impl = rep.impl;
  const std::uint64_t ws_bytes = multihead_attention_workspace_bytes(shape, sized);
  detail::check_workspace(w, options.workspace, stream, ws_bytes);
  auto* ws = static_cast<float*>(detail::workspace_memory(stream, options.workspace, ws_bytes));

  if (rep.impl == MhaImpl::kBatched) {
    // Workspace: Q, K, V, K^T, O batched [H, S, D] and the scores [H, S, S].
    float *qb = ws, *kb = qb + n, *vb = kb + n, *kt = vb + n, *ob = kt + n, *sc = ob + n;
    detail::launch_copy3d(stream, q.data().get(), qb, H, S, D, D, H * D, S * D, D, act, 0);
    detail::launch_copy3d(stream, k.data().get(), kb, H, S, D, D, H * D, S * D, D, act, 0);
    detail::launch_copy3d(stream, v.data().get(), vb, H, S, D, D, H * D, S * D, D, act, 0);
    detail::launch_transpose(stream, kb, kt, H, S, D);
    gemm(stream, rep.score_gemm, qb, kt, sc, H, S, S, D);
    detail::launch_scale_mask(stream, sc, sc, H, S, S, scale, options.causal);
    detail::launch_softmax(stream, sc, sc, H * S, S);
    gemm(stream, rep.value_gemm, sc, vb, ob, H, S, D, S);
    detail::launch_copy3d(stream, ob, out.data().get(), S, H, D, D, S * D, H * D, D, 0, act);
    rep.launches = 9;
    if (options.report != nullptr) *options.report = rep;
    return;
  }
  // PerHead: one head at a time through the same kernels (batch = 1).
  const std::uint64_t sd = std::uint64_t(S * D);
  float *qh = ws, *kh = qh + sd, *vh = kh + sd, *kt = vh + sd, *oh = kt + sd, *sc = oh + sd;
  for (std::int64_t h = 0; h < H; ++h) {
    detail::launch_copy3d(stream, q.data().get() + h * D, qh, 1, S, D, 0, H * D, 0, D, act, 0);
    detail::launch_copy3d(stream, k.data().get() + h * D, kh, 1, S, D, 0, H * D, 0, D, act, 0);
    detail::launch_copy3d(stream, v.data().get() + h * D, vh, 1, S, D, 0, H * D, 0, D, act, 0);
    detail::launch_transpose(stream, kh, kt, 1, S, D);
    gemm(stream, rep.score_gemm, qh, kt, sc, 1, S, S, D);
    detail::launch_scale_mask(stream, sc, sc, 1, S, S, scale, options.causal);
    detail::launch_softmax(stream, sc, sc, S, S);
    gemm(stream, rep.value_gemm, sc, vh, oh, 1, S, D, S);
    detail::launch_copy3d(stream, oh, out.data().get() + h * D, 1, S, D, 0, D, 0, H * D, 0, act);
    rep.launches += 9;
  }
  if (options.report != nullptr) *options.report = rep;
}

template void multihead_attention(Stream&, const Buffer<float>&, const Buffer<float>&, const Buffer<float>&,
                                  Buffer<float>&, const MhaShape&, const MhaOptions&);
template void multihead_attention(Stream&, const Buffer<half>&, const Buffer<half>&, const Buffer<half>&,
                                  Buffer<half>&, const MhaShape&, const MhaOptions&);
template void multihead_attention(Stream&, const Buffer<bfloat16>&, const Buffer<bfloat16>&, const Buffer<bfloat16>&,
                                  Buffer<bfloat16>&, const MhaShape&, const MhaOptions&);

}  // namespace lockstep
