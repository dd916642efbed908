// incremental_attention and kv_cache_scatter on every backend: bad input (typed errors, outputs
// untouched), empty caches, the scatter's positions.

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "lockstep/attention/decode.hpp"
#include "support/attention.hpp"

namespace lockstep::testing {
namespace {

TEST_P(Attention, IncrementalBadInputIsTypedAndWritesNothing) {
  const DecodeShape sh{8, 2, 64, 100};
  auto q = filled(8 * 64, 1.0f), kc = filled(2 * 100 * 64, 0.5f), vc = filled(2 * 100 * 64, 0.5f);
  auto out = filled(8 * 64, 42.0f);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 101, out, sh); }, "seq_len");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, -1, out, sh); }, "seq_len");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 3, 64, 100}); }, "num_kv_heads");
  expect_invalid([&] { incremental_attention(s(), q, kc, q, 5, out, sh); }, "v_cache.size()");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 64, 99}); }, "k_cache.size()");
  EXPECT_THROW(incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 48, 100}), Unsupported);
  try {
    incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 48, 100});
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("48"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos);
  }
  // Products that overflow 32 bits (and 64) are refused without allocating anything.
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 128, std::int64_t(1) << 31}); },
                 "max_len * head_dim");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 256, std::int64_t(1) << 56}); },
                 "max_len * head_dim");
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:3") : open("cpu");
  Buffer<float> foreign(other, 8 * 64);
  expect_invalid([&] { incremental_attention(s(), foreign, kc, vc, 5, out, sh); }, "q.device");
  // head_dim below 1, and an empty (moved-from) buffer as an argument: named.
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 0, 100}); }, "head_dim");
  Buffer<float> moved(dev, 8 * 64);
  Buffer<float> taken = std::move(moved);
  expect_invalid([&] { incremental_attention(s(), moved, kc, vc, 5, out, sh); }, "q");
  expect_all(out, 42.0f);
}

TEST_P(Attention, IncrementalOfLengthZeroGivesZeros) {
  const DecodeShape sh{4, 4, 32, 10};
  auto q = filled(4 * 32, 1.0f), kc = filled(4 * 10 * 32, NAN), vc = filled(4 * 10 * 32, NAN);
  auto out = filled(4 * 32, 42.0f);
  incremental_attention(s(), q, kc, vc, 0, out, sh);
  expect_all(out, 0.0f);
}

TEST_P(Attention, KvScatterBadPositionWritesNothing) {
  const DecodeShape sh{2, 2, 32, 16};
  auto src = filled(2 * 32, 3.0f), cache = filled(2 * 16 * 32, 7.0f);
  expect_invalid([&] { kv_cache_scatter(s(), src, 16, cache, sh); }, "pos");
  expect_invalid([&] { kv_cache_scatter(s(), src, -1, cache, sh); }, "pos");
  expect_all(cache, 7.0f);
  kv_cache_scatter(s(), src, 15, cache, sh);
  const auto c = cache.to_vector(s());
  EXPECT_EQ(c[15 * 32], 3.0f);
  EXPECT_EQ(c[16 * 32 + 15 * 32 + 31], 3.0f);
  EXPECT_EQ(c[14 * 32], 7.0f);
}

}  // namespace
}  // namespace lockstep::testing
