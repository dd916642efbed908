// Host threads: what the CPU device guarantees when several host threads use it at once (the
// "Threads" rules in docs/api.md). Each test asserts results, never timings; the CPU device's
// streams are truly asynchronous (oneTBB), so a missing lock or wait shows up as a wrong value,
// a corrupted registry or a crash. Every test is small: the whole file runs in about a second.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <latch>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/multihead.hpp"
#include "lockstep/attention/ops.hpp"
#include "support/backends.hpp"
#include "support/random.hpp"

namespace lockstep::testing {
namespace {

constexpr int kThreads = 4;

// Runs fn(t) on kThreads threads released together, and joins them.
template <class F>
void run_threads(int n, F fn) {
  std::latch start(n);
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      start.arrive_and_wait();
      fn(t);
    });
  for (auto& th : ts) th.join();
}

// A hang guard, not a timing assertion: fn must return; if it has not after a minute it is stuck
// (a deadlock) and the process aborts, since a deadlocked thread cannot be joined.
template <class F>
void must_return(const char* what, F fn) {
  auto done = std::async(std::launch::async, fn);
  if (done.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    std::fprintf(stderr, "%s: no return after a minute: deadlocked\n", what);
    std::fflush(stderr);
    std::abort();
  }
  done.get();
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// One thread's work: the primitive ops, a GEMM against a weight shared by every thread, fused
// attention (exact causal, and tensor-core, which packs K and V in the stream's scratch),
// multi-head attention (scratch again) and three Flash-Decoding steps on a KvCache of its own.
// Returns every output's bits, in order. `seed` picks the inputs.
std::vector<std::uint32_t> workload(const std::shared_ptr<Device>& dev, Stream& s,
                                    const Buffer<float>& shared_w, std::uint32_t seed) {
  Lcg rng{seed};
  auto up = [&](std::size_t n, float range = 1.0f) {
    Buffer<float> b(dev, n);
    b.copy_from_host(s, rng.floats(n, range));
    return b;
  };
  std::vector<std::uint32_t> out;
  auto take = [&](const Buffer<float>& b) {
    const auto v = bits_of(b.to_vector(s));
    out.insert(out.end(), v.begin(), v.end());
  };
  // scale, softmax, gemm (a [2, 16, 32] x shared_w [2, 32, 24]).
  auto a = up(16 * 64, 4.0f);
  Buffer<float> b(dev, a.size()), c(dev, a.size());
  ops::scale(s, a, b, 0.37f);
  ops::softmax_rows(s, b, c, 16, 64);
  take(c);
  auto g = up(2 * 16 * 32);
  Buffer<float> gc(dev, 2 * 16 * 24);
  ops::gemm(s, g, shared_w, gc, 2, 16, 24, 32, 0.5f);
  take(gc);
  // Fused attention, B1 H4 Hkv2 L48 D64.
  const AttentionShape sh{.batch = 1, .num_heads = 4, .num_kv_heads = 2, .seq_q = 48, .seq_kv = 48, .head_dim = 64};
  auto q = up(4 * 48 * 64), k = up(2 * 48 * 64), v = up(2 * 48 * 64);
  Buffer<float> o(dev, q.size());
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    AttentionOptions opt;
    opt.precision = prec;
    opt.causal = prec == AttentionPrecision::kExact;
    attention(s, q, k, v, o, sh, opt);
    take(o);
  }
  // Multi-head attention, S32 H2 D64 (fp32 GEMMs: bitwise).
  auto mq = up(32 * 128), mk = up(32 * 128), mv = up(32 * 128);
  Buffer<float> mo(dev, mq.size());
  MhaOptions mopt;
  mopt.causal = true;
  mopt.gemm = GemmKind::kExact;
  multihead_attention(s, mq, mk, mv, mo, MhaShape{32, 2, 64}, mopt);
  take(mo);
  // Flash-Decoding: two slots of different lengths, three steps.
  const KvCacheConfig cfg{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 64, .max_len = 300, .slots = 2};
  KvCache cache(dev, cfg);
  for (std::int64_t slot : {0, 1}) {
    const std::int64_t n = slot == 0 ? 270 : 37;
    const auto kh = rng.floats(std::size_t(2) * n * 64), vh = rng.floats(kh.size());
    cache.write_from_host(s, slot, 0, kh, vh, n);
  }
  auto fq = up(2 * 4 * 64), fk = up(2 * 2 * 64), fv = up(2 * 2 * 64);
  Buffer<float> fo(dev, fq.size());
  for (std::int64_t step = 0; step < 3; ++step) {
    flash_decoding(s, cache, 0, fq, fk, fv, std::vector<std::int64_t>{270 + step, 37 + step}, fo);
    take(fo);
  }
  return out;
}

Buffer<float> shared_weight(const std::shared_ptr<Device>& dev) {
  Lcg rng{12345u};
  Buffer<float> w(dev, 2 * 32 * 24);
  w.copy_from_host(dev->default_stream(), rng.floats(w.size()));
  dev->default_stream().synchronize();
  return w;
}

// --- open() and devices() ------------------------------------------------------------------------

// Concurrent open() of the same and of different cpu:N gives one shared device per N (the
// registry's map is locked: cpu_device.cpp CpuBackend::open). Indices 20-59 are opened by no
// other test, so every first open races here. devices() and make_cpu_device run alongside.
TEST(Threads, ConcurrentOpenGivesOneDevicePerIndex) {
  constexpr int kFirst = 20, kCount = 40;
  std::vector<std::vector<Device*>> got(kThreads, std::vector<Device*>(kCount));
  std::vector<std::shared_ptr<Device>> keep[kThreads];
  std::vector<Device*> listed(kThreads);
  std::vector<std::shared_ptr<Device>> own(kThreads);
  run_threads(kThreads, [&](int t) {
    for (int i = 0; i < kCount; ++i) {
      // Threads walk the indices in the same order (so that first opens collide), spelled two ways.
      const int n = kFirst + i;
      auto d = t % 2 == 0 ? open("cpu:" + std::to_string(n)) : open(DeviceId{DeviceKind::kCpu, n});
      got[t][n - kFirst] = d.get();
      keep[t].push_back(std::move(d));
    }
    const auto list = devices();
    listed[t] = open(list.at(0).devices.at(0).id).get();
    own[t] = make_cpu_device({.index = kFirst + t});  // never the shared one, though the id is
  });
  const Device* cpu0 = open("cpu").get();
  std::set<Device*> distinct;
  for (int i = 0; i < kCount; ++i) {
    const auto again = open(DeviceId{DeviceKind::kCpu, kFirst + i});
    EXPECT_EQ(again->id(), (DeviceId{DeviceKind::kCpu, kFirst + i}));
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t][i], again.get()) << "thread " << t << " cpu:" << kFirst + i;
    distinct.insert(again.get());
  }
  EXPECT_EQ(distinct.size(), std::size_t(kCount));
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(listed[t], cpu0);
    EXPECT_EQ(own[t]->id(), (DeviceId{DeviceKind::kCpu, kFirst + t}));
    EXPECT_EQ(distinct.count(own[t].get()), 0u);
  }
}

// --- streams on one device ---------------------------------------------------------------------

// kThreads threads share one device (open("cpu")) and one weight buffer; each creates its own
// stream and runs workload() twice with its own seed. Every result is bitwise the single-threaded
// one: streams share no scratch, counters or queue (a per-device scratch would mix the threads'
// packed K/V and workspaces).
TEST(Threads, OwnStreamPerThreadGivesTheSingleThreadedBits) {
  auto dev = open("cpu");
  const auto w = shared_weight(dev);
  std::vector<std::vector<std::uint32_t>> want(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    auto s = dev->create_stream();
    want[t] = workload(dev, *s, w, 1000u + t);
  }
  std::vector<std::vector<std::uint32_t>> got[kThreads];
  run_threads(kThreads, [&](int t) {
    auto s = dev->create_stream();  // created (and destroyed) on the thread
    for (int r = 0; r < 2; ++r) got[t].push_back(workload(dev, *s, w, 1000u + t));
  });
  for (int t = 0; t < kThreads; ++t)
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(got[t][r].size(), want[t].size());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < want[t].size(); ++i) bad += got[t][r][i] != want[t][i];
      EXPECT_EQ(bad, 0u) << "thread " << t << " run " << r << ": words differing from the single-threaded run";
    }
}

// One stream (a device's default stream) shared by kThreads threads, each call serialized by the
// caller's mutex but nothing synchronized until the end: allowed, and the results are the
// single-threaded bits, although the threads' multi-head attention calls (9 launches each, with
// temporaries in the one stream's scratch) interleave on the stream and its worker drains it
// meanwhile. (Without the caller's lock this is not supported: Stream's scratch blocks and
// launch count are plain members, device.hpp / device.cpp.)
TEST(Threads, SharedStreamWithCallerLockIsExact) {
  auto dev = make_cpu_device({.index = 7});
  constexpr std::int64_t S = 16, H = 2, D = 32, kCalls = 8;
  MhaOptions mopt;
  mopt.gemm = GemmKind::kExact;
  struct Work {
    Buffer<float> q, k, v, out, acc;
  };
  auto make = [&](Stream& s, int t) {
    Lcg rng{500u + t};
    Work w{Buffer<float>(dev, S * H * D), Buffer<float>(dev, S * H * D), Buffer<float>(dev, S * H * D),
           Buffer<float>(dev, S * H * D), Buffer<float>(dev, S * H * D)};
    for (auto* b : {&w.q, &w.k, &w.v}) b->copy_from_host(s, rng.floats(b->size()));
    w.acc.fill(s, 0.0f);
    return w;
  };
  auto step = [&](Stream& s, Work& w, int i) {
    ops::scale(s, w.q, w.q, i % 2 == 0 ? 2.0f : 0.5f);  // exact: the inputs differ call to call
    multihead_attention(s, w.q, w.k, w.v, w.out, MhaShape{S, H, D}, mopt);
    ops::add(s, w.out, w.acc);
  };
  std::vector<std::vector<float>> want(kThreads), got(kThreads);
  {
    auto s = dev->create_stream();
    for (int t = 0; t < kThreads; ++t) {
      auto w = make(*s, t);
      for (int i = 0; i < kCalls; ++i) step(*s, w, i);
      want[t] = w.acc.to_vector(*s);
    }
  }
  Stream& s = dev->default_stream();
  std::mutex mu;
  const auto before = s.launches();
  run_threads(kThreads, [&](int t) {
    Work w = [&] {
      std::lock_guard<std::mutex> lk(mu);
      return make(s, t);
    }();
    for (int i = 0; i < kCalls; ++i) {
      std::lock_guard<std::mutex> lk(mu);
      step(s, w, i);
    }
    std::lock_guard<std::mutex> lk(mu);
    got[t] = w.acc.to_vector(s);
  });
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(got[t].size(), want[t].size());
    EXPECT_EQ(bits_of(got[t]), bits_of(want[t])) << "thread " << t;
  }
  EXPECT_EQ(s.launches() - before, std::uint64_t(kThreads * kCalls * (1 + 9 + 1)));
}

// Streams created and destroyed on two threads while a third synchronizes the device and reads
// its statistics: the device's stream set is locked (CpuDevice::register_stream /
// unregister_stream / synchronize), so nothing is lost or touched after destruction, and every
// result is right.
TEST(Threads, StreamsComeAndGoWhileAnotherThreadSynchronizesTheDevice) {
  auto dev = make_cpu_device({.index = 8});
  std::atomic<int> wrong{0}, finished{0};
  run_threads(3, [&](int t) {
    if (t == 2) {
      int n = 0;
      while (finished.load() < 2 || n < 50) {
        dev->synchronize();
        (void)dev->memory_stats();
        ++n;
      }
      return;
    }
    for (int r = 0; r < 60; ++r) {
      auto s = dev->create_stream();
      Buffer<float> a(dev, 4096), b(dev, 4096);
      a.fill(*s, float(r));
      ops::scale(*s, a, b, 2.0f);
      ops::add(*s, a, b);
      const auto v = b.to_vector(*s);
      wrong += std::count_if(v.begin(), v.end(), [&](float x) { return x != 3.0f * float(r); });
      for (int i = 0; i < 16; ++i) (void)dev->create_stream();  // destroyed at once, nothing enqueued
    }
    ++finished;
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(dev->memory_stats().in_use, 0u);
}

// --- buffers -------------------------------------------------------------------------------------

// Allocation and release from kThreads threads: in_use is exactly the bytes of the buffers still
// alive, and 0 once they are gone; peak is at least that and at least the largest buffer. Each
// thread writes and reads back its buffers on its own stream (no two share memory).
TEST(Threads, ConcurrentAllocationKeepsMemoryStatsExact) {
  auto dev = make_cpu_device({.index = 9, .poison = false});
  std::vector<std::vector<Buffer<float>>> live(kThreads);
  std::atomic<int> wrong{0};
  run_threads(kThreads, [&](int t) {
    Lcg rng{77u + t};
    auto s = dev->create_stream();
    live[t].resize(8);
    for (int r = 0; r < 3000; ++r) {
      const std::size_t n = 1 + (std::size_t(rng.next() * 2048.0f + 2048.0f) % 4096);
      auto& slot = live[t][r % 8];
      slot = Buffer<float>(dev, n);  // releases the old one
      if (r % 128 == 0) {
        slot.fill(*s, float(t * 1000 + r));
        for (float x : slot.to_vector(*s)) wrong += x != float(t * 1000 + r);
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  std::uint64_t held = 0, largest = 0;
  for (auto& per : live)
    for (auto& b : per) {
      held += b.size_bytes();
      largest = std::max<std::uint64_t>(largest, b.size_bytes());
    }
  const auto st = dev->memory_stats();
  EXPECT_EQ(st.in_use, held);
  EXPECT_GE(st.peak, held);
  EXPECT_GE(st.peak, largest);
  live.clear();
  EXPECT_EQ(dev->memory_stats().in_use, 0u);
}

// A capped device filled by kThreads threads at once: exactly capacity / size buffers fit, the
// others are OutOfMemory, and the device never hands out more than its capacity.
TEST(Threads, ConcurrentAllocationNeverExceedsTheCapacity) {
  constexpr std::size_t kBytes = 256 * 1024, kFit = 32;
  auto dev = make_cpu_device({.index = 10, .memory_capacity = kBytes * kFit, .poison = false});
  std::vector<std::vector<Buffer<float>>> held(kThreads);
  std::atomic<int> refused{0};
  run_threads(kThreads, [&](int t) {
    for (int r = 0; r < 20; ++r) {
      try {
        held[t].emplace_back(dev, kBytes / sizeof(float));
      } catch (const OutOfMemory&) {
        ++refused;
      }
    }
  });
  std::size_t n = 0;
  for (auto& h : held) n += h.size();
  EXPECT_EQ(n, kFit);
  EXPECT_EQ(refused.load(), int(kThreads * 20 - kFit));
  EXPECT_EQ(dev->memory_stats().in_use, kBytes * kFit);
  EXPECT_EQ(dev->memory_stats().peak, kBytes * kFit);
  held.clear();
  EXPECT_EQ(dev->memory_stats().in_use, 0u);
}

// --- events --------------------------------------------------------------------------------------

// A producer thread and a consumer thread, each with its own stream, hand a buffer back and forth
// through two events: the producer refills `src` after waiting (on its stream) for the consumer's
// `consumed`; the consumer adds `src` into `acc` after waiting for the producer's `produced`. The
// threads only tell each other (host side) that a record has been made; every device-side order
// comes from Stream::wait. Then a third thread synchronizes on `consumed` (Event::synchronize)
// and reads `acc` on a stream of its own. Without the waits the 1 MB refills and the adds
// overlap (CPU streams are asynchronous) and the sums come out wrong.
TEST(Threads, EventsRecordedOnOneThreadOrderStreamsOfAnother) {
  auto dev = open("cpu");
  constexpr std::size_t kN = std::size_t(1) << 18;
  constexpr int kRounds = 6;
  Buffer<float> src(dev, kN), acc(dev, kN);
  acc.fill(dev->default_stream(), 0.0f);
  dev->default_stream().synchronize();
  auto produced = dev->create_event(), consumed = dev->create_event();
  std::mutex mu;
  std::condition_variable cv;
  int produced_records = 0, consumed_records = 0;
  auto wait_for = [&](int& counter, int n) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return counter >= n; });
  };
  auto bump = [&](int& counter) {
    std::lock_guard<std::mutex> lk(mu);
    ++counter;
    cv.notify_all();
  };
  std::vector<float> result;
  run_threads(3, [&](int t) {
    auto s = dev->create_stream();
    if (t == 0) {  // producer
      for (int r = 0; r < kRounds; ++r) {
        wait_for(consumed_records, r);  // the consumer has recorded `consumed` for round r - 1
        s->wait(*consumed);
        src.fill(*s, 1.0f);
        for (int i = 0; i < 3; ++i) ops::scale(*s, src, src, float(r + 1));  // (r + 1)^3
        produced->record(*s);
        bump(produced_records);
      }
    } else if (t == 1) {  // consumer
      for (int r = 0; r < kRounds; ++r) {
        wait_for(produced_records, r + 1);
        s->wait(*produced);
        ops::add(*s, src, acc);
        consumed->record(*s);
        bump(consumed_records);
      }
    } else {  // reader: no stream order with the others, only the event
      wait_for(consumed_records, kRounds);
      consumed->synchronize();
      EXPECT_TRUE(consumed->query());
      result = acc.to_vector(*s);
    }
  });
  float want = 0;
  for (int r = 1; r <= kRounds; ++r) want += float(r * r * r);
  ASSERT_EQ(result.size(), kN);
  EXPECT_EQ(std::count_if(result.begin(), result.end(), [&](float x) { return x != want; }), 0)
      << "want " << want << ", e.g. got " << result[0];
}

// Timing events read from two threads in opposite orders (a.elapsed_ms(b) against
// b.elapsed_ms(a)): each call locks both events' states, so the two orders must not deadlock.
TEST(Threads, ElapsedMsInOppositeOrdersDoesNotDeadlock) {
  auto dev = open("cpu");
  auto s = dev->create_stream();
  auto e0 = dev->create_event(true), e1 = dev->create_event(true);
  e0->record(*s);
  e1->record(*s);
  s->synchronize();
  std::atomic<int> negative{0}, finished{0};
  must_return("elapsed_ms from two threads", [&] {
    run_threads(2, [&](int t) {
      // Each thread keeps calling until both have made 300000 calls, so the two overlap
      // throughout. (Before the fix, two lock_guards in argument order, this hung in 3 runs of 5
      // at 200000 calls without the overlap rule.)
      for (int i = 0; i < 300000 || finished.load(std::memory_order_relaxed) < 2; ++i) {
        const double ms = t == 0 ? e1->elapsed_ms(*e0) : -e0->elapsed_ms(*e1);
        negative += ms < 0;
        if (i == 300000 - 1) ++finished;
      }
    });
  });
  EXPECT_EQ(negative.load(), 0);
}

// An event measured against itself is 0 ms (cudaEventElapsedTime gives 0 there too). Before the
// fix this locked the event's std::mutex twice and hung, on one thread.
TEST(Threads, ElapsedMsOfAnEventWithItselfIsZero) {
  auto dev = open("cpu");
  auto s = dev->create_stream();
  auto e = dev->create_event(true);
  e->record(*s);
  s->synchronize();
  double ms = -1;
  must_return("e.elapsed_ms(e)", [&] { ms = e->elapsed_ms(*e); });
  EXPECT_EQ(ms, 0.0);
  auto never = dev->create_event(true);  // and not recorded: refused, as for two events
  must_return("never.elapsed_ms(never)", [&] { EXPECT_THROW((void)never->elapsed_ms(*never), InvalidArgument); });
}

// --- the KV cache --------------------------------------------------------------------------------

// A KvCache has no thread affinity: used by one thread and then by another (handed over with a
// join, which orders the host bookkeeping), it gives the bits of a single-threaded run.
TEST(Threads, KvCacheHandedToAnotherThreadContinuesExactly) {
  auto dev = open("cpu");
  const KvCacheConfig cfg{.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 64, .max_len = 64, .slots = 2};
  Lcg rng{4242u};
  std::vector<std::vector<float>> qs, ks, vs;
  for (int step = 0; step < 4; ++step) {
    qs.push_back(rng.floats(2 * 4 * 64));
    ks.push_back(rng.floats(2 * 2 * 64));
    vs.push_back(rng.floats(2 * 2 * 64));
  }
  auto run_steps = [&](KvCache& cache, Stream& s, int from, int to, std::vector<std::uint32_t>& out) {
    Buffer<float> q(dev, 2 * 4 * 64), k(dev, 2 * 2 * 64), v(dev, 2 * 2 * 64), o(dev, 2 * 4 * 64);
    for (int step = from; step < to; ++step) {
      q.copy_from_host(s, qs[step]);
      k.copy_from_host(s, ks[step]);
      v.copy_from_host(s, vs[step]);
      for (std::int64_t layer = 0; layer < 2; ++layer) {
        flash_decoding(s, cache, layer, q, k, v, std::vector<std::int64_t>{step, step}, o);
        const auto b = bits_of(o.to_vector(s));
        out.insert(out.end(), b.begin(), b.end());
      }
    }
  };
  std::vector<std::uint32_t> want, got;
  {
    KvCache cache(dev, cfg);
    auto s = dev->create_stream();
    run_steps(cache, *s, 0, 4, want);
  }
  KvCache cache(dev, cfg);
  std::thread([&] {
    auto s = dev->create_stream();
    run_steps(cache, *s, 0, 2, got);
  }).join();
  std::thread([&] {
    auto s = dev->create_stream();
    run_steps(cache, *s, 2, 4, got);
  }).join();
  EXPECT_EQ(cache.length(0), 4);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace lockstep::testing
