// softmax_rows on the CPU device, for tools/host/softmax_instructions.sh (callgrind counts the
// instructions of the kernel code): rows x n floats, reps calls. Usage: softmax_calls [rows] [n] [reps]
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "lockstep/attention/ops.hpp"
#include "lockstep/device.hpp"
#include "lockstep/buffer.hpp"
using namespace lockstep;
int main(int argc, char** argv) {
  const long rows = argc > 1 ? std::atol(argv[1]) : 64, n = argc > 2 ? std::atol(argv[2]) : 4096;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  auto dev = open("cpu");
  auto& s = dev->default_stream();
  std::vector<float> h(rows * n);
  for (long i = 0; i < rows * n; ++i) h[i] = float((i * 2654435761u) % 1000) / 100.0f;
  Buffer<float> in(dev, rows * n), out(dev, rows * n);
  in.copy_from_host(s, h);
  for (int r = 0; r < reps; ++r) ops::softmax_rows(s, in, out, rows, n);
  s.synchronize();
  std::printf("%f\n", out.to_vector(s)[5]);
}
