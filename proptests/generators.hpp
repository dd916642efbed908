#pragma once
// RapidCheck generators shared by the property files.
#include <rapidcheck.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/harness.hpp"

namespace lockstep::harness {

// 1..max, drawing the edge sizes (1, 31, 32, 33, 97, 1025 that fit) half of the time.
inline rc::Gen<std::int64_t> size_gen(std::int64_t max) {
  std::vector<std::int64_t> edges;
  for (auto e : kEdgeSizes)
    if (e <= max) edges.push_back(e);
  return rc::gen::oneOf(rc::gen::elementOf(edges), rc::gen::inRange<std::int64_t>(1, max + 1));
}

// An integer in [lo, hi) over the whole range at every case: rc::gen::inRange narrows its range
// with the case's size (the first cases of a run draw near lo), which left 42% of the decode
// worlds with one slot and the fused properties' first half with batch 1 and one kv head.
inline std::int64_t full_range(std::int64_t lo, std::int64_t hi) {
  return *rc::gen::resize(100, rc::gen::inRange<std::int64_t>(lo, hi));
}

// The CPU device, and CUDA where usable (LOCKSTEP_TEST_REQUIRE_CUDA=1: or the property fails).
inline std::vector<std::shared_ptr<Device>> backends() {
  std::vector<std::shared_ptr<Device>> d{open("cpu")};
  if (cuda_unusable_reason().empty())
    d.push_back(open("cuda:0"));
  else if (cuda_required())
    RC_FAIL("LOCKSTEP_TEST_REQUIRE_CUDA=1, but CUDA is not usable here: " + cuda_unusable_reason());
  return d;
}

// Checks a case on every backend (oracle, unwritten outputs, SIMD variants, CUDA).
inline void check(const Case& c) {
  RC_LOG() << c.describe() << "\n";
  const Verdict v = verify(c, /*with_variant=*/true, /*with_cuda=*/true);
  RC_LOG() << v.failure << "\n";
  RC_CLASSIFY(v.compared_cuda, "compared with CUDA");
  RC_ASSERT(v.failure.empty());
}

}  // namespace lockstep::harness
