// One __global__ trampoline per kernel: the same template the CPU backend runs, instantiated
// with CudaExec. Nothing here computes; every kernel's arithmetic lives in kernels/.

#include "cuda_entries.hpp"
#include "cuda_exec.cuh"
#include "lockstep/kernels/registry.hpp"

namespace lockstep::cuda {

// Blocks per SM the register allocation must allow: K::kMinBlocks where a kernel states it.
template <class K>
constexpr int min_blocks() {
  if constexpr (requires { K::kMinBlocks; })
    return K::kMinBlocks;
  else
    return 1;
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
