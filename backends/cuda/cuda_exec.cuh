#pragma once
// CudaExec<N>: the execution context a kernel template is instantiated with on the GPU. A
// per-thread value is a register (Lanes<T> = T); every operation is the CUDA operation the CPU
// context (backends/cpu/lanes.hpp) reproduces bit for bit.
//
// Split by concept: exec/memory.cuh, exec/cross_lane.cuh, exec/matrix.cuh and exec/math.cuh hold
// the operations, which CudaExec inherits; this file holds the block (indices, shared memory,
// barriers, votes) and the ordering between blocks and grids (signals, tickets).

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "lockstep/kernels/math.hpp"
#include "exec/cross_lane.cuh"
#include "exec/math.cuh"
#include "exec/matrix.cuh"
#include "exec/memory.cuh"

namespace lockstep::cuda {

template <int N>
struct CudaExec : CudaMath, CudaMemory, CudaCrossLane, CudaMatrix {
  static_assert(N % 32 == 0 && N >= 32 && N <= 1024, "threads per block: a multiple of 32");
  static constexpr int kThreads = N;
  static constexpr int kWarps = N / 32;
  static constexpr bool kIsCpu = false;
  template <class T>
  using Lanes = T;

  std::size_t smem_off_ = 0;

  __device__ __forceinline__ int block_x() const { return static_cast<int>(blockIdx.x); }
  __device__ __forceinline__ int block_y() const { return static_cast<int>(blockIdx.y); }
  __device__ __forceinline__ int block_z() const { return static_cast<int>(blockIdx.z); }
  __device__ __forceinline__ int grid_x() const { return static_cast<int>(gridDim.x); }
  __device__ __forceinline__ int grid_y() const { return static_cast<int>(gridDim.y); }
  __device__ __forceinline__ int grid_z() const { return static_cast<int>(gridDim.z); }
  __device__ __forceinline__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ int lane() const { return static_cast<int>(threadIdx.x) & 31; }
  __device__ __forceinline__ int warp() const { return static_cast<int>(threadIdx.x) >> 5; }

  template <class T>
  __device__ __forceinline__ T* shared(std::size_t count) {
    extern __shared__ __align__(128) unsigned char lockstep_smem[];
    smem_off_ = (smem_off_ + 31) & ~std::size_t{31};
    T* p = reinterpret_cast<T*>(lockstep_smem + smem_off_);
    smem_off_ += count * sizeof(T);
    return p;
  }
  __device__ __forceinline__ void sync() const { __syncthreads(); }

  // Programmatic dependent launch (sm_90; Note [overlapped launches] in kernels/launch.hpp): a
  // kernel whose trait kOverlapsPrior is true may start before the previous kernel on its stream
  // has finished; wait_prior_grids() returns once that kernel's work is complete and visible.
  // allow_dependent_grids() lets the next such kernel be scheduled early.
  __device__ __forceinline__ void wait_prior_grids() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  }
  __device__ __forceinline__ void allow_dependent_grids() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  }

  // Block signals (Note [block signals] in kernels/decode/params.hpp). signal: the block's
  // global writes so far are released, then *c += 1 (once per block). wait_signals: returns once
  // *c >= target, with the writes released before those signals visible to every thread of the
  // block, and a ticket for release_signals: the last of the `readers` blocks that waited on c
  // resets c[0] and c[1] to zero there (the ticket's atomic is in flight meanwhile).
  //
  // Note [release and acquire]: one thread of the block does each after a barrier (the pattern of
  // CUTLASS's semaphore): the signal is a reduction with release semantics at GPU scope (SASS:
  // MEMBAR.ALL.GPU, then a fire-and-forget REDG), the wait polls with acquire loads (LDG.STRONG.GPU
  // and an L1 invalidate), and the fold's add is acquire-release (sm_70 and up; this library
  // builds for sm_90). __threadfence() (MEMBAR.SC.GPU, the sequentially consistent fence, which
  // also invalidates L1) around relaxed atomics and volatile (system-scope) polls would give the
  // same ordering, paid with the heavier fence at the end of every chunk block and after every
  // wait.
  __device__ __forceinline__ void signal(std::int32_t* c) const {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(c) : "memory");
  }
  // signal_last (Note [folded merge]): as signal, and returns true (block-uniform) in the one
  // block whose add brings *c to target; that block then sees every signalled write (the add's
  // acquire), and *c is zero again.
  __device__ __forceinline__ bool signal_last(std::int32_t* c, int target) const {
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) {
      int before;
      asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(c) : "memory");
      last = before == target - 1;
      if (last) atomicExch(c, 0);
    }
    return __syncthreads_or(last) != 0;
  }
  // same_grid (Note [one grid]): the signalling blocks are in this launch; the same wait.
  __device__ __forceinline__ int wait_signals(std::int32_t* c, int target, bool /*same_grid*/ = false) const {
    int ticket = 0;
    if (threadIdx.x == 0) {
      for (;;) {
        int v;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
        if (v >= target) break;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        __nanosleep(32);
#endif
      }
      // Relaxed, after the acquire in this thread's order; the last reader's reset
      // (release_signals) follows its own add by a control dependency only: a
      // poll cannot see the reset in practice, though the PTX model would need a release here and
      // an acquire before the reset to prove it (each costs a fence on the merge's critical path;
      // not measured).
      ticket = atomicAdd(c + 1, 1);
    }
    __syncthreads();
    return ticket;
  }
  // Note [packing blocks] (kernels/fused/wgmma.hpp): orders this thread's generic-proxy
  // accesses to global memory with its async-proxy ones (bulk copies): the packing blocks' stores
  // before their signal, and the acquire of that signal before the bulk copies that read them.
  __device__ __forceinline__ void proxy_fence_global() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
  }
  // Note [device positions] (kernels/decode/params.hpp): *c = max(*c, v), v block-uniform; several
  // blocks may flag rows in one launch, and the maximum does not depend on their order.
  __device__ __forceinline__ void status_max(std::int32_t* c, int v) const {
    if (threadIdx.x == 0) atomicMax(c, v);
  }
  // Note [one grid] (kernels/decode/one_grid.hpp): the block's ticket, *c before thread 0's atomic add,
  // the same for every thread; the block that takes ticket total - 1 resets *c to zero.
  __device__ __forceinline__ int block_ticket(std::int32_t* c, int total) const {
    __shared__ int ticket;
    if (threadIdx.x == 0) {
      const int t = atomicAdd(c, 1);
      if (t == total - 1) atomicExch(c, 0);
      ticket = t;
    }
    __syncthreads();
    return ticket;
  }
  // As block_ticket, for a ticket taken before the wait for the prior grid (DecodeOneGrid): the
  // last taker's reset is performed (a fence) before its block can let the next grid start.
  __device__ __forceinline__ int block_ticket_before_wait(std::int32_t* c, int total) const {
    __shared__ int ticket;
    if (threadIdx.x == 0) {
      const int t = atomicAdd(c, 1);
      if (t == total - 1) {
        atomicExch(c, 0);
        __threadfence();
      }
      ticket = t;
    }
    __syncthreads();
    return ticket;
  }
  __device__ __forceinline__ void release_signals(std::int32_t* c, int ticket, int readers) const {
    if (threadIdx.x == 0 && ticket == readers - 1) {
      atomicExch(c + 1, 0);
      atomicExch(c, 0);
    }
  }

  __device__ __forceinline__ bool any(bool m) const { return __syncthreads_or(m) != 0; }
  __device__ __forceinline__ bool all(bool m) const { return __syncthreads_and(m) != 0; }
};

}  // namespace lockstep::cuda
