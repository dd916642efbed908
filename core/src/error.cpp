#include "lockstep/error.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "lockstep/shapes.hpp"

namespace lockstep {

namespace {
std::string invalid_message(std::string_view where, std::string_view parameter,
                            std::string_view value, std::string_view limit) {
  std::string m = "lockstep: ";
  m += where;
  m += ": ";
  m += parameter;
  m += " = ";
  m += value;
  m += " is invalid: must be ";
  m += limit;
  return m;
}
}  // namespace

InvalidArgument::InvalidArgument(std::string_view where, std::string_view parameter,
                                 std::string_view value, std::string_view limit)
    : Error(ErrorCode::kInvalidArgument, invalid_message(where, parameter, value, limit)),
      parameter_(parameter),
      value_(value),
      limit_(limit) {}

OutOfMemory::OutOfMemory(std::string_view device, std::uint64_t requested,
                         std::uint64_t available, std::string_view what)
    : Error(ErrorCode::kOutOfMemory,
            "lockstep: out of memory on " + std::string(device) + ": requested " +
                std::to_string(requested) + " bytes" +
                (what.empty() ? std::string() : " (" + std::string(what) + ")") + ", " +
                std::to_string(available) + " bytes available"),
      requested_(requested),
      available_(available),
      purpose_(what) {}

Unsupported::Unsupported(std::string_view where, std::string_view parameter,
                         std::string_view value, std::string_view supported)
    : Error(ErrorCode::kUnsupported, "lockstep: " + std::string(where) + ": " +
                                         std::string(parameter) + " = " + std::string(value) +
                                         " is not supported (supported: " +
                                         std::string(supported) + ")") {}

namespace detail {
void throw_invalid(std::string_view where, std::string_view param, const std::string& value,
                   std::string_view limit) {
  throw InvalidArgument(where, param, value, limit);
}
void assertion_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "lockstep bug: internal assertion failed: %s (%s) at %s:%d\n", msg, expr,
               file, line);
  std::abort();
}
std::string to_text(std::int64_t v) { return std::to_string(v); }
std::string to_text(std::uint64_t v) { return std::to_string(v); }
std::string to_text(int v) { return std::to_string(v); }
std::string to_text(unsigned v) { return std::to_string(v); }
std::string to_text(long long v) { return std::to_string(v); }
std::string to_text(unsigned long long v) { return std::to_string(v); }
std::string to_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace detail

namespace detail {
void throw_mul_overflow(std::uint64_t a, std::uint64_t b, std::string_view where, std::string_view what) {
  throw InvalidArgument(where, what, std::to_string(a) + " * " + std::to_string(b),
                        "representable in 64 bits (the product overflows)");
}
}  // namespace detail

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view where,
                          std::string_view what) {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw InvalidArgument(where, what, std::to_string(a) + " + " + std::to_string(b),
                          "representable in 64 bits (the sum overflows)");
  return r;
}

void check_fits(std::uint64_t value, std::uint64_t limit, std::string_view where,
                std::string_view what) {
  if (value > limit)
    throw InvalidArgument(where, what, std::to_string(value),
                          "<= " + std::to_string(limit) + " (kernel indexing limit)");
}

}  // namespace lockstep
