// The host side of the decode calls on the CPU device, for tools/host/instructions.sh: `calls`
// eager flash_decoding calls (B=1 H32 Hkv8 D128, one token appended per call) or
// incremental_attention calls (the same shape, 100 tokens). The CPU device runs the kernels on its
// worker threads, so callgrind, collecting only inside the call on this thread, counts the checks,
// the parameter set-up and the enqueue: the code a CUDA launch shares, plus the CPU stream's
// enqueue instead of the driver's launch.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/lockstep.hpp"

int main(int argc, char** argv) {
  using namespace lockstep;
  const int calls = argc > 1 ? std::atoi(argv[1]) : 100;
  const bool incremental = argc > 2 && std::strcmp(argv[2], "incremental") == 0;
  auto dev = lockstep::open("cpu");
  auto& s = dev->default_stream();
  constexpr std::int64_t H = 32, Hkv = 8, D = 128, L = 4096;
  Buffer<float> q(dev, H * D), kn(dev, Hkv * D), vn(dev, Hkv * D), out(dev, H * D);
  Buffer<float> kc(dev, Hkv * L * D), vc(dev, Hkv * L * D);
  q.copy_from_host(s, std::vector<float>(H * D, 0.5f));
  kn.copy_from_host(s, std::vector<float>(Hkv * D, 0.25f));
  vn.copy_from_host(s, std::vector<float>(Hkv * D, 0.125f));
  kc.copy_from_host(s, std::vector<float>(Hkv * L * D, 0.25f));
  vc.copy_from_host(s, std::vector<float>(Hkv * L * D, 0.125f));
  KvCacheConfig c;
  c.num_heads = H;
  c.num_kv_heads = Hkv;
  c.head_dim = D;
  c.max_len = L;
  KvCache cache(dev, c);
  s.synchronize();
  std::vector<std::int64_t> pos{0};
  for (int i = 0; i < calls; ++i) {
    if (incremental) {
      incremental_attention(s, q, kc, vc, 100, out, DecodeShape{H, Hkv, D, L});
    } else {
      pos[0] = i;
      flash_decoding(s, cache, 0, q, kn, vn, pos, out);
    }
  }
  s.synchronize();
  std::printf("%d %s calls\n", calls, incremental ? "incremental_attention" : "flash_decoding");
  return 0;
}
