#pragma once
// DeviceId: a value naming one device: kind + index. Parsed from "cpu", "cpu:N", "cuda",
// "cuda:N". "auto" is a DeviceSpec that resolves at open() time (CUDA when a usable GPU exists,
// else CPU; the environment variable LOCKSTEP_DEVICE overrides what auto picks).

#include <string>
#include <string_view>

namespace lockstep {

enum class DeviceKind { kCpu, kCuda };

std::string_view to_string(DeviceKind kind);

struct DeviceId {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  // Parses "cpu", "cpu:N", "cuda", "cuda:N" (N a decimal integer >= 0). Anything else, "auto"
  // included, throws InvalidArgument naming the text.
  static DeviceId parse(std::string_view text);
  std::string str() const;
  friend bool operator==(const DeviceId&, const DeviceId&) = default;
};

struct DeviceSpec {
  bool is_auto = false;
  DeviceId id;  // meaningful when !is_auto

  // Parses everything DeviceId::parse accepts, plus "auto".
  static DeviceSpec parse(std::string_view text);
  std::string str() const { return is_auto ? "auto" : id.str(); }
};

}  // namespace lockstep
