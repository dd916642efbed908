// CpuExec<N>: the execution context of one block of N threads on the CPU device, built from the
// lanes' memory, cross-lane, matrix and row-form parts.
// Part of lanes.hpp, which includes the parts in order (no #pragma once: see there).

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

// ================================================================================================
// CpuExec<N>: the execution context of one block of N threads.
// ================================================================================================
struct BlockCoords {
  std::uint32_t bx = 0, by = 0, bz = 0;
  std::uint32_t gx = 1, gy = 1, gz = 1;
};

// Note [warp passes]
// CpuExec<N> runs a block's N threads statement by statement, each lane value an array of N in
// memory. A kernel whose warps never meet (no sync, no shared memory, no block-wide operation,
// no global memory that one warp writes and another reads: kernels::warp_independent_v) may
// instead run as N / 32 passes of one warp each, CpuExec<N, 32>: lane values of 32 elements,
// which the compiler can keep in registers across statements. Every lane computes the same
// operations in the same order, so the bits do not change (tested against block-wide passes,
// LOCKSTEP_CPU_BLOCK_PASSES=1); only the order in which a block's warps run does, which such a
// kernel cannot observe.
template <int N, int PW = N>
class CpuExec : public LaneMath,
                public LaneMemory<PW>,
                public CrossLane<PW>,
                public MatrixEmulation<PW>,
                public DecodeRows<PW>,
                public ExactRows,
                public SoftmaxRows {
  static_assert(N % 32 == 0 && N >= 32 && N <= 1024, "threads per block: a multiple of 32");
  static_assert(PW == N || PW == 32, "a pass is the whole block or one warp");

 public:
  static constexpr int kThreads = N;
  static constexpr int kPassLanes = PW;     // threads per pass (Note [warp passes])
  static constexpr int kWarps = PW / 32;    // warps per pass
  static constexpr bool kIsCpu = true;
  template <class T>
  using Lanes = LaneArray<T, PW>;

  // The device's paths (CpuDeviceOptions): Notes [row-major decode], [row-major exact] and
  // [row-major softmax].
  CpuExec(char* shared, std::size_t shared_bytes, const CpuPaths& paths)
      : smem_(shared),
        smem_cap_(shared_bytes),
        row_major_decode_(!paths.decode_lanes),
        row_major_exact_(!paths.exact_lanes),
        row_major_softmax_(!paths.softmax_lanes) {}
  void begin_block(const BlockCoords& b) {
    blk_ = b;
    smem_off_ = 0;
    base_ = 0;
  }
  // Warp passes (Note [warp passes]): the pass runs threads 32 w .. 32 w + 31.
  void begin_warp(int w) {
    static_assert(PW == 32, "warp passes only");
    base_ = 32 * w;
  }
  // Called by every block-wide operation (sync, shared memory, votes, signals, tickets): it does
  // not compile in a warp pass (instantiated only where a kernel uses one of them).
  void block_wide() const {
    static_assert(PW == N, "block-wide operation in a warp pass: the kernel is not warp-independent");
  }

  // --- indices (block-uniform ones are plain ints) ---
  int block_x() const { return static_cast<int>(blk_.bx); }
  int block_y() const { return static_cast<int>(blk_.by); }
  int block_z() const { return static_cast<int>(blk_.bz); }
  int grid_x() const { return static_cast<int>(blk_.gx); }
  int grid_y() const { return static_cast<int>(blk_.gy); }
  int grid_z() const { return static_cast<int>(blk_.gz); }
  ThreadIdx thread() const { return {base_}; }
  auto lane() const { return ThreadIdx{base_} & 31; }
  auto warp() const { return ThreadIdx{base_} >> 5; }

  // --- shared memory: carved in call order from the launch's dynamic shared bytes ---
  template <class T>
  T* shared(std::size_t count) {
    block_wide();
    smem_off_ = (smem_off_ + 31) & ~std::size_t{31};
    T* p = reinterpret_cast<T*>(smem_ + smem_off_);
    smem_off_ += count * sizeof(T);
    if (smem_off_ > smem_cap_) shared_overflow(smem_off_, smem_cap_);
    return p;
  }
  void sync() const { block_wide(); }  // lockstep: every thread already reached this statement

  // Overlapped launches: the CPU device runs a stream's kernels one after another, so there is
  // nothing to wait for and nothing to allow (backends/cuda/cuda_exec.cuh has the GPU's meaning).
  void wait_prior_grids() const {}
  void allow_dependent_grids() const {}
  // Block signals (Note [block signals] in kernels/decode/params.hpp). Kernels run one after
  // another here, so a wait on an earlier kernel finds its signals already given (a wait within one grid,
  // Note [one grid], may yield for them); the atomics order blocks of one launch, which run in
  // parallel.
  void signal(std::int32_t* c) const {
    block_wide();
    std::atomic_ref<std::int32_t>(*c).fetch_add(1, std::memory_order_acq_rel);
  }
  // Note [device positions] (kernels/decode/params.hpp): *c = max(*c, v); blocks of one launch run on
  // several threads here too, so the update is atomic. Idempotent, so a warp pass (which runs a
  // block's scalar code once per warp) may call it.
  void status_max(std::int32_t* c, int v) const {
    std::atomic_ref<std::int32_t> a(*c);
    std::int32_t cur = a.load(std::memory_order_relaxed);
    while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
  bool signal_last(std::int32_t* c, int target) const {  // Note [folded merge]
    block_wide();
    std::atomic_ref<std::int32_t> a(*c);
    const bool last = a.fetch_add(1, std::memory_order_acq_rel) == target - 1;
    if (last) a.store(0, std::memory_order_relaxed);
    return last;
  }
  // The signalling kernel has finished here, so the count is final: anything but the target is
  // a counter left over by an interrupted call, which the GPU could only wait on forever (or pass
  // too early); it is reported as a bug instead. same_grid (Note [one grid]): the signalling
  // blocks are in this launch and may still run on other threads; the wait yields until they
  // have signalled (they hold lower tickets and never wait, so they finish), and a count that is
  // still short after a minute is reported as the same bug.
  int wait_signals(std::int32_t* c, int target, bool same_grid = false) const {
    block_wide();
    std::atomic_ref<std::int32_t> a(c[0]);
    std::int32_t count = a.load(std::memory_order_acquire);
    if (same_grid && count < target) count = wait_for_count(a, target);
    if (count != target) signals_mismatch(count, target);
    return std::atomic_ref<std::int32_t>(c[1]).fetch_add(1, std::memory_order_acq_rel);
  }
  // Note [packing blocks]: copies are plain reads here, ordered by the signals' atomics.
  void proxy_fence_global() const {}
  // Note [one grid]: the block's ticket (*c before the add); ticket total - 1 resets *c.
  int block_ticket(std::int32_t* c, int total) const {
    block_wide();
    std::atomic_ref<std::int32_t> a(*c);
    const std::int32_t t = a.fetch_add(1, std::memory_order_acq_rel);
    if (t == total - 1) a.store(0, std::memory_order_relaxed);
    return t;
  }
  // The CPU device runs kernels one after another: no grid overlaps the next.
  int block_ticket_before_wait(std::int32_t* c, int total) const { return block_ticket(c, total); }
  void release_signals(std::int32_t* c, int ticket, int readers) const {
    block_wide();
    if (ticket != readers - 1) return;
    std::atomic_ref<std::int32_t>(c[1]).store(0, std::memory_order_release);
    std::atomic_ref<std::int32_t>(c[0]).store(0, std::memory_order_release);
  }

  // Block-wide vote (CUDA __syncthreads_or / __syncthreads_and); also a barrier.
  template <class M>
  bool any(const M& m) const {
    block_wide();
    const auto& w = wrap<bool>(m);
    for (int c = 0; c < PW / kL; ++c)
      if (!hn::AllFalse(DI(), w.eval(c).m)) return true;
    return false;
  }
  template <class M>
  bool all(const M& m) const {
    block_wide();
    const auto& w = wrap<bool>(m);
    for (int c = 0; c < PW / kL; ++c)
      if (!hn::AllTrue(DI(), w.eval(c).m)) return false;
    return true;
  }

  // The CPU row forms (rows/*.hpp) run unless the environment asks for the lane code (read in the
  // constructor): Notes [row-major decode], [row-major exact], [row-major softmax].
  bool row_major_decode() const { return row_major_decode_; }
  bool row_major_exact() const { return row_major_exact_; }
  bool row_major_softmax() const { return row_major_softmax_; }
#if HWY_MAX_BYTES >= 32 && HWY_NATIVE_FMA
  // The rows of this pass's warps (warp w: row w of the block, `in` and `out` at the block's
  // first row); warps at or past `live` have no row and touch nothing.
  void softmax_rows(const float* in, float* out, int n, int live) const {
    for (int w = base_ / 32; w < base_ / 32 + kWarps && w < live; ++w)
      softmax_row(in + std::int64_t(w) * n, out + std::int64_t(w) * n, n);
  }
#endif

 private:
  [[noreturn]] static void shared_overflow(std::size_t need, std::size_t have);
  [[noreturn]] static void signals_mismatch(int count, int target);
  static std::int32_t wait_for_count(std::atomic_ref<std::int32_t> a, int target);

  BlockCoords blk_;
  char* smem_;
  std::size_t smem_cap_;
  bool row_major_decode_ = true;
  bool row_major_exact_ = true;
  bool row_major_softmax_ = true;
  std::size_t smem_off_ = 0;
  std::int32_t base_ = 0;  // the pass's first thread (Note [warp passes])
};

template <int N, int PW>
void CpuExec<N, PW>::shared_overflow(std::size_t need, std::size_t have) {
  ::lockstep::detail::assertion_failed("shared memory carved <= launch shared_bytes", __FILE__,
                                       __LINE__,
                                       ("kernel carved " + std::to_string(need) +
                                        " bytes of shared memory but was launched with " +
                                        std::to_string(have))
                                           .c_str());
}

template <int N, int PW>
void CpuExec<N, PW>::signals_mismatch(int count, int target) {
  ::lockstep::detail::assertion_failed("block signals == target when the waiting kernel runs",
                                       __FILE__, __LINE__,
                                       ("counter at " + std::to_string(count) + ", expected " +
                                        std::to_string(target) + " (Note [block signals])")
                                           .c_str());
}

template <int N, int PW>
std::int32_t CpuExec<N, PW>::wait_for_count(std::atomic_ref<std::int32_t> a, int target) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  std::int32_t count = a.load(std::memory_order_acquire);
  while (count < target && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
    count = a.load(std::memory_order_acquire);
  }
  return count;
}

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
