#include <vector>

#include "lockstep/buffer.hpp"

namespace lockstep::detail {

void copy_across_bytes(Stream& dst_stream, void* dst, Stream& src_stream, const void* src,
                       std::size_t bytes) {
  if (bytes == 0) return;
  std::vector<unsigned char> staging(bytes);
  StreamAccess::copy_d2h(src_stream, staging.data(), src, bytes);
  src_stream.synchronize();
  // copy_h2d has consumed the staging memory when it returns.
  StreamAccess::copy_h2d(dst_stream, dst, staging.data(), bytes);
}

}  // namespace lockstep::detail
