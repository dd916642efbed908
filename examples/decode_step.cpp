// One decode step against a KV cache: a 100-token prompt's keys and values go into the cache, then
// flash_decoding appends the new token's and attends all 101. Run: decode_step [auto|cpu|cuda:0]
#include <cmath>
#include <cstdio>
#include <vector>

#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/lockstep.hpp"

int main(int argc, char** argv) try {
  auto dev = lockstep::open(argc > 1 ? argv[1] : "auto");  // auto: CUDA if usable, else the CPU
  auto& s = dev->default_stream();

  lockstep::KvCacheConfig cfg;  // one layer, one sequence (slot), 8 query heads sharing 2 KV heads
  cfg.num_heads = 8;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.max_len = 256;
  lockstep::KvCache cache(dev, cfg);
  const std::size_t kv = 2 * 64, qs = 8 * 64;  // floats per token: K (or V), q

  // The prompt: K and V of 100 tokens, [kv_heads, tokens, head_dim], into slot 0 of layer 0.
  const std::int64_t prompt = 100;
  std::vector<float> pk(prompt * kv), pv(prompt * kv);
  for (std::size_t i = 0; i < pk.size(); ++i) {
    pk[i] = std::sin(0.01f * float(i));
    pv[i] = std::cos(0.01f * float(i));
  }
  cache.write_from_host(s, /*slot=*/0, /*layer=*/0, pk, pv, prompt);

  // The new token's query, key and value, copied to the device.
  std::vector<float> hq(qs), hk(kv), hv(kv);
  for (std::size_t i = 0; i < qs; ++i) hq[i] = std::sin(0.1f * float(i));
  for (std::size_t i = 0; i < kv; ++i) {
    hk[i] = std::cos(0.2f * float(i));
    hv[i] = 0.01f * float(i);
  }
  lockstep::Buffer<float> q(dev, qs), k(dev, kv), v(dev, kv), out(dev, qs);
  q.copy_from_host(s, hq);
  k.copy_from_host(s, hk);
  v.copy_from_host(s, hv);

  // The decode step: the token goes in at position 100 (the slot's length), out = its attention.
  const std::int64_t positions[] = {cache.length(0)};
  lockstep::flash_decoding(s, cache, /*layer=*/0, q, k, v, positions, out);
  const std::vector<float> y = out.to_vector(s);  // waits for the stream

  std::printf("%s: cache length %lld, out[0..3] = %.6f %.6f %.6f %.6f\n", dev->id().str().c_str(),
              static_cast<long long>(cache.length(0)), y[0], y[1], y[2], y[3]);
  for (float x : y)
    if (!std::isfinite(x)) return 1;
  return 0;
} catch (const lockstep::Error& e) {  // typed errors name the parameter, its value and the limit
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
