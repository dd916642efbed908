// Ceilings and the benchmarks of the first kernels (softmax, scale, layouts, transpose, GEMM).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "bench_common.hpp"
#include "lockstep/attention/ops.hpp"
#include "lockstep/kernels/ceilings.hpp"
#include "lockstep/kernels/decode.hpp"
#include "lockstep/kernels/launch.hpp"

namespace lockstep::bench {

namespace {
std::string shape_str(std::initializer_list<std::pair<const char*, std::int64_t>> d) {
  std::string s;
  for (auto& [k, v] : d) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}
}  // namespace

std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  for (int i = 0; i < 8; ++i) {  // Linux: the largest cache of cpu0 (what one core shares)
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string v;
    if (!(f >> v) || v.empty()) continue;
    std::size_t n = std::strtoull(v.c_str(), nullptr, 10);
    if (v.back() == 'K') n <<= 10;
    if (v.back() == 'M') n <<= 20;
    best = std::max(best, n);
  }
  return best != 0 ? best : std::size_t{32} << 20;
}
Ceilings measure_ceilings(Context& ctx) {
  Ceilings c;
  auto& s = ctx.stream();
  const std::size_t n = ctx.pick<std::size_t>(1 << 20, std::size_t(1) << 26, std::size_t(1) << 29);
  Buffer<float> a(ctx.dev, n), b(ctx.dev, n);
  a.fill(s, 1.0f);
  b.fill(s, 2.0f);
  const double copy_ms = median_ms(*ctx.dev, s, [&] { b.copy_from(s, a); }, ctx.warmup, ctx.reps);
  c.copy_gbps = 2.0 * double(n) * 4 / (copy_ms * 1e6);
  c.copy_source = "device copy";
  if (ctx.native.copy_gbps != nullptr) {
    // The CPU device: its copy (a memcpy per chunk) or a native copy loop of its SIMD width,
    // whichever is faster (a kernel that reads and writes can reach the latter).
    s.synchronize();
    const double native = ctx.native.copy_gbps(b.data().get(), a.data().get(), n, 5);
    if (native > c.copy_gbps) {
      c.copy_gbps = native;
      c.copy_source = "native " + ctx.native.simd + " copy, all threads";
    }
    c.dram_min_bytes = double(std::max(std::size_t{64} << 20, 2 * last_level_cache_bytes()));
  }

  using RS = kernels::ReadSum;
  Buffer<float> partial(ctx.dev, n / RS::kPerBlock);
  const double read_ms = median_ms(
      *ctx.dev, s,
      [&] {
        launch<RS>(s, Dim3{std::uint32_t(n / RS::kPerBlock), 1, 1}, 64,
                   RS::Params{a.data().get(), partial.data().get()});
      },
      ctx.warmup, ctx.reps);
  c.read_gbps = double(n) * 4 / (read_ms * 1e6);
  c.read_source = "read_sum kernel";
  if (ctx.native.read_gbps != nullptr) {
    // The CPU device: the DRAM's read bandwidth, read by a native loop of the device's SIMD width
    // (the ReadSum kernel through the lanes is slower than the memory).
    s.synchronize();
    const double native = ctx.native.read_gbps(a.data().get(), n, 5);
    if (native > 0) {
      c.read_lanes_gbps = c.read_gbps;
      c.read_gbps = native;
      c.read_source = "native " + ctx.native.simd + " sum, all threads";
    }
  }

  if (ctx.cuda) {
    using FP = kernels::FmaPeak;
    const std::uint32_t blocks = 132 * 64;
    const int iters = ctx.quick ? 16 : 4096;
    Buffer<float> out(ctx.dev, std::size_t(blocks) * FP::kThreads);
    const double ms = median_ms(
        *ctx.dev, s,
        [&] { launch<FP>(s, Dim3{blocks, 1, 1}, 0, FP::Params{out.data().get(), iters, 0.999f, 1e-3f}); },
        ctx.warmup, ctx.reps);
    c.fma_gflops = 2.0 * double(blocks) * FP::kThreads * FP::kChains * iters / (ms * 1e6);
    c.fma_source = "fma_peak kernel";
  } else if (ctx.native.fma_gflops != nullptr) {
    c.fma_gflops = ctx.native.fma_gflops(ctx.quick ? 2'000'000 : 10'000'000, 3);
    c.fma_source = "native " + ctx.native.simd + " fma and add chains, all threads";
  }
  return c;
}

std::vector<Bench> attention_benches();

const std::vector<Bench>& registry() {
  static const std::vector<Bench> benches = [] {
  std::vector<Bench> b = {
      {"softmax_rows",
       [](Context& ctx) {
         std::vector<Result> rs;
         const std::int64_t total = ctx.pick<std::int64_t>(1 << 16, 1 << 25, std::int64_t(1) << 28);
         for (std::int64_t n : {std::int64_t(1024), std::int64_t(32768)}) {
           const std::int64_t rows = std::max<std::int64_t>(1, total / n);
           auto in = random_buffer(ctx.dev, std::size_t(rows * n), 1, -8.0f, 8.0f);
           Buffer<float> out(ctx.dev, std::size_t(rows * n));
           Result r;
           r.name = "softmax_rows";
           r.shape = shape_str({{"rows", rows}, {"n", n}});
           r.median_ms = median_ms(*ctx.dev, ctx.stream(), [&] { ops::softmax_rows(ctx.stream(), in, out, rows, n); },
                                   ctx.warmup, ctx.reps);
           r.bytes = 2.0 * double(rows * n) * 4;
           r.note = "bytes = read once + write once (the kernel reads each row 3 times)";
           rs.push_back(r);
         }
         return rs;
       }},
      {"decode_read_pattern",
       [](Context& ctx) {
         // What the DRAM gives for the decode chunk kernel's reads at B=1 H32 Hkv8 D128 L32768
         // (docs/performance.md): read_tiles is that kernel's access pattern without its
         // arithmetic (kernels/ceilings.hpp), with the chunk kernel's shared memory (so its 4
         // blocks per SM) and with its ring's alone; read_sum, the read ceiling's kernel, over
         // a buffer of the same size.
         std::vector<Result> rs;
         using RT = kernels::ReadTiles;
         using RS = kernels::ReadSum;
         const std::int64_t heads = 8, rows = ctx.pick<std::int64_t>(1024, 8192, 32768), D = RT::kD;
         const std::size_t n = std::size_t(heads * rows * D);
         auto k = random_buffer(ctx.dev, n, 21, -1.0f, 1.0f);
         auto v = random_buffer(ctx.dev, n, 22, -1.0f, 1.0f);
         auto& s = ctx.stream();
         const auto gx = static_cast<std::uint32_t>(rows / RT::kRows);
         Buffer<float> out(ctx.dev, std::size_t(gx) * heads * (RT::kThreads / 32));
         using Chunk = kernels::DecodeChunk<128, 4, 1, 4>;
         // Then with the chunk kernel's shared memory and an L2 policy on the copies (Note
         // [streamed tiles]): evict-first (the decode's past the L2's size), evict-normal (a
         // measurement) and evict-unchanged (the decode's below the L2's size).
         const std::pair<std::size_t, int> configs[] = {
             {Chunk::kSharedBytes, 0}, {RT::kSharedBytes, 0}, {Chunk::kSharedBytes, 1}, {Chunk::kSharedBytes, 2}, {Chunk::kSharedBytes, 3}};
         const char* names[] = {"read_tiles", "read_tiles_evict_first", "read_tiles_evict_normal", "read_tiles_evict_unchanged"};
         for (const auto& [smem, mode] : configs) {
           Result r;
           r.name = names[mode];
           r.shape = shape_str({{"heads", heads}, {"rows", rows}, {"dim", D}, {"shared_bytes", std::int64_t(smem)}});
           const RT::Params p{k.data().get(), v.data().get(), out.data().get(), rows * D, mode};
           r.median_ms = busy_ms(*ctx.dev, s, [&] { launch<RT>(s, Dim3{gx, std::uint32_t(heads), 1}, smem, p); },
                                 ctx.warmup + 3, ctx.reps);
           r.bytes = 2.0 * double(n) * 4;
           r.note = smem == RT::kSharedBytes ? "the decode chunk kernel's reads, the ring's shared memory only"
                                             : "the decode chunk kernel's reads, with its shared memory (its blocks per SM)";
           rs.push_back(r);
         }
         Buffer<float> both(ctx.dev, 2 * n), partial(ctx.dev, 2 * n / RS::kPerBlock);
         both.fill(s, 1.0f);
         Result r;
         r.name = "read_sum";
         r.shape = shape_str({{"floats", std::int64_t(2 * n)}});
         r.median_ms = busy_ms(
             *ctx.dev, s,
             [&] {
               launch<RS>(s, Dim3{std::uint32_t(2 * n / RS::kPerBlock), 1, 1}, 64,
                          RS::Params{both.data().get(), partial.data().get()});
             },
             ctx.warmup + 3, ctx.reps);
         r.bytes = 2.0 * double(n) * 4;
         r.note = "the read ceiling's kernel over the decode cache's bytes";
         rs.push_back(r);
         return rs;
       }},
      {"scale",
       [](Context& ctx) {
         const std::int64_t n = ctx.pick<std::int64_t>(1 << 20, 1 << 25, std::int64_t(1) << 28);
         auto in = random_buffer(ctx.dev, std::size_t(n), 2, -1.0f, 1.0f);
         Buffer<float> out(ctx.dev, std::size_t(n));
         Result r;
         r.name = "scale";
         r.shape = shape_str({{"n", n}});
         r.median_ms = median_ms(*ctx.dev, ctx.stream(), [&] { ops::scale(ctx.stream(), in, out, 0.5f); },
                                 ctx.warmup, ctx.reps);
         r.bytes = 2.0 * double(n) * 4;
         r.flops = double(n);
         return std::vector<Result>{r};
       }},
      {"layout",
       [](Context& ctx) {
         std::vector<Result> rs;
         const std::int64_t S = ctx.pick<std::int64_t>(256, 4096, 32768), H = 32, D = ctx.pick<std::int64_t>(64, 128, 256);
         auto in = random_buffer(ctx.dev, std::size_t(S * H * D), 3, -1.0f, 1.0f);
         Buffer<float> out(ctx.dev, std::size_t(S * H * D));
         for (int kind = 0; kind < 2; ++kind) {
           Result r;
           r.name = kind == 0 ? "interleaved_to_batched" : "batched_to_interleaved";
           r.shape = shape_str({{"seq", S}, {"heads", H}, {"dim", D}});
           r.median_ms = median_ms(
               *ctx.dev, ctx.stream(),
               [&] {
                 if (kind == 0)
                   ops::interleaved_to_batched(ctx.stream(), in, out, S, H, D);
                 else
                   ops::batched_to_interleaved(ctx.stream(), in, out, S, H, D);
               },
               ctx.warmup, ctx.reps);
           r.bytes = 2.0 * double(S * H * D) * 4;
           rs.push_back(r);
         }
         return rs;
       }},
      {"transpose",
       [](Context& ctx) {
         const std::int64_t B = ctx.pick<std::int64_t>(1, 2, 16), R = ctx.pick<std::int64_t>(512, 4096, 4096), C = R;
         auto in = random_buffer(ctx.dev, std::size_t(B * R * C), 4, -1.0f, 1.0f);
         Buffer<float> out(ctx.dev, std::size_t(B * R * C));
         Result r;
         r.name = "transpose";
         r.shape = shape_str({{"batch", B}, {"rows", R}, {"cols", C}});
         r.median_ms = median_ms(*ctx.dev, ctx.stream(), [&] { ops::transpose(ctx.stream(), in, out, B, R, C); },
                                 ctx.warmup, ctx.reps);
         r.bytes = 2.0 * double(B * R * C) * 4;
         return std::vector<Result>{r};
       }},
      {"gemm_f32",
       [](Context& ctx) {
         const std::int64_t M = ctx.pick<std::int64_t>(128, 1024, 4096);
         auto a = random_buffer(ctx.dev, std::size_t(M * M), 5, -1.0f, 1.0f);
         auto b = random_buffer(ctx.dev, std::size_t(M * M), 6, -1.0f, 1.0f);
         Buffer<float> c(ctx.dev, std::size_t(M * M));
         Result r;
         r.name = "gemm_f32";
         r.shape = shape_str({{"m", M}, {"n", M}, {"k", M}});
         r.median_ms = median_ms(*ctx.dev, ctx.stream(), [&] { ops::gemm(ctx.stream(), a, b, c, 1, M, M, M); },
                                 ctx.warmup, std::max(1, ctx.reps / 2));
         r.bytes = 3.0 * double(M * M) * 4;
         r.flops = 2.0 * double(M) * M * M;
         return std::vector<Result>{r};
       }},
  };
  for (auto& a : attention_benches()) b.push_back(std::move(a));
  return b;
  }();
  return benches;
}

void print_table(const std::vector<Result>& rs) {
  std::printf("\n| device | benchmark | shape | median ms | GB/s | GFLOP/s | %% copy ceil | %% read ceil | %% fma ceil |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  bool above = false;
  auto pct = [](double f, const char* format) {
    if (f <= 0) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, format, 100 * f);
    return std::string(buf);
  };
  for (const auto& r : rs) {
    std::printf("| %s | %s | %s | %.4f | %.1f | %.1f | %s | %s | %s |\n", r.device.c_str(), r.name.c_str(),
                r.shape.c_str(), r.median_ms, r.gbps(), r.gflops(), pct(r.frac_copy, "%.0f%%").c_str(),
                pct(r.frac_read, "%.0f%%").c_str(), pct(r.frac_fma, "%.1f%%").c_str());
    above = above || r.frac_copy > 1.0 || r.frac_read > 1.0 || r.frac_fma > 1.0;
  }
  std::printf("\n-: no FLOPs, or (the CPU device) data that fit in the caches, which the DRAM's ceilings do "
              "not bound.\n");
  if (above)  // the ceilings are medians measured once per device in this run, not hardware limits
    std::printf("\nA fraction above 100%% means the benchmark ran faster than the ceiling measured in this "
                "run: a ceiling measured on a busy or noisy machine (or one a kernel's cache reuse beats); "
                "rerun on an idle machine before reading it as a limit.\n");
}

}  // namespace lockstep::bench
