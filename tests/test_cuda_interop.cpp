// CUDA interop: wrapping a caller's cudaStream_t and device pointer without taking ownership.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "lockstep/attention/ops.hpp"
#include "support/backends.hpp"

namespace lockstep::testing {
namespace {

class CudaInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = unavailable_reason(DeviceKind::kCuda);
    if (!why.empty()) GTEST_SKIP() << "cuda unavailable: " << why;
    dev = open("cuda:0");
  }
  std::shared_ptr<Device> dev;
};

TEST_F(CudaInterop, WrapsAnExternalStreamAndPointer) {
  cudaStream_t raw;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  float* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, 1000 * sizeof(float)), cudaSuccess);
  {
    auto s = cuda_wrap_stream(dev, raw);
    EXPECT_EQ(s->native_handle(), raw);
    auto ext = Buffer<float>::wrap(dev, ptr, 1000);
    EXPECT_FALSE(ext.owning());
    std::vector<float> h(1000);
    std::iota(h.begin(), h.end(), 0.0f);
    ext.copy_from_host(*s, h);
    Buffer<float> out(dev, 1000);
    ops::scale(*s, ext, out, 3.0f);
    const auto back = out.to_vector(*s);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(back[i], 3.0f * i);
  }  // the wrappers are gone: the stream and the pointer must still be valid
  EXPECT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
  EXPECT_EQ(cudaMemset(ptr, 0, 4), cudaSuccess);
  EXPECT_EQ(cudaFree(ptr), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(raw), cudaSuccess);
}

TEST_F(CudaInterop, RejectsTheLegacyDefaultStreamAndCpuDevices) {
  EXPECT_THROW(cuda_wrap_stream(dev, nullptr), InvalidArgument);
  int dummy;
  EXPECT_THROW(cuda_wrap_stream(open("cpu"), &dummy), InvalidArgument);
}

TEST_F(CudaInterop, OutOfMemoryIsTypedAndNotSticky) {
  const auto total = dev->caps().total_memory;
  EXPECT_THROW(Buffer<char>(dev, total * 2), OutOfMemory);
  Buffer<float> ok(dev, 16);  // the device still works
  ok.fill(dev->default_stream(), 1.0f);
  EXPECT_EQ(ok.to_vector(dev->default_stream())[0], 1.0f);
}

}  // namespace
}  // namespace lockstep::testing
