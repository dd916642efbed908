// Core: device ids, the registry, streams, events, buffers, memory statistics and errors, on
// every backend.

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/attention/ops.hpp"
#include "lockstep/interop.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/backends.hpp"

namespace lockstep::testing {
namespace {

// --- DeviceId / registry (backend independent) --------------------------------------------------

TEST(DeviceId, ParsesValidSpecs) {
  EXPECT_EQ(DeviceId::parse("cpu"), (DeviceId{DeviceKind::kCpu, 0}));
  EXPECT_EQ(DeviceId::parse("cpu:3"), (DeviceId{DeviceKind::kCpu, 3}));
  EXPECT_EQ(DeviceId::parse("cuda"), (DeviceId{DeviceKind::kCuda, 0}));
  EXPECT_EQ(DeviceId::parse("cuda:1"), (DeviceId{DeviceKind::kCuda, 1}));
  EXPECT_EQ(DeviceId::parse("cuda:1").str(), "cuda:1");
  EXPECT_TRUE(DeviceSpec::parse("auto").is_auto);
  EXPECT_FALSE(DeviceSpec::parse("cpu:2").is_auto);
}

TEST(DeviceId, RejectsInvalidSpecsNamingTheText) {
  for (const char* bad : {"gpu", "cuda:x", "cpu:-1", "cpu:", ":0", "CPU", "cuda:1:2", "cpu:+1",
                          "cpu 0", "", "auto:1", "cpu:-0", "cpu:007", "cpu:2147483648", "cuda: 1"}) {
    try {
      (void)DeviceSpec::parse(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), "device");
      EXPECT_EQ(e.value(), "\"" + std::string(bad) + "\"");
      EXPECT_NE(std::string(e.what()).find("\"" + std::string(bad) + "\""), std::string::npos);
      // The limit lists what a spec may be, "auto" included, and N's range.
      EXPECT_NE(e.limit().find("\"auto\""), std::string::npos) << e.limit();
      EXPECT_NE(e.limit().find("2147483647"), std::string::npos) << e.limit();
    }
  }
  EXPECT_EQ(DeviceId::parse("cpu:0"), (DeviceId{DeviceKind::kCpu, 0}));
  EXPECT_EQ(DeviceId::parse("cuda:2147483647").index, 2147483647);
}

TEST(Registry, ListsEveryBackendWithReasons) {
  const auto list = devices();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].kind, DeviceKind::kCpu);
  EXPECT_TRUE(list[0].usable);
  ASSERT_FALSE(list[0].devices.empty());
  EXPECT_GT(list[0].devices[0].caps.total_memory, 0u);
  EXPECT_FALSE(list[0].devices[0].name.empty());
  EXPECT_EQ(list[1].kind, DeviceKind::kCuda);
  if (!list[1].usable) {
    EXPECT_FALSE(list[1].reason.empty());
    std::printf("cuda unavailable here: %s\n", list[1].reason.c_str());
  } else {
    EXPECT_FALSE(list[1].devices.empty());
  }
}

TEST(Registry, OutOfRangeDevicesAreTypedErrors) {
  EXPECT_THROW(open("cuda:7"), DeviceUnavailable);  // at most one GPU on our machines
  EXPECT_THROW(open("cpu:64"), DeviceUnavailable);
  try {
    open("cuda:7");
  } catch (const DeviceUnavailable& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:7"), std::string::npos);
  }
}

TEST(Registry, OpenReturnsTheSameDevice) {
  EXPECT_EQ(open("cpu").get(), open("cpu:0").get());
  EXPECT_NE(open("cpu:0").get(), open("cpu:1").get());
}

// A DeviceKind cast from an integer that names no backend is InvalidArgument naming it (it was
// reported as the CUDA backend, "cannot open cuda:0").
TEST(Registry, OpenRefusesAKindThatIsNoBackend) {
  try {
    (void)open(DeviceId{static_cast<DeviceKind>(7), 0});
    ADD_FAILURE() << "opened DeviceKind 7";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "id.kind") << e.what();
    EXPECT_EQ(e.value(), "7") << e.what();
  }
  EXPECT_EQ(to_string(static_cast<DeviceKind>(7)), "unknown");
}

TEST(Registry, EnvironmentOverridesAuto) {
  ::setenv("LOCKSTEP_DEVICE", "cpu:5", 1);
  EXPECT_EQ(resolve_auto(), (DeviceId{DeviceKind::kCpu, 5}));
  EXPECT_EQ(open("auto")->id(), (DeviceId{DeviceKind::kCpu, 5}));
  ::setenv("LOCKSTEP_DEVICE", "gpu", 1);
  EXPECT_THROW(resolve_auto(), InvalidArgument);
  ::unsetenv("LOCKSTEP_DEVICE");
  const bool cuda = unavailable_reason(DeviceKind::kCuda).empty();
  EXPECT_EQ(resolve_auto().kind, cuda ? DeviceKind::kCuda : DeviceKind::kCpu);
}

TEST(Numerics, FlushToZeroAndDenormalsAreZeroAreOff) {
  const unsigned csr = _mm_getcsr();
  EXPECT_EQ(csr & 0x8000u, 0u) << "FTZ is on";
  EXPECT_EQ(csr & 0x0040u, 0u) << "DAZ is on";
  // And on the worker threads that run kernels: a denormal survives a kernel's multiply.
  auto dev = open("cpu");
  auto& s = dev->default_stream();
  std::vector<float> in(5000, 1e-40f);
  Buffer<float> a(dev, in.size()), b(dev, in.size());
  a.copy_from_host(s, in);
  ops::scale(s, a, b, 0.5f);
  const auto out = b.to_vector(s);
  for (float v : out) ASSERT_EQ(bits(v), bits(1e-40f * 0.5f));
  EXPECT_NE(out[0], 0.0f);
}

// --- per-backend ----------------------------------------------------------------------------------

class Core : public BackendTest {};

TEST_P(Core, CopyRoundTripThroughStreams) {
  auto& s = dev->default_stream();
  std::vector<float> h(1000);
  std::iota(h.begin(), h.end(), 0.5f);
  Buffer<float> a(dev, h.size()), b(dev, h.size());
  a.copy_from_host(s, h);
  b.copy_from(s, a);
  std::vector<float> back(h.size(), -1.0f);
  b.copy_to_host(s, back);
  s.synchronize();
  EXPECT_EQ(back, h);
  // Offsets.
  std::vector<float> part(10, 7.0f);
  a.copy_from_host(s, part, 990);
  std::vector<float> tail(10);
  a.copy_to_host(s, tail, 990);
  s.synchronize();
  EXPECT_EQ(tail, part);
  EXPECT_THROW(a.copy_from_host(s, part, 991), InvalidArgument);
}

TEST_P(Core, HostSourceMayBeReusedAfterCopyFromHost) {
  auto& s = dev->default_stream();
  Buffer<int> a(dev, 4096);
  std::vector<int> h(4096, 1);
  a.copy_from_host(s, h);
  std::fill(h.begin(), h.end(), 2);  // before any synchronization
  const auto back = a.to_vector(s);
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](int v) { return v == 1; }));
}

TEST_P(Core, StreamIsInOrder) {
  auto s = dev->create_stream();
  Buffer<float> a(dev, 1 << 16), b(dev, 1 << 16);
  // 50 dependent steps: fill, scale into the other buffer, scale back... the result is only right
  // if every step saw the previous one.
  a.fill(*s, 1.0f);
  for (int i = 0; i < 25; ++i) {
    ops::scale(*s, a, b, 2.0f);
    ops::scale(*s, b, a, 1.5f);
  }
  const auto out = a.to_vector(*s);
  float expect = 1.0f;
  for (int i = 0; i < 25; ++i) expect = (expect * 2.0f) * 1.5f;
  for (float v : out) ASSERT_EQ(v, expect);
  EXPECT_TRUE(s->query());
}

TEST_P(Core, EventsOrderTwoStreams) {
  auto s1 = dev->create_stream();
  auto s2 = dev->create_stream();
  auto ev = dev->create_event();
  EXPECT_TRUE(ev->query()) << "an event never recorded is complete";
  const std::size_t n = 1 << 22;
  Buffer<float> a(dev, n), b(dev, n), c(dev, n);
  for (int round = 0; round < 5; ++round) {
    const float v = 1.0f + round;
    a.fill(*s1, v);
    // x 1.5 per pass (exact), so that c shows how much of the chain s2 waited for.
    for (int i = 0; i < 4; ++i) ops::scale(*s1, a, b, 2.0f), ops::scale(*s1, b, a, 0.75f);
    ev->record(*s1);
    s2->wait(*ev);
    ops::scale(*s2, a, c, 2.0f);  // must see the whole chain of s1
    std::vector<float> host(n);
    c.copy_to_host(*s2, host);
    s2->synchronize();
    EXPECT_TRUE(ev->query());
    for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(host[i], 2.0f * v * 5.0625f) << "round " << round;
  }
}

TEST_P(Core, TimingEventsMeasureElapsedTime) {
  auto& s = dev->default_stream();
  auto t0 = dev->create_event(true), t1 = dev->create_event(true);
  Buffer<float> a(dev, 1 << 22), b(dev, 1 << 22);
  t0->record(s);
  a.fill(s, 3.0f);
  for (int i = 0; i < 8; ++i) ops::scale(s, a, b, 0.5f), ops::scale(s, b, a, 2.0f);  // 16 passes over 16 MB
  t1->record(s);
  t1->synchronize();
  EXPECT_GT(t1->elapsed_ms(*t0), 0.0) << "work between the two records takes time";
  EXPECT_LT(t1->elapsed_ms(*t0), 60000.0);
  auto untimed = dev->create_event(false);
  untimed->record(s);
  untimed->synchronize();
  EXPECT_THROW((void)untimed->elapsed_ms(*t0), InvalidArgument);
}

TEST_P(Core, MemoryStatisticsTrackBuffers) {
  const auto before = dev->memory_stats();
  {
    Buffer<float> a(dev, 1000);
    Buffer<double> b(dev, 10);
    const auto during = dev->memory_stats();
    EXPECT_EQ(during.in_use, before.in_use + 4000 + 80);
    EXPECT_GE(during.peak, during.in_use);
  }
  EXPECT_EQ(dev->memory_stats().in_use, before.in_use);
}

// Note [stream counters]: a stream's counters are zeros; a request that fits the current block
// returns it (not fresh), a larger one a new zeroed block (fresh: the fill just enqueued is the
// work before the next launch, which Note [one grid] must know).
TEST_P(Core, StreamCountersAreZerosAndSayWhenFresh) {
  auto s = dev->create_stream();
  bool fresh = false;
  std::int32_t* a = detail::StreamAccess::counters(*s, 10, &fresh);
  EXPECT_TRUE(fresh) << "the stream's first counters";
  std::vector<std::int32_t> host(1024, -1);
  detail::StreamAccess::copy_d2h(*s, host.data(), a, host.size() * sizeof(std::int32_t));
  s->synchronize();
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](std::int32_t v) { return v == 0; }));
  fresh = true;
  EXPECT_EQ(detail::StreamAccess::counters(*s, 1000, &fresh), a);
  EXPECT_FALSE(fresh) << "a request within the block";
  std::int32_t* b = detail::StreamAccess::counters(*s, 5000, &fresh);
  EXPECT_TRUE(fresh) << "a larger request";
  EXPECT_NE(b, a);
  std::vector<std::int32_t> big(5000, -1);
  detail::StreamAccess::copy_d2h(*s, big.data(), b, big.size() * sizeof(std::int32_t));
  s->synchronize();
  EXPECT_TRUE(std::all_of(big.begin(), big.end(), [](std::int32_t v) { return v == 0; }));
  EXPECT_EQ(detail::StreamAccess::counters(*s, 10), b) << "the newest block serves smaller requests";
}

TEST_P(Core, DestroyingABufferWithQueuedWorkIsSafe) {
  // The input is released while kernels that read it are still queued: the release waits for
  // the device's streams (Note [buffer release]); AddressSanitizer / compute-sanitizer would flag
  // a use after free, and the result shows every kernel read live memory.
  auto s = dev->create_stream();
  const std::size_t n = 1 << 22;
  Buffer<float> out(dev, n);
  {
    Buffer<float> in(dev, n);
    in.fill(*s, 4.0f);
    for (int i = 0; i < 8; ++i) ops::scale(*s, in, out, 0.25f);
  }  // released here
  const auto host = out.to_vector(*s);
  for (std::size_t i = 0; i < n; i += 1021) ASSERT_EQ(host[i], 1.0f);
}

TEST_P(Core, LaunchConfigurationErrorsAreTypedAndEnqueueNothing) {
  auto& s = dev->default_stream();
  Buffer<float> a(dev, 1024), b(dev, 1024);
  a.fill(s, 1.0f);
  b.fill(s, 9.0f);
  s.synchronize();
  kernels::ScaleParams p{a.data().get(), b.data().get(), 1024, 2.0f};
  auto expect_invalid = [&](LaunchConfig c, const std::string& param) {
    try {
      launch<kernels::Scale>(s, c, p);
      ADD_FAILURE() << "launch accepted " << param;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), param) << e.what();
    }
  };
  expect_invalid(LaunchConfig{Dim3{1, 1, 1}, 0, 0}, "block_threads");
  expect_invalid(LaunchConfig{Dim3{1, 1, 1}, 2048, 0}, "block_threads");
  expect_invalid(LaunchConfig{Dim3{1, 1, 1}, 128, 0}, "block_threads");
  expect_invalid(LaunchConfig{Dim3{0, 1, 1}, 256, 0}, "grid.x");
  expect_invalid(LaunchConfig{Dim3{1, 70000, 1}, 256, 0}, "grid.y");
  expect_invalid(LaunchConfig{Dim3{1, 1, 1}, 256, 1 << 20}, "shared_bytes");
  const auto host = b.to_vector(s);
  for (float v : host) ASSERT_EQ(v, 9.0f) << "a rejected launch ran";
}

TEST_P(Core, BadBufferArgumentsAreTypedErrors) {
  auto& s = dev->default_stream();
  Buffer<float> a(dev, 100), b(dev, 99);
  EXPECT_THROW(b.copy_from(s, a), InvalidArgument);
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:1") : open("cpu:0");
  Buffer<float> c(other, 100);
  EXPECT_THROW(c.copy_from(other->default_stream(), a), InvalidArgument);
  EXPECT_THROW(a.copy_from_host(other->default_stream(), std::vector<float>(10)), InvalidArgument);
  EXPECT_THROW(ops::scale(s, a, b, 1.0f), InvalidArgument);
  try {
    ops::scale(s, a, b, 1.0f);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "out.size()");
    EXPECT_EQ(e.value(), "99");
    EXPECT_NE(e.limit().find("100"), std::string::npos);
  }
  EXPECT_THROW(Buffer<float>(dev, std::size_t(1) << 62), InvalidArgument);  // bytes overflow
}

TEST_P(Core, CopiesAcrossDevicesAreExplicit) {
  auto other = open("cpu:2");
  std::vector<float> h(777);
  std::iota(h.begin(), h.end(), 1.0f);
  Buffer<float> a(dev, h.size()), b(other, h.size());
  a.copy_from_host(dev->default_stream(), h);
  copy_across(other->default_stream(), b, dev->default_stream(), a);
  EXPECT_EQ(b.to_vector(other->default_stream()), h);
}

LOCKSTEP_INSTANTIATE_BACKENDS(Core);

// --- CPU device specifics ------------------------------------------------------------------------

TEST(CpuDevice, NewAllocationsArePoisoned) {
  auto dev = make_cpu_device({});
  Buffer<float> a(dev, 333);
  const auto h = a.to_vector(dev->default_stream());
  for (float v : h) {
    ASSERT_EQ(bits(v), kPoisonPattern);
    ASSERT_TRUE(v != v) << "the poison pattern is a NaN";
  }
  CpuDeviceOptions o;
  o.poison = false;
  auto clean = make_cpu_device(o);
  Buffer<float> b(clean, 1 << 16);
  const auto hb = b.to_vector(clean->default_stream());
  EXPECT_LT(std::count_if(hb.begin(), hb.end(), [](float v) { return bits(v) == kPoisonPattern; }),
            16);
}

TEST(CpuDevice, CapacityExhaustionIsOutOfMemoryAndLeaksNothing) {
  CpuDeviceOptions o;
  o.memory_capacity = 1 << 20;
  auto dev = make_cpu_device(o);
  EXPECT_EQ(dev->memory_stats().capacity, 1u << 20);
  Buffer<char> a(dev, 600 * 1024);
  const auto before = dev->memory_stats();
  try {
    Buffer<char> b(dev, 500 * 1024);
    ADD_FAILURE() << "allocation beyond capacity succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), 500u * 1024);
    EXPECT_EQ(e.available(), (1u << 20) - 600u * 1024);
    EXPECT_NE(std::string(e.what()).find("512000"), std::string::npos);
  }
  EXPECT_EQ(dev->memory_stats().in_use, before.in_use);
  EXPECT_EQ(dev->memory_stats().peak, 600u * 1024);
  Buffer<char> c(dev, 400 * 1024);  // what is left still works
  EXPECT_EQ(dev->memory_stats().in_use, 1000u * 1024);
}

// An out-of-memory error says what the request was for at each layer: a stream's scratch block
// keeps the device's own reason (here: host memory of an uncapped CPU device).
TEST(CpuDevice, OutOfMemoryKeepsTheDevicesReason) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on a 2^60-byte allocation instead of returning null";
#else
  CpuDeviceOptions o;
  o.index = 11;
  auto dev = make_cpu_device(o);
  const std::size_t huge = std::size_t(1) << 60;
  try {
    Buffer<char> b(dev, huge);
    ADD_FAILURE() << "a 2^60-byte allocation succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), huge);
    EXPECT_EQ(e.purpose(), "host memory for an uncapped CPU device");
  }
  try {
    (void)detail::StreamAccess::scratch(dev->default_stream(), huge);
    ADD_FAILURE() << "a 2^60-byte scratch block succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), huge);
    EXPECT_NE(e.purpose().find("a stream scratch block"), std::string::npos) << e.what();
    EXPECT_NE(e.purpose().find("; host memory for an uncapped CPU device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(e.purpose()), std::string::npos);
  }
  EXPECT_EQ(dev->memory_stats().in_use, 0u);
#endif
}

// cuda_wrap_stream in a library without the CUDA backend is Unsupported, whatever the arguments
// (interop.hpp); with the backend, a CPU device is InvalidArgument.
TEST(CpuDevice, CudaInteropWithoutTheBackendIsUnsupported) {
  int dummy = 0;
  bool cuda_built = false;
  for (const auto& b : devices()) cuda_built = cuda_built || (b.kind == DeviceKind::kCuda && b.built);
  if (cuda_built)
    EXPECT_THROW(cuda_wrap_stream(open("cpu"), &dummy), InvalidArgument);
  else
    EXPECT_THROW(cuda_wrap_stream(open("cpu"), &dummy), Unsupported);
}

// LOCKSTEP_CPU_MEMORY caps a CPU device opened by `open`; a value that is not a byte count is
// InvalidArgument naming the variable (strtoull read "abc" and "-5" as no cap at all).
TEST(CpuDevice, MemoryCapFromTheEnvironmentIsCheckedWhenOpened) {
  // The variables as they were, restored at the end (a run under a cap keeps it).
  struct Saved {
    const char* name;
    std::string value;
    bool set;
    explicit Saved(const char* n) : name(n), set(std::getenv(n) != nullptr) {
      if (set) value = std::getenv(n);
    }
    ~Saved() {
      if (set)
        ::setenv(name, value.c_str(), 1);
      else
        ::unsetenv(name);
    }
  } saved_memory("LOCKSTEP_CPU_MEMORY"), saved_simd("LOCKSTEP_CPU_SIMD");
  ::setenv("LOCKSTEP_CPU_SIMD", "bogus", 1);
  try {
    (void)open("cpu:40");
    ADD_FAILURE() << "opened with LOCKSTEP_CPU_SIMD=bogus";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "LOCKSTEP_CPU_SIMD");
    EXPECT_EQ(e.value(), "bogus");
  }
  ::unsetenv("LOCKSTEP_CPU_SIMD");
  for (const char* bad : {"abc", "-5", "12k", "99999999999999999999"}) {
    ::setenv("LOCKSTEP_CPU_MEMORY", bad, 1);
    try {
      (void)open("cpu:41");
      ADD_FAILURE() << "opened with LOCKSTEP_CPU_MEMORY=" << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), "LOCKSTEP_CPU_MEMORY");
      EXPECT_EQ(e.value(), bad);
    }
  }
  ::setenv("LOCKSTEP_CPU_MEMORY", "4096", 1);
  auto dev = open("cpu:41");
  EXPECT_EQ(dev->memory_stats().capacity, 4096u);
  EXPECT_THROW(Buffer<char>(dev, 4097), OutOfMemory);
}

// A numeric knob set to a value it does not take (LOCKSTEP_PDL=false would have been "on",
// LOCKSTEP_CPU_SHUFFLE_BLOCKS=off too) is InvalidArgument naming the variable when a device is
// opened, by open and make_cpu_device alike, and by devices(); the values it takes, and empty, open
// the device.
TEST(CpuDevice, KnobsWithAValueTheyDoNotTakeAreRefusedWhenADeviceIsOpened) {
  struct Case {
    const char* name;
    const char* bad;
    const char* good;
  };
  for (const Case& c : {Case{"LOCKSTEP_CPU_SHUFFLE_BLOCKS", "off", "1"}, Case{"LOCKSTEP_PDL", "false", "0"},
                        Case{"LOCKSTEP_DRIVER_LAUNCH", "yes", "1"}, Case{"LOCKSTEP_CPU_DECODE_LANES", "2", "0"},
                        Case{"LOCKSTEP_CPU_POISON", "2", ""}, Case{"LOCKSTEP_CPU_BLOCK_PASSES", "on", "0"}}) {
    SCOPED_TRACE(c.name);
    const char* before = std::getenv(c.name);
    const std::string saved = before != nullptr ? before : "";
    ::setenv(c.name, c.bad, 1);
    for (int how = 0; how < 2; ++how) {
      try {
        if (how == 0) {
          (void)open("cpu:42");
        } else {
          CpuDeviceOptions o;
          o.index = 43;
          (void)make_cpu_device(o);
        }
        ADD_FAILURE() << "opened with " << c.name << "=" << c.bad;
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(e.parameter(), c.name);
        EXPECT_EQ(e.value(), "\"" + std::string(c.bad) + "\"");
        EXPECT_NE(e.limit().find("or unset"), std::string::npos) << e.limit();
      }
    }
    EXPECT_THROW((void)devices(), InvalidArgument);
    ::setenv(c.name, c.good, 1);
    EXPECT_NO_THROW((void)open("cpu:42"));
    EXPECT_NO_THROW((void)devices());
    if (before != nullptr)
      ::setenv(c.name, saved.c_str(), 1);
    else
      ::unsetenv(c.name);
  }
}

// Buffers take the API's signed sizes: a negative count is InvalidArgument naming count and its
// value, never a huge unsigned request.
TEST(CpuDevice, BufferCountsMayBeSigned) {
  auto dev = open("cpu");
  const std::int64_t n = 5;
  Buffer<float> b(dev, n);
  EXPECT_EQ(b.size(), 5u);
  for (std::int64_t bad : {std::int64_t(-1), std::numeric_limits<std::int64_t>::min()}) {
    try {
      Buffer<float> x(dev, bad);
      ADD_FAILURE() << "accepted count " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), "count");
      EXPECT_EQ(e.value(), std::to_string(bad));
    }
  }
  try {
    (void)Buffer<float>::wrap(dev, b.data().get(), -3);
    ADD_FAILURE() << "wrap accepted count -3";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "count");
    EXPECT_EQ(e.value(), "-3");
  }
  EXPECT_EQ(Buffer<float>::wrap(dev, b.data().get(), 4).size(), 4u);
}

// A stream made by create_stream keeps its device alive: destroying the caller's last handle to
// the device first (a class that declares its stream before its device) is safe, and queued work
// still completes. (It was a double free.)
TEST(CpuDevice, AStreamMayOutliveItsDeviceHandle) {
  std::unique_ptr<Stream> s;
  std::vector<float> host(1 << 16, 0.0f);
  {
    CpuDeviceOptions o;
    o.index = 9;
    auto d = make_cpu_device(o);
    s = d->create_stream();
    Buffer<float> b(d, host.size());
    b.fill(*s, 2.5f);
    b.copy_to_host(*s, host);
  }  // the device handle and the buffer are gone; the stream is not
  s->synchronize();
  EXPECT_TRUE(s->query());
  EXPECT_EQ(host[12345], 2.5f);
  EXPECT_EQ(s->device().id().index, 9);
  s.reset();
}

// An empty Buffer (moved from) and an out-of-range device index are typed errors naming the
// parameter, not internal assertions.
TEST(CpuDevice, EmptyBuffersAndBadIndicesAreInvalidArguments) {
  auto d = open("cpu");
  Buffer<float> a(d, 16), b;
  b = std::move(a);
  try {
    a.fill(d->default_stream(), 1.0f);
    ADD_FAILURE() << "fill on a moved-from Buffer";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "buffer") << e.what();
  }
  EXPECT_THROW((void)a.device(), InvalidArgument);
  // As a copy's source or destination: the copy's name and the argument's (it named
  // Buffer::device and "buffer").
  auto named = [](auto call, const std::string& where, const std::string& param) {
    try {
      call();
      ADD_FAILURE() << where << " from a moved-from Buffer";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.parameter(), param) << e.what();
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  };
  auto& st = d->default_stream();
  named([&] { b.copy_from(st, a); }, "Buffer::copy_from", "src");
  named([&] { a.copy_from(st, b); }, "Buffer::copy_from", "buffer");
  named([&] { copy_across(st, b, st, a); }, "copy_across", "src");
  named([&] { copy_across(st, a, st, b); }, "copy_across", "dst");
  CpuDeviceOptions o;
  o.index = 64;
  EXPECT_THROW(make_cpu_device(o), InvalidArgument);
  o.index = -1;
  EXPECT_THROW(make_cpu_device(o), InvalidArgument);
  // Two devices with one id: the message says why the stream does not fit.
  o.index = 0;
  auto twin = make_cpu_device(o);
  try {
    b.fill(twin->default_stream(), 1.0f);
    ADD_FAILURE() << "a stream of another device";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("make_cpu_device"), std::string::npos) << e.what();
  }
}

// As on CUDA: an event is recorded on its own device's streams; another device's stream may wait
// on it.
TEST(CpuDevice, EventsAreRecordedOnTheirOwnDevice) {
  auto a = open("cpu:0"), b = open("cpu:1");
  auto ev = a->create_event();
  try {
    ev->record(b->default_stream());
    ADD_FAILURE() << "recorded on another device's stream";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "stream.device") << e.what();
  }
  ev->record(a->default_stream());
  b->default_stream().wait(*ev);
  b->default_stream().synchronize();
  EXPECT_TRUE(ev->query());
}

TEST(CpuDevice, DevicesAreIndependent) {
  auto d1 = make_cpu_device({});
  auto d2 = make_cpu_device({});
  Buffer<float> a(d1, 1000);
  EXPECT_EQ(d1->memory_stats().in_use, 4000u);
  EXPECT_EQ(d2->memory_stats().in_use, 0u);
}

TEST(CpuDevice, StreamsReallyRunAsynchronously) {
  // A long queue is accepted without waiting: the host returns before the work is done, and a
  // copy to the host is only visible after synchronize (the CPU device enforces what a GPU does).
  auto dev = make_cpu_device({});
  auto s = dev->create_stream();
  const std::size_t n = 1 << 24;
  Buffer<float> a(dev, n), b(dev, n);
  a.fill(*s, 1.0f);
  for (int i = 0; i < 30; ++i) ops::scale(*s, a, b, 1.0f), ops::scale(*s, b, a, 1.0f);
  std::vector<float> host(16, -5.0f);
  a.copy_to_host(*s, host);
  const bool done_immediately = s->query();
  s->synchronize();
  EXPECT_FALSE(done_immediately) << "61 passes over 64 MiB finished before the enqueue returned";
  EXPECT_EQ(host[0], 1.0f);
}

TEST(CpuDevice, SimdVariantsAreSelectable) {
  CpuDeviceOptions o;
  o.simd = "generic";
  auto g = make_cpu_device(o);
  EXPECT_FALSE(g->caps().simd_target.empty());
  // Each variant that this CPU supports runs its own table: its target differs from generic's
  // (the properties compare the portable variant with the native one only where they differ).
  for (const char* v : {"avx2", "avx3"})
    if (const auto d = cpu_variant_or_null(v)) EXPECT_NE(d->caps().simd_target, g->caps().simd_target) << v;
  o.simd = "sse9";
  EXPECT_THROW(make_cpu_device(o), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::testing
