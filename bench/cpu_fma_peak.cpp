// The CPU's native ceilings, in the SIMD width of the CPU device's variant (Note [SIMD variants] in
// docs/architecture.md), on every hardware thread: the fp32 arithmetic peak (independent chains in
// registers), the DRAM read bandwidth (sums of a large buffer) and the copy bandwidth. Compiled
// once per width (bench/CMakeLists.txt) with LOCKSTEP_BENCH_NS = avx512 / avx2 / sse2 and that
// width's -m flags; cpu_fma_dispatch.cpp calls the one the device runs, only where the CPU has it.
// Each is the best of several passes: a ceiling is what the machine gives at best, and a busy
// machine only ever makes a pass slower.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace lockstep::bench::LOCKSTEP_BENCH_NS {

namespace {
#if defined(__AVX512F__)
using V = __m512;
constexpr int kLanes = 16;
inline V splat(float x) { return _mm512_set1_ps(x); }
inline V zero() { return _mm512_setzero_ps(); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, V a) { _mm512_storeu_ps(p, a); }
inline void stream(float* p, V a) { _mm512_stream_ps(p, a); }  // p 64-byte aligned
constexpr std::size_t kAlign = 64;
inline float first(V a) { return _mm512_cvtss_f32(a); }
#elif defined(__AVX2__) && defined(__FMA__)
using V = __m256;
constexpr int kLanes = 8;
inline V splat(float x) { return _mm256_set1_ps(x); }
inline V zero() { return _mm256_setzero_ps(); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, V a) { _mm256_storeu_ps(p, a); }
inline void stream(float* p, V a) { _mm256_stream_ps(p, a); }
constexpr std::size_t kAlign = 32;
inline float first(V a) { return _mm256_cvtss_f32(a); }
#else
// x86-64's baseline, SSE2: no fused multiply-add; a multiply and an add, 2 FLOPs.
using V = __m128;
constexpr int kLanes = 4;
inline V splat(float x) { return _mm_set1_ps(x); }
inline V zero() { return _mm_setzero_ps(); }
inline V add(V a, V b) { return _mm_add_ps(a, b); }
inline V fma(V a, V b, V c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
inline V load(const float* p) { return _mm_loadu_ps(p); }
inline void store(float* p, V a) { _mm_storeu_ps(p, a); }
inline void stream(float* p, V a) { _mm_stream_ps(p, a); }
constexpr std::size_t kAlign = 16;
inline float first(V a) { return _mm_cvtss_f32(a); }
#endif

unsigned hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Seconds for work(t) on every hardware thread t at once.
template <class F>
double on_every_thread(F&& work) {
  const unsigned threads = hardware_threads();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GFLOP/s of kFma chains of fused multiply-adds (2 FLOPs) and kAdd chains of adds (1 FLOP), all
// independent, `iters` steps each, on every thread.
template <int kFma, int kAdd>
double arithmetic_gflops(long iters) {
  std::vector<float> sink(hardware_threads());
  const double s = on_every_thread([&](unsigned t) {
    V f[kFma], a[kAdd > 0 ? kAdd : 1];
    for (int i = 0; i < kFma; ++i) f[i] = splat(float(i + int(t)));
    for (int i = 0; i < kAdd; ++i) a[i] = splat(float(i));
    const V x = splat(0.9999f), y = splat(1e-4f);
    for (long it = 0; it < iters; ++it) {
      for (int i = 0; i < kFma; ++i) f[i] = fma(f[i], x, y);
      for (int i = 0; i < kAdd; ++i) a[i] = add(a[i], y);
    }
    V sum = f[0];
    for (int i = 1; i < kFma; ++i) sum = add(sum, f[i]);
    for (int i = 0; i < kAdd; ++i) sum = add(sum, a[i]);
    sink[t] = first(sum);
  });
  volatile float keep = sink[0];
  (void)keep;
  return double(2 * kFma + kAdd) * kLanes * double(iters) * hardware_threads() / s / 1e9;
}
}  // namespace

// The fp32 peak: the better of fma chains alone and fma chains beside add chains (CPUs with
// separate add pipes, e.g. AMD Zen, run both at once; on others the adds take fma slots), each
// the best of `reps` passes of `iters` steps. More chains than the latency x issue width.
double fma_peak_gflops(long iters, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    best = std::max(best, arithmetic_gflops<10, 0>(iters));
    best = std::max(best, arithmetic_gflops<10, 8>(iters));
  }
  return best;
}

namespace {
// GB/s of one pass over in[0, n) by all hardware threads, each reading its slice as kStreams
// parts side by side (4 vectors of each per step, one accumulator per part).
template <int kStreams>
double read_streams_gbps(const float* in, std::size_t n) {
  constexpr std::size_t kStep = 4 * kLanes;
  const std::size_t part = n / hardware_threads() / kStreams / kStep * kStep;
  const std::size_t per = part * kStreams;
  std::vector<float> sink(hardware_threads());
  const double s = on_every_thread([&](unsigned t) {
    const float* base = in + t * per;
    V acc[kStreams];
    for (auto& a : acc) a = zero();
    for (std::size_t i = 0; i < part; i += kStep)
      for (int k = 0; k < kStreams; ++k) {
        const float* p = base + std::size_t(k) * part + i;
        acc[k] = add(acc[k], add(add(load(p), load(p + kLanes)), add(load(p + 2 * kLanes), load(p + 3 * kLanes))));
      }
    V sum = acc[0];
    for (int k = 1; k < kStreams; ++k) sum = add(sum, acc[k]);
    sink[t] = first(sum);
  });
  volatile float keep = sink[0];
  (void)keep;
  return double(per * hardware_threads()) * sizeof(float) / s / 1e9;
}
}  // namespace

// GB/s of one pass over in[0, n) by all hardware threads: the best of `reps` passes each reading
// every thread's slice front to back and as 4 and 8 parts side by side (more hardware prefetch
// streams: what a kernel whose blocks read several rows at once gets).
double read_gbps(const float* in, std::size_t n, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    best = std::max(best, read_streams_gbps<1>(in, n));
    best = std::max(best, read_streams_gbps<4>(in, n));
    best = std::max(best, read_streams_gbps<8>(in, n));
  }
  return best;
}

// GB/s (bytes read + bytes written) of copying in[0, n) to out by all hardware threads: the best
// of `reps` passes each with ordinary stores and with non-temporal ones (which skip reading the
// destination's lines first, where the CPU has them).
double copy_gbps(float* out, const float* in, std::size_t n, int reps) {
  constexpr std::size_t kStep = 4 * kLanes;
  const std::size_t per = n / hardware_threads() / kStep * kStep;
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % kAlign == 0 && per % (kAlign / sizeof(float)) == 0;
  double best = 0;
  for (int r = 0; r < reps; ++r)
    for (const bool nt : {false, true}) {
      if (nt && !aligned) continue;
      const double s = on_every_thread([&](unsigned t) {
        const std::size_t b = t * per, e = b + per;
        for (std::size_t i = b; i < e; i += kStep)
          for (std::size_t k = 0; k < 4; ++k) {
            const V v = load(in + i + k * kLanes);
            if (nt)
              stream(out + i + k * kLanes, v);
            else
              store(out + i + k * kLanes, v);
          }
        _mm_sfence();
      });
      best = std::max(best, 2.0 * double(per * hardware_threads()) * sizeof(float) / s / 1e9);
    }
  return best;
}

}  // namespace lockstep::bench::LOCKSTEP_BENCH_NS
