// One __global__ trampoline per kernel: the same template the CPU backend runs, instantiated
// with CudaExec. Nothing here computes; every kernel's arithmetic lives in kernels/.

#include "cuda_entries.hpp"
#include "cuda_exec.cuh"
#include "lockstep/kernels/registry.hpp"

#include <type_traits>

namespace lockstep::cuda {

// Blocks per SM the register allocation must allow: K::kMinBlocks where a kernel states it.
// (Device code is C++17: no requires-expressions.)
template <class K, class = void>
struct min_blocks_of {
  static constexpr int value = 1;
};
template <class K>
struct min_blocks_of<K, std::void_t<decltype(K::kMinBlocks)>> {
  static constexpr int value = K::kMinBlocks;
};
template <class K>
constexpr int min_blocks() {
  return min_blocks_of<K>::value;
}

template <class K>
__global__ void __launch_bounds__(K::kThreads, min_blocks<K>()) entry(const typename K::Params p) {
  CudaExec<K::kThreads> x;
  K::run(x, p);
}

template <class... Ks>
const void* const* make_entries(kernels::KernelList<Ks...>) {
  static const void* const e[] = {reinterpret_cast<const void*>(&entry<Ks>)...};
  return e;
}

const void* kernel_entry(int index) {
  static const void* const* e = make_entries(kernels::AllKernels{});
  return (index >= 0 && index < kernels::AllKernels::size) ? e[index] : nullptr;
}

int fill32_kernel_index() { return kernels::kernel_index_v<kernels::Fill32>; }

}  // namespace lockstep::cuda
