#pragma once
// A tiny deterministic generator for test data (the same numbers on every platform).

#include <cstdint>
#include <vector>

namespace lockstep::testing {

struct Lcg {
  std::uint32_t state;
  // Uniform in [-1, 1), multiples of 2^-23.
  float next() {
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) / float(1 << 24) * 2.0f - 1.0f;
  }
  // n values uniform in [-scale, scale).
  std::vector<float> floats(std::size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = next() * scale;
    return v;
  }
};

}  // namespace lockstep::testing
