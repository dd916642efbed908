#pragma once
// The format a command-line option names ("float", "half", "bfloat16", "fp8_e4m3", "fp8_e5m2":
// lockstep::format_name's spellings), for `lockstep demo` and `lockstep parity`.
#include <optional>
#include <string_view>

#include "lockstep/formats.hpp"

namespace lockstep {

inline std::optional<Format> format_named(std::string_view name) {
  for (Format f : {Format::f32, Format::f16, Format::bf16, Format::fp8_e4m3, Format::fp8_e5m2})
    if (name == format_name(f)) return f;
  return std::nullopt;
}

}  // namespace lockstep
