#include "bench_common.hpp"

namespace lockstep::bench {
double cpu_fma_peak_avx2();
double cpu_read_avx2(const float* in, std::size_t n, int reps);
double cpu_native_read_gbps(const float* in, std::size_t n, int reps) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return cpu_read_avx2(in, n, reps);
  return 0;
}
double cpu_native_fma_gflops() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return cpu_fma_peak_avx2();
  return 0;
}
}  // namespace lockstep::bench
