// lockstep's format conversions (lockstep/formats.hpp) against CUDA's own, on the GPU: every one
// of the 2^32 floats through float -> half, bfloat16, fp8 e4m3 and fp8 e5m2 (fp8 with
// __NV_SATFINITE), and every code of each format back to float, compared bit for bit, NaNs
// included. Prints one line per conversion; exit status 1 on any difference.
//
//   nvcc -std=c++20 -O2 -arch=sm_90a -I core/include -o formats tools/gpu/formats.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdio>

#include "lockstep/formats.hpp"

namespace {

constexpr int kConversions = 8;
const char* const kNames[kConversions] = {"float -> half",     "float -> bfloat16", "float -> fp8_e4m3",
                                          "float -> fp8_e5m2", "half -> float",     "bfloat16 -> float",
                                          "fp8_e4m3 -> float", "fp8_e5m2 -> float"};

struct Result {
  unsigned long long mismatches[kConversions];
  unsigned int first[kConversions];  // the smallest input (bits or code) that differs
  unsigned int ours[kConversions], theirs[kConversions];
};

__device__ void record(Result* r, int k, std::uint32_t input, std::uint32_t ours, std::uint32_t theirs) {
  atomicAdd(&r->mismatches[k], 1ull);
  if (atomicMin(&r->first[k], input) > input) {  // racy pair, but only for the report's example
    r->ours[k] = ours;
    r->theirs[k] = theirs;
  }
}

__global__ void from_float(Result* r, std::uint64_t begin) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t i = begin + blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < begin + (1ull << 30);
       i += stride) {
    const std::uint32_t u = std::uint32_t(i);
    const float x = __uint_as_float(u);
    {
      const std::uint32_t a = lockstep::to_half(x).bits, b = __half_as_ushort(__float2half_rn(x));
      if (a != b) record(r, 0, u, a, b);
    }
    {
      const std::uint32_t a = lockstep::to_bfloat16(x).bits, b = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      if (a != b) record(r, 1, u, a, b);
    }
    {
      const std::uint32_t a = lockstep::to_fp8_e4m3(x).bits, b = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      if (a != b) record(r, 2, u, a, b);
    }
    {
      const std::uint32_t a = lockstep::to_fp8_e5m2(x).bits, b = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
      if (a != b) record(r, 3, u, a, b);
    }
  }
}

__global__ void to_float(Result* r) {
  const std::uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= 65536) return;
  {
    const std::uint32_t a = __float_as_uint(lockstep::to_float(lockstep::half{std::uint16_t(c)}));
    const std::uint32_t b = __float_as_uint(__half2float(__ushort_as_half(std::uint16_t(c))));
    if (a != b) record(r, 4, c, a, b);
  }
  {
    const std::uint32_t a = __float_as_uint(lockstep::to_float(lockstep::bfloat16{std::uint16_t(c)}));
    const std::uint32_t b = __float_as_uint(__bfloat162float(__ushort_as_bfloat16(std::uint16_t(c))));
    if (a != b) record(r, 5, c, a, b);
  }
  if (c < 256) {
    __nv_fp8_e4m3 e4;
    e4.__x = __nv_fp8_storage_t(c);
    __nv_fp8_e5m2 e5;
    e5.__x = __nv_fp8_storage_t(c);
    const std::uint32_t a4 = __float_as_uint(lockstep::to_float(lockstep::fp8_e4m3{std::uint8_t(c)}));
    const std::uint32_t b4 = __float_as_uint(float(e4));
    if (a4 != b4) record(r, 6, c, a4, b4);
    const std::uint32_t a5 = __float_as_uint(lockstep::to_float(lockstep::fp8_e5m2{std::uint8_t(c)}));
    const std::uint32_t b5 = __float_as_uint(float(e5));
    if (a5 != b5) record(r, 7, c, a5, b5);
  }
}

}  // namespace

int main() {
  Result* r = nullptr;
  if (cudaMallocManaged(&r, sizeof(Result)) != cudaSuccess) {
    std::printf("formats: no CUDA device\n");
    return 2;
  }
  for (int k = 0; k < kConversions; ++k) {
    r->mismatches[k] = 0;
    r->first[k] = 0xffffffffu;
    r->ours[k] = r->theirs[k] = 0;
  }
  for (std::uint64_t begin = 0; begin < (1ull << 32); begin += 1ull << 30) from_float<<<132 * 16, 256>>>(r, begin);
  to_float<<<256, 256>>>(r);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("formats: a kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  int rc = 0;
  for (int k = 0; k < kConversions; ++k) {
    const unsigned long long inputs = k < 4 ? (1ull << 32) : k < 6 ? 65536 : 256;
    if (r->mismatches[k] == 0) {
      std::printf("  %-18s identical to CUDA's over all %llu inputs\n", kNames[k], inputs);
    } else {
      rc = 1;
      std::printf("  %-18s %llu of %llu inputs differ; the first: input 0x%08x gives 0x%08x, CUDA 0x%08x\n",
                  kNames[k], r->mismatches[k], inputs, r->first[k], r->ours[k], r->theirs[k]);
    }
  }
  return rc;
}
