// Picks a backend at run time ("auto" = CUDA when a usable GPU exists, else the CPU device),
// decodes one token against a small KV cache and prints the result's checksum (and the version
// of the lockstep it was built against: the installed lockstep/version.hpp).
#include <cmath>
#include <cstdio>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/lockstep.hpp"
#include "lockstep/version.hpp"

int main(int argc, char** argv) {
  const char* spec = argc > 1 ? argv[1] : "auto";
  try {
    auto dev = lockstep::open(spec);
    auto& s = dev->default_stream();
    const lockstep::DecodeShape shape{8, 2, 64, 128};
    std::vector<float> q(8 * 64), cache(2 * 128 * 64);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(float(i));
    for (std::size_t i = 0; i < cache.size(); ++i) cache[i] = std::cos(float(i) * 0.01f);
    lockstep::Buffer<float> bq(dev, q.size()), bk(dev, cache.size()), bv(dev, cache.size()),
        out(dev, q.size());
    bq.copy_from_host(s, q);
    bk.copy_from_host(s, cache);
    bv.copy_from_host(s, cache);
    lockstep::incremental_attention(s, bq, bk, bv, 100, out, shape);
    double sum = 0;
    for (float v : out.to_vector(s)) sum += v;
    std::printf("consumer of lockstep %s: %s (%s): checksum %.6f\n", LOCKSTEP_VERSION_STRING,
                dev->id().str().c_str(), dev->name().c_str(), sum);
    return std::isfinite(sum) ? 0 : 1;
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
