#include "lockstep/device_id.hpp"

#include <charconv>

#include "lockstep/error.hpp"

namespace lockstep {

std::string_view to_string(DeviceKind kind) { return kind == DeviceKind::kCpu ? "cpu" : "cuda"; }

DeviceId DeviceId::parse(std::string_view text) {
  auto fail = [&]() -> DeviceId {
    throw InvalidArgument("DeviceId::parse", "device", "\"" + std::string(text) + "\"",
                          "one of \"cpu\", \"cpu:N\", \"cuda\", \"cuda:N\" with N >= 0");
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
    if (ec != std::errc() || ptr != index.data() + index.size() || v < 0 || index[0] == '+')
      return fail();
    id.index = v;
  }
  return id;
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
  s.id = DeviceId::parse(text);
  return s;
}

}  // namespace lockstep
