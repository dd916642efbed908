#pragma once
// Row softmax, one warp per row (the worked example of docs/kernels.md).
//
// out[r, j] = exp(in[r, j] - max_r) / sum_j exp(in[r, j] - max_r)
//
// Three passes over the row: the max, the sum of exponentials, the normalized output (the
// exponentials are recomputed, identically, rather than stored; rows of up to 1024, held in
// registers, keep them instead: Note [softmax exponentials once]). Each lane walks the row with a
// stride of 32 and keeps its own running max / sum; the warp then combines the 32 partial values
// with the fixed butterfly (Note [max is commutative]). So the summation order depends only on the
// row length, never on the backend, the number of rows or the launch.
//
// Edge cases: a row of only -inf gives zeros (the max is -inf, and exp(-inf - -inf) would be NaN);
// a NaN anywhere in a row makes that row all NaN and no other; +inf in a row gives NaN.

#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

// Note [softmax exponentials once]
// Rows held in registers (n <= 1024) compute each exp(x - max) once, in the sum's loop, into the
// value's own register, and divide that register for the output; longer rows, read from memory
// in each pass, compute it again in the output pass on the GPU (where it is memory-bound and a
// second pass over `out` would cost DRAM traffic), while the CPU device stores it in `out` in the
// sum's pass and divides it there (arithmetic-bound: 1024 x 32768 from 19.9-20.5 ms to
// 16.0-16.7 ms, 65-71% of the read ceiling from 51%). Both give the same bits (the same function of
// the same float, in the same order; the tests compare the two paths' bytes at the boundary and
// the CPU with the float64 oracle). The exponential is the strict one (math::exp), about twenty
// instructions: on the CPU device, which runs this arithmetic-bound, once instead of twice per
// element took 32768 x 1024 from 22.0-22.7 ms to 13.5-15.3 ms (twenty-second session, AVX-512
// machine: 73-74% of the read ceiling); on the GPU it holds the exponentials in the values' own
// registers, and has not yet run there.
// Note [row-major softmax]
// On the CPU device's avx2 and avx3 variants each warp's row is computed by x.softmax_rows
// (backends/cpu/lanes.hpp) with SIMD loads straight from the row, every value by the same
// operations in the same order as the lane that computes it here (the CPU branch below: each
// exponential once, kept in `out`); LOCKSTEP_CPU_SOFTMAX_LANES=1 runs this code instead, and the
// tests compare the two paths' bytes (CpuRowMajor.SoftmaxGivesTheLaneBytes). The row-major code
// is 1.2-1.4x faster on AVX2 (docs/performance.md; not because it skips the lane machinery's
// offset, mask and contiguity checks: a lane mechanism without them was as slow, branch
// lane-structure). Like Notes [row-major decode] and [row-major exact], this
// writes a kernel's arithmetic a second time, in the backend (docs/architecture.md).
LOCKSTEP_FLAG_TRAIT(has_row_major_softmax, kRowMajorSoftmax)  // hd.hpp

struct SoftmaxRowsParams {
  const float* in;
  float* out;
  std::int64_t rows;
  std::int64_t n;  // row length, 1 <= n; rows are contiguous
};

// Two kernels (Note [two softmax kernels]): rows of up to kCachedMax held in registers
// (SoftmaxRows), longer rows read from memory in each pass (SoftmaxRowsLong); the host picks by n.
template <bool kLong>
struct SoftmaxRowsT {
  static constexpr const char* kName = kLong ? "softmax_rows_long" : "softmax_rows";
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / kWarpSize;
  static constexpr int kCachedMax = 1024;  // rows up to this length are held in registers
  static constexpr int kBatch = 8;         // loads in flight per lane on long rows (Note [batched loads])
  static constexpr bool kWarpIndependent = true;  // a row per warp, nothing shared (hd.hpp)
  using Params = SoftmaxRowsParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t row0 = std::int64_t{x.block_x()} * kRowsPerBlock;
    const int live = static_cast<int>(imin(p.rows - row0, kRowsPerBlock));
    const int n = static_cast<int>(p.n);
    const float* in = p.in + row0 * p.n;
    float* out = p.out + row0 * p.n;
    if constexpr (has_row_major_softmax<X>::value) {
      if (x.row_major_softmax()) {  // Note [row-major softmax]
        x.softmax_rows(in, out, n, live);
        return;
      }
    }

    const I lane = x.lane();
    const I base = x.warp() * n + lane;
    const B row_ok = x.warp() < live;

    if constexpr (!kLong) {
      // Rows of up to 1024: the row stays in registers (32 values per lane), read once from
      // memory. The same operations in the same order as the general path below: same bits.
      // Every load is issued first (masked, so lanes past the row read nothing and hold -inf,
      // which changes neither the max nor, as exp(-inf) = +0, the sum).
      F vals[kCachedMax / kWarpSize];
      LOCKSTEP_UNROLL
      for (int k = 0; k < kCachedMax / kWarpSize; ++k)
        vals[k] = x.load(in, base + k * kWarpSize, row_ok & (lane < n - k * kWarpSize), -kInf);
      F m = -kInf;
      LOCKSTEP_UNROLL
      for (int k = 0; k < kCachedMax / kWarpSize; ++k) m = x.max(m, vals[k]);
      m = x.warp_max(m);
      const B empty = m == -kInf;
      // Each exponential is computed once and kept in its value's register (Note [softmax
      // exponentials once]): the sum adds, and the output divides, the very values the general
      // path below computes twice.
      F s = 0.0f;
      LOCKSTEP_UNROLL
      for (int k = 0; k < kCachedMax / kWarpSize; ++k)
        if (k * kWarpSize < n) {
          vals[k] = x.exp(vals[k] - m);
          s = s + vals[k];
        }
      s = x.warp_sum(s);
      LOCKSTEP_UNROLL
      for (int k = 0; k < kCachedMax / kWarpSize; ++k)
        if (k * kWarpSize < n)
          x.store(out, base + k * kWarpSize, x.select(empty, 0.0f, vals[k] / s), row_ok & (lane < n - k * kWarpSize));
    } else {
      run_long(x, in, out, n, lane, base, row_ok);
    }
  }

  // Rows longer than kCachedMax: three passes over the row in memory.
  template <class X, class I, class B>
  LOCKSTEP_HD static void run_long(X& x, const float* in, float* out, int n, const I& lane, const I& base,
                                   const B& row_ok) {
    using F = typename X::template Lanes<float>;

    // Note [batched loads]
    // On the GPU each pass issues kBatch loads per lane before using any: the output pass's
    // division has a slow path whose branch kept ptxas from hoisting the next load above it, so
    // a warp had one load in flight there (the max and sum passes had four). Each value takes the
    // same operations in the same order as one by one: same bits (the max's order is free, and
    // lanes past the row hold -inf, which leaves it as it is). Rows of 32768 at 1 GiB on an H100:
    // 2.65-2.67 ms -> 1.63-1.65 ms, 27% -> 44% of the copy ceiling (run 155a). The three passes
    // read each row from DRAM (the rows in flight exceed the L2), so 50% is this design's bound
    // at that size. The CPU's lanes run the max pass the same way (one code for the max); its
    // sum and output passes are its own (Note [softmax exponentials once]).
    F m = -kInf;
    for (int j0 = 0; j0 < n; j0 += kWarpSize * kBatch) {
      F v[kBatch];
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int j = j0 + k * kWarpSize;
        v[k] = x.load(in, base + j, row_ok & (lane < n - j), -kInf);
      }
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k) m = x.max(m, v[k]);
    }
    m = x.warp_max(m);

    const B empty = m == -kInf;  // all -inf (or a padding-only lane group)
    F s = 0.0f;
    if constexpr (X::kIsCpu) {
      // Note [softmax exponentials once]: the CPU device keeps each exponential in `out` (the
      // row's own elements, each written and read back by the lane that computed it; `out` is
      // `in` itself or does not overlap it) and divides it there, where the GPU recomputes it.
      for (int j = 0; j < n; j += kWarpSize) {
        const B ok = row_ok & (lane < n - j);
        const F e = x.exp(x.load(in, base + j, ok, -kInf) - m);
        x.store(out, base + j, e, ok);
        s = s + e;
      }
      s = x.warp_sum(s);
      for (int j = 0; j < n; j += kWarpSize) {
        const B ok = row_ok & (lane < n - j);
        x.store(out, base + j, x.select(empty, 0.0f, x.load(out, base + j, ok, 0.0f) / s), ok);
      }
      return;
    }
    // Note [batched loads] (above).
    for (int j0 = 0; j0 < n; j0 += kWarpSize * kBatch) {
      F v[kBatch];
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int j = j0 + k * kWarpSize;
        v[k] = x.load(in, base + j, row_ok & (lane < n - j), -kInf);
      }
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k)
        if (j0 + k * kWarpSize < n) s = s + x.exp(v[k] - m);
    }
    s = x.warp_sum(s);

    for (int j0 = 0; j0 < n; j0 += kWarpSize * kBatch) {
      F v[kBatch];
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int j = j0 + k * kWarpSize;
        v[k] = x.load(in, base + j, row_ok & (lane < n - j), -kInf);
      }
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int j = j0 + k * kWarpSize;
        if (j < n) x.store(out, base + j, x.select(empty, 0.0f, x.exp(v[k] - m) / s), row_ok & (lane < n - j));
      }
    }
  }
};

// Note [two softmax kernels]
// The register path (n <= kCachedMax) and the long rows were one kernel with a branch on n until
// the thirty-second session. Then batching the long rows' loads (Note [batched loads]) changed
// how ptxas scheduled the register path, which it never runs: with the max pass batched too,
// 5 of its 32 loads were issued before its first max instead of 16 (1.8x slower at n = 1024,
// run 155a); without, 3.5% slower still (run 155b). As two kernels each is compiled alone, and
// the register path's code is the one it had before. The host picks the kernel by n
// (launch_softmax); the bits are those of the one kernel (the tests compare n = 1024 with
// n = 1025 padded by -inf, one kernel against the other).
using SoftmaxRows = SoftmaxRowsT<false>;
using SoftmaxRowsLong = SoftmaxRowsT<true>;

}  // namespace lockstep::kernels
