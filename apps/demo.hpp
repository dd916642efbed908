#pragma once
#include <cstdint>
#include <string>

namespace lockstep::demo {
struct Options {
  int layers = 4;
  int slots = 4;
  int steps = 32;
  std::uint64_t seed = 7;
};
// The main job on `device`; returns the process exit code.
int run(const std::string& device, const Options& o);
}  // namespace lockstep::demo
