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
  // The decode entries' reruns in child processes: "one-grid" (the Tuning decode.one_grid=1) or
  // "all" (every decode schedule set, apps/parity.cpp schedule_sets).
  std::string knob_reruns = "one-grid";
  // The formats of the flash_decoding_formats entry's random cases, "ACTIVATIONS/CACHE" (e.g.
  // "bfloat16/fp8_e4m3"), or "any": each case draws a pair.
  std::string formats = "bfloat16/fp8_e4m3";
  // Internal (a knob rerun, a child process): only these entries (comma-separated), the
  // CPU bytes each must reproduce ("name=hex,..."), and a label for the table.
  std::string only, expect_digests, label;
};
// Returns the process exit code.
int run(const Options& o);
}  // namespace lockstep::parity
