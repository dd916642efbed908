// Instantiates every kernel for one CPU SIMD variant. Built three times (CMakeLists.txt) with
// LOCKSTEP_CPU_NS = avx3 / avx2 / generic and the matching -m flags; nothing here is shared
// between the variants (Note [SIMD variants] in docs/architecture.md).

#include <cstdlib>

#include "kernel_table.hpp"
#include "lanes.hpp"
#include "lockstep/kernels/registry.hpp"

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

template <class K, class X>
void run_range(X& x, const lockstep::detail::KernelLaunch& l, std::uint64_t begin, std::uint64_t end,
               const std::uint64_t* order) {
  const auto& p = *static_cast<const typename K::Params*>(l.params);
  const Dim3 g = l.config.grid;
  const std::uint64_t gxy = std::uint64_t{g.x} * g.y;
  for (std::uint64_t i = begin; i < end; ++i) {
    const std::uint64_t b = order != nullptr ? order[i] : i;
    BlockCoords c;
    c.bx = static_cast<std::uint32_t>(b % g.x);
    c.by = static_cast<std::uint32_t>((b / g.x) % g.y);
    c.bz = static_cast<std::uint32_t>(b / gxy);
    c.gx = g.x;
    c.gy = g.y;
    c.gz = g.z;
    x.begin_block(c);
    if constexpr (X::kPassLanes == X::kThreads) {
      K::run(x, p);
    } else {
      for (int w = 0; w < X::kThreads / X::kPassLanes; ++w) {  // Note [warp passes]
        x.begin_warp(w);
        K::run(x, p);
      }
    }
  }
}

// paths.block_passes runs warp-independent kernels block-wide too (a check: the same bits; Note
// [warp passes]).
template <class K>
void run_blocks(const lockstep::detail::KernelLaunch& l, std::uint64_t begin, std::uint64_t end,
                char* shared, const std::uint64_t* order, const CpuPaths& paths) {
  if constexpr (kernels::warp_independent_v<K>) {
    if (!paths.block_passes) {
      warp_pass_ranges().fetch_add(1, std::memory_order_relaxed);
      CpuExec<K::kThreads, 32> x(shared, l.config.shared_bytes, paths);
      run_range<K>(x, l, begin, end, order);
      return;
    }
  }
  CpuExec<K::kThreads> x(shared, l.config.shared_bytes, paths);
  run_range<K>(x, l, begin, end, order);
}

template <class... Ks>
const BlockRangeFn* make_fns(kernels::KernelList<Ks...>) {
  static const BlockRangeFn fns[] = {&run_blocks<Ks>...};
  return fns;
}

const KernelTable& kernel_table() {
  static const KernelTable t{variant_target_name(), make_fns(kernels::AllKernels{}),
                             kernels::AllKernels::size};
  return t;
}

}  // namespace lockstep::cpu::LOCKSTEP_CPU_NS
