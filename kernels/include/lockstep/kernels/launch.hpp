#pragma once
// Host side of a launch: lockstep::launch<K>(stream, config, params) checks the configuration
// against the device (typed errors on both backends) and enqueues K on the stream.

#include <type_traits>

#include "lockstep/device.hpp"
#include "lockstep/kernels/registry.hpp"

namespace lockstep {

namespace detail {
// Validates `l` against `stream`'s device (block size, grid, shared memory) and enqueues it.
void launch_checked(Stream& stream, const KernelLaunch& l);
}  // namespace detail

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
