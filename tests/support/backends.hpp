#pragma once
// Tests are written once and instantiated for every backend (like Kokkos's TEST_CATEGORY). A
// backend that cannot run here is skipped with the reason printed.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "lockstep/launch_checked.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::testing {

// The reason a backend cannot run here, or "" when it can.
inline std::string unavailable_reason(DeviceKind kind) {
  for (const auto& b : devices())
    if (b.kind == kind) return b.usable ? "" : b.reason;
  return "unknown backend";
}

// Sets an environment variable (nullptr: unsets it) for a scope, then restores what it was: a
// test's knob must not undo a rerun's (tests/CMakeLists.txt runs tests again with, e.g.,
// LOCKSTEP_CPU_DECODE_LANES=1; a plain unsetenv after a test's own setting dropped it for every
// later test of that run).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) had_ = true, old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* v) {
    if (v != nullptr) ::setenv(name_.c_str(), v, 1);
    else ::unsetenv(name_.c_str());
  }
  std::string name_, old_;
  bool had_ = false;
};

// The Tuning a call on `d` from this thread uses when it passes none (lockstep/tuning.hpp).
inline const Tuning& tuning_in_force(const Device& d) {
  return detail::scoped_tuning() != nullptr ? *detail::scoped_tuning() : d.tuning();
}

// One Tuning field (a name of Tuning::apply's text form, e.g. "fused.tc_rows") set to `value`
// for a scope, on top of the Tuning in force on this thread (the innermost TuningScope's, or the
// defaults); nullptr or "": the field's default. Scopes nest, so settings compose.
class ScopedSetting {
 public:
  ScopedSetting(const char* field, const char* value) : scope_(make(field, value)) {}

 private:
  static Tuning make(const char* field, const char* value) {
    Tuning t = detail::scoped_tuning() != nullptr ? *detail::scoped_tuning() : Tuning{};
    if (value != nullptr && *value == '\0') value = nullptr;
    std::string v = value != nullptr ? value : "auto";
    if (value == nullptr) {  // the fields without "auto": their defaults
      const std::string f(field);
      const Tuning d;
      if (f == "fused.tc_splits") v = std::to_string(d.fused.tc_splits);
      if (f == "fused.pack_ahead") v = std::to_string(d.fused.pack_ahead);
      if (f == "fused.wgmma_serial") v = d.fused.wgmma_serial ? "1" : "0";
      if (f == "fused.wgmma_deferred") v = d.fused.wgmma_deferred ? "1" : "0";
      if (f == "decode.block_signals") v = d.decode.block_signals ? "1" : "0";
      if (f == "decode.max_heads_x_dim") v = std::to_string(d.decode.max_heads_x_dim);
    }
    t.apply(std::string(field) + "=" + v, "ScopedSetting");
    return t;
  }
  TuningScope scope_;
};

// One CPU simulation path of `device` (CpuDeviceOptions::decode_lanes, exact_lanes,
// softmax_lanes, block_passes) set for a scope, then restored (the same bits either way).
class ScopedCpuPath {
 public:
  ScopedCpuPath(Device& device, bool CpuDeviceOptions::*path, bool on) : device_(device) {
    old_ = detail::set_cpu_paths(device_, CpuDeviceOptions{});  // read the current ones
    CpuDeviceOptions now = old_;
    now.*path = on;
    detail::set_cpu_paths(device_, now);
  }
  ~ScopedCpuPath() { detail::set_cpu_paths(device_, old_); }
  ScopedCpuPath(const ScopedCpuPath&) = delete;
  ScopedCpuPath& operator=(const ScopedCpuPath&) = delete;

 private:
  Device& device_;
  CpuDeviceOptions old_;
};

// A CPU device like open("cpu")'s with one code path of the simulation switched (the same bits
// either way): CpuDeviceOptions::decode_lanes, exact_lanes, softmax_lanes or block_passes.
inline std::shared_ptr<Device> cpu_with(bool CpuDeviceOptions::*path, bool on = true) {
  CpuDeviceOptions o;
  o.index = 7;
  o.*path = on;
  return make_cpu_device(o);
}

// A new CPU device running the SIMD variant `simd` ("generic", "avx2", "avx3"), or nullptr, with
// the reason printed, where this CPU cannot run it.
inline std::shared_ptr<Device> cpu_variant_or_null(const char* simd) {
  CpuDeviceOptions o;
  o.simd = simd;
  try {
    return make_cpu_device(o);
  } catch (const Unsupported&) {
    std::printf("SIMD variant %s: not supported by this CPU, skipped\n", simd);
    return nullptr;
  }
}

// LOCKSTEP_TEST_REQUIRE_CUDA=1 (the GPU runs set it, tools/gpu/): a CUDA test fails instead of
// skipping when CUDA is not usable, so that a broken driver cannot turn a GPU run green.
inline bool cuda_required() {
  const char* v = std::getenv("LOCKSTEP_TEST_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto spec = DeviceSpec::parse(GetParam());
    const std::string why = unavailable_reason(spec.id.kind);
    if (!why.empty() && spec.id.kind == DeviceKind::kCuda && cuda_required())
      GTEST_FAIL() << GetParam() << " unavailable with LOCKSTEP_TEST_REQUIRE_CUDA=1: " << why;
    if (!why.empty()) GTEST_SKIP() << GetParam() << " unavailable: " << why;
    dev = open(GetParam());
  }
  std::shared_ptr<Device> dev;
};

#define LOCKSTEP_INSTANTIATE_BACKENDS(Suite)                                          \
  INSTANTIATE_TEST_SUITE_P(AllBackends, Suite, ::testing::Values("cpu", "cuda:0"),    \
                           [](const auto& info) {                                     \
                             return info.param == "cpu" ? std::string("cpu")          \
                                                        : std::string("cuda");        \
                           })

inline bool same_bits(float a, float b) {
  if (a != a && b != b) return true;  // NaN payloads are not part of the contract
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}
inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace lockstep::testing
