// Benchmarks of the attention algorithms: decode (incremental_attention, flash_decoding over
// batched slots) against the read ceiling, multi-head attention per-head vs batched and fp32 vs
// tensor-core GEMM, and the host time per call.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "bench_common.hpp"
#ifdef LOCKSTEP_BENCH_CUDA
#include <cuda_runtime.h>
#endif
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/multihead.hpp"
#include "lockstep/kernels/decode.hpp"

namespace lockstep::bench {

namespace {

std::string dshape(std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t D, std::int64_t L) {
  return "B=" + std::to_string(B) + " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) +
         " D=" + std::to_string(D) + " L=" + std::to_string(L);
}

// Host time of enqueueing `fn` (no synchronization inside), microseconds per call.
// steady: calls enqueued back to back while the device works through them, as in a decode loop
//   (the median over 5 batches of `reps` calls of the batch's mean);
// cold: one call on an idle stream right after a synchronize (the median over `reps` calls),
//   which also contains the cost of waking an idle stream.
struct HostTime {
  double steady, cold;
};
template <class F>
HostTime host_us(Stream& s, F&& fn, int reps) {
  using clock = std::chrono::steady_clock;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> cold, batches;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock::now();
    fn();
    cold.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
    s.synchronize();
  }
  for (int b = 0; b < 5; ++b) {
    const auto t0 = clock::now();
    for (int i = 0; i < reps; ++i) fn();
    batches.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count() / reps);
    s.synchronize();
  }
  return {median(batches), median(cold)};
}
// Kernel launches one call enqueues (the stream's count around it): the decode chunk kernel,
// plus the merge where it is not folded into it (Note [folded merge]).
template <class F>
int launches_per_call(Stream& s, F&& fn) {
  const auto before = s.launches();
  fn();
  return static_cast<int>(s.launches() - before);
}
void record_host_time(Result& r, const HostTime& h) {
  r.extra["host_us_per_call"] = h.steady;
  r.extra["host_us_per_call_cold"] = h.cold;
}

// The CPU device's decode against the DRAM, measured alongside: each repetition times a native
// read of the same K and V (loads of the device's SIMD width on every thread) and then one call;
// the median over repetitions of (read time / call time) is the fraction of the read bandwidth
// that the call reaches. Pairing cancels the 2-core machine's drift, which moves a ceiling taken
// once at the start by up to +-20-30% against medians taken later (docs/performance.md). 0 off
// the CPU device, or when K and V are under twice the last-level cache (at least 64 MiB): data
// that the caches largely hold make no DRAM figure (on a GPU host's large cache, 202%).
template <class F>
double paired_read_fraction(Context& ctx, F&& call, std::initializer_list<const Buffer<float>*> spans) {
  if (ctx.cuda || ctx.native.read_gbps == nullptr) return 0;
  std::size_t bytes = 0;
  for (const Buffer<float>* b : spans) bytes += b->size() * sizeof(float);
  static const std::size_t need = std::max(std::size_t{64} << 20, 2 * last_level_cache_bytes());
  if (bytes < need) return 0;
  using clock = std::chrono::steady_clock;
  std::vector<double> f;
  const int reps = ctx.quick ? 1 : 15;
  for (int i = 0; i < reps; ++i) {
    double read_s = 0;
    for (const Buffer<float>* b : spans) {
      const double gbps = ctx.native.read_gbps(b->data().get(), b->size(), 1);
      if (gbps <= 0) return 0;
      read_s += double(b->size()) * sizeof(float) / (gbps * 1e9);
    }
    const auto t0 = clock::now();
    call();
    ctx.stream().synchronize();
    f.push_back(read_s / std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::sort(f.begin(), f.end());
  return f[f.size() / 2];
}
void record_paired_read(Result& r, double fraction) {
  if (fraction <= 0) return;
  r.extra["paired_read_fraction"] = fraction;
  r.note += "; paired with a native read of the same K, V: " + std::to_string(int(std::lround(100 * fraction))) + "%";
}

Result decode_single(Context& ctx, std::int64_t H, std::int64_t Hkv, std::int64_t D, std::int64_t L) {
  const std::size_t cache = std::size_t(Hkv * L * D);
  auto q = random_buffer(ctx.dev, std::size_t(H * D), 11, -1.0f, 1.0f);
  auto k = random_buffer(ctx.dev, cache, 12, -1.0f, 1.0f);
  auto v = random_buffer(ctx.dev, cache, 13, -1.0f, 1.0f);
  Buffer<float> out(ctx.dev, std::size_t(H * D));
  const DecodeShape sh{H, Hkv, D, L};
  auto call = [&] { incremental_attention(ctx.stream(), q, k, v, L, out, sh); };
  Result r;
  r.name = "incremental_attention";
  r.shape = dshape(1, H, Hkv, D, L);
  r.median_ms = busy_ms(*ctx.dev, ctx.stream(), call, ctx.warmup + 3, ctx.reps);
  r.extra["idle_stream_ms"] = median_ms(*ctx.dev, ctx.stream(), call, 1, ctx.reps);
  r.bytes = double(2 * cache + 2 * std::size_t(H * D)) * 4;
  r.flops = 4.0 * double(H) * double(L) * double(D);
  r.launches = launches_per_call(ctx.stream(), call);
  record_host_time(r, host_us(ctx.stream(), call, std::max(5, ctx.reps)));
  r.note = "bytes = K + V + q + out";
  record_paired_read(r, paired_read_fraction(ctx, call, {&k, &v}));
  return r;
}

// A cache of B slots x `layers` whose every slot holds L random tokens: append is per token, so
// the data goes in with one host copy per slot and layer.
KvCache full_cache(Context& ctx, std::int64_t layers, std::int64_t B, std::int64_t H, std::int64_t Hkv,
                   std::int64_t D, std::int64_t L, Format format = Format::f32) {
  KvCacheConfig c;
  c.format = format;
  if (is_fp8(format)) c.k_scales = c.v_scales = std::vector<float>(std::size_t(layers * Hkv), 1.0f / 256.0f);
  c.num_layers = layers;
  c.num_heads = H;
  c.num_kv_heads = Hkv;
  c.head_dim = D;
  c.max_len = L;
  c.slots = B;
  KvCache cache(ctx.dev, c);
  const auto host = random_host(std::size_t(Hkv * L * D), 14, -1.0f, 1.0f);
  for (std::int64_t l = 0; l < layers; ++l)
    for (std::int64_t s = 0; s < B; ++s) cache.write_from_host(ctx.stream(), s, l, host, host, L);
  return cache;
}

// A buffer of T (float, half or bfloat16) with random values in [-1, 1).
template <class T>
Buffer<T> random_as(Context& ctx, std::size_t n, std::uint32_t seed) {
  if constexpr (std::is_same_v<T, float>) {
    return random_buffer(ctx.dev, n, seed, -1.0f, 1.0f);
  } else {
    const auto h = random_host(n, seed, -1.0f, 1.0f);
    std::vector<T> c(n);
    for (std::size_t i = 0; i < n; ++i) c[i] = from_float<T>(h[i]);
    Buffer<T> b(ctx.dev, n);
    b.copy_from_host(ctx.stream(), c);
    ctx.stream().synchronize();
    return b;
  }
}

// q, out and the new tokens in T, the cache in `format` (docs/api.md, "Formats").
template <class T = float>
Result flash(Context& ctx, std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t D, std::int64_t L,
             Format format = Format::f32) {
  // Lengths L - 1: each call decodes the last token.
  KvCache cache = full_cache(ctx, 1, B, H, Hkv, D, L, format);
  for (std::int64_t s = 0; s < B; ++s) cache.rollback(s, L - 1);
  const std::size_t per_slot = std::size_t(Hkv * L * D);
  auto q = random_as<T>(ctx, std::size_t(B * H * D), 15);
  auto kn = random_as<T>(ctx, std::size_t(B * Hkv * D), 16);
  auto vn = random_as<T>(ctx, std::size_t(B * Hkv * D), 17);
  Buffer<T> out(ctx.dev, std::size_t(B * H * D));
  std::vector<std::int64_t> pos(static_cast<std::size_t>(B), L - 1);
  auto call = [&] {
    for (std::int64_t s = 0; s < B; ++s) cache.rollback(s, L - 1);
    flash_decoding(ctx.stream(), cache, 0, q, kn, vn, pos, out);
  };
  Result r;
  r.name = std::is_same_v<T, float> && format == Format::f32 ? "flash_decoding" : "flash_decoding_formats";
  r.shape = dshape(B, H, Hkv, D, L);
  if (!std::is_same_v<T, float> || format != Format::f32)
    r.shape += std::string(" ") + format_name(format_of<T>()) + "/" + format_name(format);
  r.median_ms = busy_ms(*ctx.dev, ctx.stream(), call, ctx.warmup + 3, ctx.reps);
  r.extra["idle_stream_ms"] = median_ms(*ctx.dev, ctx.stream(), call, 1, ctx.reps);
  r.bytes = double(B) * (double(2 * per_slot) * format_bytes(format) +
                         double(2 * std::size_t(H * D) + 2 * std::size_t(Hkv * D)) * sizeof(T));
  r.flops = 4.0 * double(B) * double(H) * double(L) * double(D);
  r.launches = launches_per_call(ctx.stream(), call);
  record_host_time(r, host_us(ctx.stream(), call, std::max(5, ctx.reps)));
  r.extra["bytes_per_token_per_layer"] = cache.bytes_per_token_per_layer();
  r.extra["cache_bytes"] = cache.bytes();
  r.note = std::string("bytes = K + V (each slot's L tokens) + q + out + new K/V; ") +
           (B <= kernels::kInlineRows ? "positions inline" : "1 H2D copy of the positions") +
           " + " + std::to_string(r.launches) + " launch(es): chunk kernel with the append" +
           (r.launches > 1 ? ", merge" : " and the merge (folded in, or its blocks in the same grid)");
  record_paired_read(r, paired_read_fraction(ctx, call, {&cache.k(0), &cache.v(0)}));
  return r;
}

#ifdef LOCKSTEP_BENCH_CUDA
// A decode step of `layers` flash_decoding calls with device-side positions (Note [device
// positions]) captured once in a CUDA graph and replayed: the host time per replay (and per
// attention call) and the device time per step.
Result flash_graph(Context& ctx, std::int64_t layers, std::int64_t B, std::int64_t H, std::int64_t Hkv,
                   std::int64_t D, std::int64_t L) {
  KvCache cache = full_cache(ctx, layers, B, H, Hkv, D, L);
  const std::size_t per_slot = std::size_t(Hkv * L * D);
  auto q = random_buffer(ctx.dev, std::size_t(B * H * D), 15, -1.0f, 1.0f);
  auto kn = random_buffer(ctx.dev, std::size_t(B * Hkv * D), 16, -1.0f, 1.0f);
  auto vn = random_buffer(ctx.dev, std::size_t(B * Hkv * D), 17, -1.0f, 1.0f);
  Buffer<float> out(ctx.dev, std::size_t(B * H * D));
  Buffer<std::int32_t> pos(ctx.dev, std::size_t(B));
  pos.copy_from_host(ctx.stream(), std::vector<std::int32_t>(std::size_t(B), std::int32_t(L - 1)));
  Stream& s = ctx.stream();
  auto raw = static_cast<cudaStream_t>(s.native_handle());
  auto step = [&] {
    for (std::int64_t l = 0; l < layers; ++l) flash_decoding(s, cache, l, q, kn, vn, pos, out);
  };
  step();  // sizes the stream's scratch
  s.synchronize();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  if (cudaStreamBeginCapture(raw, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    throw DeviceError("cudaStreamBeginCapture failed", false);
  step();
  if (cudaStreamEndCapture(raw, &graph) != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    throw DeviceError("cudaStreamEndCapture or cudaGraphInstantiate failed", false);
  auto replay = [&] { (void)cudaGraphLaunch(exec, raw); };
  Result r;
  r.name = "flash_decoding_graph_step";
  r.shape = dshape(B, H, Hkv, D, L) + " layers=" + std::to_string(layers);
  r.median_ms = busy_ms(*ctx.dev, s, replay, ctx.warmup + 3, ctx.reps);
  r.extra["idle_stream_ms"] = median_ms(*ctx.dev, s, replay, 1, ctx.reps);
  r.bytes = double(layers) * double(B) * double(2 * per_slot + 2 * std::size_t(H * D) + 2 * std::size_t(Hkv * D)) * 4;
  r.flops = 4.0 * double(layers) * double(B) * double(H) * double(L) * double(D);
  r.launches = 1;
  const HostTime host_step = host_us(s, replay, std::max(5, ctx.reps));
  record_host_time(r, host_step);
  r.extra["host_us_per_attention_call"] = host_step.steady / double(layers);
  r.note = "one cudaGraphLaunch per step of " + std::to_string(layers) + " flash_decoding calls (3 kernels each)";
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  return r;
}
#endif

std::vector<Result> mha(Context& ctx, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D) {
  std::vector<Result> rs;
  const std::size_t n = std::size_t(S * H * D);
  auto q = random_buffer(ctx.dev, n, 21, -1.0f, 1.0f), k = random_buffer(ctx.dev, n, 22, -1.0f, 1.0f),
       v = random_buffer(ctx.dev, n, 23, -1.0f, 1.0f);
  Buffer<float> out(ctx.dev, n);
  for (auto impl : {MhaImpl::kPerHead, MhaImpl::kBatched})
    for (auto gemm : {GemmKind::kExact, GemmKind::kTensorCore}) {
      if (!ctx.cuda && gemm == GemmKind::kTensorCore && S > 256) continue;  // emulated: too slow here
      MhaOptions o;
      o.impl = impl;
      o.gemm = gemm;
      int launches = 0;
      MhaReport rep;
      o.report = &rep;
      auto call = [&] {
        launches = 0;
        for (std::int64_t b = 0; b < B; ++b) {
          multihead_attention(ctx.stream(), q, k, v, out, MhaShape{S, H, D}, o);
          launches += rep.launches;
        }
      };
      Result r;
      r.name = std::string("multihead_") + (impl == MhaImpl::kPerHead ? "per_head" : "batched") +
               (gemm == GemmKind::kExact ? "_fp32" : "_tensor_core");
      r.shape = "B=" + std::to_string(B) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
                " D=" + std::to_string(D);
      r.median_ms = median_ms(*ctx.dev, ctx.stream(), call, ctx.quick ? 0 : 1, std::max(1, ctx.reps / 4));
      r.flops = 4.0 * double(B) * double(H) * double(S) * double(S) * double(D);
      r.bytes = 4.0 * double(B) * double(n) * 4;
      r.launches = launches;
      r.note = "launches per call " + std::to_string(launches) + (B > 1 ? " (B calls)" : "");
      rs.push_back(r);
    }
  return rs;
}

// S query rows over Skv keys (S when Skv < 0; causal bottom-right aligned); invariant:
// AttentionOptions::batch_invariant (false: small grids split keys, Note [split keys]).
// T: q, k, v and out in float, half or bfloat16 (Exact: Note [exact formats]).
template <class T = float>
Result fused(Context& ctx, std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D, bool causal,
             bool tc = false, std::int64_t Skv = -1, bool invariant = true) {
  if (Skv < 0) Skv = S;
  const std::size_t n = std::size_t(B * H * S * D), nkv = std::size_t(B * H * Skv * D);
  auto q = random_as<T>(ctx, n, 31), k = random_as<T>(ctx, nkv, 32), v = random_as<T>(ctx, nkv, 33);
  Buffer<T> out(ctx.dev, n);
  AttentionOptions o;
  o.causal = causal;
  o.precision = tc ? AttentionPrecision::kTensorCore : AttentionPrecision::kExact;
  o.batch_invariant = invariant;
  Result r;
  constexpr bool kFloat = std::is_same_v<T, float>;
  r.name = std::string(tc ? "attention_fused_tensor_core" : "attention_fused_exact") + (kFloat ? "" : "_formats");
  r.shape = "B=" + std::to_string(B) + " H=" + std::to_string(H) + " L=" + std::to_string(S) +
            (Skv != S ? " Lkv=" + std::to_string(Skv) : std::string()) + " D=" + std::to_string(D) +
            (causal ? " causal" : "") + (invariant ? "" : " batch_invariant=false") +
            (kFloat ? std::string() : std::string(" ") + format_name<T>());
  const auto call = [&] { attention(ctx.stream(), q, k, v, out, AttentionShape{B, H, H, S, Skv, D}, o); };
  r.median_ms = median_ms(*ctx.dev, ctx.stream(), call, ctx.quick ? 0 : 1, std::max(1, ctx.reps / 4));
  // The stream kept busy when the start event is recorded: the device's time without this call's
  // host enqueue, which median_ms (an idle stream, as PyTorch's prefill figures) includes.
  if (ctx.cuda) r.extra["busy_stream_ms"] = busy_ms(*ctx.dev, ctx.stream(), call, 1, std::max(1, ctx.reps / 4));
  // Score-weight pairs: causal row i sees Skv - S + i + 1 keys (S(S + 1) / 2 of them when S = Skv,
  // counted as S^2 / 2 as PyTorch's figures count them).
  const double pairs = !causal ? double(S) * double(Skv)
                       : Skv == S ? double(S) * double(S) / 2.0
                                  : double(S) * double(Skv - S) + double(S) * double(S + 1) / 2.0;
  r.flops = 4.0 * double(B) * double(H) * pairs * double(D);
  r.bytes = double(sizeof(T)) * double(2 * n + 2 * nkv);
  r.note = tc ? "2 launches (K, V to fp16, or bfloat16 for bfloat16 inputs; the fused kernel: wgmma on sm_90a builds at head_dim 64 and 128, else mma.sync m16n8k16; S, P, O in registers; at head_dim 64 with large grids the first launch packs one kv head and the fused kernel's packing blocks the rest), fp32 accumulation and softmax, FlashAttention-2 schedule; FLOPs halved when causal"
             : "strict fp32 SIMT, FlashAttention-2 schedule; FLOPs halved when causal";
  // The H200's dense fp16 tensor-core peak, 763 TFLOP/s (the vendor's figure), not measured here.
  if (tc && ctx.cuda) r.extra["frac_fp16_tensor_peak_763_TFLOPs"] = r.flops / (r.median_ms * 1e-3) / 763e12;
  return r;
}

}  // namespace

std::vector<Bench> attention_benches() {
  return {
      {"decode",
       [](Context& ctx) {
         std::vector<Result> rs;
         if (ctx.quick) {
           rs.push_back(decode_single(ctx, 8, 2, 64, 300));
           return rs;
         }
         rs.push_back(decode_single(ctx, 6, 6, 64, 448));
         rs.push_back(decode_single(ctx, 32, 8, 128, ctx.cuda ? 32768 : 4096));
         if (!ctx.cuda) rs.push_back(decode_single(ctx, 32, 8, 128, 16384));
         if (!ctx.cuda) rs.push_back(decode_single(ctx, 8, 8, 128, 4096));
         return rs;
       }},
      {"flash_decoding_formats",
       [](Context& ctx) {
         // Note [decode formats]: bf16 q/out with bf16 and fp8 e4m3 caches (fp16 on the CPU too).
         std::vector<Result> rs;
         if (ctx.quick) {
           rs.push_back(flash<bfloat16>(ctx, 3, 8, 2, 64, 200, Format::fp8_e4m3));
           return rs;
         }
         if (ctx.cuda) {
           for (Format f : {Format::bf16, Format::fp8_e4m3}) {
             rs.push_back(flash<bfloat16>(ctx, 32, 32, 8, 128, 4096, f));
             rs.push_back(flash<bfloat16>(ctx, 1, 32, 8, 128, 32768, f));
             rs.push_back(flash<bfloat16>(ctx, 128, 32, 8, 128, 2048, f));
             rs.push_back(flash<bfloat16>(ctx, 32, 32, 32, 128, 2048, f));
           }
         } else {
           rs.push_back(flash<bfloat16>(ctx, 4, 32, 8, 128, 4096, Format::bf16));
           rs.push_back(flash<half>(ctx, 4, 32, 8, 128, 4096, Format::f16));
           rs.push_back(flash<bfloat16>(ctx, 4, 32, 8, 128, 4096, Format::fp8_e4m3));
         }
         return rs;
       }},
      {"flash_decoding",
       [](Context& ctx) {
         std::vector<Result> rs;
         if (ctx.quick) {
           rs.push_back(flash(ctx, 3, 8, 2, 64, 200));
           return rs;
         }
         if (ctx.cuda) {
           rs.push_back(flash(ctx, 32, 32, 8, 128, 4096));
           rs.push_back(flash(ctx, 1, 32, 8, 128, 32768));
           rs.push_back(flash(ctx, 128, 32, 8, 128, 2048));
           rs.push_back(flash(ctx, 32, 32, 32, 128, 2048));
         } else {
           rs.push_back(flash(ctx, 4, 32, 8, 128, 4096));
         }
         return rs;
       }},
#ifdef LOCKSTEP_BENCH_CUDA
      {"flash_decoding_graph",
       [](Context& ctx) {
         std::vector<Result> rs;
         if (!ctx.cuda) return rs;
         rs.push_back(flash_graph(ctx, 4, 32, 32, 8, 128, 4096));
         rs.push_back(flash_graph(ctx, 32, 1, 32, 8, 128, 4096));
         return rs;
       }},
#endif
      {"attention_fused",
       [](Context& ctx) {
         std::vector<Result> rs;
         if (ctx.quick) {
           rs.push_back(fused(ctx, 1, 2, 64, 64, true));
           rs.push_back(fused(ctx, 1, 2, 64, 64, true, true));
           return rs;
         }
         for (bool tc : {false, true}) {
           if (ctx.cuda) {
             rs.push_back(fused(ctx, 1, 6, 1500, 64, false, tc));
             rs.push_back(fused(ctx, 4, 32, 4096, 128, false, tc));
             rs.push_back(fused(ctx, 4, 32, 4096, 128, true, tc));
             rs.push_back(fused(ctx, 16, 16, 1024, 64, true, tc));
             if (tc) {  // head_dim 64 grids where the one-warpgroup wgmma kernel also runs (Note [deferred P.V wait])
               rs.push_back(fused(ctx, 16, 16, 1024, 64, false, tc));
               rs.push_back(fused(ctx, 2, 16, 4096, 64, true, tc));
             }
             // Small grids over many keys (Note [split keys]): a causal chunk of 512 queries over an
             // 8192-token context, and whisper-tiny causal; Exact at whisper-tiny with
             // batch_invariant = false (split keys).
             rs.push_back(fused(ctx, 1, 32, 512, 128, true, tc, 8192));
             rs.push_back(fused(ctx, 1, 6, 1500, 64, true, tc));
             if (!tc) {  // TensorCore does not split unless its Tuning asks
               rs.push_back(fused(ctx, 1, 6, 1500, 64, false, tc, -1, false));
               rs.push_back(fused(ctx, 1, 6, 1500, 64, true, tc, -1, false));
             }
           } else {
             rs.push_back(fused(ctx, 1, 4, 256, 64, false, tc));
             // Note [row-major exact]: prefill shapes for the CPU's exact path (the tensor-core
             // emulation, 10 GFLOP/s, keeps the small one).
             if (!tc) {
               rs.push_back(fused(ctx, 1, 6, 1500, 64, false));
               rs.push_back(fused(ctx, 1, 8, 1024, 64, true));
               rs.push_back(fused(ctx, 1, 4, 1024, 128, false));
             }
           }
         }
         return rs;
       }},
      {"attention_fused_formats",
       [](Context& ctx) {
         // Note [exact formats]: Exact on bfloat16 q, k, v and out, at attention_fused's shapes;
         // TensorCore on half inputs (fp16 products) and on bfloat16 inputs (bfloat16 products:
         // Note [tensor-core formats]), against FA2 on the same input type.
         std::vector<Result> rs;
         if (ctx.quick) {
           rs.push_back(fused<bfloat16>(ctx, 1, 2, 64, 64, true));
           rs.push_back(fused<half>(ctx, 1, 2, 64, 64, true, true));
           rs.push_back(fused<bfloat16>(ctx, 1, 2, 64, 64, true, true));
         } else if (ctx.cuda) {
           rs.push_back(fused<bfloat16>(ctx, 1, 6, 1500, 64, false));
           rs.push_back(fused<bfloat16>(ctx, 4, 32, 4096, 128, false));
           rs.push_back(fused<bfloat16>(ctx, 16, 16, 1024, 64, true));
           rs.push_back(fused<half>(ctx, 1, 6, 1500, 64, false, true));
           rs.push_back(fused<half>(ctx, 4, 32, 4096, 128, false, true));
           rs.push_back(fused<half>(ctx, 4, 32, 4096, 128, true, true));
           rs.push_back(fused<half>(ctx, 16, 16, 1024, 64, true, true));
           rs.push_back(fused<bfloat16>(ctx, 1, 6, 1500, 64, false, true));
           rs.push_back(fused<bfloat16>(ctx, 4, 32, 4096, 128, false, true));
           rs.push_back(fused<bfloat16>(ctx, 4, 32, 4096, 128, true, true));
           rs.push_back(fused<bfloat16>(ctx, 16, 16, 1024, 64, true, true));
         } else {
           rs.push_back(fused<bfloat16>(ctx, 1, 6, 1500, 64, false));
           rs.push_back(fused<half>(ctx, 1, 4, 1024, 128, false));
           rs.push_back(fused<bfloat16>(ctx, 1, 2, 256, 64, true, true));
         }
         return rs;
       }},
      {"multihead",
       [](Context& ctx) {
         std::vector<Result> rs;
         if (ctx.quick) return mha(ctx, 1, 64, 2, 32);
         for (auto& r : mha(ctx, 1, 1500, 6, 64)) rs.push_back(r);
         if (ctx.cuda)
           for (auto& r : mha(ctx, 4, 1024, 32, 128)) rs.push_back(r);
         return rs;
       }},
  };
}

}  // namespace lockstep::bench
