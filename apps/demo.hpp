#pragma once
#include <cstdint>
#include <string>

namespace lockstep::demo {
struct Options {
  int layers = 4;
  int slots = 4;
  int steps = 32;
  std::uint64_t seed = 7;
  // Attention's q, k, v and output (float, half or bfloat16: converted from and to the fp32
  // projections around it) and the KV cache's format (fp8 with scales of 1/32).
  std::string activations = "bfloat16";
  std::string cache = "fp8_e4m3";
  // A self-test of the demo's checks (hidden option --inject-fault): "hidden" flips one bit of
  // the run's final hidden states, "rollback" one of the step after the rollback, before they
  // are compared; the demo must then report the mismatch and exit 1 (a ctest holds it to that).
  std::string inject_fault;
};
// The main job on `device`; returns the process exit code.
int run(const std::string& device, const Options& o);
}  // namespace lockstep::demo
