#pragma once
// The bridge between the baseline-compiled CPU device and the per-SIMD-variant kernel code:
// plain function pointers, no TBB, no Highway, no templates shared across variants.

#include <atomic>
#include <cstdint>

#include "lockstep/device.hpp"

namespace lockstep::cpu {

// Which code paths a device's launches take (CpuDeviceOptions; the same bits either way).
struct CpuPaths {
  bool decode_lanes = false, exact_lanes = false, softmax_lanes = false, block_passes = false;
};

// Runs blocks [begin, end) of a launch (block b = order ? order[i] : i), with `shared` as the
// block's shared memory.
using BlockRangeFn = void (*)(const lockstep::detail::KernelLaunch& launch, std::uint64_t begin,
                              std::uint64_t end, char* shared, const std::uint64_t* order,
                              const CpuPaths& paths);

struct KernelTable {
  const char* target = "";  // Highway target name
  const BlockRangeFn* fns = nullptr;
  int count = 0;
};

// Block ranges run as warp passes since the process started (Note [warp passes] in lanes/cpu_exec.hpp),
// over every variant: lets a test see that warp passes ran at all.
std::atomic<std::uint64_t>& warp_pass_ranges();

// One per compiled variant (cpu_variant.cpp).
namespace avx3 {
const KernelTable& kernel_table();
}
namespace avx2 {
const KernelTable& kernel_table();
}
namespace generic {
const KernelTable& kernel_table();
}

}  // namespace lockstep::cpu
