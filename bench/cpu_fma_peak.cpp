// The CPU's native ceilings: fp32 fma (independent AVX2 fma chains in registers on every hardware
// thread) and DRAM read bandwidth (AVX2 sums of a large buffer, a slice per hardware thread).
// Compiled with -mavx2 -mfma; only called when the CPU has them.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace lockstep::bench {

double cpu_fma_peak_avx2() {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  constexpr long kIters = 20'000'000;
  std::vector<float> sink(threads);
  auto work = [&](unsigned t) {
    __m256 acc[10];
    for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(float(i + t));
    const __m256 a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(1e-4f);
    for (long it = 0; it < kIters; ++it)
      for (int i = 0; i < 10; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, acc[i]);
    sink[t] = _mm256_cvtss_f32(s);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = sink[0];
  (void)keep;
  return 2.0 * 8 * 10 * double(kIters) * threads / s / 1e9;
}

// GB/s of one pass over in[0, n) by all hardware threads (the median of `reps` passes).
double cpu_read_avx2(const float* in, std::size_t n, int reps) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<float> sink(threads);
  auto work = [&](unsigned t) {
    const std::size_t per = n / threads / 32 * 32, b = t * per, e = b + per;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (std::size_t i = b; i < e; i += 32)
      for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_loadu_ps(in + i + 8 * k));
    const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    sink[t] = _mm256_cvtss_f32(s);
  };
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work, t);
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(double(n / threads / 32 * 32 * threads) * sizeof(float) / s / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace lockstep::bench
