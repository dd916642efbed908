#pragma once
// Internal: the one checked entry point of every kernel launch (lockstep/kernels/launch.hpp's
// launch<K> calls it), and the launch recorder tests use.

#include <vector>

#include "lockstep/device.hpp"

namespace lockstep {

namespace detail {
// Validates `l` against `stream`'s device (block size, grid, shared memory) and enqueues it.
void launch_checked(Stream& stream, const KernelLaunch& l);

// Test support: while a LaunchRecorder lives, the launches its thread makes through
// launch_checked append their kernels::kernel_index_v to it (so that a test of a plan or a
// Tuning choice can tell which kernel ran). Nested, the innermost records; not copyable.
class LaunchRecorder {
 public:
  LaunchRecorder();
  ~LaunchRecorder();
  LaunchRecorder(const LaunchRecorder&) = delete;
  LaunchRecorder& operator=(const LaunchRecorder&) = delete;
  void record(int kernel_index) { kernels_.push_back(kernel_index); }
  const std::vector<int>& kernels() const { return kernels_; }
  bool launched(int kernel_index) const;

 private:
  std::vector<int> kernels_;
  LaunchRecorder* outer_;
};

// Test support: the CPU device's simulation paths (CpuDeviceOptions' shuffle_blocks,
// decode_lanes, exact_lanes, softmax_lanes, block_passes) for the launches enqueued from now on;
// returns the previous ones (in a CpuDeviceOptions, other fields default). Not while another
// thread enqueues on the device. A device that is not a CPU device is InvalidArgument.
CpuDeviceOptions set_cpu_paths(Device& device, const CpuDeviceOptions& paths);
}  // namespace detail

}  // namespace lockstep
