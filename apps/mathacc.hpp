#pragma once
#include <cstdint>
#include <string>
namespace lockstep::mathacc {
// Every kDefaultStride-th float bit pattern: about 44 million per function, under a minute for
// the five functions on a 2-core CPU device; stride 1 (`--all`) is every float.
inline constexpr std::uint64_t kDefaultStride = 97;
// Prints the accuracy table to stdout (progress to stderr); returns the process exit code.
int run(const std::string& device, std::uint64_t stride);
}  // namespace lockstep::mathacc
