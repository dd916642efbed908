#pragma once
// `lockstep parity` (apps/parity.cpp): every registered kernel on random shapes and on a few fixed
// large shapes, on every device, compared bitwise with the CPU device and with a float64 oracle.
#include <cstdint>
#include <string>

namespace lockstep::parity {
struct Options {
  std::string device = "all";
  int cases = 20;
  std::uint64_t seed = 1;
  // Internal (the one-grid rerun, a child process): only these entries (comma-separated), the
  // CPU bytes each must reproduce ("name=hex,..."), and a label for the table.
  std::string only, expect_digests, label;
};
// Returns the process exit code.
int run(const Options& o);
}  // namespace lockstep::parity
