#pragma once
// Buffer<T>: owning, typed device memory that knows its device and element count. Copies to and
// from host spans are stream operations (docs/api.md, "Devices, streams, events, buffers").
//
// Note [buffer release]
// Destroying a Buffer while work that uses it is still queued is defined: the release waits for
// every stream of the buffer's device to drain, then frees the memory (as cudaFree does). So no
// kernel or copy ever touches freed memory, on either backend. Releasing from inside a stream's
// own work is not supported (it would wait for itself).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lockstep/device.hpp"
#include "lockstep/shapes.hpp"

namespace lockstep {

// A device address, for kernel parameters only. Dereferencing it on the host is undefined on the
// CUDA backend, so the public API never hands out a plain pointer.
template <class T>
struct DevicePtr {
  T* ptr = nullptr;
  T* get() const noexcept { return ptr; }
};

template <class T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>, "Buffer<T> needs a trivially copyable T");

 public:
  using value_type = T;

  Buffer() = default;
  // Allocates `count` elements on `device` (poisoned on a CPU device with poison on).
  Buffer(std::shared_ptr<Device> device, std::size_t count) : device_(std::move(device)) {
    LOCKSTEP_CHECK_ARG(device_ != nullptr, "Buffer", "device", "null", "an open device");
    bytes_ = checked_mul(count, sizeof(T), "Buffer", "count * sizeof(T)");
    count_ = count;
    if (bytes_ > 0) data_ = static_cast<T*>(detail::DeviceAccess::allocate(*device_, bytes_));
    owning_ = true;
  }
  // The same from a signed count (the API's shapes are int64): a negative count is
  // InvalidArgument naming `count`, not a huge unsigned request.
  template <std::signed_integral I>
  Buffer(std::shared_ptr<Device> device, I count)
      : Buffer(std::move(device), unsigned_count("Buffer", count)) {}
  // Wraps memory owned elsewhere (e.g. a CUDA pointer from another library) without taking
  // ownership: destroying the Buffer frees nothing. The caller keeps the memory alive.
  static Buffer wrap(std::shared_ptr<Device> device, T* device_pointer, std::size_t count) {
    LOCKSTEP_CHECK_ARG(device != nullptr, "Buffer::wrap", "device", "null", "an open device");
    LOCKSTEP_CHECK_ARG(device_pointer != nullptr || count == 0, "Buffer::wrap", "device_pointer", "null",
              "non-null when count > 0");
    Buffer b;
    b.device_ = std::move(device);
    b.bytes_ = checked_mul(count, sizeof(T), "Buffer::wrap", "count * sizeof(T)");
    b.count_ = count;
    b.data_ = device_pointer;
    b.owning_ = false;
    return b;
  }
  template <std::signed_integral I>
  static Buffer wrap(std::shared_ptr<Device> device, T* device_pointer, I count) {
    return wrap(std::move(device), device_pointer, unsigned_count("Buffer::wrap", count));
  }

  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return count_ == 0; }
  bool owning() const noexcept { return owning_; }
  // The buffer's device; InvalidArgument for an empty Buffer (default-constructed or moved from).
  Device& device() const {
    check_not_empty("Buffer::device");
    return *device_;
  }
  const std::shared_ptr<Device>& shared_device() const noexcept { return device_; }
  DevicePtr<T> data() const noexcept { return DevicePtr<T>{data_}; }

  // Enqueues a copy of `src` into elements [offset, offset + src.size()). `src` may be reused as
  // soon as this returns.
  void copy_from_host(Stream& stream, std::span<const T> src, std::size_t offset = 0) {
    check_range("Buffer::copy_from_host", stream, offset, src.size());
    if (!src.empty())
      detail::StreamAccess::copy_h2d(stream, data_ + offset, src.data(), src.size_bytes());
  }
  // Enqueues a copy of elements [offset, offset + dst.size()) into `dst`. `dst` holds the data
  // once the stream has been synchronized (or an event recorded after the copy completed).
  void copy_to_host(Stream& stream, std::span<T> dst, std::size_t offset = 0) const {
    check_range("Buffer::copy_to_host", stream, offset, dst.size());
    if (!dst.empty())
      detail::StreamAccess::copy_d2h(stream, dst.data(), data_ + offset, dst.size_bytes());
  }
  // Enqueues a device-to-device copy of all of `src` (same device, same size). `src` may be this
  // memory itself (nothing to copy) but not partly overlap it (wrapped buffers):
  // InvalidArgument naming `src`.
  void copy_from(Stream& stream, const Buffer& src) {
    check_not_empty("Buffer::copy_from");
    src.check_not_empty("Buffer::copy_from", "src");
    LOCKSTEP_CHECK_ARG(src.device_ == device_, "Buffer::copy_from", "src.device", src.device().id().str(),
              "the destination's device " + device().id().str() +
                  " (use lockstep::copy_across for another device)");
    LOCKSTEP_CHECK_ARG(src.count_ == count_, "Buffer::copy_from", "src.size()", src.count_,
              "equal to the destination's size " + std::to_string(count_));
    check_stream("Buffer::copy_from", stream);
    if (bytes_ == 0 || src.data_ == data_) return;
    const auto d = reinterpret_cast<std::uintptr_t>(data_), s = reinterpret_cast<std::uintptr_t>(src.data_);
    LOCKSTEP_CHECK_ARG(d + bytes_ <= s || s + bytes_ <= d, "Buffer::copy_from", "src",
              "memory that partly overlaps the destination",
              "the destination itself or memory distinct from it (a wrapped buffer)");
    detail::StreamAccess::copy_d2d(stream, data_, src.data_, bytes_);
  }
  // Enqueues filling every element with `value` (4-byte element types).
  void fill(Stream& stream, T value) {
    static_assert(sizeof(T) == 4, "fill needs a 4-byte element type");
    check_stream("Buffer::fill", stream);
    std::uint32_t pattern;
    std::memcpy(&pattern, &value, 4);
    if (count_ > 0) detail::StreamAccess::fill32(stream, data_, pattern, count_);
  }
  // Copies everything to a new vector and synchronizes `stream`.
  std::vector<T> to_vector(Stream& stream) const {
    std::vector<T> out(count_);
    copy_to_host(stream, out);
    stream.synchronize();
    return out;
  }

 private:
  template <std::signed_integral I>
  static std::size_t unsigned_count(std::string_view where, I count) {
    LOCKSTEP_CHECK_ARG(count >= 0, where, "count", std::int64_t(count), ">= 0");
    return static_cast<std::size_t>(count);
  }
  void check_not_empty(std::string_view where, std::string_view name = "buffer") const {
    LOCKSTEP_CHECK_ARG(device_ != nullptr, where, name, "an empty Buffer (default-constructed or moved from)",
              "a Buffer with a device");
  }
  void check_stream(std::string_view where, Stream& stream) const {
    check_not_empty(where);
    LOCKSTEP_CHECK_ARG(&stream.device() == device_.get(), where, "stream.device",
              stream.device().id().str(),
              "the buffer's device " + detail::device_limit(*device_, stream.device()));
  }
  void check_range(std::string_view where, Stream& stream, std::size_t offset,
                   std::size_t n) const {
    check_stream(where, stream);
    LOCKSTEP_CHECK_ARG(offset <= count_ && n <= count_ - offset, where, "offset + count",
              std::to_string(offset) + " + " + std::to_string(n),
              "<= buffer size " + std::to_string(count_));
  }
  void reset() noexcept {
    if (owning_ && data_ != nullptr) detail::DeviceAccess::release(*device_, data_, bytes_);
    data_ = nullptr;
    count_ = bytes_ = 0;
    device_.reset();
  }
  void swap(Buffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    std::swap(bytes_, o.bytes_);
    std::swap(owning_, o.owning_);
  }

  std::shared_ptr<Device> device_;
  T* data_ = nullptr;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
  bool owning_ = false;
};

// Copies between buffers of different devices (e.g. cpu:0 -> cpu:1, cuda:0 -> cpu): the source is
// read on `src_stream` into host memory, which blocks the caller until the read is done, and the
// write is enqueued on `dst_stream`. Same-device copies use Buffer::copy_from.
namespace detail {
void copy_across_bytes(Stream& dst_stream, void* dst, Stream& src_stream, const void* src,
                       std::size_t bytes);
}
template <class T>
void copy_across(Stream& dst_stream, Buffer<T>& dst, Stream& src_stream, const Buffer<T>& src) {
  LOCKSTEP_CHECK_ARG(dst.shared_device() != nullptr, "copy_across", "dst", "an empty Buffer (default-constructed or moved from)",
                     "a Buffer with a device");
  LOCKSTEP_CHECK_ARG(src.shared_device() != nullptr, "copy_across", "src", "an empty Buffer (default-constructed or moved from)",
                     "a Buffer with a device");
  LOCKSTEP_CHECK_ARG(&dst_stream.device() == &dst.device(), "copy_across", "dst_stream.device",
            dst_stream.device().id().str(), "dst's device " + dst.device().id().str());
  LOCKSTEP_CHECK_ARG(&src_stream.device() == &src.device(), "copy_across", "src_stream.device",
            src_stream.device().id().str(), "src's device " + src.device().id().str());
  LOCKSTEP_CHECK_ARG(dst.size() == src.size(), "copy_across", "src.size()", src.size(),
            "equal to dst.size() " + std::to_string(dst.size()));
  detail::copy_across_bytes(dst_stream, dst.data().get(), src_stream, src.data().get(),
                            src.size_bytes());
}

}  // namespace lockstep
