#pragma once
// Host side of a launch: lockstep::launch<K>(stream, config, params) checks the configuration
// against the device (typed errors on both backends) and enqueues K on the stream.

#include <type_traits>

#include "lockstep/device.hpp"
#include "lockstep/launch_checked.hpp"
#include "lockstep/kernels/registry.hpp"

namespace lockstep {

// Note [overlapped launches]
// A kernel with `static constexpr bool kOverlapsPrior = true` calls x.wait_prior_grids() before
// it touches memory (DecodeOneGrid takes its ticket before, as Note [one grid] argues), and
// x.allow_dependent_grids() once its successors may be scheduled. On
// sm_90 the CUDA backend then launches it with programmatic stream serialization: its blocks may
// be scheduled while the previous kernel on the stream drains, and wait there until that
// kernel's writes are visible, which hides the launch latency between the decode kernels. The
// order of every kernel's memory effects is the stream order, as without it; the CPU backend
// runs kernels one after another and the two calls do nothing there. LOCKSTEP_PDL=0 turns it
// off (a measurement override, read when the device is opened: docs/api.md).
template <class K>
constexpr bool overlaps_prior() {
  if constexpr (requires { K::kOverlapsPrior; }) return K::kOverlapsPrior;
  else return false;
}

// A kernel with `static constexpr bool kMaxSharedCarveout = true` is launched with the SM's
// largest shared-memory carveout preferred (Note [four wgmma blocks per SM]: four blocks of 49 KB
// need the 228 KB configuration).
template <class K>
constexpr bool max_shared_carveout() {
  if constexpr (requires { K::kMaxSharedCarveout; }) return K::kMaxSharedCarveout;
  else return false;
}


template <class K>
void launch(Stream& stream, const LaunchConfig& config, const typename K::Params& params) {
  static_assert(std::is_trivially_copyable_v<typename K::Params>,
                "kernel parameters are copied bytewise");
  detail::KernelLaunch l;
  l.kernel_index = kernels::kernel_index_v<K>;
  l.kernel_name = K::kName;
  l.compiled_threads = K::kThreads;
  l.config = config;
  l.params = &params;
  l.params_size = sizeof(params);
  l.overlaps_prior = overlaps_prior<K>();
  l.max_shared_carveout = max_shared_carveout<K>();
  detail::launch_checked(stream, l);
}

// The usual case: K's own block size.
template <class K>
void launch(Stream& stream, Dim3 grid, std::size_t shared_bytes,
            const typename K::Params& params) {
  launch<K>(stream, LaunchConfig{grid, static_cast<std::uint32_t>(K::kThreads), shared_bytes},
            params);
}

}  // namespace lockstep
