// lockstep-bench: each kernel on each device over a shape list. Reports the median time (CUDA
// events on the GPU, the CPU device's steady-clock events on the CPU) after warm-up, the bytes
// moved and FLOPs, and the fraction of the ceilings measured in the same run (copy and read
// bandwidth, fp32 fma rate). --json writes everything for docs/gpu-results.md.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_common.hpp"
#include "lockstep/kernels/launch.hpp"

namespace lockstep::bench {

namespace {
// The median over reps of the event interval around fn(); `before` (if any) is enqueued ahead of
// the start event each time.
double event_median_ms(Device& dev, Stream& s, const std::function<void()>& fn, int warmup, int reps,
                       const std::function<void()>& before) {
  for (int i = 0; i < warmup; ++i) fn();
  s.synchronize();
  auto t0 = dev.create_event(true), t1 = dev.create_event(true);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    if (before) before();
    t0->record(s);
    fn();
    t1->record(s);
    t1->synchronize();
    ms.push_back(t1->elapsed_ms(*t0));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
}  // namespace

double median_ms(Device& dev, Stream& s, const std::function<void()>& fn, int warmup, int reps) {
  return event_median_ms(dev, s, fn, warmup, reps, nullptr);
}

// A ~40 us compute-only kernel (one block of fma chains: no memory traffic, the L2 is left as
// it is) enqueued before the start event, so that the measured interval starts with the GPU
// busy and the host's enqueue of `fn` is not in it.
double busy_ms(Device& dev, Stream& s, const std::function<void()>& fn, int warmup, int reps) {
  if (dev.id().kind != DeviceKind::kCuda) return median_ms(dev, s, fn, warmup, reps);
  using FP = kernels::FmaPeak;
  Buffer<float> sink(dev.shared_from_this(), FP::kThreads);
  auto delay = [&](int n) { launch<FP>(s, Dim3{1, 1, 1}, 0, FP::Params{sink.data().get(), n, 0.999f, 1e-3f}); };
  const double cal_ms = median_ms(dev, s, [&] { delay(20000); }, 1, 5);  // calibrate: 40 us
  const int iters = std::max(1000, static_cast<int>(20000 * 0.040 / std::max(cal_ms, 1e-4)));
  return event_median_ms(dev, s, fn, warmup, reps, [&] { delay(iters); });
}

std::vector<float> random_host(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  // Random but cheap for large buffers: a few thousand draws, repeated with an offset.
  std::vector<float> base(4099);
  for (auto& x : base) x = d(g);
  for (std::size_t i = 0; i < n; ++i) v[i] = base[i % base.size()] + float(i % 7) * 1e-3f;
  return v;
}

Buffer<float> random_buffer(const std::shared_ptr<Device>& dev, std::size_t n, std::uint64_t seed,
                            float lo, float hi) {
  Buffer<float> b(dev, n);
  const std::size_t chunk = std::size_t(1) << 24;
  auto& s = dev->default_stream();
  for (std::size_t off = 0; off < n; off += chunk) {
    const auto h = random_host(std::min(chunk, n - off), seed + off, lo, hi);
    b.copy_from_host(s, h, off);
  }
  s.synchronize();
  return b;
}

}  // namespace lockstep::bench

using namespace lockstep;
using namespace lockstep::bench;

namespace {
int run(const std::string& device_arg, const std::string& json_path, const std::string& filter,
        bool quick, int reps);
// The benchmarks' names, which --filter matches (each gives one or more results, whose names in
// the table and the JSON may differ: `decode` gives incremental_attention's).
std::string benchmark_names() {
  std::string names;
  for (const auto& b : registry()) names += (names.empty() ? "" : ", ") + std::string(b.name);
  return names;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lockstep-bench: kernel benchmarks with ceilings measured in the same run"};
  std::string device_arg = "all", json_path, filter = ".*";
  bool quick = false;
  int reps = 0;
  app.add_option("--device", device_arg, "cpu, cuda:0, ... or all");
  app.add_option("--json", json_path, "write results as JSON to this file");
  bool list = false;
  app.add_option("--filter", filter, "regex on benchmark names (--list prints them)");
  app.add_flag("--list", list, "print the benchmark names that --filter matches, and exit");
  app.add_flag("--quick", quick, "tiny sizes, one repetition (CI smoke test)");
  app.add_option("--reps", reps, "timed repetitions (default: 20 on CUDA, 5 on CPU)")
      ->check(CLI::Range(1, 1000000));  // PositiveNumber said "not in range 0 to 1.79e308" (309 digits)
  CLI11_PARSE(app, argc, argv);
  try {
    if (list) {
      const std::regex re(filter);
      for (const auto& b : registry())
        if (std::regex_search(b.name, re)) std::printf("%s\n", std::string(b.name).c_str());
      return 0;
    }
    return run(device_arg, json_path, filter, quick, reps);
  } catch (const lockstep::Error& e) {  // bad device, unusable device, a failed benchmark
    std::fprintf(stderr, "lockstep-bench: %s\n", e.what());
    return 2;
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "lockstep-bench: --filter '%s' is not a valid regular expression (%s)\n",
                 filter.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-bench: %s\n", e.what());
    return 2;
  }
}

namespace {
int run(const std::string& device_arg, const std::string& json_path, const std::string& filter,
        bool quick, int reps) {
  // A filter that matches nothing, and a JSON path that cannot be written, fail before minutes of
  // measurements, not after them. The results go to <path>.lockstep-bench-<pid>.tmp, renamed over <path> only when
  // the run succeeds: a failed run leaves an earlier results file as it was.
  const std::regex re(filter);
  if (std::none_of(registry().begin(), registry().end(),
                   [&](const auto& b) { return std::regex_search(b.name, re); })) {
    std::fprintf(stderr, "lockstep-bench: no benchmark matches --filter '%s' (the benchmarks: %s)\n", filter.c_str(),
                 benchmark_names().c_str());
    return 2;
  }
  // A temporary name of this process's own, so that no file of the user's is overwritten or
  // removed.
  const std::string json_tmp = json_path + ".lockstep-bench-" + std::to_string(::getpid()) + ".tmp";
  std::ofstream json_file;
  if (!json_path.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(json_path, ec)) {
      std::fprintf(stderr, "lockstep-bench: --json %s: is a directory (give a file name)\n", json_path.c_str());
      return 2;
    }
    json_file.open(json_tmp);
    if (!json_file) {
      std::fprintf(stderr, "lockstep-bench: --json %s: cannot write there (%s)\n", json_path.c_str(),
                   std::strerror(errno));
      return 2;
    }
  }
  struct RemoveTmp {  // on any early exit: the temporary file, if one was opened
    std::string path;
    ~RemoveTmp() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } remove_tmp{json_path.empty() ? std::string() : json_tmp};
  std::vector<std::shared_ptr<Device>> devs;
  if (device_arg == "all") {
    for (const auto& b : devices())
      if (b.usable)
        for (const auto& d : b.devices) devs.push_back(open(d.id));
  } else {
    devs.push_back(open(device_arg));
  }
  nlohmann::json out;
  out["quick"] = quick;
  std::vector<Result> all;
  for (const auto& dev : devs) {
    Context ctx;
    ctx.dev = dev;
    ctx.quick = quick;
    ctx.cuda = dev->id().kind == DeviceKind::kCuda;
    if (dev->id().kind == DeviceKind::kCpu) ctx.native = native_cpu_for(dev->caps().simd_target);
    ctx.reps = reps > 0 ? reps : (quick ? 1 : (ctx.cuda ? 20 : 5));
    ctx.warmup = quick ? 0 : 2;
    std::fprintf(stderr, "== %s: %s\n", dev->id().str().c_str(), dev->name().c_str());
    ctx.ceil = measure_ceilings(ctx);
    nlohmann::json dj;
    dj["device"] = dev->id().str();
    dj["name"] = dev->name();
    dj["ceilings"] = {{"copy_GBps", ctx.ceil.copy_gbps},
                      {"copy_source", ctx.ceil.copy_source},
                      {"read_GBps", ctx.ceil.read_gbps},
                      {"read_source", ctx.ceil.read_source},
                      {"read_lanes_GBps", ctx.ceil.read_lanes_gbps},
                      {"fma_GFLOPs", ctx.ceil.fma_gflops},
                      {"fma_source", ctx.ceil.fma_source}};
    std::fprintf(stderr, "   ceilings: copy %.1f GB/s (%s), read %.1f GB/s (%s), fp32 fma %.1f GFLOP/s (%s)\n",
                 ctx.ceil.copy_gbps, ctx.ceil.copy_source.c_str(), ctx.ceil.read_gbps, ctx.ceil.read_source.c_str(),
                 ctx.ceil.fma_gflops, ctx.ceil.fma_source.c_str());
    if (quick)
      std::fprintf(stderr, "   (--quick: tiny sizes, one repetition: a smoke test; these ceilings and the fractions below mean nothing)\n");
    if (ctx.ceil.read_lanes_gbps > 0)
      std::fprintf(stderr, "   (the read_sum kernel through the lanes: %.1f GB/s)\n", ctx.ceil.read_lanes_gbps);
    for (const auto& b : registry()) {
      if (!std::regex_search(b.name, re)) continue;
      for (auto r : b.run(ctx)) {
        r.device = dev->id().str();
        r.fill_fractions(ctx.ceil);
        std::fprintf(stderr, "   %-34s %-38s %10.4f ms  %8.1f GB/s  %8.2f GFLOP/s  %s\n",
                     r.name.c_str(), r.shape.c_str(), r.median_ms, r.gbps(), r.gflops(),
                     r.note.c_str());
        dj["results"].push_back(r.to_json());
        all.push_back(r);
      }
    }
    out["devices"].push_back(dj);
  }
  if (all.empty()) {
    std::fprintf(stderr, "lockstep-bench: no benchmark ran (no usable device?)\n");
    return 2;
  }
  print_table(all);
  if (json_file.is_open()) {
    json_file << out.dump(2) << "\n";
    json_file.close();
    if (!json_file) {
      std::fprintf(stderr, "lockstep-bench: --json %s: writing %s failed\n", json_path.c_str(), json_tmp.c_str());
      return 2;
    }
    if (std::rename(json_tmp.c_str(), json_path.c_str()) != 0) {
      std::fprintf(stderr, "lockstep-bench: --json %s: renaming %s to it failed (%s)\n", json_path.c_str(),
                   json_tmp.c_str(), std::strerror(errno));
      return 2;
    }
    remove_tmp.path.clear();  // renamed: nothing to remove
  }
  return 0;
}
}  // namespace
