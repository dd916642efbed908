// One __global__ trampoline per kernel: the same template the CPU backend runs, instantiated
// with CudaExec. Nothing here computes; every kernel's arithmetic lives in kernels/.

#include "cuda_entries.hpp"
#include "cuda_exec.cuh"
#include "lockstep/kernels/registry.hpp"

#include <type_traits>

namespace lockstep::cuda {

template <class K>
__global__ void __launch_bounds__(K::kThreads) entry(const typename K::Params p) {
  CudaExec<K::kThreads> x;
  K::run(x, p);
}
// A kernel that states kMinBlocks (blocks per SM the register allocation must allow) gets it as
// the second launch bound; the others keep ptxas's own choice (stating 1 is not the same: it
// lets ptxas use more registers, which cost the decode and Exact kernels 5-10%).
template <class K>
__global__ void __launch_bounds__(K::kThreads, K::kMinBlocks) entry_min_blocks(const typename K::Params p) {
  CudaExec<K::kThreads> x;
  K::run(x, p);
}

// (Device code is C++17: a detection trait, not a requires-expression.)
template <class K, class = void>
struct states_min_blocks : std::false_type {};
template <class K>
struct states_min_blocks<K, std::void_t<decltype(K::kMinBlocks)>> : std::true_type {};

template <class K>
const void* entry_of() {
  if constexpr (states_min_blocks<K>::value)
    return reinterpret_cast<const void*>(&entry_min_blocks<K>);
  else
    return reinterpret_cast<const void*>(&entry<K>);
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
