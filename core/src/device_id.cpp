#include "lockstep/device_id.hpp"

#include <charconv>

#include "lockstep/error.hpp"

namespace lockstep {

std::string_view to_string(DeviceKind kind) {
  return kind == DeviceKind::kCpu ? "cpu" : kind == DeviceKind::kCuda ? "cuda" : "unknown";
}

namespace {
// "cpu", "cuda", or either with ":N", N in [0, 2147483647] in plain decimal (no sign, no leading
// zero); anything else is InvalidArgument from `where` listing `accepted`.
DeviceId parse_id(std::string_view text, std::string_view where, std::string_view accepted) {
  auto fail = [&]() -> DeviceId {
    throw InvalidArgument(where, "device", "\"" + std::string(text) + "\"",
                          std::string(accepted) + ", N in [0, 2147483647] without a sign or leading zeros");
  };
  DeviceId id;
  std::string_view kind = text, index;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    kind = text.substr(0, colon);
    index = text.substr(colon + 1);
    if (index.empty()) return fail();
  }
  if (kind == "cpu")
    id.kind = DeviceKind::kCpu;
  else if (kind == "cuda")
    id.kind = DeviceKind::kCuda;
  else
    return fail();
  if (!index.empty()) {
    int v = 0;
    auto [ptr, ec] = std::from_chars(index.data(), index.data() + index.size(), v);
    if (ec != std::errc() || ptr != index.data() + index.size() || v < 0 || index[0] < '0' || index[0] > '9' ||
        (index.size() > 1 && index[0] == '0'))
      return fail();
    id.index = v;
  }
  return id;
}
}  // namespace

DeviceId DeviceId::parse(std::string_view text) {
  return parse_id(text, "DeviceId::parse", "one of \"cpu\", \"cpu:N\", \"cuda\", \"cuda:N\"");
}

std::string DeviceId::str() const {
  return std::string(to_string(kind)) + ":" + std::to_string(index);
}

DeviceSpec DeviceSpec::parse(std::string_view text) {
  DeviceSpec s;
  if (text == "auto") {
    s.is_auto = true;
    return s;
  }
  s.id = parse_id(text, "DeviceSpec::parse", "one of \"auto\", \"cpu\", \"cpu:N\", \"cuda\", \"cuda:N\"");
  return s;
}

}  // namespace lockstep
