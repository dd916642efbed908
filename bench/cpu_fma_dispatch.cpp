// Picks the native ceiling loops (cpu_fma_peak.cpp) of the SIMD width the CPU device runs.
#include <string>

#include "bench_common.hpp"

namespace lockstep::bench {
namespace avx512 {
double fma_peak_gflops(long iters, int reps);
double read_gbps(const float* in, std::size_t n, int reps);
double copy_gbps(float* out, const float* in, std::size_t n, int reps);
}  // namespace avx512
namespace avx2 {
double fma_peak_gflops(long iters, int reps);
double read_gbps(const float* in, std::size_t n, int reps);
double copy_gbps(float* out, const float* in, std::size_t n, int reps);
}  // namespace avx2
namespace sse2 {
double fma_peak_gflops(long iters, int reps);
double read_gbps(const float* in, std::size_t n, int reps);
double copy_gbps(float* out, const float* in, std::size_t n, int reps);
}  // namespace sse2

NativeCpu native_cpu_for(const std::string& simd_target) {
  // The device's variants (backends/cpu): "AVX3..." runs 512-bit vectors, "AVX2" 256-bit ones
  // with fma, the portable variant x86-64's baseline. Each exists only where the CPU has it (the
  // device refuses a variant the CPU lacks); the checks keep a mismatch from running an illegal
  // instruction.
  __builtin_cpu_init();
  if (simd_target.rfind("AVX3", 0) == 0 && __builtin_cpu_supports("avx512f"))
    return {"AVX-512", &avx512::fma_peak_gflops, &avx512::read_gbps, &avx512::copy_gbps};
  if (simd_target == "AVX2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {"AVX2", &avx2::fma_peak_gflops, &avx2::read_gbps, &avx2::copy_gbps};
  return {"SSE2", &sse2::fma_peak_gflops, &sse2::read_gbps, &sse2::copy_gbps};
}
}  // namespace lockstep::bench
