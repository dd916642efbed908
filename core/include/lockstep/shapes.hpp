#pragma once
// Size arithmetic. Every product of user-supplied sizes goes through checked_mul before anything
// is allocated or launched: 64-bit, and an overflow is an InvalidArgument naming what overflowed.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>

#include "lockstep/error.hpp"

namespace lockstep {

namespace detail {
[[noreturn]] void throw_mul_overflow(std::uint64_t a, std::uint64_t b, std::string_view where,
                                     std::string_view what);
}  // namespace detail

// a * b, or InvalidArgument naming `what` with the value "a * b" and the limit "representable in
// 64 bits (the product overflows)". Inline: the checks run on every call's host path (an eager
// decode call makes several), and only the throw is out of line.
inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view where,
                                 std::string_view what) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::throw_mul_overflow(a, b, where, what);
  return r;
}

// The product of all factors, checked.
inline std::uint64_t checked_product(std::initializer_list<std::uint64_t> factors, std::string_view where,
                                     std::string_view what) {
  std::uint64_t r = 1;
  for (auto f : factors) r = checked_mul(r, f, where, what);
  return r;
}

// a + b, checked.
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view where,
                          std::string_view what);

// Checks that a (non-negative) size fits the limit a kernel indexes with; e.g. per-lane offsets
// are 32-bit (docs/kernels.md, "Indexing").
void check_fits(std::uint64_t value, std::uint64_t limit, std::string_view where,
                std::string_view what);

inline constexpr std::uint64_t kMaxLaneOffset = static_cast<std::uint64_t>(
    std::numeric_limits<std::int32_t>::max());

}  // namespace lockstep
