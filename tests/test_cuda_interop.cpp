// CUDA interop: wrapping a caller's cudaStream_t and device pointer without taking ownership.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/ops.hpp"
#include "support/backends.hpp"
#include "support/random.hpp"

namespace lockstep::testing {
namespace {

class CudaInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = unavailable_reason(DeviceKind::kCuda);
    if (!why.empty() && cuda_required()) GTEST_FAIL() << "cuda unavailable with LOCKSTEP_TEST_REQUIRE_CUDA=1: " << why;
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

// A launch that CUDA refuses is a DeviceError naming the kernel and CUDA's error, not sticky, and
// it enqueues nothing: here the launch goes to a stream whose capture was invalidated (Note [driver
// launches]: the driver's launch by default, the runtime's with LOCKSTEP_DRIVER_LAUNCH=0).
TEST_F(CudaInterop, ARefusedLaunchIsATypedNonStickyError) {
  cudaStream_t raw;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  {
    auto s = cuda_wrap_stream(dev, raw);
    Buffer<float> in(dev, 256), out(dev, 256);
    in.fill(*s, 2.0f);
    out.fill(*s, -1.0f);
    s->synchronize();
    ASSERT_EQ(cudaStreamBeginCapture(raw, cudaStreamCaptureModeRelaxed), cudaSuccess);
    // Synchronizing a stream that is being captured is invalid, and invalidates the capture.
    EXPECT_NE(cudaStreamSynchronize(raw), cudaSuccess);
    const auto launches = s->launches();
    bool thrown = false;
    try {
      ops::scale(*s, in, out, 3.0f);
    } catch (const DeviceError& e) {  // (any other exception fails the test)
      thrown = true;
      const std::string m = e.what();
      EXPECT_FALSE(e.sticky()) << m;
      EXPECT_NE(m.find("CUDA error in scale: "), std::string::npos) << m;
      EXPECT_TRUE(m.find("CAPTURE_INVALIDATED") != std::string::npos ||
                  m.find("CaptureInvalidated") != std::string::npos) << m;
    }
    EXPECT_TRUE(thrown) << "the launch into an invalidated capture was accepted";
    EXPECT_EQ(s->launches(), launches) << "a refused launch is not counted";
    cudaGraph_t graph = nullptr;
    EXPECT_NE(cudaStreamEndCapture(raw, &graph), cudaSuccess);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    // Nothing ran: out is as it was, and the stream and device still work.
    std::vector<float> back;
    ASSERT_NO_THROW(back = out.to_vector(*s));
    for (float v : back) ASSERT_EQ(v, -1.0f);
    ASSERT_NO_THROW(ops::scale(*s, in, out, 3.0f));
    ASSERT_NO_THROW(back = out.to_vector(*s));
    for (float v : back) ASSERT_EQ(v, 6.0f);
  }
  EXPECT_EQ(cudaStreamDestroy(raw), cudaSuccess);
}

// A whole decode step (flash_decoding on every layer, positions in device memory) captured in a
// CUDA graph and replayed with new positions gives the bytes of the same steps run eagerly with
// host positions (Note [device positions]).
TEST_F(CudaInterop, DecodeStepReplaysAsACudaGraph) {
  const KvCacheConfig c{.num_layers = 3, .num_heads = 8, .num_kv_heads = 2, .head_dim = 128, .max_len = 700, .slots = 4};
  KvCache eager(dev, c), graphed(dev, c);
  cudaStream_t raw;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  {
    auto gs = cuda_wrap_stream(dev, raw);
    Stream& es = dev->default_stream();
    Lcg rng{3};
    auto rnd = [&](std::size_t n) { return rng.floats(n, 0.5f); };
    const std::vector<std::int64_t> start{10, 300, 0, 650};
    for (std::int64_t slot = 0; slot < 4; ++slot)
      for (std::int64_t l = 0; l < 3; ++l) {
        const auto n = std::size_t(2 * start[std::size_t(slot)] * 128);
        const auto hk = rnd(n), hv = rnd(n);
        eager.write_from_host(es, slot, l, hk, hv, start[std::size_t(slot)]);
        graphed.write_from_host(es, slot, l, hk, hv, start[std::size_t(slot)]);
      }
    es.synchronize();
    // Per layer: q, k_new, v_new and out buffers that the graph reads and writes in place.
    std::vector<Buffer<float>> q, kn, vn, out;
    for (int l = 0; l < 3; ++l) {
      q.emplace_back(dev, 4 * 8 * 128);
      kn.emplace_back(dev, 4 * 2 * 128);
      vn.emplace_back(dev, 4 * 2 * 128);
      out.emplace_back(dev, 4 * 8 * 128);
    }
    Buffer<std::int32_t> pos(dev, 4);
    std::int32_t* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, 4 * sizeof(std::int32_t)), cudaSuccess);
    auto step = [&] {
      for (int l = 0; l < 3; ++l) flash_decoding(*gs, graphed, l, q[std::size_t(l)], kn[std::size_t(l)], vn[std::size_t(l)], pos, out[std::size_t(l)]);
    };
    // One eager call sizes the stream's scratch; then capture.
    for (int i = 0; i < 4; ++i) pinned[i] = -1;
    ASSERT_EQ(cudaMemcpyAsync(pos.data().get(), pinned, 16, cudaMemcpyHostToDevice, raw), cudaSuccess);
    step();
    ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(raw, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const auto launches_before = gs->launches();
    step();
    const auto launched = gs->launches() - launches_before;
    ASSERT_EQ(cudaStreamEndCapture(raw, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::size_t nodes = 0;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    // Kernels only, no copies: two per layer (the chunk kernel appends: Note [fused append]; 3
    // chunks x 4 heads per block is too large a merge to fold by default: Note [folded merge]),
    // one with the Tuning decode.fold_merge = 1 or decode.one_grid = 1 (Note [one grid]).
    EXPECT_EQ(nodes, launched) << "graph nodes vs kernel launches: no copies";
    const Tuning& t = tuning_in_force(*dev);
    const bool one_grid = t.decode.one_grid.value_or(false);
    if (!t.decode.fold_merge.has_value() && t.decode.block_signals)
      EXPECT_EQ(nodes, one_grid ? 3u : 6u) << (one_grid ? "one kernel per layer" : "two kernels per layer");

    std::vector<std::int64_t> len = start;
    for (int t = 0; t < 4; ++t) {
      if (t == 2) eager.mark_done(2);  // slot 2 finishes: -1 from now on
      for (int l = 0; l < 3; ++l) {
        q[std::size_t(l)].copy_from_host(es, rnd(4 * 8 * 128));
        kn[std::size_t(l)].copy_from_host(es, rnd(4 * 2 * 128));
        vn[std::size_t(l)].copy_from_host(es, rnd(4 * 2 * 128));
      }
      es.synchronize();
      for (int i = 0; i < 4; ++i) pinned[i] = (t >= 2 && i == 2) ? -1 : std::int32_t(len[std::size_t(i)]);
      ASSERT_EQ(cudaMemcpyAsync(pos.data().get(), pinned, 16, cudaMemcpyHostToDevice, raw), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, raw), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
      for (int l = 0; l < 3; ++l) {
        Buffer<float> ref(dev, 4 * 8 * 128);
        flash_decoding(es, eager, l, q[std::size_t(l)], kn[std::size_t(l)], vn[std::size_t(l)], len, ref);
        const auto a = ref.to_vector(es), b = out[std::size_t(l)].to_vector(es);
        ASSERT_EQ(a.size(), b.size());
        for (std::size_t i = 0; i < a.size(); ++i)
          ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "step " << t << " layer " << l << " element " << i;
      }
      for (std::size_t i = 0; i < 4; ++i)
        if (!(t >= 2 && i == 2)) ++len[i];
    }
    // The written tokens [0, len) of every slot and kv head (the rest was never initialized).
    for (int l = 0; l < 3; ++l) {
      const auto a = eager.k(l).to_vector(es), b = graphed.k(l).to_vector(es);
      const auto av = eager.v(l).to_vector(es), bv = graphed.v(l).to_vector(es);
      for (std::size_t slot = 0; slot < 4; ++slot)
        for (std::size_t hk = 0; hk < 2; ++hk) {
          const std::size_t off = ((slot * 2 + hk) * 700) * 128, n = std::size_t(len[slot]) * 128;
          EXPECT_EQ(std::memcmp(a.data() + off, b.data() + off, n * 4), 0) << "K, layer " << l << " slot " << slot;
          EXPECT_EQ(std::memcmp(av.data() + off, bv.data() + off, n * 4), 0) << "V, layer " << l << " slot " << slot;
        }
    }
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamDestroy(raw), cudaSuccess);
}

}  // namespace
}  // namespace lockstep::testing
