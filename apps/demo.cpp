// `lockstep demo`: opens the chosen device and runs a small job through two streams and an
// event, checking the bytes against the CPU device.
#include "demo.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "lockstep/attention/ops.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::demo {

int run(const std::string& device, const Options& o) {
  auto dev = open(device);
  std::printf("device: %s (%s)\n", dev->id().str().c_str(), dev->name().c_str());
  const std::size_t n = 1 << 20;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.0f);
  auto s1 = dev->create_stream(), s2 = dev->create_stream();
  auto ev = dev->create_event();
  Buffer<float> a(dev, n), b(dev, n);
  const auto t0 = std::chrono::steady_clock::now();
  a.copy_from_host(*s1, host);
  ops::softmax_rows(*s1, a, a, 1024, 1024);
  ev->record(*s1);
  s2->wait(*ev);
  b.copy_from(*s2, a);
  std::vector<float> back(n);
  b.copy_to_host(*s2, back);
  s2->synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The same on the CPU device, compared bit for bit.
  auto cpu = open("cpu");
  Buffer<float> c(cpu, n);
  c.copy_from_host(cpu->default_stream(), host);
  ops::softmax_rows(cpu->default_stream(), c, c, 1024, 1024);
  const auto ref = c.to_vector(cpu->default_stream());
  const bool same = std::memcmp(ref.data(), back.data(), n * 4) == 0;
  std::printf("round trip of %zu floats through two streams and an event: %.2f ms\n", n, ms);
  std::printf("bytes match the CPU device: %s\n", same ? "yes" : "NO");
  (void)o;
  return same ? 0 : 1;
}

}  // namespace lockstep::demo
