// The CPU execution model itself (backends/cpu/lanes.hpp), instantiated here with this file's
// (baseline) flags: memory access fast paths against their scalar meaning, cross-lane operations
// against a scalar model of the CUDA instructions they stand for.

#define LOCKSTEP_CPU_NS lanes_test
#include "../backends/cpu/lanes.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "lockstep/error.hpp"

namespace lockstep::cpu::lanes_test {
namespace {

constexpr int N = 128;
using X = CpuExec<N>;

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-10.0f, 10.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Lanes, LoadsMatchTheirScalarMeaning) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  const auto data = random_floats(4096, 1);
  const auto t = x.thread();
  // contiguous, broadcast, strided gather, masked
  X::Lanes<float> a = x.load(data.data(), t + 5);
  X::Lanes<float> b = x.load(data.data(), (t >> 3) * 0 + 77);
  X::Lanes<float> c = x.load(data.data(), t * 31);
  X::Lanes<float> d = x.load(data.data(), t * 2, (t & 3) != 1, -1.5f);
  for (int i = 0; i < N; ++i) {
    ASSERT_EQ(a[i], data[i + 5]);
    ASSERT_EQ(b[i], data[77]);
    ASSERT_EQ(c[i], data[i * 31]);
    ASSERT_EQ(d[i], (i & 3) != 1 ? data[i * 2] : -1.5f);
  }
}

TEST(Lanes, MaskedLoadsNeverTouchMaskedOffLanes) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  std::vector<float> small(10, 3.0f);  // lanes >= 10 would read out of bounds (ASan would see it)
  X::Lanes<float> v = x.load(small.data(), x.thread(), x.thread() < 10, 0.0f);
  for (int i = 0; i < N; ++i) ASSERT_EQ(v[i], i < 10 ? 3.0f : 0.0f);
}

TEST(Lanes, StoresMatchTheirScalarMeaning) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  std::vector<float> out(1024, -7.0f);
  const auto t = x.thread();
  x.store(out.data(), t * 3 + 1, x.to_float(t), (t % 5) != 0);
  for (int i = 0; i < N; ++i) ASSERT_EQ(out[i * 3 + 1], (i % 5) != 0 ? float(i) : -7.0f);
  EXPECT_EQ(out[0], -7.0f);
  x.store(out.data(), t + 600, 2.5f);
  for (int i = 0; i < N; ++i) ASSERT_EQ(out[600 + i], 2.5f);
}

TEST(Lanes, Quad16ByteLoadsAndStores) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  std::vector<float> data(N * 4 + 64);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  auto q = x.load4(data.data(), x.thread() * 4);        // contiguous quads
  auto r = x.load4(data.data(), (x.thread() ^ 1) * 4);  // permuted quads (scalar path)
  for (int i = 0; i < N; ++i) {
    ASSERT_EQ(q.x[i], float(4 * i));
    ASSERT_EQ(q.w[i], float(4 * i + 3));
    ASSERT_EQ(r.y[i], float(4 * (i ^ 1) + 1));
  }
  std::vector<float> out(N * 4, 0.0f);
  x.store4(out.data(), x.thread() * 4, q);
  for (int i = 0; i < N * 4; ++i) ASSERT_EQ(out[i], float(i));
}

// Every path of load4 and store4 against its scalar meaning: contiguous, broadcast, gathered
// (all lanes active: staged 16-byte copies), masked (inactive lanes load zeros, store nothing).
TEST(Lanes, QuadGathersAndScattersMatchTheirScalarMeaning) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  std::vector<float> data(N * 8 + 64);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i) * 0.5f - 3.0f;
  const auto t = x.thread();
  auto perm = [](int i) { return ((i * 5 + 3) % N) * 2; };  // distinct quads, 32 bytes apart
  const auto g = x.load4(data.data(), ((t * 5 + 3) % N) * 8);             // gathered
  const auto b = x.load4(data.data(), t * 0 + 12);                       // broadcast
  const auto m = x.load4(data.data(), ((t * 5 + 3) % N) * 8, (t % 3) != 1);  // masked gather
  for (int i = 0; i < N; ++i) {
    const int o = perm(i) * 4;
    ASSERT_EQ(g.x[i], data[o]);
    ASSERT_EQ(g.y[i], data[o + 1]);
    ASSERT_EQ(g.z[i], data[o + 2]);
    ASSERT_EQ(g.w[i], data[o + 3]);
    ASSERT_EQ(b.z[i], data[14]);
    ASSERT_EQ(m.w[i], (i % 3) != 1 ? data[o + 3] : 0.0f);
  }
  std::vector<float> out(N * 8 + 64, -1.0f);
  x.store4(out.data(), ((t * 5 + 3) % N) * 8, g, (t % 4) != 2);  // scattered, partly masked
  std::vector<float> want(out.size(), -1.0f);
  for (int i = 0; i < N; ++i)
    if (i % 4 != 2)
      for (int e = 0; e < 4; ++e) want[perm(i) * 4 + e] = data[perm(i) * 4 + e];
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], want[i]) << i;
  x.store4(out.data(), ((t * 5 + 3) % N) * 8, b);  // scattered, every lane
  for (int i = 0; i < N; ++i) ASSERT_EQ(out[perm(i) * 4 + 1], data[13]);
}

// CUDA: for (k = W/2; k >= 1; k /= 2) v = op(v, __shfl_xor_sync(~0, v, k)); per warp.
template <class Op>
std::vector<float> cuda_butterfly(std::vector<float> v, int W, Op op) {
  for (int k = W / 2; k >= 1; k /= 2) {
    std::vector<float> t(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) t[i] = v[i ^ std::size_t(k)];
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = op(v[i], t[i]);
  }
  return v;
}

TEST(Lanes, WarpReductionsAreTheCudaButterflyBitForBit) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    auto in = random_floats(N, seed);
    in[seed % N] = seed % 3 == 0 ? -0.0f : in[seed % N];
    X::Lanes<float> v = x.load(in.data(), x.thread());
    const auto s32 = x.warp_sum(v);
    const auto s8 = x.warp_sum<8>(v);
    const auto m32 = x.warp_max(v);
    const auto n4 = x.warp_min<4>(v);
    const auto e32 = cuda_butterfly(in, 32, [](float a, float b) { return a + b; });
    const auto e8 = cuda_butterfly(in, 8, [](float a, float b) { return a + b; });
    const auto f32 = cuda_butterfly(in, 32, [](float a, float b) { return math::max(a, b); });
    const auto g4 = cuda_butterfly(in, 4, [](float a, float b) { return math::min(a, b); });
    for (int i = 0; i < N; ++i) {
      ASSERT_EQ(bits(s32[i]), bits(e32[i])) << i;
      ASSERT_EQ(bits(s8[i]), bits(e8[i])) << i;
      ASSERT_EQ(bits(m32[i]), bits(f32[i])) << i;
      ASSERT_EQ(bits(n4[i]), bits(g4[i])) << i;
      ASSERT_EQ(bits(s32[i]), bits(s32[(i / 32) * 32])) << "every lane holds the warp's value";
    }
  }
}

TEST(Lanes, ShufflesMoveValuesLikeCuda) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  const X::Lanes<float> v = x.to_float(x.thread());
  for (int k : {1, 2, 4, 8, 16}) {
    const auto s = x.shfl_xor(v, k);
    for (int i = 0; i < N; ++i) ASSERT_EQ(s[i], float(i ^ k));
  }
  const auto b = x.shfl(v, 7);
  for (int i = 0; i < N; ++i) ASSERT_EQ(b[i], float((i / 32) * 32 + 7));
}

TEST(Lanes, FusedExpressionsEvaluateLaneWise) {
  alignas(64) char smem[64];
  X x(smem, sizeof smem, CpuPaths{});
  const auto in = random_floats(N, 9);
  X::Lanes<float> v = x.load(in.data(), x.thread());
  X::Lanes<float> r = x.select(v > 0.0f, x.exp(v - 1.0f) * 2.0f, x.fma(v, v, 0.5f));
  for (int i = 0; i < N; ++i) {
    const float e = in[i] > 0.0f ? math::exp(in[i] - 1.0f) * 2.0f : std::fma(in[i], in[i], 0.5f);
    ASSERT_EQ(bits(r[i]), bits(e));
  }
  X::Lanes<std::int32_t> q = x.idiv(x.thread() + 7, 3);
  for (int i = 0; i < N; ++i) ASSERT_EQ(q[i], (i + 7) / 3);
}

TEST(Lanes, SharedMemoryIsCarvedInOrderAndBounded) {
  alignas(64) char smem[256];
  X x(smem, sizeof smem, CpuPaths{});
  float* a = x.shared<float>(10);
  float* b = x.shared<float>(10);
  EXPECT_EQ(reinterpret_cast<char*>(a), smem);
  EXPECT_EQ(reinterpret_cast<char*>(b), smem + 64);  // 40 bytes rounded up to 32
  EXPECT_DEATH(x.shared<float>(100), "shared memory");
}

}  // namespace
}  // namespace lockstep::cpu::lanes_test
