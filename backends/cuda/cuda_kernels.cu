// One __global__ trampoline per kernel: the same template the CPU backend runs, instantiated
// with CudaExec. Nothing here computes; every kernel's arithmetic lives in kernels/.

#include <type_traits>

#include "cuda_entries.hpp"
#include "cuda_exec.cuh"
#include "lockstep/kernels/registry.hpp"

namespace lockstep::cuda {

template <class K>
__global__ void __launch_bounds__(K::kThreads) entry(const typename K::Params p) {
  CudaExec<K::kThreads> x;
  K::run(x, p);
}

// A kernel with `static constexpr int kMinBlocksPerSM = n > 0` is compiled for at least n
// resident blocks per multiprocessor (Note [decode occupancy] in kernels/decode.hpp).
template <class K, class = void>
struct MinBlocks {
  static constexpr int value = 0;
};
template <class K>
struct MinBlocks<K, std::void_t<decltype(K::kMinBlocksPerSM)>> {
  static constexpr int value = K::kMinBlocksPerSM;
};
template <class K>
__global__ void __launch_bounds__(K::kThreads, MinBlocks<K>::value > 0 ? MinBlocks<K>::value : 1)
    entry_min_blocks(const typename K::Params p) {
  CudaExec<K::kThreads> x;
  K::run(x, p);
}
template <class K>
const void* entry_of() {
  if constexpr (MinBlocks<K>::value > 0) return reinterpret_cast<const void*>(&entry_min_blocks<K>);
  else return reinterpret_cast<const void*>(&entry<K>);
}

template <class... Ks>
const void* const* make_entries(kernels::KernelList<Ks...>) {
  static const void* const e[] = {entry_of<Ks>()...};
  return e;
}

const void* kernel_entry(int index) {
  static const void* const* e = make_entries(kernels::AllKernels{});
  return (index >= 0 && index < kernels::AllKernels::size) ? e[index] : nullptr;
}

int fill32_kernel_index() { return kernels::kernel_index_v<kernels::Fill32>; }

}  // namespace lockstep::cuda
