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

#include <type_traits>

#include "lockstep/formats.hpp"
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
// element took 32768 x 1024 from 22.0-22.7 ms to 13.5-15.3 ms (an AVX-512 machine: 73-74% of the
// read ceiling); on the GPU it holds the exponentials in the values' own
// registers, and has not yet run there.
// Note [row-major softmax]
// On the CPU device's avx2 and avx3 variants each warp's row is computed by x.softmax_rows
// (SoftmaxRowForm in softmax_rows.hpp) with SIMD loads straight from the row, every value by the same
// operations in the same order as the lane that computes it here (the CPU branch below: each
// exponential once, kept in `out`); LOCKSTEP_CPU_SOFTMAX_LANES=1 runs this code instead, and the
// tests compare the two paths' bytes (CpuRowMajor.SoftmaxGivesTheLaneBytes). The row-major code
// is 1.2-1.4x faster on AVX2 (docs/performance.md): it executes 2.3x fewer instructions per
// element (callgrind, tools/host/softmax_instructions.sh), the lane code's being mostly each
// chunk's contiguity and mask checks on every load and store. Like Notes [row-major decode] and [row-major exact], this
// writes a kernel's arithmetic a second time, beside it (Note [row forms] in row_form.hpp).
LOCKSTEP_FLAG_TRAIT(has_row_major_softmax, kRowMajorSoftmax)  // hd.hpp

// T: the rows' element type, float, half or bfloat16 (Note [decode formats]: loads widen, the
// output is rounded once).
template <class T = float>
struct SoftmaxRowsParams {
  const T* in;
  T* out;
  std::int64_t rows;
  std::int64_t n;  // row length, 1 <= n; rows are contiguous
};

// Note [softmax in formats]: with half or bfloat16 rows, the CPU device computes each exponential
// twice as the GPU does (keeping it in a 16-bit `out` would round it) and has no row form; the
// arithmetic and its order are the float kernel's, so the output is the float softmax of the
// widened row, rounded once (tested).
template <class T = float>
struct SoftmaxRows {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "softmax rows: float, half or bfloat16");
  static constexpr const char* kName = "softmax_rows";
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / kWarpSize;
  static constexpr int kCachedMax = 1024;  // rows up to this length are held in registers
  static constexpr int kBatch = 8;         // loads in flight per lane on the GPU's long rows
  static constexpr bool kWarpIndependent = true;  // a row per warp, nothing shared (hd.hpp)
  using Params = SoftmaxRowsParams<T>;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    const std::int64_t row0 = std::int64_t{x.block_x()} * kRowsPerBlock;
    const int live = static_cast<int>(imin(p.rows - row0, kRowsPerBlock));
    const int n = static_cast<int>(p.n);
    const T* in = p.in + row0 * p.n;
    T* out = p.out + row0 * p.n;
    if constexpr (has_row_major_softmax<X>::value && std::is_same_v<T, float>) {
      if (x.row_major_softmax()) {  // Note [row-major softmax]
        x.softmax_rows(in, out, n, live);
        return;
      }
    }

    const I lane = x.lane();
    const I base = x.warp() * n + lane;
    const B row_ok = x.warp() < live;

    if (n <= kCachedMax) {
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
      return;
    }

    F m = -kInf;
    for (int j = 0; j < n; j += kWarpSize) m = x.max(m, x.load(in, base + j, row_ok & (lane < n - j), -kInf));
    m = x.warp_max(m);

    const B empty = m == -kInf;  // all -inf (or a padding-only lane group)
    F s = 0.0f;
    if constexpr (X::kIsCpu && std::is_same_v<T, float>) {
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
    // Note [batched loads]
    // The GPU's sum and output passes issue kBatch loads per lane before using any: the output
    // pass's division has a slow path whose branch kept ptxas from hoisting the next load above
    // it, so a warp had one load in flight there. Each value takes the same operations in the
    // same order as one by one: same bits. Run 155b (H100, three rounds alternating with
    // 62c076c): rows of 32768 at 1 GiB 2.65-2.66 -> 1.73-1.74 ms, 27% -> 41% of the copy
    // ceiling; the three passes read each row from DRAM (the rows in flight exceed the L2), so
    // 50% is this design's bound there. But rows of 1024 (the register path above, which this
    // code never runs) 0.90-0.91 -> 0.935-0.941 ms, 79% -> 76%: ptxas schedules that path
    // differently once this code changes. Two variants were worse there: the max pass batched as
    // well (run 155a: 1.63-1.65 ms at 32768, but 1.60 ms at 1024, whose schedule issued 5 of its
    // 32 loads before the first max instead of 16), and the register path as a kernel of its own
    // (run 155c: 1.55-1.56 ms at 1024, 8 loads before the first max; 1.84 ms at 32768). So check
    // the register path's SASS and time both shapes after changing this kernel.
    for (int j0 = 0; j0 < n; j0 += kWarpSize * kBatch) {
      F v[kBatch];
      load_batch(x, v, in, base, lane, row_ok, n, j0);
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k)
        if (j0 + k * kWarpSize < n) s = s + x.exp(v[k] - m);
    }
    s = x.warp_sum(s);

    for (int j0 = 0; j0 < n; j0 += kWarpSize * kBatch) {
      F v[kBatch];
      load_batch(x, v, in, base, lane, row_ok, n, j0);
      LOCKSTEP_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int j = j0 + k * kWarpSize;
        if (j < n) x.store(out, base + j, x.select(empty, 0.0f, x.exp(v[k] - m) / s), row_ok & (lane < n - j));
      }
    }
  }

  // Note [batched loads]: each lane's kBatch values from j0 on, every load issued before any is
  // used (lanes past the row hold -inf and read nothing).
  template <class X, class F, class I, class B>
  LOCKSTEP_HD static void load_batch(X& x, F (&v)[kBatch], const T* in, const I& base, const I& lane,
                                     const B& row_ok, int n, int j0) {
    LOCKSTEP_UNROLL
    for (int k = 0; k < kBatch; ++k) {
      const int j = j0 + k * kWarpSize;
      v[k] = x.load(in, base + j, row_ok & (lane < n - j), -kInf);
    }
  }
};

}  // namespace lockstep::kernels
