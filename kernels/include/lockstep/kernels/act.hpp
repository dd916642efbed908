#pragma once
// Activation formats: q, k, v and out of the attention kernels are float, half or bfloat16,
// chosen at run time (a parameter's act_format; Note [decode formats] in decode/params.hpp,
// Note [exact formats] in fused/exact.hpp). A load widens a value exactly, a store rounds once.

#include <cstdint>

#include "lockstep/formats.hpp"
#include "lockstep/kernels/hd.hpp"

namespace lockstep::kernels {

// The values of act_format (lockstep::Format's f32, f16 and bf16).
inline constexpr int kActF32 = 0, kActF16 = 1, kActBF16 = 2;

// An activation value (q, k_new, v_new) at base[off] as float, base in format fmt.
template <class X, class I, class B>
LOCKSTEP_HD typename X::template Lanes<float> load_act(X& x, const void* base, int fmt, const I& off, const B& ok) {
  typename X::template Lanes<float> v;
  if (fmt == kActF16) v = x.load(static_cast<const half*>(base), off, ok, 0.0f);
  else if (fmt == kActBF16) v = x.load(static_cast<const bfloat16*>(base), off, ok, 0.0f);
  else v = x.load(static_cast<const float*>(base), off, ok, 0.0f);
  return v;
}
// Stores v at base[off] (+ elem0 elements) rounded to format fmt.
template <class X, class I, class F, class B>
LOCKSTEP_HD void store_act(X& x, void* base, int fmt, std::int64_t elem0, const I& off, const F& v, const B& ok) {
  if (fmt == kActF16) x.store(static_cast<half*>(base) + elem0, off, v, ok);
  else if (fmt == kActBF16) x.store(static_cast<bfloat16*>(base) + elem0, off, v, ok);
  else x.store(static_cast<float*>(base) + elem0, off, v, ok);
}
// The base of an activation array at element elem0, for pointer arithmetic in its format.
LOCKSTEP_HD const void* act_at(const void* base, int fmt, std::int64_t elem0) {
  return static_cast<const char*>(base) + elem0 * (fmt == kActF32 ? 4 : 2);
}
LOCKSTEP_HD void* act_at(void* base, int fmt, std::int64_t elem0) {
  return static_cast<char*>(base) + elem0 * (fmt == kActF32 ? 4 : 2);
}

}  // namespace lockstep::kernels
