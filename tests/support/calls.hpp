#pragma once
// A backend test's helpers for calls on the device's default stream: filled buffers, typed-error
// checks, byte comparison (shared by the attention, kernel and mutation-pass tests).

#include <cstddef>
#include <string>
#include <vector>

#include "support/backends.hpp"

namespace lockstep::testing {

class CallTest : public BackendTest {
 protected:
  Stream& s() { return dev->default_stream(); }
  Buffer<float> upload(const std::vector<float>& h) {
    Buffer<float> b(dev, h.size());
    b.copy_from_host(s(), h);
    return b;
  }
  Buffer<float> filled(std::size_t n, float v) {
    Buffer<float> b(dev, n);
    b.fill(s(), v);
    return b;
  }
  // The call throws InvalidArgument naming `param` (and, when given, the value it was passed)
  // and a limit.
  template <class F>
  void expect_invalid(F&& call, const std::string& param, const std::string& value = {}) {
    try {
      call();
      ADD_FAILURE() << "accepted bad " << param << (value.empty() ? "" : " = " + value);
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), param) << e.what();
      EXPECT_FALSE(e.value().empty()) << e.what();
      if (!value.empty()) EXPECT_EQ(e.value(), value) << e.what();
      EXPECT_FALSE(e.limit().empty()) << e.what();
    }
  }
  // Bitwise equality of two host copies.
  static bool same(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (bits(a[i]) != bits(b[i])) return false;
    return true;
  }
};

}  // namespace lockstep::testing
