#pragma once
// Flash-Decoding in the formats (Note [decode formats] in kernels/decode/params.hpp): a decode
// world (harness_decode.hpp) with q, out and the new tokens in float, half or bfloat16 and the
// cache in any format; fp8 with scales per kv head drawn from the seed (not powers of two).
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "harness_decode.hpp"

namespace lockstep::harness {

// Host values as T (float, or a storage format rounded by its conversion), and back.
template <class T>
std::vector<T> encode(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) out[i] = x[i];
    else out[i] = from_float<T>(x[i]);
  }
  return out;
}
// A host vector's bytes.
template <class T>
std::vector<std::uint8_t> raw(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
// fn(T{}) with T the activation type of f: half, bfloat16, else float.
template <class F>
decltype(auto) with_act(Format f, F&& fn) {
  switch (f) {
    case Format::f16: return fn(half{});
    case Format::bf16: return fn(bfloat16{});
    default: return fn(float{});
  }
}
template <class T>
float widen(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return to_float(v);
}
template <class T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = widen(x[i]);
  return out;
}

struct FormatWorldShape {
  DecodeWorldShape world;  // one layer is used
  Format act = Format::bf16;
  Format cache = Format::fp8_e4m3;
};

// out (widened) against the float64 oracle on the values the cache holds (its codes times the
// scales) within the fp32 bound plus the output's rounding; then the cache's codes below each
// slot's new length, exactly the conversions of x / scale.
std::unique_ptr<Case> format_flash_case(const FormatWorldShape& s);

// The pair of formats (activations, cache) that the flash_decoding_formats entry's random cases
// take (lockstep parity --formats); unset: each case draws one.
void fix_decode_formats(std::optional<std::pair<Format, Format>> pair);
std::optional<std::pair<Format, Format>> fixed_decode_formats();

// The widened outputs [slots, heads, dim] of flash_decoding over world w in these formats on dev.
std::vector<float> format_flash_outputs(const DecodeWorld& w, Format act, Format cache,
                                        const std::shared_ptr<Device>& dev);

}  // namespace lockstep::harness
