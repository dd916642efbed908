// Instantiates every kernel for one CPU SIMD variant. Built three times (CMakeLists.txt) with
// LOCKSTEP_CPU_NS = avx3 / avx2 / generic and the matching -m flags; nothing here is shared
// between the variants (Note [SIMD variants] in docs/architecture.md).

#include "kernel_table.hpp"
#include "lanes.hpp"
#include "lockstep/kernels/registry.hpp"

namespace lockstep::cpu::LOCKSTEP_CPU_NS {

template <class K>
void run_blocks(const lockstep::detail::KernelLaunch& l, std::uint64_t begin, std::uint64_t end,
                char* shared, const std::uint64_t* order) {
  const auto& p = *static_cast<const typename K::Params*>(l.params);
  const Dim3 g = l.config.grid;
  CpuExec<K::kThreads> x(shared, l.config.shared_bytes);
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
    K::run(x, p);
  }
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
