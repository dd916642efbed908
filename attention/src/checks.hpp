#pragma once
// Argument checks shared by the attention calls: every failure is an InvalidArgument naming the
// parameter, its value and the limit, raised before anything is enqueued.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "lockstep/buffer.hpp"

namespace lockstep::detail {

inline void check_positive(std::string_view where, std::string_view name, std::int64_t v) {
  LOCKSTEP_CHECK_ARG(v >= 1, where, name, v, ">= 1");
}
inline void check_nonneg(std::string_view where, std::string_view name, std::int64_t v) {
  LOCKSTEP_CHECK_ARG(v >= 0, where, name, v, ">= 0");
}
// The head dimensions every attention kernel is instantiated for (Unsupported otherwise).
inline void check_head_dim(std::string_view where, std::int64_t d) {
  LOCKSTEP_CHECK_ARG(d > 0, where, "head_dim", d, ">= 1");  // not a value a kernel could support
  if (d != 32 && d != 64 && d != 96 && d != 128 && d != 256)
    throw Unsupported(where, "head_dim", std::to_string(d), "32, 64, 96, 128, 256");
}

template <class T>
void check_on(std::string_view where, std::string_view name, const Buffer<T>& b, Stream& s) {
  LOCKSTEP_CHECK_ARG(!b.empty() || b.shared_device() != nullptr, where, name, "an empty Buffer",
            "an allocated buffer");
  LOCKSTEP_CHECK_ARG(&b.device() == &s.device(), where, std::string(name) + ".device", b.device().id().str(),
            "the stream's device " + detail::device_limit(s.device(), b.device()));
}

inline std::string hex_address(std::uintptr_t a) {
  char buf[2 + 2 * sizeof(a) + 1];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

// The decode kernels read q, the caches and the new tokens as 16-byte vectors (load4,
// cp.async): a wrapped pointer must be 16-byte aligned (allocated buffers always are).
template <class T>
void check_aligned16(std::string_view where, std::string_view name, const Buffer<T>& b) {
  const auto addr = reinterpret_cast<std::uintptr_t>(b.data().get());
  LOCKSTEP_CHECK_ARG(addr % 16 == 0, where, std::string(name) + ".data()", "address " + hex_address(addr),
            "a multiple of 16 bytes");
}

// `out` must not share memory with `in` (an operation that reads `in` while writing `out` in
// another order; allocated buffers never overlap unless they are the same, wrapped ones may).
template <class T, class U>
bool overlaps(const Buffer<T>& a, const Buffer<U>& b) {
  const auto x = reinterpret_cast<std::uintptr_t>(a.data().get()),
             y = reinterpret_cast<std::uintptr_t>(b.data().get());
  return a.size_bytes() > 0 && b.size_bytes() > 0 && x < y + b.size_bytes() && y < x + a.size_bytes();
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_overlap(std::string_view where, std::string_view out_name,
                                                                 std::string_view in_name) {
  throw_invalid(where, out_name, "memory that overlaps " + std::string(in_name),
                "a buffer distinct from " + std::string(in_name) + " (this operation is not in place)");
}
// Inline, the throw out of line: an eager decode call makes about ten of these checks.
template <class T, class U>
inline void check_no_overlap(std::string_view where, std::string_view out_name, const Buffer<T>& out,
                             std::string_view in_name, const Buffer<U>& in) {
  if (overlaps(out, in)) [[unlikely]]
    throw_overlap(where, out_name, in_name);
}

// An option of enum type must hold one of its named values (a cast from an integer can hold any
// other, which would otherwise run as whichever branch it falls into).
template <class E>
void check_enum(std::string_view where, std::string_view name, E value, std::initializer_list<E> named,
                std::string_view names) {
  bool ok = false;
  for (E e : named) ok = ok || e == value;
  LOCKSTEP_CHECK_ARG(ok, where, name, static_cast<long long>(value), names);
}

// An elementwise operation may run in place: `out` is either `in` itself (the same first element;
// the sizes are checked to be equal) or shares no memory with it. A partial overlap (a wrapped
// buffer a few elements into the other) would read elements already written, in an order that
// depends on the blocks' schedule.
template <class T, class U>
void check_in_place_or_distinct(std::string_view where, std::string_view out_name, const Buffer<T>& out,
                                std::string_view in_name, const Buffer<U>& in) {
  const bool same_start = static_cast<const void*>(out.data().get()) == static_cast<const void*>(in.data().get());
  LOCKSTEP_CHECK_ARG(same_start || !overlaps(out, in), where, out_name,
                     "memory that partly overlaps " + std::string(in_name),
                     std::string(in_name) + " itself (in place) or a buffer distinct from it");
}

// Buffer `b` must hold exactly `expected` elements (the product of the named dims).
template <class T>
void check_size(std::string_view where, std::string_view name, const Buffer<T>& b,
                std::uint64_t expected, std::string_view shape) {
  LOCKSTEP_CHECK_ARG(b.size() == expected, where, std::string(name) + ".size()", b.size(),
            std::to_string(expected) + " (" + std::string(shape) + ")");
}

inline std::string dims(std::initializer_list<std::int64_t> d) {
  std::string s = "[";
  bool first = true;
  for (auto v : d) {
    if (!first) s += ", ";
    s += std::to_string(v);
    first = false;
  }
  return s + "]";
}

// The Tuning a call uses: its own (`call`), else the innermost TuningScope's on this thread,
// else the stream's device's (lockstep/tuning.hpp).
inline const Tuning& tuning_for(const Device& d, const Tuning* call) {
  if (call != nullptr) return *call;
  if (const Tuning* scoped = scoped_tuning()) return *scoped;
  return d.tuning();
}
inline const Tuning& tuning_for(const Stream& s, const Tuning* call) { return tuning_for(s.device(), call); }

// A call's softmax scale: options.scale (checked finite) or 1 / sqrt(head_dim).
inline float softmax_scale(std::string_view where, const std::optional<float>& scale, std::int64_t head_dim) {
  if (scale) LOCKSTEP_CHECK_ARG(std::isfinite(*scale), where, "options.scale", *scale, "a finite float");
  return scale.value_or(1.0f / std::sqrt(static_cast<float>(head_dim)));
}

// Note [caller workspace]: a call's temporaries live in options.workspace when the caller gives
// one, else in the stream's scratch (Note [stream scratch]). The caller's buffer is checked with
// the call's other arguments (on the stream's device, at least the bytes the call needs, 16-byte
// aligned, overlapping none of the call's buffers: check_workspace_apart), so that a refused
// call enqueues nothing; workspace_memory then hands out its start.
inline void check_workspace(std::string_view where, const Buffer<std::byte>* ws, Stream& s, std::uint64_t bytes) {
  if (ws == nullptr) return;
  check_on(where, "options.workspace", *ws, s);
  LOCKSTEP_CHECK_ARG(ws->size() >= bytes, where, "options.workspace.size()", ws->size(),
                     "at least " + std::to_string(bytes) + " bytes (the call's workspace bytes)");
  check_aligned16(where, "options.workspace", *ws);
}
template <class T>
void check_workspace_apart(std::string_view where, const Buffer<std::byte>* ws, std::string_view name,
                           const Buffer<T>& b) {
  if (ws != nullptr) check_no_overlap(where, "options.workspace", *ws, name, b);
}
inline void* workspace_memory(Stream& s, Buffer<std::byte>* ws, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  return ws != nullptr ? static_cast<void*>(ws->data().get()) : StreamAccess::scratch(s, bytes);
}

}  // namespace lockstep::detail
