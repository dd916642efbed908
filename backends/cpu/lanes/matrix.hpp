// Matrix-instruction emulation: fp16 storage and the tensor-core operations (wmma tiles,
// mma.sync fragments, warpgroup products, bulk tiles) as CpuExec runs them.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

template <int PW>
class MatrixEmulation {
  template <class T>
  using Lanes = LaneArray<T, PW>;
  static constexpr int kWarps = PW / 32;

 public:
  // --- fp16 storage and warp-level 16x16x16 matrix tiles (the tensor-core operations) ---------
  // half_t is fp16 storage (bits). A tile operation is executed by every warp of the block; the
  // offsets are lane values that are uniform within each warp (each warp's tile).
  using half_t = std::uint16_t;
  struct AccTile {
    alignas(64) float v[kWarps][256];
  };
  template <LaneExpr O, class V, class M>
  void store_half(half_t* base, O&& off, V&& val, M&& mask) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    const Lanes<float> v(wrap<float>(std::forward<V>(val)));
    const Lanes<bool> m(wrap<bool>(std::forward<M>(mask)));
    for (int i = 0; i < PW; ++i)
      if (m[i]) base[o[i]] = math::half_bits_rn(v[i]);
  }
  template <LaneExpr O, class V>
  void store_half(half_t* base, O&& off, V&& val) const {
    store_half(base, std::forward<O>(off), std::forward<V>(val), true);
  }
  void tile_zero(AccTile& t) const {
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 256; ++i) t.v[w][i] = 0.0f;
  }
  // acc += A x B for the warp's 16x16 row-major fp16 tiles A (at a_off, leading dimension lda)
  // and B. Note [tensor-core emulation]: every product of two fp16 values is exact; the 16
  // products and the accumulator are summed in float64 and rounded once to fp32 per 16x16x16
  // step: the same tiles and rounding points as the hardware, whose internal summation is not
  // IEEE-specified (docs/numerics.md gives the measured difference).
  template <class OA, class OB>
  void tile_mma(AccTile& acc, const half_t* A, const OA& a_off, int lda, const half_t* B,
                const OB& b_off, int ldb) const {
    const Lanes<std::int32_t> ao(a_off), bo(b_off);
    for (int w = 0; w < kWarps; ++w) {
      const half_t* a = A + ao[w * 32];
      const half_t* b = B + bo[w * 32];
      double af[16][16], bf[16][16];
      for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 16; ++k) {
          af[i][k] = math::half_bits_to_float(a[i * lda + k]);
          bf[i][k] = math::half_bits_to_float(b[i * ldb + k]);
        }
      float* c = acc.v[w];
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
          double sum = c[i * 16 + j];
          for (int k = 0; k < 16; ++k) sum += af[i][k] * bf[k][j];
          c[i * 16 + j] = static_cast<float>(sum);
        }
    }
  }
  template <class O>
  void tile_store(float* C, const O& c_off, int ldc, const AccTile& acc) const {
    const Lanes<std::int32_t> co(c_off);
    for (int w = 0; w < kWarps; ++w) {
      float* c = C + co[w * 32];
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) c[i * ldc + j] = acc.v[w][i * 16 + j];
    }
  }
  template <class O>
  void tile_load(AccTile& acc, const float* C, const O& c_off, int ldc) const {
    const Lanes<std::int32_t> co(c_off);
    for (int w = 0; w < kWarps; ++w) {
      const float* c = C + co[w * 32];
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) acc.v[w][i * 16 + j] = c[i * ldc + j];
    }
  }

  // --- register fragments of mma.sync.m16n8k16 (backends/cuda/exec/matrix.cuh has the layout)
  // A fragment register is an int32 lane value holding two fp16 bit patterns (low half first).
  // ldmatrix_x4: lane 8i + r of each warp gives the offset of row r of 8x8 matrix i; lane 4g + t
  // receives row g, columns 2t and 2t + 1 of matrix i in r[i] (_trans: column g, rows 2t, 2t + 1).
  template <LaneExpr O>
  void ldmatrix_x4(Lanes<std::int32_t> (&r)[4], const half_t* base, O&& off) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < 32; ++l) {
          const half_t* row = base + o[w * 32 + 8 * i + (l >> 2)] + 2 * (l & 3);
          r[i].set(w * 32 + l, pack_bits(row[0], row[1]));
        }
  }
  template <LaneExpr O>
  void ldmatrix_x4_trans(Lanes<std::int32_t> (&r)[4], const half_t* base, O&& off) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    for (int w = 0; w < kWarps; ++w)
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < 32; ++l) {
          const int c = l >> 2, r0 = 2 * (l & 3);
          r[i].set(w * 32 + l, pack_bits(base[o[w * 32 + 8 * i + r0] + c], base[o[w * 32 + 8 * i + r0 + 1] + c]));
        }
  }
  // Two floats rounded to fp16 (nearest even), lo in the low half (CUDA __floats2half2_rn).
  template <class A, class B>
  Lanes<std::int32_t> pack_half2(const A& lo, const B& hi) const {
    return pack2(lo, hi, ::lockstep::half{});
  }
  // The same in the element format E (half or bfloat16; CUDA __floats2bfloat162_rn for bfloat16).
  template <class A, class B, class E>
  Lanes<std::int32_t> pack2(const A& lo, const B& hi, E) const {
    const Lanes<float> a(wrap<float>(lo)), b(wrap<float>(hi));
    Lanes<std::int32_t> r;
    for (int i = 0; i < PW; ++i) r.set(i, pack_bits(elem_rn<E>(a[i]), elem_rn<E>(b[i])));
    return r;
  }
  // One value per active lane rounded to E into 16-bit storage (store_half for half).
  template <class E, LaneExpr O, class V>
  void store_elem(E, half_t* base, O&& off, V&& val) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    const Lanes<float> v(wrap<float>(std::forward<V>(val)));
    for (int i = 0; i < PW; ++i) base[o[i]] = elem_rn<E>(v[i]);
  }
  // c += A (16x16) x B (16x8) for each warp, Note [tensor-core emulation]: the 16 exact products
  // of a row and column and the accumulator are summed in float64 and rounded once to fp32. The
  // fragments hold elements of format E (half, or bfloat16: the .bf16 instruction).
  template <class E = ::lockstep::half>
  void mma_16816(Lanes<float> (&c)[4], const Lanes<std::int32_t> (&a)[4], const Lanes<std::int32_t>& b0,
                 const Lanes<std::int32_t>& b1, E = {}) const {
    for (int w = 0; w < kWarps; ++w) {
      double A[16][16], Bm[16][8];
      float C[16][8];
      for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = 2 * (l & 3), i = w * 32 + l;
        auto lo = [](std::int32_t v) { return double(elem_to_float<E>(half_t(std::uint32_t(v) & 0xffffu))); };
        auto hi = [](std::int32_t v) { return double(elem_to_float<E>(half_t(std::uint32_t(v) >> 16))); };
        A[g][t] = lo(a[0][i]), A[g][t + 1] = hi(a[0][i]);
        A[g + 8][t] = lo(a[1][i]), A[g + 8][t + 1] = hi(a[1][i]);
        A[g][t + 8] = lo(a[2][i]), A[g][t + 9] = hi(a[2][i]);
        A[g + 8][t + 8] = lo(a[3][i]), A[g + 8][t + 9] = hi(a[3][i]);
        Bm[t][g] = lo(b0[i]), Bm[t + 1][g] = hi(b0[i]);
        Bm[t + 8][g] = lo(b1[i]), Bm[t + 9][g] = hi(b1[i]);
        C[g][t] = c[0][i], C[g][t + 1] = c[1][i], C[g + 8][t] = c[2][i], C[g + 8][t + 1] = c[3][i];
      }
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
          double sum = C[r][n];
          for (int k = 0; k < 16; ++k) sum += A[r][k] * Bm[k][n];
          C[r][n] = static_cast<float>(sum);
        }
      for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = 2 * (l & 3), i = w * 32 + l;
        c[0].set(i, C[g][t]), c[1].set(i, C[g][t + 1]), c[2].set(i, C[g + 8][t]), c[3].set(i, C[g + 8][t + 1]);
      }
    }
  }
  // Warpgroup products (backends/cuda/exec/matrix.cuh has the layouts; Note [wgmma products]): the
  // kernels that use them give every warpgroup of the block the same B, so each warp's 16 rows
  // are its A fragment times that B, n-tile by n-tile, each as mma_16816 (Note [tensor-core
  // emulation]): the same bits as the mma.sync schedule over the same operands. The fences and
  // waits order nothing here (a block runs its statements in order).
  template <int NB, bool kTransB, class E = ::lockstep::half>
  void wgmma(Lanes<float> (&c)[NB / 8][4], const Lanes<std::int32_t> (&a)[4], const half_t* base, int off,
             int lbo, int sbo, bool accumulate, E e = {}) const {
    auto b_at = [&](int k, int n) -> half_t {
      return base[off + (kTransB ? n % 8 + (n / 8) * sbo + (k % 8) * 8 + (k / 8) * lbo
                                 : (n % 8) * 8 + (n / 8) * sbo + k % 8 + (k / 8) * lbo)];
    };
    if (!accumulate)
      for (int n8 = 0; n8 < NB / 8; ++n8)
        for (int e = 0; e < 4; ++e) c[n8][e] = Lanes<float>(0.0f);
    for (int n8 = 0; n8 < NB / 8; ++n8) {
      Lanes<std::int32_t> b0, b1;
      for (int i = 0; i < PW; ++i) {
        const int l = i & 31, n = 8 * n8 + (l >> 2), t = 2 * (l & 3);
        b0.set(i, pack_bits(b_at(t, n), b_at(t + 1, n)));
        b1.set(i, pack_bits(b_at(t + 8, n), b_at(t + 9, n)));
      }
      mma_16816(c[n8], a, b0, b1, e);
    }
  }
  void wgmma_fence() const {}
  void wgmma_commit() const {}
  template <int P>
  void wgmma_wait() const {}
  template <int K>
  void wgmma_hold(Lanes<float> (&)[K][4]) const {}
  template <int K>
  void wgmma_keep(Lanes<std::int32_t> (&)[K][4], int) const {}
  template <int K>
  void wgmma_ready(Lanes<std::int32_t> (&)[K][4]) const {}
  // Bulk tiles (backends/cuda/exec/matrix.cuh): the copies happen where they are issued, and every
  // wait is already satisfied (a block runs its statements in order).
  void mbar_init(std::uint64_t*, int) const {}
  void mbar_wait(std::uint64_t*, int) const {}
  void mbar_arrive_warp(std::uint64_t*) const {}
  void bulk_tiles(std::uint64_t*, std::uint64_t*, int, bool, half_t* dst0, const half_t* src0, half_t* dst1,
                  const half_t* src1, int bytes) const {
    std::memcpy(dst0, src0, std::size_t(bytes));
    std::memcpy(dst1, src1, std::size_t(bytes));
  }
  // Four 32-bit words per lane to base[off .. off + 3] (CUDA: one 16-byte store).
  template <LaneExpr O, class W0, class W1, class W2, class W3>
  void store_words4(std::int32_t* base, O&& off, const W0& w0, const W1& w1, const W2& w2, const W3& w3) const {
    const Lanes<std::int32_t> o(wrap<std::int32_t>(std::forward<O>(off)));
    const Lanes<std::int32_t> a(wrap<std::int32_t>(w0)), b(wrap<std::int32_t>(w1)), c(wrap<std::int32_t>(w2)),
        d(wrap<std::int32_t>(w3));
    for (int i = 0; i < PW; ++i) {
      std::int32_t* p = base + o[i];
      p[0] = a[i], p[1] = b[i], p[2] = c[i], p[3] = d[i];
    }
  }
  // 16 bytes (8 halves) per active lane into shared memory, zeros where the mask is false.
  template <LaneExpr DO, LaneExpr SO, class M>
  void copy8h_async(half_t* dst, DO&& doff, const half_t* src, SO&& soff, M&& mask) const {
    const Lanes<std::int32_t> od(wrap<std::int32_t>(std::forward<DO>(doff)));
    const Lanes<std::int32_t> os(wrap<std::int32_t>(std::forward<SO>(soff)));
    const Lanes<bool> m(wrap<bool>(std::forward<M>(mask)));
    for (int i = 0; i < PW; ++i) {
      if (m[i])
        std::memcpy(dst + od[i], src + os[i], 16);
      else
        std::memset(dst + od[i], 0, 16);
    }
  }

 private:
  template <class E>
  static half_t elem_rn(float v) {
    if constexpr (std::is_same_v<E, ::lockstep::bfloat16>) return ::lockstep::to_bfloat16(v).bits;
    else return math::half_bits_rn(v);
  }
  template <class E>
  static float elem_to_float(half_t bits) {
    if constexpr (std::is_same_v<E, ::lockstep::bfloat16>) return ::lockstep::to_float(::lockstep::bfloat16{bits});
    else return math::half_bits_to_float(bits);
  }
  static std::int32_t pack_bits(half_t lo, half_t hi) {
    return static_cast<std::int32_t>(std::uint32_t(lo) | (std::uint32_t(hi) << 16));
  }
};

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
