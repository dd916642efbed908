#pragma once
// Shared pieces of lockstep-bench: results, ceilings, the benchmark registry.

#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lockstep/lockstep.hpp"

namespace lockstep::bench {

struct Ceilings {
  double copy_gbps = 0;   // device-to-device copy, bytes read + written
  std::string copy_source;
  double read_gbps = 0;   // read-only sum of a large buffer (the CPU: native, all threads)
  double read_lanes_gbps = 0;  // the CPU: the same sum as a kernel through the lanes (ReadSum)
  std::string read_source;
  double fma_gflops = 0;  // fp32 fused multiply-adds (2 FLOPs each)
  std::string fma_source;
  // The CPU device: a benchmark that moves fewer bytes than this (twice the last-level cache, at
  // least 64 MiB) has its data largely in the caches, where the DRAM's copy and read ceilings
  // bound nothing: it gets no fraction of them.
  double dram_min_bytes = 0;
};

struct Result {
  std::string name, device, shape, note;
  double median_ms = 0;
  double bytes = 0;  // the fewest bytes the operation must move
  double flops = 0;
  int launches = 1;
  double frac_copy = 0, frac_read = 0, frac_fma = 0;
  nlohmann::json extra = nlohmann::json::object();

  double gbps() const { return median_ms > 0 ? bytes / (median_ms * 1e6) : 0; }
  double gflops() const { return median_ms > 0 ? flops / (median_ms * 1e6) : 0; }
  // The fractions of the ceilings (0: none, where the figure says nothing: no FLOPs, or data in
  // the CPU's caches against the DRAM's ceilings).
  void fill_fractions(const Ceilings& c) {
    const bool dram = bytes >= c.dram_min_bytes;
    if (c.copy_gbps > 0 && dram) frac_copy = gbps() / c.copy_gbps;
    if (c.read_gbps > 0 && dram) frac_read = gbps() / c.read_gbps;
    if (c.fma_gflops > 0) frac_fma = gflops() / c.fma_gflops;
  }
  nlohmann::json to_json() const {
    nlohmann::json j = {{"name", name},           {"device", device},
                        {"shape", shape},         {"median_ms", median_ms},
                        {"bytes", bytes},         {"flops", flops},
                        {"GBps", gbps()},         {"GFLOPs", gflops()},
                        {"launches", launches},   {"frac_copy_ceiling", frac_copy},
                        {"frac_read_ceiling", frac_read}, {"frac_fma_ceiling", frac_fma},
                        {"note", note}};
    for (auto& [k, v] : extra.items()) j[k] = v;
    return j;
  }
};

// The CPU's native ceilings, written with the intrinsics of one SIMD width (bench/cpu_fma_peak.cpp)
// and run on every hardware thread, each the best of `reps` passes: the fp32 peak in registers
// (GFLOP/s; fma chains, alone and beside add chains), the GB/s of reading in[0, n), and the GB/s
// (read + written) of copying it to out.
struct NativeCpu {
  std::string simd;  // "AVX-512", "AVX2" or "SSE2"
  double (*fma_gflops)(long iters, int reps) = nullptr;
  double (*read_gbps)(const float* in, std::size_t n, int reps) = nullptr;
  double (*copy_gbps)(float* out, const float* in, std::size_t n, int reps) = nullptr;
};
// The loops of the width the CPU device with this DeviceCaps::simd_target runs, so that no kernel
// of the device can beat its ceiling by using wider vectors than the ceiling's loops.
NativeCpu native_cpu_for(const std::string& simd_target);

struct Context {
  std::shared_ptr<Device> dev;
  bool quick = false, cuda = false;
  int reps = 5, warmup = 2;
  Ceilings ceil;
  NativeCpu native;  // the CPU device: its SIMD width's native loops
  Stream& stream() const { return dev->default_stream(); }
  // Picks a size by device class: (quick, cpu, cuda).
  template <class T>
  T pick(T q, T cpu, T gpu) const {
    return quick ? q : (cuda ? gpu : cpu);
  }
};

struct Bench {
  std::string name;
  std::function<std::vector<Result>(Context&)> run;
};

// Median over reps of the time between two events around fn() on an idle stream: on the GPU
// this includes the host's enqueue of fn's first launch.
double median_ms(Device& dev, Stream& s, const std::function<void()>& fn, int warmup, int reps);
// The same with the stream kept busy by a compute-only kernel when the start event is recorded
// (CUDA; elsewhere = median_ms): the device time of fn, without the host's enqueue.
double busy_ms(Device& dev, Stream& s, const std::function<void()>& fn, int warmup, int reps);
Buffer<float> random_buffer(const std::shared_ptr<Device>& dev, std::size_t n, std::uint64_t seed,
                            float lo, float hi);
std::vector<float> random_host(std::size_t n, std::uint64_t seed, float lo, float hi);

Ceilings measure_ceilings(Context& ctx);
// The largest cache of cpu0 (Linux sysfs; 32 MiB where it cannot be read).
std::size_t last_level_cache_bytes();
const std::vector<Bench>& registry();
void print_table(const std::vector<Result>& rs);

}  // namespace lockstep::bench
