#pragma once
#include <cstdint>
#include <string>
namespace lockstep::mathacc {
int run(const std::string& device, std::uint64_t stride);
}
