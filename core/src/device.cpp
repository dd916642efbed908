// Out-of-line members of the core interface.
#include <string>
#include "lockstep/device.hpp"

#include <algorithm>

namespace lockstep {

Device::Device() : tuning_(detail::tuning_from_environment("open device")) {}

// Note [stream scratch]: device memory for temporaries of calls enqueued on a stream (split-K
// partials, attention workspaces) when the caller passes no workspace of its own. Work on one
// stream is ordered, so consecutive calls may share it; a larger request allocates a new block and
// keeps the old one (queued work may still use it) until the stream is destroyed. Never freed
// mid-stream, so no call synchronizes.
//
// Note [stream counters]: int32 zeros for kernels that count among their blocks (Note [block
// signals] in kernels/decode/params.hpp). The kernels that use them leave them zero when they
// finish, so consecutive calls share them; a larger request allocates a new block, zero-filled on
// the stream (an ordered fill, enqueued once), and keeps the old one until the stream is
// destroyed. *fresh (when given) says whether this call allocated the block, i.e. whether that
// fill is the work just before the next launch (Note [one grid] in kernels/decode/one_grid.hpp).
namespace detail {
struct StreamMemory {
  struct Block {
    Device* device;
    void* ptr;
    std::size_t bytes;
  };
  std::vector<Block> scratch, counters;
};
}  // namespace detail

Stream::Stream() : memory_(std::make_unique<detail::StreamMemory>()) {}

Stream::~Stream() { release_scratch(); }

void Stream::release_scratch() noexcept {
  for (auto* blocks : {&memory_->scratch, &memory_->counters}) {
    for (auto& b : *blocks) detail::DeviceAccess::release(*b.device, b.ptr, b.bytes);
    blocks->clear();
  }
}

namespace {
// The last block of `blocks` if it holds `bytes`, else a new one of the smallest power-of-two
// multiple of `min_size` that does (the old blocks stay: queued work may still use them).
template <class Block>
Block& block_for(std::vector<Block>& blocks, Device& dev, std::size_t bytes, std::size_t min_size,
                 bool& fresh) {
  fresh = blocks.empty() || blocks.back().bytes < bytes;
  if (!fresh) return blocks.back();
  std::size_t size = min_size;
  while (size < bytes) size *= 2;
  void* p = nullptr;
  try {
    p = detail::DeviceAccess::allocate(dev, size);
  } catch (const OutOfMemory& e) {  // say what it was for: the caller asked for fewer bytes
    throw OutOfMemory(dev.id().str(), e.requested(), e.available(),
                      "a stream scratch block for a call's temporaries, " + std::to_string(bytes) +
                          " bytes rounded up to a power-of-two multiple of " + std::to_string(min_size) +
                          ", kept until the stream is destroyed" +
                          (e.purpose().empty() ? std::string() : "; " + e.purpose()));
  }
  blocks.push_back(Block{&dev, p, size});
  return blocks.back();
}
}  // namespace

void* Stream::scratch(std::size_t bytes) {
  bool fresh = false;
  return block_for(memory_->scratch, device(), std::max<std::size_t>(bytes, 1), std::size_t(1) << 20, fresh).ptr;
}

std::int32_t* Stream::counters(std::size_t count, bool* fresh_out) {
  bool fresh = false;
  const auto& b = block_for(memory_->counters, device(), std::max<std::size_t>(count, 1) * sizeof(std::int32_t), 4096, fresh);
  if (fresh) fill32(b.ptr, 0, b.bytes / sizeof(std::int32_t));
  if (fresh_out != nullptr) *fresh_out = fresh;
  return static_cast<std::int32_t*>(b.ptr);
}

}  // namespace lockstep
