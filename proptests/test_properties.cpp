// Properties of every kernel (RapidCheck): on random shapes drawn to include 1, 31, 32, 33, 97,
// 1025 and large rows, (a) the CPU result is within the documented error of a float64 oracle,
// (b) every output element was written (outputs start poisoned), (c) the portable SIMD variant
// returns the same bits as the native one, and (d) on a machine with a GPU, the CUDA result is
// byte-identical to the CPU result. Failures shrink to a minimal shape; RapidCheck prints the
// seed to reproduce (RC_PARAMS="reproduce=...").

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "generators.hpp"
#include "harness/harness.hpp"

namespace lockstep::harness {
namespace {



RC_GTEST_PROP(Kernels, SoftmaxRows, ()) {
  SoftmaxShape s;
  s.n = *rc::gen::weightedOneOf<std::int64_t>(
      {{9, size_gen(3000)}, {1, rc::gen::inRange<std::int64_t>(100000, 100100)}});
  s.rows = *size_gen(std::max<std::int64_t>(1, std::min<std::int64_t>(300, 1500000 / s.n)));
  // 300: exponents past exp's range of 88 (the row's maximum must be subtracted first).
  s.range = *rc::gen::element(1.0f, 8.0f, 80.0f, 300.0f);
  s.special = *rc::gen::weightedOneOf<int>({{4, rc::gen::just(0)}, {1, rc::gen::just(1)}, {1, rc::gen::just(2)}});
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*softmax_case(s));
}

RC_GTEST_PROP(Kernels, Scale, ()) {
  ScaleShape s;
  s.n = *size_gen(300000);
  s.scale = *rc::gen::element(1.0f, -0.5f, 3.0f, 1e-3f, 65536.0f);
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*scale_case(s));
}

// ops::convert: every backend gives lockstep/formats.hpp's bits (codes or floats), for every
// format and direction.
RC_GTEST_PROP(Kernels, Convert, ()) {
  ConvertShape s;
  s.format = *rc::gen::inRange(0, 4);
  s.to_format = *rc::gen::arbitrary<bool>();
  s.n = *size_gen(70000);
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*convert_case(s));
}

RC_GTEST_PROP(Kernels, Layouts, ()) {
  LayoutShape s;
  s.kind = *rc::gen::inRange(0, 4);
  s.heads = *rc::gen::inRange<std::int64_t>(1, 13);
  s.dim = *rc::gen::oneOf(rc::gen::element<std::int64_t>(32, 64, 96, 128, 256), size_gen(160));
  s.seq = *size_gen(std::max<std::int64_t>(1, std::min<std::int64_t>(1100, 2000000 / (s.heads * s.dim))));
  s.head = *rc::gen::inRange<std::int64_t>(0, s.heads);
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*layout_case(s));
}

RC_GTEST_PROP(Kernels, Transpose, ()) {
  TransposeShape s;
  s.batch = *rc::gen::inRange<std::int64_t>(1, 5);
  s.rows = *size_gen(1100);
  s.cols = *size_gen(std::max<std::int64_t>(1, std::min<std::int64_t>(1100, 2000000 / (s.batch * s.rows))));
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*transpose_case(s));
}

RC_GTEST_PROP(Kernels, GemmF32, ()) {
  GemmShape s;
  s.batch = *rc::gen::inRange<std::int64_t>(1, 4);
  s.m = *size_gen(160);
  s.n = *size_gen(160);
  s.k = *size_gen(std::max<std::int64_t>(1, std::min<std::int64_t>(1100, 6000000 / (s.batch * s.m * s.n))));
  s.alpha = *rc::gen::element(1.0f, 0.125f, -3.0f);
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*gemm_case(s));
}

RC_GTEST_PROP(Kernels, StrictMath, ()) {
  MathShape s;
  s.fn = *rc::gen::inRange(0, 7);
  s.n = *size_gen(20000);
  switch (s.fn) {
    case 0: s.lo = -104.0f, s.hi = 89.0f; break;
    case 1: s.lo = -152.0f, s.hi = 129.0f; break;
    case 3:
    case 4: s.lo = -1e5f, s.hi = 1e5f; break;
    case 5: s.lo = -70000.0f, s.hi = 70000.0f; break;
    case 6: s.lo = -140.0f, s.hi = 127.0f; break;  // exp2_weight's domain and its flush
    default: break;
  }
  s.seed = *rc::gen::arbitrary<std::uint64_t>();
  check(*math_case(s));
}

// LOCKSTEP_TEST_REQUIRE_CUDA=1 (the GPU runs set it): verify() fails where CUDA is not usable,
// naming the variable and the reason, instead of leaving the CUDA comparison out; where CUDA is
// usable it compares with it.
TEST(Harness, VerifyFailsWhenRequiredCudaIsNotUsable) {
  std::mt19937_64 rng(5);
  const auto c = kernel_entries().front().random_case(rng);
  const char* before = std::getenv("LOCKSTEP_TEST_REQUIRE_CUDA");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("LOCKSTEP_TEST_REQUIRE_CUDA", "1", 1);
  const Verdict v = verify(*c, false, true);
  if (before != nullptr)
    ::setenv("LOCKSTEP_TEST_REQUIRE_CUDA", saved.c_str(), 1);
  else
    ::unsetenv("LOCKSTEP_TEST_REQUIRE_CUDA");
  if (cuda_unusable_reason().empty()) {
    EXPECT_TRUE(v.compared_cuda);
    EXPECT_TRUE(v.failure.empty()) << v.failure;
  } else {
    EXPECT_FALSE(v.compared_cuda);
    EXPECT_NE(v.failure.find("LOCKSTEP_TEST_REQUIRE_CUDA=1"), std::string::npos) << v.failure;
    EXPECT_NE(v.failure.find(cuda_unusable_reason()), std::string::npos) << v.failure;
  }
  // Without it, a machine without CUDA leaves the comparison out and passes.
  if (before == nullptr && !cuda_unusable_reason().empty()) EXPECT_TRUE(verify(*c, false, true).failure.empty());
}

}  // namespace
}  // namespace lockstep::harness

int main(int argc, char** argv) {
  // At least 200 cases per property unless RC_PARAMS says otherwise (the GPU run asks for 2000).
  ::setenv("RC_PARAMS", "max_success=200", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
