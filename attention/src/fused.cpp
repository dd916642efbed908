#include "lockstep/attention/fused.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "checks.hpp"
#include "fused_plan.hpp"
#include "lockstep/formats.hpp"
#include "lockstep/kernels/launch.hpp"

namespace lockstep {

namespace {

// Enqueues the plan's launches (plan::plan_fused): the packing launch, if any, then the attention
// kernel, with the workspace carved from the caller's or the stream's scratch (Note [caller
// workspace]) and the stream's counters.
// T: the inputs' type, a template parameter of the tensor-core kernels (Note [tensor-core
// formats]); Exact reads it from p.act_format.
template <int D, class T>
void launch_fused(Stream& s, const kernels::FusedAttentionParams& p, const plan::FusedPlan& pl,
                  Buffer<std::byte>* workspace) {
  kernels::FusedAttentionParams kp = p;
  char* ws = static_cast<char*>(detail::workspace_memory(s, workspace, pl.workspace_bytes));
  const std::size_t part_rows =
      pl.kv_splits > 1 ? std::size_t(p.B) * std::size_t(p.H) * std::size_t(pl.kv_splits) * std::size_t(p.Sq) : 0;
  if (pl.pack != plan::FusedPack::kNone) {
    // K and V rounded to fp16 once, packed in the workspace (Note [fused tensor-core
    // rounding points]); the wgmma kernel's packing is tiled (Note [wgmma products]).
    const std::int64_t skv_packed = pl.kernel == plan::FusedKernel::kWgmma ? kernels::ceil_div(p.Skv, 64) * 64 : p.Skv;
    const std::size_t half_bytes =
        std::size_t(p.B) * std::size_t(p.Hkv) * std::size_t(skv_packed) * std::size_t(D) * 2;
    kp.k_half = ws;
    kp.v_half = ws + half_bytes;
    ws += 2 * half_bytes;
  }
  if (pl.kv_splits > 1) {
    // Note [split keys]: the partials, [B, H, S, Sq, D] o, then (m, l); a zero per 64 query rows
    // of every (batch, head), after the stream's first counter (Note [one grid]); the last block
    // of each query tile resets its own.
    kp.kv_splits = pl.kv_splits;
    kp.part = reinterpret_cast<float*>(ws);
    kp.part_ml = kp.part + part_rows * std::size_t(D);
    kp.split_counters = detail::StreamAccess::counters(s, pl.counter_ints) + 1;
  }
  const auto go = [&](auto k) {
    using K = decltype(k);
    launch<K>(s, pl.grid, K::kSharedBytes, kp);
  };
  const auto pack = [&](auto k, std::int64_t rows) {  // rows of K and V per block
    using P = decltype(k);
    const Dim3 grid{static_cast<std::uint32_t>(kernels::ceil_div(p.Skv, rows)),
                    static_cast<std::uint32_t>(p.Hkv), static_cast<std::uint32_t>(p.B)};
    launch<P>(s, grid, P::kSharedBytes, kp);
  };
  using plan::FusedKernel;
  switch (pl.kernel) {
    case FusedKernel::kExact: return go(kernels::FusedAttentionExact<D>{});
    case FusedKernel::kExactSeparateP:
      if constexpr (D == 64) return go(kernels::FusedAttentionExact<64, 8, 1>{});
      break;
    case FusedKernel::kTensorCore:
      if (pl.pack == plan::FusedPack::kLaunch) pack(kernels::FusedHalfPack<D, T>{}, kernels::FusedHalfPack<D, T>::kRows);
      return go(kernels::FusedAttentionTensorCore<D, 1, T>{});
    case FusedKernel::kTensorCoreTwoTiles:
      if constexpr (D >= 64 && D <= 128) {
        if (pl.pack == plan::FusedPack::kLaunch) pack(kernels::FusedHalfPack<D, T>{}, kernels::FusedHalfPack<D, T>::kRows);
        return go(kernels::FusedAttentionTensorCore<D, 2, T>{});
      }
      break;
    case FusedKernel::kWgmma:
      if constexpr (D == 64 || D == 128) {
        if (pl.pack == plan::FusedPack::kInKernel) {
          // Note [packing blocks]: kv heads 0 .. pack_ahead - 1 of batch 0 here, the others by
          // the attention's blocks; the counters after the stream's first, which only
          // DecodeOneGrid uses (Note [one grid]).
          std::int32_t* c = detail::StreamAccess::counters(s, pl.counter_ints) + 1;
          kp.ticket = c;
          kp.pack_counters = c + 1;
          kp.pack_ahead = pl.pack_ahead;
          launch<kernels::FusedHalfPackTiled<D, T>>(
              s, Dim3{static_cast<std::uint32_t>(kernels::ceil_div(p.Skv, 64)), static_cast<std::uint32_t>(kp.pack_ahead), 1},
              0, kp);
          if constexpr (D == 64) {
            if (pl.deferred) return go(kernels::FusedAttentionWgmma<64, 1, true, false, true, T>{});
            if (pl.serial) return go(kernels::FusedAttentionWgmma<64, 1, true, false, false, T>{});
          }
          return pl.warpgroups == 2 ? go(kernels::FusedAttentionWgmma<D, 2, true, true, false, T>{})
                                    : go(kernels::FusedAttentionWgmma<D, 1, true, true, false, T>{});
        }
        if (pl.pack == plan::FusedPack::kTiledLaunch) pack(kernels::FusedHalfPackTiled<D, T>{}, 64);
        if (pl.warpgroups == 2) return go(kernels::FusedAttentionWgmma<D, 2, false, true, false, T>{});
        if constexpr (D == 64) {
          if (pl.deferred) return go(kernels::FusedAttentionWgmma<64, 1, false, false, true, T>{});
          if (pl.serial) return go(kernels::FusedAttentionWgmma<64, 1, false, false, false, T>{});
        }
        return go(kernels::FusedAttentionWgmma<D, 1, false, true, false, T>{});
      }
      break;
  }
  LOCKSTEP_ASSERT(false, "fused plan: a kernel that is not registered for this head_dim");
}
// The shape's own rules (both attention calls).
void check_attention_shape(std::string_view w, const AttentionShape& sh) {
  detail::check_positive(w, "batch", sh.batch);
  detail::check_positive(w, "num_heads", sh.num_heads);
  detail::check_positive(w, "num_kv_heads", sh.num_kv_heads);
  LOCKSTEP_CHECK_ARG(sh.num_heads % sh.num_kv_heads == 0, w, "num_kv_heads", sh.num_kv_heads,
                     "a divisor of num_heads = " + std::to_string(sh.num_heads));
  detail::check_nonneg(w, "seq_q", sh.seq_q);
  detail::check_nonneg(w, "seq_kv", sh.seq_kv);
  detail::check_head_dim(w, sh.head_dim);
}
}  // namespace

std::uint64_t attention_workspace_bytes(const Device& device, const AttentionShape& sh, const AttentionOptions& o) {
  constexpr std::string_view w = "attention_workspace_bytes";
  check_attention_shape(w, sh);
  LOCKSTEP_CHECK_ARG(sh.seq_q <= 0x7fffffff, w, "seq_q", sh.seq_q, "<= 2147483647");
  LOCKSTEP_CHECK_ARG(sh.seq_kv <= 0x7fffffff, w, "seq_kv", sh.seq_kv, "<= 2147483647");
  if (o.tuning != nullptr) o.tuning->check(w);
  if (sh.seq_q == 0) return 0;
  const bool tensor_core = o.precision == AttentionPrecision::kTensorCore;
  return plan::plan_fused(device.caps(),
                          plan::FusedProblem{sh.batch, sh.num_heads, sh.num_kv_heads, sh.seq_q, sh.seq_kv,
                                             sh.head_dim, tensor_core, o.batch_invariant},
                          detail::tuning_for(device, o.tuning))
      .workspace_bytes;
}

template <class T>
void attention(Stream& stream, const Buffer<T>& q, const Buffer<T>& k, const Buffer<T>& v, Buffer<T>& out,
               const AttentionShape& sh, const AttentionOptions& o) {
  constexpr std::string_view w = "attention";
  check_attention_shape(w, sh);
  const std::int64_t D = sh.head_dim;
  detail::check_enum(w, "options.precision", o.precision,
                     {AttentionPrecision::kAuto, AttentionPrecision::kExact, AttentionPrecision::kTensorCore},
                     "AttentionPrecision::kAuto, kExact or kTensorCore");
  detail::check_enum(w, "options.layout", o.layout, {AttentionLayout::kHeadsFirst, AttentionLayout::kInterleaved},
                     "AttentionLayout::kHeadsFirst or kInterleaved");
  const bool tensor_core = o.precision == AttentionPrecision::kTensorCore;
  if (tensor_core && !stream.device().caps().tensor_cores &&
      stream.device().id().kind == DeviceKind::kCuda)
    throw Unsupported(w, "precision", "TensorCore", "a CUDA device with tensor cores (this build targets sm_90)");
  LOCKSTEP_CHECK_ARG(sh.batch <= 65535, w, "batch", sh.batch, "<= 65535");
  LOCKSTEP_CHECK_ARG(sh.num_heads <= 65535, w, "num_heads", sh.num_heads, "<= 65535");
  LOCKSTEP_CHECK_ARG(sh.seq_q <= 0x7fffffff, w, "seq_q", sh.seq_q, "<= 2147483647");
  LOCKSTEP_CHECK_ARG(sh.seq_kv <= 0x7fffffff, w, "seq_kv", sh.seq_kv, "<= 2147483647");
  detail::check_on(w, "q", q, stream);
  detail::check_on(w, "k", k, stream);
  detail::check_on(w, "v", v, stream);
  detail::check_on(w, "out", out, stream);
  const auto B = std::uint64_t(sh.batch), H = std::uint64_t(sh.num_heads), Hk = std::uint64_t(sh.num_kv_heads),
             Sq = std::uint64_t(sh.seq_q), Sk = std::uint64_t(sh.seq_kv), UD = std::uint64_t(D);
  const auto nq = checked_product({B, H, Sq, UD}, w, "batch * num_heads * seq_q * head_dim");
  const auto nk = checked_product({B, Hk, Sk, UD}, w, "batch * num_kv_heads * seq_kv * head_dim");
  detail::check_size(w, "q", q, nq, "batch * num_heads * seq_q * head_dim");
  detail::check_size(w, "out", out, nq, "batch * num_heads * seq_q * head_dim");
  detail::check_size(w, "k", k, nk, "batch * num_kv_heads * seq_kv * head_dim");
  detail::check_size(w, "v", v, nk, "batch * num_kv_heads * seq_kv * head_dim");
  if (tensor_core) {  // K and V are read as 16-byte vectors (FusedHalfPack)
    detail::check_aligned16(w, "k", k);
    detail::check_aligned16(w, "v", v);
  }
  if (o.lse != nullptr) {
    detail::check_on(w, "lse", *o.lse, stream);
    detail::check_size(w, "lse", *o.lse, B * H * Sq, "batch * num_heads * seq_q");
  }
  detail::check_no_overlap(w, "out", out, "q", q);
  detail::check_no_overlap(w, "out", out, "k", k);
  detail::check_no_overlap(w, "out", out, "v", v);
  if (o.lse != nullptr) {
    detail::check_no_overlap(w, "lse", *o.lse, "q", q);
    detail::check_no_overlap(w, "lse", *o.lse, "k", k);
    detail::check_no_overlap(w, "lse", *o.lse, "v", v);
    detail::check_no_overlap(w, "lse", *o.lse, "out", out);
  }
  const float scale = detail::softmax_scale(w, o.scale, D);
  if (o.tuning != nullptr) o.tuning->check(w);
  const Tuning& tuning = detail::tuning_for(stream, o.tuning);
  detail::check_workspace(w, o.workspace, stream, 0);
  for (const auto& [name, b] : {std::pair<const char*, const Buffer<T>*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    detail::check_workspace_apart(w, o.workspace, name, *b);
  if (o.lse != nullptr) detail::check_workspace_apart(w, o.workspace, "lse", *o.lse);
  kernels::FusedAttentionParams p{};
  const bool heads_first = o.layout == AttentionLayout::kHeadsFirst;
  auto strides = [&](std::int64_t heads, std::int64_t seq, std::int64_t& sb, std::int64_t& ss,
                     std::int64_t& shd) {
    sb = heads * seq * D;
    ss = heads_first ? D : heads * D;
    shd = heads_first ? seq * D : D;
  };
  strides(sh.num_heads, sh.seq_q, p.q_sb, p.q_ss, p.q_sh);
  strides(sh.num_kv_heads, sh.seq_kv, p.k_sb, p.k_ss, p.k_sh);
  strides(sh.num_kv_heads, sh.seq_kv, p.v_sb, p.v_ss, p.v_sh);
  strides(sh.num_heads, sh.seq_q, p.o_sb, p.o_ss, p.o_sh);
  // Lane offsets inside a block: the rows of a query or key tile (at most 64).
  check_fits(std::uint64_t(std::max({p.q_ss, p.k_ss, p.v_ss, p.o_ss})) * 64 + UD, kMaxLaneOffset, w,
             "64 * row stride");
  if (sh.seq_q == 0) return;
  p.q = q.data().get();
  p.k = k.data().get();
  p.v = v.data().get();
  p.out = out.data().get();
  p.act_format = static_cast<std::int32_t>(format_of<T>());  // kernels/act.hpp: 0, 1, 2
  p.lse = o.lse ? o.lse->data().get() : nullptr;
  p.B = static_cast<std::int32_t>(sh.batch);
  p.H = static_cast<std::int32_t>(sh.num_heads);
  p.Hkv = static_cast<std::int32_t>(sh.num_kv_heads);
  p.Sq = static_cast<std::int32_t>(sh.seq_q);
  p.Skv = static_cast<std::int32_t>(sh.seq_kv);
  p.causal = o.causal ? 1 : 0;
  p.scale = scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(p.scale) * 1.4426950408889634);
  const plan::FusedPlan pl = plan::plan_fused(
      stream.device().caps(),
      plan::FusedProblem{sh.batch, sh.num_heads, sh.num_kv_heads, sh.seq_q, sh.seq_kv, D, tensor_core, o.batch_invariant},
      tuning);
  detail::check_workspace(w, o.workspace, stream, pl.workspace_bytes);
  const std::uint64_t launches_before = stream.launches();
  switch (D) {
    case 32: launch_fused<32, T>(stream, p, pl, o.workspace); break;
    case 64: launch_fused<64, T>(stream, p, pl, o.workspace); break;
    case 96: launch_fused<96, T>(stream, p, pl, o.workspace); break;
    case 128: launch_fused<128, T>(stream, p, pl, o.workspace); break;
    default: launch_fused<256, T>(stream, p, pl, o.workspace); break;
  }
  LOCKSTEP_ASSERT(stream.launches() - launches_before == std::uint64_t(pl.launches), "fused plan: launches");
}

template void attention(Stream&, const Buffer<float>&, const Buffer<float>&, const Buffer<float>&, Buffer<float>&,
                        const AttentionShape&, const AttentionOptions&);
template void attention(Stream&, const Buffer<half>&, const Buffer<half>&, const Buffer<half>&, Buffer<half>&,
                        const AttentionShape&, const AttentionOptions&);
template void attention(Stream&, const Buffer<bfloat16>&, const Buffer<bfloat16>&, const Buffer<bfloat16>&,
                        Buffer<bfloat16>&, const AttentionShape&, const AttentionOptions&);

}  // namespace lockstep
