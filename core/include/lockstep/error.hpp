#pragma once
// Errors (../shared/design.md §2, beside the repository): bad user input throws a typed
// lockstep::Error whose message names the parameter, its value and the limit; internal invariants
// use LOCKSTEP_ASSERT, which says "bug".
// A call that throws has not enqueued anything: outputs and caches are untouched.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lockstep {

enum class ErrorCode {
  kInvalidArgument,
  kOutOfMemory,
  kUnsupported,
  kDeviceError,
  kDeviceUnavailable,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// A parameter is outside what the call accepts. `parameter()` names it, `value()` is its value as
// text and `limit()` states what was required.
class InvalidArgument : public Error {
 public:
  InvalidArgument(std::string_view where, std::string_view parameter, std::string_view value,
                  std::string_view limit);
  const std::string& parameter() const noexcept { return parameter_; }
  const std::string& value() const noexcept { return value_; }
  const std::string& limit() const noexcept { return limit_; }

 private:
  std::string parameter_, value_, limit_;
};

// An allocation would exceed the device's memory (or its configured capacity).
class OutOfMemory : public Error {
 public:
  // `what`, when given, names what the request was for (e.g. a whole KV cache whose buffers
  // are allocated one by one: the request is the total, the available bytes those before it).
  OutOfMemory(std::string_view device, std::uint64_t requested, std::uint64_t available,
              std::string_view what = {});
  std::uint64_t requested() const noexcept { return requested_; }
  std::uint64_t available() const noexcept { return available_; }
  // What the request was for (empty when not given).
  const std::string& purpose() const noexcept { return purpose_; }

 private:
  std::uint64_t requested_, available_;
  std::string purpose_;
};

// A valid request that this build, backend or kernel does not implement (e.g. a head_dim
// without a compiled kernel). The message names the value and what is supported.
class Unsupported : public Error {
 public:
  Unsupported(std::string_view where, std::string_view parameter, std::string_view value,
              std::string_view supported);
  explicit Unsupported(const std::string& message) : Error(ErrorCode::kUnsupported, message) {}
};

// The device failed (CUDA returned an error). `sticky()` is true when the CUDA context is lost
// and every later call on the device will fail too.
class DeviceError : public Error {
 public:
  DeviceError(const std::string& message, bool sticky)
      : Error(ErrorCode::kDeviceError, message), sticky_(sticky) {}
  bool sticky() const noexcept { return sticky_; }

 private:
  bool sticky_;
};

// A backend or device cannot be used here (not built, no driver, no device, index too large).
class DeviceUnavailable : public Error {
 public:
  explicit DeviceUnavailable(const std::string& message)
      : Error(ErrorCode::kDeviceUnavailable, message) {}
};

namespace detail {
[[noreturn]] void assertion_failed(const char* expr, const char* file, int line, const char* msg);
std::string to_text(std::int64_t v);
std::string to_text(std::uint64_t v);
std::string to_text(int v);
std::string to_text(unsigned v);
std::string to_text(long long v);
std::string to_text(unsigned long long v);
std::string to_text(double v);
inline std::string to_text(std::string_view v) { return std::string(v); }
inline std::string to_text(const char* v) { return std::string(v); }
inline std::string to_text(bool v) { return v ? "true" : "false"; }
}  // namespace detail

namespace detail {
[[noreturn]] void throw_invalid(std::string_view where, std::string_view param,
                                const std::string& value, std::string_view limit);
}  // namespace detail

// Throws InvalidArgument naming `param`, its `value` and the `limit` text when `cond` is false.
// (LOCKSTEP_CHECK_ARG does the same but builds the texts only when the check fails: hot paths.)
template <class V>
inline void check_arg(bool cond, std::string_view where, std::string_view param, const V& value,
                      std::string_view limit) {
  if (!cond) throw InvalidArgument(where, param, detail::to_text(value), limit);
}

}  // namespace lockstep

#define LOCKSTEP_CHECK_ARG(cond, where, param, value, limit)                                 \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::lockstep::detail::throw_invalid((where), (param), ::lockstep::detail::to_text(value), \
                                        (limit));                                           \
  } while (0)

// Internal invariant: failing means a bug in lockstep, not bad input.
#define LOCKSTEP_ASSERT(cond, msg)                                                   \
  do {                                                                               \
    if (!(cond)) ::lockstep::detail::assertion_failed(#cond, __FILE__, __LINE__, msg); \
  } while (0)
