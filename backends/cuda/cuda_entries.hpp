#pragma once
namespace lockstep::cuda {
// The __global__ function of kernel `index` of kernels::AllKernels (nullptr when out of range).
const void* kernel_entry(int index);
int fill32_kernel_index();
}  // namespace lockstep::cuda
