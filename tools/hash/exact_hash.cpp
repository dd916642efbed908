// Prints an FNV-1a hash of Exact attention's output and log-sum-exp bytes over ten shapes (head_dim
// 32 to 256, causal and not, GQA, lengths around the tiles), per shape and over all: a check that
// a schedule change kept Exact's bits (docs/gpu-results.md, runs 60-63). Not part of the build:
//   g++ -std=c++20 -O1 -Icore/include -Iattention/include tools/hash/exact_hash.cpp \
//       -Lbuild-cuda -l:liblockstep.so.0 -o /tmp/exact_hash
//   LD_LIBRARY_PATH=build-cuda /tmp/exact_hash cpu   (or cuda:0)
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "lockstep/lockstep.hpp"
#include "lockstep/attention/fused.hpp"
using namespace lockstep;
int main(int argc, char** argv) {
  auto dev = open(argc > 1 ? argv[1] : "cpu");
  auto& s = dev->default_stream();
  std::uint64_t all = 1469598103934665603ull;
  struct C { int B, H, Hkv, Sq, Skv, D; bool causal; };
  std::vector<C> cs = {{1,2,1,70,130,32,false},{1,2,2,65,200,64,true},{2,4,2,129,129,64,false},
                       {1,2,1,64,300,96,true},{1,2,1,100,191,128,false},{1,4,2,200,257,128,true},
                       {1,1,1,33,97,256,false},{1,2,1,50,65,256,true},{1,1,1,1,1,128,false},{1,1,1,130,70,128,true}};
  for (auto c : cs) {
    std::mt19937 g(c.D * 131 + c.Sq);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    auto mk = [&](std::size_t n) { std::vector<float> h(n); for (auto& x : h) x = u(g); return h; };
    const std::size_t nq = std::size_t(c.B) * c.H * c.Sq * c.D, nk = std::size_t(c.B) * c.Hkv * c.Skv * c.D;
    auto hq = mk(nq), hk = mk(nk), hv = mk(nk);
    Buffer<float> q(dev, nq), k(dev, nk), v(dev, nk), o(dev, nq), lse(dev, std::size_t(c.B) * c.H * c.Sq);
    q.copy_from_host(s, std::span<const float>(hq)); k.copy_from_host(s, std::span<const float>(hk)); v.copy_from_host(s, std::span<const float>(hv));
    AttentionShape sh{c.B, c.H, c.Hkv, c.Sq, c.Skv, c.D};
    AttentionOptions opt; opt.causal = c.causal; opt.precision = AttentionPrecision::kExact; opt.lse = &lse;
    attention(s, q, k, v, o, sh, opt);
    std::vector<float> ho(nq), hl(std::size_t(c.B) * c.H * c.Sq);
    o.copy_to_host(s, std::span<float>(ho)); lse.copy_to_host(s, std::span<float>(hl));
    s.synchronize();
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](const std::vector<float>& vv) { const auto* p = reinterpret_cast<const unsigned char*>(vv.data()); for (std::size_t i = 0; i < vv.size() * 4; ++i) { h ^= p[i]; h *= 1099511628211ull; all ^= p[i]; all *= 1099511628211ull; } };
    mix(ho); mix(hl);
    std::printf("D=%d Sq=%d Skv=%d causal=%d: %016llx\n", c.D, c.Sq, c.Skv, int(c.causal), (unsigned long long)h);
  }
  std::printf("all: %016llx\n", (unsigned long long)all);
}
