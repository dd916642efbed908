// Attention calls and the KV cache on every backend: shapes, bad input (typed errors, outputs and
// caches untouched), memory accounting, cache operations.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/fused.hpp"
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/multihead.hpp"
#include "lockstep/kernels/decode.hpp"
#include "harness/harness.hpp"
#include "support/random.hpp"
#include "lockstep/kernels/launch.hpp"
#include "support/calls.hpp"

namespace lockstep::testing {
namespace {

// Note [one grid]: whether a decode whose merge does not fold is one launch on `d`:
// LOCKSTEP_DECODE_ONE_GRID=0|1 forces either; unset, the two launches on every device for now
// (kOneGridOnCuda in attention/src/decode_launch.cpp; this follows it).
constexpr bool kOneGridOnCuda = false;
bool one_grid_by_default(const Device& d) {
  const char* env = std::getenv("LOCKSTEP_DECODE_ONE_GRID");
  const int n = env != nullptr ? std::atoi(env) : -1;  // as the library's knob: negative is unset
  return n >= 0 ? n != 0 : kOneGridOnCuda && d.id().kind == DeviceKind::kCuda;
}

class Attention : public CallTest {
 protected:
  // A schedule knob (environment variable) set to a and then to b gives the same bytes, out and
  // log-sum-exp, for fused attention of shape sh (inputs uniform in [-range, range]).
  void expect_knob_gives_same_bytes(const char* knob, const char* a, const char* b,
                                    AttentionPrecision precision, const AttentionShape& sh,
                                    bool causal, Lcg& rng, float range) {
    const std::size_t nq = std::size_t(sh.batch * sh.heads * sh.seq_q * sh.head_dim);
    const std::size_t nkv = std::size_t(sh.batch * sh.kv_heads * sh.seq_kv * sh.head_dim);
    const std::size_t nl = std::size_t(sh.batch * sh.heads * sh.seq_q);
    auto buf = [&](std::size_t n) {
      Buffer<float> x(dev, n);
      x.copy_from_host(s(), rng.floats(n, range));
      return x;
    };
    auto q = buf(nq), k = buf(nkv), v = buf(nkv);
    std::vector<float> outs[2], lses[2];
    for (int i = 0; i < 2; ++i) {
      auto out = filled(nq, 42.0f), lse = filled(nl, 42.0f);
      AttentionOptions o;
      o.precision = precision;
      o.causal = causal;
      o.lse = &lse;
      // Set until the results are read: the CPU device reads some knobs when the blocks run.
      const ScopedEnv knob_value(knob, i == 0 ? a : b);
      attention(s(), q, k, v, out, sh, o);
      outs[i] = out.to_vector(s());
      lses[i] = lse.to_vector(s());
    }
    for (std::size_t e = 0; e < outs[0].size(); ++e) ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
    for (std::size_t e = 0; e < lses[0].size(); ++e) ASSERT_EQ(bits(lses[0][e]), bits(lses[1][e])) << e;
    ASSERT_NE(outs[0][0], 42.0f);
    ASSERT_NE(lses[0][0], 42.0f);
  }
  // One TensorCore attention call with the defaults (LOCKSTEP_FUSED_TC_PACK=pack), synchronized:
  // what a launch record around it shows is what runs by default.
  void tensor_core_attention(const AttentionShape& sh, bool causal, const char* pack) {
    const ScopedEnv packing("LOCKSTEP_FUSED_TC_PACK", pack);
    auto q = filled(std::size_t(sh.batch * sh.heads * sh.seq_q * sh.head_dim), 0.5f);
    auto kv = filled(std::size_t(sh.batch * sh.kv_heads * sh.seq_kv * sh.head_dim), 0.25f);
    auto out = filled(std::size_t(sh.batch * sh.heads * sh.seq_q * sh.head_dim), 42.0f);
    AttentionOptions o;
    o.precision = AttentionPrecision::kTensorCore;
    o.causal = causal;
    attention(s(), q, kv, kv, out, sh, o);
    s().synchronize();
  }
  void expect_all(const Buffer<float>& b, float v) {
    for (float x : b.to_vector(s())) ASSERT_EQ(bits(x), bits(v)) << "a rejected call wrote";
  }
  // Note [split keys]: a split cuts each query tile's key tiles into S ranges, one block each, and
  // the last block of a tile merges them in split order. Shapes: one kv head of 700 keys under 150
  // rows (11 tiles; Exact's S = 2 with batch_invariant = false); GQA, two batches, 1100 keys at
  // head_dim 128 (18 tiles, Exact's S = 4; 70 rows: partial query tiles); 600 queries over 560 keys
  // (9 tiles, S = 2), causal: the first 40 rows see no key, and the later splits of early query
  // tiles none either. (TensorCore splits only when its knob asks.)
  // For each, with `knob` = 3 and with the default: against the float64 reference
  // (harness::attention_reference) within `tol(qmag, keys, D)` (qmag: the row's largest sum of
  // |q k| scale), rows that see no key +0 with
  // log-sum-exp -inf, the same bytes from a second call on the stream (the counters are zeros
  // again), and other bytes than without splits (`knob` = 1: the split ran); by default
  // (batch_invariant) the bytes of no split; with batch_invariant = false, other bytes where
  // `by_default(shape)` says the library splits, else the same. Then, on the CPU
  // device, `same_bytes(sh, causal, rng, range)` with `knob` = 3 set (the schedule variants' bytes).
  // LOCKSTEP_TEST_SPLIT_SHAPES=1 keeps the first shape (for compute-sanitizer's slower runs).
  template <class Tol, class ByDefault, class SameBytes>
  void split_keys_case(AttentionPrecision precision, const char* knob, Tol tol, ByDefault by_default,
                       SameBytes same_bytes) {
    Lcg rng{31};
    const char* few = std::getenv("LOCKSTEP_TEST_SPLIT_SHAPES");
    const std::size_t shapes = few != nullptr && std::atoi(few) == 1 ? 1 : 3;
    const AttentionShape all[] = {AttentionShape{1, 2, 1, 150, 700, 64}, AttentionShape{2, 4, 2, 70, 1100, 128},
                                  AttentionShape{1, 2, 1, 600, 560, 64}};
    for (const AttentionShape& sh : std::span(all, shapes))
      for (bool causal : {false, true})
        for (float range : {1.0f, 4.0f}) {
          SCOPED_TRACE("B=" + std::to_string(sh.batch) + " Sq=" + std::to_string(sh.seq_q) + " Skv=" +
                       std::to_string(sh.seq_kv) + " D=" + std::to_string(sh.head_dim) + (causal ? " causal" : "") +
                       " range " + std::to_string(range));
          const std::int64_t D = sh.head_dim, Sq = sh.seq_q, Skv = sh.seq_kv, g = sh.heads / sh.kv_heads;
          const std::size_t nq = std::size_t(sh.batch * sh.heads * Sq * D);
          const std::size_t nkv = std::size_t(sh.batch * sh.kv_heads * Skv * D);
          const std::size_t nl = std::size_t(sh.batch * sh.heads * Sq);
          const auto hq = rng.floats(nq, range), hk = rng.floats(nkv, range), hv = rng.floats(nkv, 1.0f);
          auto up = [&](const std::vector<float>& h) {
            Buffer<float> x(dev, h.size());
            x.copy_from_host(s(), h);
            return x;
          };
          auto q = up(hq), k = up(hk), v = up(hv);
          auto call = [&](const char* splits, std::vector<float>& lse_out, bool invariant = true) {
            auto out = up(std::vector<float>(nq, 42.0f)), lse = up(std::vector<float>(nl, 42.0f));
            AttentionOptions o;
            o.precision = precision;
            o.causal = causal;
            o.lse = &lse;
            o.batch_invariant = invariant;
            const ScopedEnv split(knob, splits);  // nullptr: the default
            attention(s(), q, k, v, out, sh, o);
            lse_out = lse.to_vector(s());
            return out.to_vector(s());
          };
          std::vector<float> l1, l3, l3b, ld, lf;
          const auto o1 = call("1", l1), o3 = call("3", l3), o3b = call("3", l3b), od = call(nullptr, ld),
                     of = call(nullptr, lf, false);
          for (std::size_t e = 0; e < nq; ++e) ASSERT_EQ(bits(o3[e]), bits(o3b[e])) << e;
          for (std::size_t e = 0; e < nl; ++e) ASSERT_EQ(bits(l3[e]), bits(l3b[e])) << e;
          EXPECT_FALSE(same(o1, o3));
          EXPECT_TRUE(same(o1, od));                 // batch-invariant by default: no split
          EXPECT_TRUE(same(l1, ld));
          EXPECT_EQ(same(o1, of), !by_default(sh));  // batch_invariant = false: the heuristic's
          // The float64 reference (the properties' oracle), once per (batch, head) for both runs.
          for (std::int64_t b = 0; b < sh.batch; ++b)
            for (std::int64_t h = 0; h < sh.heads; ++h) {
              const std::size_t q0 = std::size_t((b * sh.heads + h) * Sq) * D;
              const std::size_t kv0 = std::size_t((b * sh.kv_heads + h / g) * Skv) * D;
              const auto ref = harness::attention_reference(hq.data() + q0, D, hk.data() + kv0, hv.data() + kv0, D,
                                                            Sq, Skv, D, causal);
              for (const auto* run : {&o3, &of}) {
                const auto& lr = run == &o3 ? l3 : lf;
                for (std::int64_t i = 0; i < Sq; ++i) {
                  const std::int64_t vis = causal ? std::clamp<std::int64_t>(i + 1 + Skv - Sq, 0, Skv) : Skv;
                  const std::size_t row = std::size_t((b * sh.heads + h) * Sq + i);
                  if (vis == 0) {
                    for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(bits((*run)[row * D + d]), bits(0.0f)) << row;
                    ASSERT_TRUE(std::isinf(lr[row]) && lr[row] < 0) << row;
                    continue;
                  }
                  const double e = tol(ref.qk_mag[std::size_t(i)], vis, D);  // |v| <= 1
                  for (std::int64_t d = 0; d < D; ++d)
                    ASSERT_NEAR((*run)[row * D + d], ref.out[std::size_t(i * D + d)], e) << row << " " << d;
                  const double ref_lse = ref.lse[std::size_t(i)];
                  ASSERT_NEAR(lr[row], ref_lse, e + 1e-6 * std::fabs(ref_lse)) << row;
                }
              }
            }
          if (dev->id().kind == DeviceKind::kCpu) {
            const ScopedEnv split(knob, "3");
            same_bytes(sh, causal, rng, range);
          }
        }
  }
};

TEST_P(Attention, IncrementalBadInputIsTypedAndWritesNothing) {
  const DecodeShape sh{8, 2, 64, 100};
  auto q = filled(8 * 64, 1.0f), kc = filled(2 * 100 * 64, 0.5f), vc = filled(2 * 100 * 64, 0.5f);
  auto out = filled(8 * 64, 42.0f);
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 101, out, sh); }, "seq_len");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, -1, out, sh); }, "seq_len");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 3, 64, 100}); }, "n_kv_heads");
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
                 "max_seq_len * head_dim");
  expect_invalid([&] { incremental_attention(s(), q, kc, vc, 5, out, DecodeShape{8, 2, 256, std::int64_t(1) << 56}); },
                 "max_seq_len * head_dim");
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

// How the merge of run_decode learns that a row's chunks are done: it waits for the whole chunk
// kernel (no counters), or on the stream's counters (Note [block signals]), or it is folded into
// the chunk kernel and not launched (Note [folded merge]), or its blocks follow the chunk blocks
// in one launch and wait on the counters there (Note [one grid]).
enum class DecodeSync { kKernel, kSignals, kFold, kOneGrid };

// Chunk then Merge over `rows` query rows (row r's q is row r of q; every row reads slot 0's
// cache) of length len; with counters, checks that they are zero afterwards. timeline: the
// timeline variant's marks (Note [decode timeline]), or null; merge_timeline: Note [merge
// timeline]; l2_policy: the K/V copies' L2 policy (Note [streamed tiles]); prefetch_tail: Note
// [tail prefetch].
template <class Chunk, class Merge>
std::vector<float> run_decode(Stream& s, const std::shared_ptr<Device>& dev, const Buffer<float>& q,
                              const Buffer<float>& k, const Buffer<float>& v, int H, int Hkv, int L,
                              int len, int rows, DecodeSync sync, std::uint64_t* timeline = nullptr,
                              std::uint64_t* merge_timeline = nullptr, int l2_policy = kernels::kL2Unchanged,
                              int prefetch_tail = 0) {
  constexpr int D = Chunk::kQuads * 32;
  const int chunks = (L + kernels::kDecodeChunk - 1) / kernels::kDecodeChunk;
  const std::size_t blocks_y = std::size_t(H / Chunk::kHeads);
  Buffer<float> ws(dev, std::size_t(rows) * H * chunks * (D + 2)), out(dev, std::size_t(rows) * H * D);
  kernels::DecodeParams p{};
  p.q = q.data().get();
  p.k = k.data().get();
  p.v = v.data().get();
  p.part_o = ws.data().get();
  p.part_ml = ws.data().get() + std::size_t(rows) * H * chunks * D;
  p.out = out.data().get();
  p.head_stride = std::int64_t{L} * D;
  p.slot_stride = 0;
  p.rows = rows;
  p.H = H;
  p.Hkv = Hkv;
  p.max_chunks = chunks;
  p.length = len;
  p.max_len = L;
  p.scale = 1.0f / std::sqrt(float(D));
  p.heads_per_block = Chunk::kHeads;
  p.timeline = timeline;
  p.merge_timeline = merge_timeline;
  p.kv_l2_policy = l2_policy;
  p.prefetch_tail = prefetch_tail;
  // The ticket, then the pairs (as launch_decode lays them out: Note [one grid]).
  const std::size_t counter_ints = 1 + rows * blocks_y * 2;
  bool fresh = false;
  std::int32_t* const counter_base =
      sync != DecodeSync::kKernel ? detail::StreamAccess::counters(s, counter_ints, &fresh) : nullptr;
  p.ticket = counter_base;
  p.counters = counter_base != nullptr ? counter_base + 1 : nullptr;
  p.ticket_after_wait = fresh ? 1 : 0;  // Note [one grid]
  p.fold = sync == DecodeSync::kFold ? 1 : 0;
  if (sync == DecodeSync::kOneGrid) {
    using One = kernels::DecodeOneGrid<Chunk, Merge>;
    if constexpr (kernels::registered_v<One>)
      launch<One>(s, Dim3{std::uint32_t(One::chunk_blocks(p) + One::merge_blocks(p)), 1, 1}, One::kSharedBytes, p);
    else
      ADD_FAILURE() << "no DecodeOneGrid of this chunk kernel and merge in AllKernels";
  } else {
    launch<Chunk>(s, Dim3{std::uint32_t(chunks), std::uint32_t(blocks_y), std::uint32_t(rows)},
                  Chunk::kSharedBytes, p);
  }
  if (sync == DecodeSync::kKernel || sync == DecodeSync::kSignals)
    launch<Merge>(s, Dim3{std::uint32_t(H * Merge::kSlices), std::uint32_t(rows), 1}, Merge::kSharedBytes, p);
  if (counter_base != nullptr) {
    std::vector<std::int32_t> counters(counter_ints, -1);
    detail::StreamAccess::copy_d2h(s, counters.data(), counter_base, counters.size() * sizeof(std::int32_t));
    s.synchronize();
    for (std::size_t i = 0; i < counters.size(); ++i) EXPECT_EQ(counters[i], 0) << "counter " << i;
  }
  return out.to_vector(s);
}

// The decode kernels' schedule choices (row batches in the chunk kernel, merge batches) move
// loads, never arithmetic: every variant gives the same bytes (Note [row batches], Note [merge
// order]), for rows that the merge folds in one batch and in several.
template <class Chunk, class Merge>
std::vector<float> run_decode_variant(Stream& s, const std::shared_ptr<Device>& dev,
                                      const Buffer<float>& q, const Buffer<float>& k,
                                      const Buffer<float>& v, int H, int Hkv, int L, int len) {
  return run_decode<Chunk, Merge>(s, dev, q, k, v, H, Hkv, L, len, 1, DecodeSync::kKernel);
}

template <int D>
struct DecodeInputs {
  Buffer<float> q, k, v;
  DecodeInputs(const std::shared_ptr<Device>& dev, Stream& s, int H, int Hkv, int L, std::uint32_t seed)
      : q(dev, std::size_t(H) * D), k(dev, std::size_t(Hkv) * L * D), v(dev, std::size_t(Hkv) * L * D) {
    Lcg rng{seed};
    for (auto* b : {&q, &k, &v}) b->copy_from_host(s, rng.floats(b->size()));
  }
};

TEST_P(Attention, DecodeScheduleVariantsGiveTheSameBytes) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int L = 9000;
  for (int Hkv : {1, 2}) {
    const int H = 4 * Hkv;
    {
      constexpr int D = 128;
      DecodeInputs<D> in(dev, s(), H, Hkv, L, 12345u + Hkv);
      // One chunk; one merge batch for both merge variants (12 chunks); one batch at MB = 8 but
      // two at MB = 4 (20 chunks); several batches for both (36 chunks).
      for (int len : {1, 3000, 5000, 9000}) {
        SCOPED_TRACE("D 128, Hkv " + std::to_string(Hkv) + ", length " + std::to_string(len));
        const auto a = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto b = run_decode_variant<DecodeChunk<D, 4, 4>, DecodeMerge<D, 4>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, b)) << "row batch 2 / merge batch 8 vs row batch 4 / merge batch 4";
        // One query head per block: 4 blocks per kv head, each over the same chunk.
        const auto c = run_decode_variant<DecodeChunk<D, 1, 4>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto d = run_decode_variant<DecodeChunk<D, 1, 2>, DecodeMerge<D, 4>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, c)) << "4 query heads per block vs 1";
        EXPECT_TRUE(same(c, d)) << "row batch 4 vs 2 at one head per block";
        // Note [async tiles]: K and V through a ring of tiles in shared memory (the defaults:
        // 16-row tiles in a ring of 4 with four heads per block, 32-row tiles in a ring of 3
        // with one).
        const auto e3 = run_decode_variant<DecodeChunk<D, 4, 2, 3>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto e4 = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto f3 = run_decode_variant<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto g4 = run_decode_variant<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, e3)) << "registers vs a ring of 3 async 32-row tiles";
        EXPECT_TRUE(same(a, e4)) << "registers vs a ring of 4 async 16-row tiles";
        EXPECT_TRUE(same(a, f3)) << "registers vs a ring of 3 async tiles, one head per block";
        EXPECT_TRUE(same(a, g4)) << "registers vs a ring of 4 async tiles, two heads per block";
        // Note [decode timeline]: the diagnostic variant computes what the default does.
        const auto tl = run_decode_variant<DecodeChunk<D, 4, 1, 4, true>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, tl)) << "registers vs the timeline variant";
        // Note [merge schedule]: 4 blocks per head, all chunks in one round trip.
        const auto m16 = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D, 16>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto sl = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, m16)) << "merge batch 8 vs 16";
        const auto m2 = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 2>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, m2)) << "merge batch 8 vs 2";
        EXPECT_TRUE(same(a, sl)) << "merge without slices vs 4 slices";
        bool finite = true;
        for (float x : a) finite = finite && std::isfinite(x);
        EXPECT_TRUE(finite);
      }
    }
    {
      constexpr int D = 96;  // the merge's 480-thread shape (5 groups); 4 heads per block vs 1
      DecodeInputs<D> in(dev, s(), H, Hkv, L, 777u + Hkv);
      for (int len : {300, 9000}) {
        SCOPED_TRACE("D 96, Hkv " + std::to_string(Hkv) + ", length " + std::to_string(len));
        const auto a = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto b = run_decode_variant<DecodeChunk<D, 1, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        const auto c = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, b)) << "registers, 4 query heads per block vs async tiles, 1";
        EXPECT_TRUE(same(a, c)) << "registers vs async tiles, 4 query heads per block";
        // Note [merge schedule]: one element per thread, 3 slices, 10-chunk batches (so several
        // batches at length 9000) vs the default (4 elements per thread, 120 of 128 threads).
        const auto m = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D, 2, 3, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
        EXPECT_TRUE(same(a, m)) << "merge: 4 elements per thread, one slice vs 1, 3 slices";
      }
    }
  }
}

// A timeline buffer's marks (Note [decode timeline], Note [merge timeline]): 64-bit words held in
// a float buffer.
std::vector<std::uint64_t> timeline_words(Stream& s, const Buffer<float>& tl) {
  const auto words = tl.to_vector(s);
  std::vector<std::uint64_t> t(words.size() / 2);
  std::memcpy(t.data(), words.data(), t.size() * sizeof(std::uint64_t));
  return t;
}

// Note [decode timeline]: with its buffer set, the timeline variant computes the default
// kernel's bytes, and each block's marks are in order: start <= first K tile <= scores <= softmax
// <= P x V <= partials stored; a block past the length marks its start only. On the CPU device
// the test takes the lane path (the row-major path marks the start only).
TEST_P(Attention, DecodeTimelineMarksEachPhaseInOrder) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  std::optional<ScopedEnv> lanes;
  if (cpu) lanes.emplace("LOCKSTEP_CPU_DECODE_LANES", "1");
  constexpr int D = 128, L = 1500, H = 8, Hkv = 2;
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 99u);
  const int chunks = (L + kernels::kDecodeChunk - 1) / kernels::kDecodeChunk;
  const int blocks = chunks * (H / 4);
  Buffer<float> tl(dev, std::size_t(blocks) * 16);
  for (int len : {1500, 700}) {
    SCOPED_TRACE("length " + std::to_string(len));
    const auto ref = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
    tl.fill(s(), 0.0f);
    const auto got = run_decode<DecodeChunk<D, 4, 1, 4, true>, DecodeMerge<D>>(
        s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kKernel,
        reinterpret_cast<std::uint64_t*>(tl.data().get()));
    EXPECT_TRUE(same(ref, got)) << "the timeline variant vs the default";
    const auto t = timeline_words(s(), tl);
    for (int b = 0; b < blocks; ++b) {
      const std::uint64_t* m = &t[std::size_t(b) * 8];
      EXPECT_GT(m[0], 0u) << "block " << b << ": its start";
      if ((b % chunks) * kernels::kDecodeChunk >= len) {
        for (int k = 1; k < 6; ++k) EXPECT_EQ(m[k], 0u) << "block " << b << " past the length, mark " << k;
      } else {
        for (int k = 1; k < 6; ++k) EXPECT_LE(m[k - 1], m[k]) << "block " << b << ", mark " << k;
      }
    }
  }
}

// Note [streamed tiles]: the K/V copies' L2 policy is a cache hint: every policy gives the bytes
// of a chunk kernel that copies nothing (K and V loaded straight into registers, the same
// arithmetic: Note [async tiles]), in the two launches and in DecodeOneGrid (whose first tiles
// are issued by a loop that is not unrolled), for rows past and within the length, at head_dim
// 128 with 4 heads per block and with 1 (32-row tiles). At head_dim 64 (whisper-tiny's kernel),
// where no copy-free variant is registered, every policy gives evict-unchanged's bytes. So does
// the variant of Note [tail prefetch] (another hint) at head_dim 128 with 4 heads per block,
// with none of its blocks, the last, the last three and all of them prefetching (on the CPU
// device by both of its decode paths).
TEST_P(Attention, DecodeL2PoliciesGiveTheSameBytes) {
  const auto check = [&]<class Chunk, class Ref>(int H, int Hkv, std::uint32_t seed) {
    constexpr int D = Chunk::kQuads * 32;
    using Merge = kernels::DecodeMerge<D>;
    constexpr int L = 1500;
    DecodeInputs<D> in(dev, s(), H, Hkv, L, seed);
    for (int len : {1500, 700}) {
      SCOPED_TRACE("head_dim " + std::to_string(D) + ", heads per block " + std::to_string(Chunk::kHeads) +
                   ", length " + std::to_string(len));
      const auto ref = std::is_same_v<Ref, Chunk>
                           ? run_decode<Chunk, Merge>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kSignals,
                                                      nullptr, nullptr, kernels::kL2Unchanged)
                           : run_decode<Ref, Merge>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kKernel);
      for (int policy : {kernels::kL2Unchanged, kernels::kL2EvictFirst, kernels::kL2EvictNormal}) {
        for (auto sync : {DecodeSync::kSignals, DecodeSync::kOneGrid}) {
          const auto got = run_decode<Chunk, Merge>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, sync, nullptr,
                                                    nullptr, policy);
          EXPECT_TRUE(same(ref, got)) << "policy " << policy << (sync == DecodeSync::kOneGrid ? ", one grid" : ", two launches");
        }
        if constexpr (std::is_same_v<Chunk, kernels::DecodeChunk<128, 4, 1, 4>>) {
          // On the CPU device both paths: the lane path runs the GPU's code (the ring, its
          // rolled first copies and the prefetch's checks), the row-major path its own.
          using Prefetching = kernels::DecodeChunk<128, 4, 1, 4, false, true>;
          const bool cpu = dev->id().kind == DeviceKind::kCpu;
          for (int lanes : {0, 1}) {
            if (lanes == 1 && !cpu) break;
            const ScopedEnv path("LOCKSTEP_CPU_DECODE_LANES", lanes == 1 ? "1" : "0");
            for (int tail : {0, 1, 3, 1 << 30}) {
              const auto got = run_decode<Prefetching, Merge>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1,
                                                              DecodeSync::kSignals, nullptr, nullptr, policy, tail);
              EXPECT_TRUE(same(ref, got)) << "policy " << policy << ", tail prefetch " << tail << (lanes ? ", lane path" : "");
            }
          }
        }
      }
    }
  };
  using kernels::DecodeChunk;
  check.template operator()<DecodeChunk<128, 4, 1, 4>, DecodeChunk<128, 4, 2>>(8, 2, 97u);
  check.template operator()<DecodeChunk<128, 1, 2, 3>, DecodeChunk<128, 1, 2>>(4, 4, 98u);
  check.template operator()<DecodeChunk<64, 1, 1, 4>, DecodeChunk<64, 1, 1, 4>>(6, 6, 96u);
}

// Note [merge timeline]: with its buffer set, the timeline merge gives the default's bytes and
// leaves the counters zero (run_decode checks), and each merge block marks start <= counter
// reached <= merged <= after the final wait, and its multiprocessor.
TEST_P(Attention, DecodeMergeTimelineMarksInOrder) {
  using kernels::DecodeChunk;
  using Sliced = kernels::DecodeMerge<128, 32, 4, 1, true>;
  constexpr int D = 128, L = 1500, H = 8, Hkv = 2;
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 98u);
  const int blocks = H * Sliced::kSlices;
  Buffer<float> mtl(dev, std::size_t(blocks) * 16);
  for (int len : {1500, 700}) {
    SCOPED_TRACE("length " + std::to_string(len));
    const auto ref = run_decode<DecodeChunk<D, 4, 1, 4>, kernels::DecodeMerge<D>>(
        s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kSignals);
    mtl.fill(s(), 0.0f);
    const auto got = run_decode<DecodeChunk<D, 4, 1, 4>, Sliced>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1,
                                                                  DecodeSync::kSignals, nullptr,
                                                                  reinterpret_cast<std::uint64_t*>(mtl.data().get()));
    EXPECT_TRUE(same(ref, got)) << "the merge with its marks vs the default";
    const auto t = timeline_words(s(), mtl);
    for (int b = 0; b < blocks; ++b) {
      const std::uint64_t* m = &t[std::size_t(b) * 8];
      EXPECT_GT(m[0], 0u) << "merge block " << b << ": its start";
      for (int k = 1; k < 4; ++k) EXPECT_LE(m[k - 1], m[k]) << "merge block " << b << ", mark " << k;
      for (int k = 4; k < 6; ++k) EXPECT_EQ(m[k], 0u) << "merge block " << b << ", unused word " << k;
    }
  }
}

// Three rows over the same cache (row r's q is row r of in.q): `sync` gives the bytes of the two
// launches with counters (kSignals), whose blocks of different rows run concurrently, and row 0's
// output is `ref`, the single row's.
template <class Chunk, class Merge, class In>
void expect_three_rows(Stream& s, const std::shared_ptr<Device>& dev, const In& in, int H, int Hkv, int L,
                       int len, DecodeSync sync, const std::vector<float>& ref) {
  const auto rows3 = run_decode<Chunk, Merge>(s, dev, in.q, in.k, in.v, H, Hkv, L, len, 3, sync);
  const auto rows3s = run_decode<Chunk, Merge>(s, dev, in.q, in.k, in.v, H, Hkv, L, len, 3, DecodeSync::kSignals);
  const auto same_bits = [](float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); };
  EXPECT_TRUE(rows3.size() == rows3s.size() && std::equal(rows3.begin(), rows3.end(), rows3s.begin(), same_bits))
      << "three rows vs the two launches with signals";
  EXPECT_TRUE(std::equal(ref.begin(), ref.end(), rows3.begin(), same_bits)) << "row 0 of three vs the single row";
}

// Note [block signals]: incremental_attention's merge waits on counters that the chunk blocks
// count up; it gives the bytes of the same kernels without counters (the merge then waits for
// the whole chunk kernel), and leaves the stream's counters zero for the next call, call after
// call (a counter left non-zero would let a later merge read partials before they are written).
TEST_P(Attention, DecodeSignalsGiveTheSameBytesAndLeaveCountersZero) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int D = 128, L = 5000, H = 16, Hkv = 2;  // 8 query heads per kv head: 2 blocks of 4
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 2024u);
  const DecodeShape sh{H, Hkv, D, L};
  Buffer<float> out(dev, std::size_t(H) * D);
  // Note [folded merge]: incremental_attention's chunks are those of its length; with 4 heads per
  // block, up to 2 chunks (G * chunks <= 8) the chunk kernel merges, one launch; more take the
  // separate merge, which waits on the counters: two launches.
  // With the one grid (Note [one grid]; LOCKSTEP_DECODE_ONE_GRID=1) the merges that do not fold
  // run in the chunk kernel's launch: one launch always.
  const bool one_grid = one_grid_by_default(*dev);
  const bool default_schedule =
      std::getenv("LOCKSTEP_DECODE_FOLD") == nullptr && std::getenv("LOCKSTEP_DECODE_SIGNALS") == nullptr &&
      std::getenv("LOCKSTEP_DECODE_STAGES") == nullptr && std::getenv("LOCKSTEP_DECODE_DIAG_ONLY") == nullptr &&
      std::getenv("LOCKSTEP_DECODE_MERGE_BATCH") == nullptr;
  for (int len : {4999, 1, 0, 700, 5000}) {
    SCOPED_TRACE("length " + std::to_string(len));
    const auto launches_before = s().launches();
    incremental_attention(s(), in.q, in.k, in.v, len, out, sh);
    const std::uint64_t expected = (std::max(len, 1) + 255) / 256 <= 2 || one_grid ? 1 : 2;
    if (default_schedule) EXPECT_EQ(s().launches() - launches_before, expected) << "folded merge or one grid: one launch";
    const auto plain = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
    EXPECT_TRUE(same(out.to_vector(s()), plain));
    std::vector<std::int32_t> counters(64, -1);
    auto* c = detail::StreamAccess::counters(s(), counters.size());
    detail::StreamAccess::copy_d2h(s(), counters.data(), c, counters.size() * sizeof(std::int32_t));
    s().synchronize();
    for (std::size_t i = 0; i < counters.size(); ++i) ASSERT_EQ(counters[i], 0) << "counter " << i;
  }
  {
    // One head per block at head_dim 128 (MHA) with 16 chunks: a merge batch of 4 chunks, whose
    // one-grid pair is not registered, so the knob takes the plain merge's (the same bits).
    DecodeInputs<D> mha(dev, s(), 4, 4, 4096, 2025u);
    Buffer<float> o(dev, std::size_t(4) * D);
    const auto launches_before = s().launches();
    incremental_attention(s(), mha.q, mha.k, mha.v, 4000, o, DecodeShape{4, 4, D, 4096});
    if (default_schedule) EXPECT_EQ(s().launches() - launches_before, one_grid ? 1u : 2u) << "MHA, 16 chunks";
    const auto plain = run_decode_variant<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, mha.q, mha.k, mha.v, 4, 4, 4096, 4000);
    EXPECT_TRUE(same(o.to_vector(s()), plain));
  }
  // Several rows of different lengths, one of them done, through flash_decoding, twice.
  KvCacheConfig cfg{.num_layers = 1, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .max_len = 1100, .slots = 3};
  KvCache cache(dev, cfg);
  Lcg rng{77u};
  for (std::int64_t slot : {0, 2}) {
    const std::int64_t n = slot == 0 ? 1000 : 300;
    const auto kh = rng.floats(std::size_t(2) * n * 64), vh = rng.floats(kh.size());
    cache.write_from_host(s(), slot, 0, kh, vh, n);
  }
  cache.mark_done(1);
  Buffer<float> fq(dev, 3 * 8 * 64), fk(dev, 3 * 2 * 64), fv(dev, 3 * 2 * 64), fo(dev, 3 * 8 * 64);
  for (auto* b : {&fq, &fk, &fv}) b->copy_from_host(s(), rng.floats(b->size()));
  for (int step = 0; step < 2; ++step) {
    const auto launches_before = s().launches();
    flash_decoding(s(), cache, 0, fq, fk, fv, std::vector<std::int64_t>{1000 + step, -1, 300 + step}, fo);
    // 5 chunks x 4 heads per block: too large a merge to fold by default (Note [folded merge]);
    // one with the one grid (Note [one grid]; LOCKSTEP_DECODE_ONE_GRID=1).
    if (default_schedule) EXPECT_EQ(s().launches() - launches_before, one_grid ? 1u : 2u) << "the chunk kernel and the merge";
    std::vector<std::int32_t> counters(64, -1);
    auto* c = detail::StreamAccess::counters(s(), counters.size());
    detail::StreamAccess::copy_d2h(s(), counters.data(), c, counters.size() * sizeof(std::int32_t));
    s().synchronize();
    for (std::size_t i = 0; i < counters.size(); ++i) ASSERT_EQ(counters[i], 0) << "step " << step << ", counter " << i;
    for (float v : fo.to_vector(s())) ASSERT_TRUE(std::isfinite(v));
  }
}

// Note [folded merge]: the last chunk block of each (row, block y) merges, in the chunk kernel;
// the bytes are those of the separate merge (waiting on the same counters, or on the whole chunk
// kernel), for rows of one merge batch and of several, every head count per block, several rows
// (whose last blocks merge concurrently) and rows of length 0; the counters end at zero.
TEST_P(Attention, DecodeFoldedMergeGivesTheSameBytes) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int L = 9000, H = 8, Hkv = 2;
  {
    constexpr int D = 128;
    DecodeInputs<D> in(dev, s(), 3 * H, Hkv, L, 5150u);  // q of 3 rows
    // 0 to 36 chunks; the folded merge's batch is 8 chunks with 4 heads per block (every head's
    // partials loaded at once), 16 with 2, 32 with 1: rows of one batch and of several.
    for (int len : {0, 1, 2048, 3000, 4096, 8192, 9000}) {
      SCOPED_TRACE("D 128, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto f4 = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      const auto f1 = run_decode<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      const auto f2 = run_decode<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      const auto w4 = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kSignals);
      EXPECT_TRUE(same(ref, f4)) << "folded, 4 heads per block";
      EXPECT_TRUE(same(ref, f1)) << "folded, 1 head per block";
      EXPECT_TRUE(same(ref, f2)) << "folded, 2 heads per block";
      EXPECT_TRUE(same(ref, w4)) << "signals, sliced merge";
      if (len == 0) EXPECT_TRUE(std::all_of(f4.begin(), f4.end(), [](float x) { return x == 0.0f; }));
      expect_three_rows<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in, H, Hkv, L, len, DecodeSync::kFold, ref);
    }
  }
  {
    constexpr int D = 96;  // 5 merge groups, 120 of 128 threads active
    DecodeInputs<D> in(dev, s(), H, Hkv, L, 5151u);
    for (int len : {300, 9000}) {
      SCOPED_TRACE("D 96, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto f = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kFold);
      EXPECT_TRUE(same(ref, f));
    }
  }
}

// Note [one grid]: the chunk blocks and the merge blocks in one launch, each block's work given
// by its ticket, give the bytes of the two launches, for every chunk variant with the merges
// launch_decode pairs it with, rows of one merge batch and of several, three rows (blocks of
// different rows interleaved in ticket order), rows of length 0; the counters and the ticket end
// at zero (run_decode checks), so calls in a row work.
TEST_P(Attention, DecodeOneGridGivesTheSameBytes) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int L = 9000, H = 8, Hkv = 2;
  {
    constexpr int D = 128;
    DecodeInputs<D> in(dev, s(), 3 * H, Hkv, L, 6160u);
    for (int len : {0, 1, 2048, 4000, 9000}) {
      SCOPED_TRACE("D 128, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto a = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto b = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto c = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 2>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto d = run_decode<DecodeChunk<D, 1, 2, 3>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto e = run_decode<DecodeChunk<D, 2, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      EXPECT_TRUE(same(ref, a)) << "4 heads per block";
      EXPECT_TRUE(same(ref, b)) << "4 heads per block, sliced merge";
      EXPECT_TRUE(same(ref, c)) << "4 heads per block, 2-chunk merge batches";
      EXPECT_TRUE(same(ref, d)) << "1 head per block, sliced merge";
      EXPECT_TRUE(same(ref, e)) << "2 heads per block";
      if (len == 0) EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float x) { return x == 0.0f; }));
      expect_three_rows<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in, H, Hkv, L, len, DecodeSync::kOneGrid, ref);
    }
  }
  {
    constexpr int D = 64;  // 8 heads per block at most
    DecodeInputs<D> in(dev, s(), H, Hkv, L, 6161u);
    for (int len : {300, 9000}) {
      SCOPED_TRACE("D 64, length " + std::to_string(len));
      const auto ref = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
      const auto a = run_decode<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      const auto b = run_decode<DecodeChunk<D, 1, 1, 4>, DecodeMerge<D>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len, 1, DecodeSync::kOneGrid);
      EXPECT_TRUE(same(ref, a)) << "4 heads per block";
      EXPECT_TRUE(same(ref, b)) << "1 head per block";
    }
  }
}

// 129 chunks: more than the sliced merge folds in one batch (4 groups x 32).
// Note [row-major decode]: the CPU's row-by-row products give the lane path's bytes
// (LOCKSTEP_CPU_DECODE_LANES=1), for every head_dim, 1 to 8 query heads per block, lengths that
// end inside, at and just past a chunk, the fused append of flash_decoding (out and cache), rows
// whose scores overflow to inf and a NaN query; K/V past each length are NaN and never read.
TEST_P(Attention, DecodeRowMajorGivesTheLaneBytes) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "a CPU device path (Note [row-major decode])";
  if (dev->name().find("AVX2") == std::string::npos && dev->name().find("AVX3") == std::string::npos)
    GTEST_SKIP() << dev->name() << ": this SIMD variant has no row-major decode (it runs the lane path)";
  struct Case { int H, Hkv, D; };
  const Case cases[] = {{32, 8, 128}, {8, 8, 128}, {4, 2, 128}, {16, 2, 64}, {8, 1, 32},
                        {4, 2, 256}, {4, 1, 96}, {6, 6, 64}};
  Lcg rng{2024u};
  auto both = [&](auto&& call) {
    std::vector<float> r[2];
    for (int i = 0; i < 2; ++i) {
      const ScopedEnv path("LOCKSTEP_CPU_DECODE_LANES", i == 1 ? "1" : "0");
      r[i] = call();
    }
    return std::pair{r[0], r[1]};
  };
  for (const Case& c : cases) {
    const int L = 700;
    for (int len : {1, 255, 256, 257, 700}) {
      SCOPED_TRACE("H " + std::to_string(c.H) + " Hkv " + std::to_string(c.Hkv) + " D " + std::to_string(c.D) +
                   " length " + std::to_string(len));
      auto kh = rng.floats(std::size_t(c.Hkv) * L * c.D), vh = rng.floats(kh.size());
      for (int h = 0; h < c.Hkv; ++h)
        for (std::size_t i = (std::size_t(h) * L + len) * c.D; i < std::size_t(h + 1) * L * c.D; ++i)
          kh[i] = vh[i] = std::numeric_limits<float>::quiet_NaN();
      auto qh = rng.floats(std::size_t(c.H) * c.D, 2.0f);
      if (len == 257) qh[0] = 1e30f;  // head 0's scores overflow to +-inf
      if (len == 255) qh[c.D + 1] = std::numeric_limits<float>::quiet_NaN();  // head 1: NaN
      Buffer<float> q(dev, qh.size()), k(dev, kh.size()), v(dev, vh.size());
      q.copy_from_host(s(), qh);
      k.copy_from_host(s(), kh);
      v.copy_from_host(s(), vh);
      const auto [a, b] = both([&] {
        auto out = filled(qh.size(), 42.0f);
        incremental_attention(s(), q, k, v, len, out, DecodeShape{c.H, c.Hkv, c.D, L});
        return out.to_vector(s());
      });
      EXPECT_TRUE(same(a, b)) << "incremental_attention";
      bool finite = true;
      for (std::size_t i = 2 * std::size_t(c.D); i < a.size(); ++i) finite = finite && std::isfinite(a[i]);
      EXPECT_TRUE(finite) << "heads without inf or NaN inputs";
    }
    // flash_decoding: three slots of different lengths, the new token appended in the chunk kernel.
    const KvCacheConfig cfg{.num_layers = 1, .num_heads = c.H, .num_kv_heads = c.Hkv, .head_dim = c.D,
                            .max_len = 600, .slots = 3};
    KvCache ca(dev, cfg), cb(dev, cfg);
    const std::int64_t pre[3] = {255, 0, 511};
    for (int slot = 0; slot < 3; ++slot) {
      if (pre[slot] == 0) continue;
      const auto kh = rng.floats(std::size_t(c.Hkv) * pre[slot] * c.D), vh = rng.floats(kh.size());
      ca.write_from_host(s(), slot, 0, kh, vh, pre[slot]);
      cb.write_from_host(s(), slot, 0, kh, vh, pre[slot]);
    }
    Buffer<float> q(dev, std::size_t(3) * c.H * c.D), kn(dev, std::size_t(3) * c.Hkv * c.D), vn(dev, kn.size());
    for (auto* buf : {&q, &kn, &vn}) buf->copy_from_host(s(), rng.floats(buf->size()));
    int call = 0;  // the first call (row-major) on ca, the second (lanes) on cb
    const auto [a, b] = both([&] {
      KvCache& cache = call++ == 0 ? ca : cb;
      auto out = filled(q.size(), 42.0f);
      flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{255, 0, 511}, out);
      return out.to_vector(s());
    });
    EXPECT_TRUE(same(a, b)) << "flash_decoding";
    EXPECT_TRUE(same(ca.k(0).to_vector(s()), cb.k(0).to_vector(s())) && same(ca.v(0).to_vector(s()), cb.v(0).to_vector(s())))
        << "the caches after the append";
  }
}

TEST_P(Attention, DecodeMergeSlicesGiveTheSameBytesOnLongRows) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int D = 128, L = 33000, H = 4, Hkv = 1;
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 99u);
  const auto a = run_decode_variant<DecodeChunk<D, 4, 2>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, L);
  const auto b = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, L);
  EXPECT_TRUE(same(a, b));
  bool finite = true;
  for (float x : b) finite = finite && std::isfinite(x);
  EXPECT_TRUE(finite);
}

// The asynchronous tile copies never read a row at or past the length: NaN there changes no bit.
TEST_P(Attention, DecodeAsyncTilesNeverReadPastTheLength) {
  using kernels::DecodeChunk;
  using kernels::DecodeMerge;
  constexpr int D = 128, L = 1200, H = 8, Hkv = 2;
  DecodeInputs<D> in(dev, s(), H, Hkv, L, 4242u);
  for (int len : {1, 37, 256, 1000}) {
    SCOPED_TRACE("length " + std::to_string(len));
    const auto clean = run_decode_variant<DecodeChunk<D, 4, 2, 3>, DecodeMerge<D, 8>>(s(), dev, in.q, in.k, in.v, H, Hkv, L, len);
    DecodeInputs<D> poisoned(dev, s(), H, Hkv, L, 4242u);
    for (auto* b : {&poisoned.k, &poisoned.v}) {
      auto h = b->to_vector(s());
      for (int hk = 0; hk < Hkv; ++hk)
        for (int t = len; t < L; ++t)
          for (int d = 0; d < D; ++d) h[(std::size_t(hk) * L + t) * D + d] = std::numeric_limits<float>::quiet_NaN();
      b->copy_from_host(s(), h);
    }
    const auto p3 = run_decode_variant<DecodeChunk<D, 4, 2, 3>, DecodeMerge<D, 8>>(s(), dev, poisoned.q, poisoned.k, poisoned.v, H, Hkv, L, len);
    const auto p4 = run_decode_variant<DecodeChunk<D, 4, 1, 4>, DecodeMerge<D, 32, 4, 1>>(s(), dev, poisoned.q, poisoned.k, poisoned.v, H, Hkv, L, len);
    EXPECT_TRUE(same(clean, p3));
    EXPECT_TRUE(same(clean, p4));
  }
}

TEST_P(Attention, KvScatterBadPositionWritesNothing) {
  const DecodeShape sh{2, 2, 32, 16};
  auto src = filled(2 * 32, 3.0f), cache = filled(2 * 16 * 32, 7.0f);
  expect_invalid([&] { kv_cache_scatter(s(), src, cache, 16, sh); }, "pos");
  expect_invalid([&] { kv_cache_scatter(s(), src, cache, -1, sh); }, "pos");
  expect_all(cache, 7.0f);
  kv_cache_scatter(s(), src, cache, 15, sh);
  const auto c = cache.to_vector(s());
  EXPECT_EQ(c[15 * 32], 3.0f);
  EXPECT_EQ(c[16 * 32 + 15 * 32 + 31], 3.0f);
  EXPECT_EQ(c[14 * 32], 7.0f);
}

TEST_P(Attention, MultiheadReportsLaunchesAndRejectsBadShapes) {
  const std::int64_t S = 20, H = 3, D = 32;
  auto q = filled(S * H * D, 0.1f), k = filled(S * H * D, 0.2f), v = filled(S * H * D, 0.3f);
  auto out = filled(S * H * D, 42.0f);
  MhaOptions o;
  o.gemm = GemmKind::kFp32;
  o.impl = MhaImpl::kPerHead;
  EXPECT_EQ(multihead_attention(s(), q, k, v, out, MhaShape{S, H, D}, o).launches, 9 * H);
  o.impl = MhaImpl::kBatched;
  EXPECT_EQ(multihead_attention(s(), q, k, v, out, MhaShape{S, H, D}, o).launches, 9);
  // Every value row is 0.3: attention returns 0.3 exactly (convex combination of equal values).
  for (float x : out.to_vector(s())) ASSERT_NEAR(x, 0.3f, 1e-6f);
  auto out2 = filled(S * H * D, 42.0f);
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S + 1, H, D}, o); }, "q.size()");
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S, 0, D}, o); }, "n_heads");
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{std::int64_t(1) << 40, 1 << 20, 1 << 20}, o); },
                 "seq_len * n_heads * head_dim");
  // With seq_len 0 the size product is 0: n_heads * head_dim is checked on its own.
  Buffer<float> none(dev, 0), none_out(dev, 0);
  const std::int64_t big = std::int64_t(1) << 40;
  expect_invalid([&] { multihead_attention(s(), none, none, none, none_out, MhaShape{0, big, big}, o); },
                 "n_heads * head_dim");
  // The batched kernels take the heads as a grid dimension: more than 65535 is refused by name
  // before anything is enqueued (kPerHead takes them one by one).
  auto wide = filled(65536, 0.1f), wide_out = filled(65536, 42.0f);
  expect_invalid([&] { multihead_attention(s(), wide, wide, wide, wide_out, MhaShape{1, 65536, 1}, o); }, "n_heads",
                 "65536");
  expect_all(wide_out, 42.0f);
  // A head_dim past the GEMMs' 32-bit offsets (64 * lda + the k-tile): refused by name before
  // anything is enqueued or any scratch taken, by both implementations on both GEMMs (2^25 used
  // to fail inside the score GEMM, after three copies and the transpose were enqueued and 1 GiB
  // of scratch was taken).
  {
    const std::int64_t big_d = std::int64_t(1) << 25;
    auto bq = filled(big_d, 0.1f), bout = filled(big_d, 42.0f);
    for (const auto impl : {MhaImpl::kBatched, MhaImpl::kPerHead})
      for (const auto gemm : {GemmKind::kFp32, GemmKind::kTensorCore}) {
        MhaOptions bo;
        bo.impl = impl;
        bo.gemm = gemm;
        const auto launches = s().launches();
        const auto in_use = dev->memory_stats().in_use;
        expect_invalid([&] { multihead_attention(s(), bq, bq, bq, bout, MhaShape{1, 1, big_d}, bo); },
                       "64 * head_dim + 64");
        EXPECT_EQ(s().launches(), launches);
        EXPECT_EQ(dev->memory_stats().in_use, in_use);
      }
    expect_all(bout, 42.0f);
  }
  MhaOptions bad_impl = o, bad_gemm = o;
  bad_impl.impl = static_cast<MhaImpl>(7);
  bad_gemm.gemm = static_cast<GemmKind>(-1);
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S, H, D}, bad_impl); }, "options.impl", "7");
  expect_invalid([&] { multihead_attention(s(), q, k, v, out2, MhaShape{S, H, D}, bad_gemm); }, "options.gemm", "-1");
  expect_all(out2, 42.0f);
}

TEST_P(Attention, MultiheadAutoFollowsTheSeedRule) {
  auto run = [&](std::int64_t S, std::int64_t D) {
    auto q = filled(S * D, 0.1f), k = filled(S * D, 0.1f), v = filled(S * D, 0.1f), o = filled(S * D, 0.0f);
    return multihead_attention(s(), q, k, v, o, MhaShape{S, 1, D}, {});
  };
  auto r = run(64, 64);
  EXPECT_EQ(r.score_gemm, GemmKind::kTensorCore);  // m = n = 64 >= 16, k = 64
  EXPECT_EQ(r.value_gemm, GemmKind::kTensorCore);
  r = run(64, 32);
  EXPECT_EQ(r.score_gemm, GemmKind::kFp32);        // k = head_dim = 32 < 64
  EXPECT_EQ(r.value_gemm, GemmKind::kTensorCore);  // k = seq_len = 64
  {
    const ScopedEnv fp32("LOCKSTEP_FORCE_FP32_GEMM", "1");
    r = run(64, 64);
  }
  EXPECT_EQ(r.score_gemm, GemmKind::kFp32);
  EXPECT_EQ(r.value_gemm, GemmKind::kFp32);
}

KvCacheConfig small_config() {
  return {.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 8, .slots = 3};
}

TEST_P(Attention, KvCacheMemoryIsExactlyTheLayout) {
  const auto before = dev->memory_stats().in_use;
  KvCache cache(dev, small_config());
  EXPECT_EQ(cache.bytes(), 2ull * 2 * 3 * 2 * 8 * 32 * 4);
  EXPECT_EQ(cache.bytes_per_token_per_layer(), 2ull * 2 * 32 * 4);
  EXPECT_EQ(dev->memory_stats().in_use - before, cache.bytes());
}

// Every bad KvCacheConfig field is refused by its own name (the config's, not another call's)
// and the value passed; nothing stays allocated.
TEST_P(Attention, KvCacheRejectsBadConfigurations) {
  const auto in_use = dev->memory_stats().in_use;
  auto bad = [&](auto edit, const std::string& param, const std::string& value) {
    auto c = small_config();
    edit(c);
    expect_invalid([&] { KvCache cache(dev, c); }, param, value);
  };
  bad([](KvCacheConfig& c) { c.num_kv_heads = 3; }, "num_kv_heads", "3");
  bad([](KvCacheConfig& c) { c.num_kv_heads = 0; }, "num_kv_heads", "0");
  bad([](KvCacheConfig& c) { c.num_heads = 0; }, "num_heads", "0");
  bad([](KvCacheConfig& c) { c.num_heads = 70000; c.num_kv_heads = 70000; }, "num_heads", "70000");
  bad([](KvCacheConfig& c) { c.slots = 0; }, "slots", "0");
  bad([](KvCacheConfig& c) { c.num_layers = -1; }, "num_layers", "-1");
  bad([](KvCacheConfig& c) { c.max_len = 0; }, "max_len", "0");
  bad([](KvCacheConfig& c) { c.head_dim = 0; }, "head_dim", "0");
  bad([](KvCacheConfig& c) { c.max_len = std::int64_t(1) << 40; }, "max_len * head_dim", "35184372088832");
  auto c = small_config();
  c.head_dim = 80;
  EXPECT_THROW(KvCache(dev, c), Unsupported);
  EXPECT_EQ(dev->memory_stats().in_use, in_use);
}

// A moved-from cache holds nothing (slots 0, bytes 0, not valid) and every operation on it, as
// the cache or as copy_slot_from's source, is InvalidArgument naming `cache` or `src`; the cache
// it moved into works, with the contents and lengths it had. A moved-into cache's old memory
// is released.
TEST_P(Attention, KvCacheMovedFromIsTypedAndTheMoveKeepsTheContents) {
  const auto in_use = dev->memory_stats().in_use;
  KvCache a(dev, small_config());
  auto kn = filled(3 * 2 * 32, 1.5f), vn = filled(3 * 2 * 32, 2.5f);
  const std::vector<std::int64_t> pos = {0, 0, 0};
  for (std::int64_t l = 0; l < 2; ++l) a.append(s(), l, kn, vn, pos);
  const auto k0 = a.k(0).to_vector(s());
  KvCache b(std::move(a));
  EXPECT_FALSE(a.valid());
  EXPECT_TRUE(b.valid());
  EXPECT_EQ(a.slots(), 0);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_TRUE(a.lengths().empty());
  EXPECT_EQ(b.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_TRUE(same(b.k(0).to_vector(s()), k0));
  auto q = filled(3 * 4 * 32, 0.5f), out = filled(3 * 4 * 32, 42.0f);
  const std::vector<std::int64_t> next = {1, 1, 1};
  expect_invalid([&] { (void)a.length(0); }, "cache");
  expect_invalid([&] { (void)a.length(0, 0); }, "cache");
  expect_invalid([&] { (void)a.done(0); }, "cache");
  expect_invalid([&] { (void)a.k(0); }, "cache");
  expect_invalid([&] { (void)a.device(); }, "cache");
  expect_invalid([&] { a.reset(0); }, "cache");
  expect_invalid([&] { a.reset_all(); }, "cache");
  expect_invalid([&] { a.rollback(0, 0); }, "cache");
  expect_invalid([&] { a.set_length(0, 0); }, "cache");
  expect_invalid([&] { a.mark_done(0); }, "cache");
  expect_invalid([&] { a.append(s(), 0, kn, vn, next); }, "cache");
  expect_invalid([&] { a.grow(s(), 4); }, "cache");
  expect_invalid([&] { a.write_from_device(s(), 0, 0, kn, vn, 1); }, "cache");
  expect_invalid([&] { flash_decoding(s(), a, 0, q, kn, vn, next, out); }, "cache");
  expect_invalid([&] { b.copy_slot_from(s(), 0, a, 0); }, "src");
  expect_all(out, 42.0f);
  EXPECT_EQ(b.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  // The moved-into cache decodes: the next token in every layer.
  for (std::int64_t l = 0; l < 2; ++l) flash_decoding(s(), b, l, q, kn, vn, next, out);
  EXPECT_EQ(b.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  // Move assignment: c's own memory is released, b is left empty.
  KvCache c(dev, small_config());
  const auto with_both = dev->memory_stats().in_use;
  c = std::move(b);
  EXPECT_FALSE(b.valid());
  EXPECT_EQ(c.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ(with_both - dev->memory_stats().in_use, c.bytes());
  EXPECT_GE(dev->memory_stats().in_use - in_use, c.bytes());
}

TEST_P(Attention, KvCacheAppendValidatesAndWritesNothingOnError) {
  KvCache cache(dev, small_config());
  const auto c = cache.config();
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  std::vector<std::int64_t> pos = {0, 0, 0};
  cache.append(s(), 0, kn, vn, pos);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  cache.append(s(), 1, kn, vn, pos);  // the same token in the next layer
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  const auto snapshot = cache.k(0).to_vector(s());
  auto kn2 = filled(3 * 2 * 32, 9.0f);
  expect_invalid([&] { cache.append(s(), 0, kn2, vn, std::vector<std::int64_t>{1, 3, 1}); }, "positions[1]");
  expect_invalid([&] { cache.append(s(), 0, kn2, vn, std::vector<std::int64_t>{1, 1}); }, "positions.size()");
  expect_invalid([&] { cache.append(s(), 2, kn2, vn, std::vector<std::int64_t>{1, 1, 1}); }, "layer");
  Buffer<float> wrong(dev, 5);
  expect_invalid([&] { cache.append(s(), 0, wrong, vn, std::vector<std::int64_t>{1, 1, 1}); }, "k_new.size()");
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), snapshot));
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  // Fill slot 0 to max_len (slots 1 and 2 done meanwhile), then one more is refused.
  cache.mark_done(1);
  cache.mark_done(2);
  for (std::int64_t t = 1; t < c.max_len; ++t)
    for (std::int64_t l = 0; l < 2; ++l) cache.append(s(), l, kn, vn, std::vector<std::int64_t>{t, 0, 0});
  EXPECT_EQ(cache.length(0), c.max_len);
  expect_invalid([&] { cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{c.max_len, 0, 0}); }, "positions[0]",
                 std::to_string(c.max_len));
  expect_invalid([&] { cache.rollback(1, cache.length(1) + 1); }, "position");
  expect_invalid([&] { cache.reset(3); }, "slot");
}

// Note [layer lengths]: each layer appends the step's token once. length - 1 is accepted only in
// a layer that does not hold it yet; a new token only when every layer holds the slot's tokens.
// So a token written twice in a layer, positions re-read after the first layer (which skipped
// a token in the later layers), or a layer imported with fewer tokens are refused with nothing
// written; and a rollback cuts every layer to the new length.
TEST_P(Attention, KvCacheKeepsEveryLayerAtTheSlotsLength) {
  KvCache cache(dev, small_config());
  auto kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f), kn9 = filled(3 * 2 * 32, 9.0f);
  auto q = filled(3 * 4 * 32, 0.5f), out = filled(3 * 4 * 32, 0.0f);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{0, 0, 0});
  EXPECT_EQ(cache.length(0, 0), 1);
  EXPECT_EQ(cache.length(0, 1), 0);
  const auto k0 = cache.k(0).to_vector(s()), v0 = cache.v(0).to_vector(s());
  const auto k1 = cache.k(1).to_vector(s()), v1 = cache.v(1).to_vector(s()), out0 = out.to_vector(s());
  // Layer 0 again at position 0: refused, in append and in flash_decoding, nothing written.
  expect_invalid([&] { cache.append(s(), 0, kn9, kn9, std::vector<std::int64_t>{1, 0, 1}); }, "positions[0]", "1");
  expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn9, kn9, std::vector<std::int64_t>{0, 1, 1}, out); },
                 "positions[0]", "0");
  // The positions re-read after layer 0 (the lengths are now 1): a new token in layer 1 would
  // skip token 0 there. Refused.
  expect_invalid([&] { flash_decoding(s(), cache, 1, q, kn9, kn9, cache.lengths(), out); }, "positions[0]", "1");
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), k0));
  EXPECT_TRUE(same(cache.v(0).to_vector(s()), v0));
  EXPECT_TRUE(same(cache.k(1).to_vector(s()), k1));
  EXPECT_TRUE(same(cache.v(1).to_vector(s()), v1));
  EXPECT_TRUE(same(out.to_vector(s()), out0));
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 1, 1}));
  // A no-op rollback mid-step does not take the step's token from layer 1.
  cache.rollback(0, 1);
  // Layer 1 takes the step's token once (by flash_decoding), then it has it.
  flash_decoding(s(), cache, 1, q, kn, vn, std::vector<std::int64_t>{0, 0, 0}, out);
  EXPECT_EQ(cache.length(0, 1), 1);
  const auto k1b = cache.k(1).to_vector(s()), v1b = cache.v(1).to_vector(s());
  expect_invalid([&] { cache.append(s(), 1, kn9, kn9, std::vector<std::int64_t>{0, 0, 0}); }, "positions[0]", "0");
  EXPECT_TRUE(same(cache.k(1).to_vector(s()), k1b));
  EXPECT_TRUE(same(cache.v(1).to_vector(s()), v1b));
  // A layer may take the new token first; the other layer then appends length - 1.
  cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{1, 1, 1});
  EXPECT_EQ(cache.length(2, 0), 1);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{1, 1, 1});
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{2, 2, 2}));
  // Rollback cuts every layer: re-appending the token before the new length is refused, and
  // the rolled-back position is a new token again.
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{2, 2, 2});
  for (std::int64_t sl = 0; sl < 3; ++sl) cache.rollback(sl, 2);
  EXPECT_EQ(cache.length(0, 0), 2);
  EXPECT_EQ(cache.length(0, 1), 2);
  expect_invalid([&] { cache.append(s(), 1, kn9, kn9, std::vector<std::int64_t>{1, 2, 2}); }, "positions[0]", "1");
  cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{2, 2, 2});  // a new token again
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{3, 3, 3}));
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{2, 2, 2});
  // A layer imported with fewer tokens than the length: the next token is refused until it is
  // written again (write_from_host with the same count for every layer).
  std::vector<float> h4(2 * 4 * 32, 1.0f), h6(2 * 6 * 32, 1.0f);
  cache.write_from_host(s(), 1, 0, h4, h4, 4);
  cache.write_from_host(s(), 1, 1, h6, h6, 6);
  EXPECT_EQ(cache.length(1), 6);
  EXPECT_EQ(cache.length(1, 0), 4);
  expect_invalid([&] { cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{3, 6, 3}); }, "positions[1]", "6");
  expect_invalid([&] { cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{3, 5, 3}); }, "positions[1]", "5");
  cache.write_from_host(s(), 1, 0, h6, h6, 6);
  cache.append(s(), 0, kn, vn, std::vector<std::int64_t>{3, 6, 3});
  // set_length sets every layer.
  cache.set_length(2, 3);
  EXPECT_EQ(cache.length(2, 0), 3);
  EXPECT_EQ(cache.length(2, 1), 3);
  // Re-importing one layer of a used slot starts a new sequence: the other layer holds nothing of
  // it, and the next token is refused until that layer is imported too.
  cache.write_from_host(s(), 2, 0, h4, h4, 4);
  EXPECT_EQ(cache.length(2, 0), 4);
  EXPECT_EQ(cache.length(2, 1), 0);
  cache.write_from_host(s(), 2, 1, h4, h4, 4);
  EXPECT_EQ(cache.length(2, 1), 4);
  // After that complete import, the next sequence's first layer starts a new run (its layer was
  // written by the run before): layer 1 holds nothing of it, and the next token is refused until
  // layer 1 is imported too. (The run used to go on: layer 1 kept the old sequence's 4 rows and
  // reported them as the new one's, and decoding attended them.)
  std::vector<float> y4(2 * 4 * 32, 5.0f);
  cache.write_from_host(s(), 2, 0, y4, y4, 4);
  EXPECT_EQ(cache.length(2, 0), 4);
  EXPECT_EQ(cache.length(2, 1), 0);
  expect_invalid([&] { cache.append(s(), 1, kn, vn, std::vector<std::int64_t>{3, 6, 4}); }, "positions[2]", "4");
  // mark_done inside a run only sets the flag: the run goes on (layer 0 keeps its 4 rows), and
  // the run's next import clears the flag.
  cache.mark_done(2);
  cache.write_from_host(s(), 2, 1, y4, y4, 4);
  EXPECT_EQ(cache.length(2, 0), 4);
  EXPECT_EQ(cache.length(2, 1), 4);
  EXPECT_FALSE(cache.done(2));
  // copy_slot_from takes each layer's length from the source: a source in the middle of a step
  // stays there.
  auto one = small_config();
  one.slots = 1;
  KvCache src(dev, one);
  auto kn1 = filled(2 * 32, 1.0f), vn1 = filled(2 * 32, 2.0f);
  src.append(s(), 0, kn1, vn1, std::vector<std::int64_t>{0});
  cache.copy_slot_from(s(), 0, src);
  EXPECT_EQ(cache.length(0), 1);
  EXPECT_EQ(cache.length(0, 0), 1);
  EXPECT_EQ(cache.length(0, 1), 0);
  expect_invalid([&] { cache.length(3, 0); }, "slot");
  expect_invalid([&] { cache.length(0, 2); }, "layer");
}

// rope refuses every bad argument with InvalidArgument naming it, and leaves q and k untouched;
// the largest accepted position still rotates within Note [rope bound] (positions of 2^28 gave
// norms 4500 times too large before the limit).
TEST_P(Attention, RopeValidatesAndWritesNothingOnError) {
  const std::int64_t rows = 3, H = 4, Hk = 2, D = 8;
  auto q = filled(rows * H * D, 0.75f), k = filled(rows * Hk * D, -0.5f);
  const auto q0 = q.to_vector(s()), k0 = k.to_vector(s());
  const std::vector<std::int64_t> pos = {0, 5, 9};
  const RopeConfig ok{H, Hk, D, 10000.0f, RopeStyle::kNorm};
  auto with = [&](auto edit) {
    RopeConfig c = ok;
    edit(c);
    return c;
  };
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.head_dim = 7; })); }, "head_dim", "7");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.head_dim = 0; })); }, "head_dim", "0");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.theta = 1.0f; })); }, "theta");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.theta = INFINITY; })); }, "theta");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.theta = NAN; })); }, "theta");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.style = static_cast<RopeStyle>(7); })); },
                 "config.style", "7");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.n_heads = 0; })); }, "n_heads", "0");
  expect_invalid([&] { rope(s(), &q, &k, pos, with([](RopeConfig& c) { c.n_heads = 70000; })); }, "q.size()");
  expect_invalid([&] { rope(s(), nullptr, &k, pos, with([](RopeConfig& c) { c.n_kv_heads = 70000; })); },
                 "k.size()");
  {
    Buffer<float> big(dev, std::size_t(rows) * 70000 * 2);
    expect_invalid([&] { rope(s(), nullptr, &big, pos, RopeConfig{0, 70000, 2, 10000.0f, RopeStyle::kNorm}); },
                   "n_kv_heads", "70000");
  }
  expect_invalid([&] { rope(s(), &q, &k, std::vector<std::int64_t>{0, -1, 2}, ok); }, "positions[1]", "-1");
  expect_invalid([&] { rope(s(), &q, &k, std::vector<std::int64_t>{0, 1, std::int64_t{1} << 20}, ok); },
                 "positions[2]", "1048576");
  expect_invalid([&] { rope(s(), &q, &k, std::vector<std::int64_t>{0, 1}, ok); }, "q.size()");
  expect_invalid([&] { rope(s(), nullptr, &k, std::vector<std::int64_t>{0, 1}, ok); }, "k.size()");
  auto other = open("cpu:9");
  Buffer<float> qo(other, q0.size());
  expect_invalid([&] { rope(s(), &qo, &k, pos, ok); }, "q.device");
  EXPECT_TRUE(same(q.to_vector(s()), q0));
  EXPECT_TRUE(same(k.to_vector(s()), k0));

  // One launch for q and k together; k alone gives the bits k gets with q.
  const auto launches = s().launches();
  rope(s(), &q, &k, pos, ok);
  EXPECT_EQ(s().launches() - launches, 1u);
  auto k_alone = filled(rows * Hk * D, -0.5f);
  rope(s(), nullptr, &k_alone, pos, ok);
  EXPECT_TRUE(same(k_alone.to_vector(s()), k.to_vector(s())));
  EXPECT_FALSE(same(k.to_vector(s()), k0));  // it did rotate (positions 5 and 9)

  // The largest position: each pair's norm within Note [rope bound], and the float64 rotation of
  // the same float angle within it too.
  const std::int64_t pmax = (std::int64_t{1} << 20) - 1;
  std::vector<float> x(std::size_t(2 * 128));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i) + 0.1f);
  Buffer<float> xb(dev, x.size());
  xb.copy_from_host(s(), x);
  rope(s(), &xb, nullptr, std::vector<std::int64_t>{pmax, 0}, RopeConfig{1, 0, 128, 500000.0f, RopeStyle::kNeox});
  const auto y = xb.to_vector(s());
  const double bound = (8.0 * double(pmax + 1) + 16.0) * 0x1p-24;
  for (int i = 0; i < 64; ++i) {
    const double a = x[std::size_t(i)], b = x[std::size_t(i + 64)];
    const double ya = y[std::size_t(i)], yb = y[std::size_t(i + 64)];
    const double norm = std::hypot(a, b);
    // The norm does not depend on the angle's accuracy: cos and sin of any float (2 ulp each) and
    // the rotation's roundings keep it within 16 u.
    EXPECT_LE(std::fabs(std::hypot(ya, yb) - norm), 16.0 * norm * 0x1p-24) << "pair " << i;
    const float freq = std::exp2(-(float(2 * i) / 128.0f) * std::log2(500000.0f));
    const double ang = double(freq * float(pmax));
    EXPECT_LE(std::fabs(ya - (a * std::cos(ang) - b * std::sin(ang))), (std::fabs(a) + std::fabs(b)) * bound) << i;
    EXPECT_LE(std::fabs(yb - (a * std::sin(ang) + b * std::cos(ang))), (std::fabs(a) + std::fabs(b)) * bound) << i;
  }
  for (int i = 0; i < 128; ++i) EXPECT_EQ(bits(y[std::size_t(128 + i)]), bits(x[std::size_t(128 + i)])) << "position 0";
}

// KvCache::append writes every slot's token in one launch, with the positions inline (up to
// kInlineRows slots) or staged by one copy (more): 2 M launches in the seed.
TEST_P(Attention, KvCacheAppendIsOneLaunchForAnyNumberOfSlots) {
  for (std::int64_t slots : {std::int64_t{3}, std::int64_t{200}}) {
    SCOPED_TRACE(std::to_string(slots) + " slots");
    auto c = small_config();
    c.slots = slots;
    KvCache cache(dev, c);
    const std::size_t tok = std::size_t(slots * 2 * 32);
    std::vector<float> hk(tok);
    for (std::size_t i = 0; i < tok; ++i) hk[i] = float(i);
    Buffer<float> kn(dev, tok), vn(dev, tok);
    kn.copy_from_host(s(), hk);
    vn.fill(s(), 1.0f);
    std::vector<std::int64_t> pos(std::size_t(slots), 0);
    const auto launches = s().launches();
    cache.append(s(), 0, kn, vn, pos);
    EXPECT_EQ(s().launches() - launches, 1u);
    const auto k = cache.k(0).to_vector(s());
    for (std::int64_t sl = 0; sl < slots; sl += 37)
      for (std::int64_t h = 0; h < 2; ++h)
        ASSERT_EQ(k[std::size_t(((sl * 2 + h) * 8) * 32 + 5)], float((sl * 2 + h) * 32 + 5)) << sl << " " << h;
  }
}

// write_from_host makes a done slot live again, as set_length and copy_slot_from do.
TEST_P(Attention, KvCacheWriteFromHostClearsDone) {
  KvCache cache(dev, small_config());
  cache.mark_done(2);
  std::vector<float> k(2 * 3 * 32, 1.0f), v(2 * 3 * 32, 2.0f);
  cache.write_from_host(s(), 2, 0, k, v, 3);
  EXPECT_FALSE(cache.done(2));
  EXPECT_EQ(cache.length(2), 3);
}

// write_from_device imports the same bytes as write_from_host (the cache's K and V, and so the
// attention over them), mixes with it in one import run, refuses bad input with nothing written,
// and an unfinished import is named as such when the next token is refused.
TEST_P(Attention, KvCacheWriteFromDeviceIsWriteFromHostWithoutTheRoundTrip) {
  const KvCacheConfig c{.num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 16, .slots = 2};
  KvCache a(dev, c), b(dev, c);
  Lcg rng(7);
  const std::int64_t count = 11;
  const std::size_t n = std::size_t(2 * count * 32);
  std::vector<std::vector<float>> hk, hv;
  for (int l = 0; l < 2; ++l) {
    hk.push_back(rng.floats(n, 1.0f));
    hv.push_back(rng.floats(n, 1.0f));
  }
  Buffer<float> dk(dev, n), dv(dev, n);
  for (std::int64_t l = 0; l < 2; ++l) a.write_from_host(s(), 1, l, hk[std::size_t(l)], hv[std::size_t(l)], count);
  dk.copy_from_host(s(), hk[0]);
  dv.copy_from_host(s(), hv[0]);
  b.write_from_device(s(), 1, 0, dk, dv, count);
  // Layer 1 not yet written: the next token is refused, and the message says why.
  auto q = filled(2 * 4 * 32, 0.5f), kn = filled(2 * 2 * 32, 0.25f), vn = filled(2 * 2 * 32, -1.0f);
  auto out_a = filled(2 * 4 * 32, 42.0f), out_b = filled(2 * 4 * 32, 42.0f);
  const std::vector<std::int64_t> pos{-1, count};
  b.mark_done(0);
  a.mark_done(0);
  try {
    flash_decoding(s(), b, 0, q, kn, vn, pos, out_b);
    ADD_FAILURE() << "a token after an unfinished import was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.limit()).find("layer 1's missing tokens: it holds 0 of the slot's 11"), std::string::npos)
        << e.what();
  }
  expect_all(out_b, 42.0f);
  // The run continues with a host import of layer 1 (mixed), as `a` was written.
  b.write_from_host(s(), 1, 1, hk[1], hv[1], count);
  EXPECT_EQ(b.length(1, 0), count);
  EXPECT_EQ(b.length(1, 1), count);
  // Slot 1's tokens [0, n) of each kv head (the rest of a layer is memory nobody wrote).
  auto written = [&](const Buffer<float>& layer, std::int64_t n) {
    const auto h = layer.to_vector(s());
    std::vector<float> w;
    for (std::size_t hk = 0; hk < 2; ++hk) {
      const auto* base = h.data() + ((1 * 2 + hk) * 16) * 32;
      w.insert(w.end(), base, base + n * 32);
    }
    return w;
  };
  for (std::int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(same(written(a.k(l), count), written(b.k(l), count))) << l;
    EXPECT_TRUE(same(written(a.v(l), count), written(b.v(l), count))) << l;
    EXPECT_FALSE(same(written(a.k(l), count), written(b.k(1 - l), count))) << l;  // not trivially equal
    flash_decoding(s(), a, l, q, kn, vn, pos, out_a);
    flash_decoding(s(), b, l, q, kn, vn, pos, out_b);
    EXPECT_TRUE(same(out_a.to_vector(s()), out_b.to_vector(s()))) << l;
  }
  // Bad input: nothing written (the whole of layer 0's and 1's K and V: the refused calls target
  // slot 0, or a slot or layer out of range), lengths kept.
  std::vector<std::vector<float>> before;
  for (std::int64_t l = 0; l < 2; ++l) before.push_back(b.k(l).to_vector(s())), before.push_back(b.v(l).to_vector(s()));
  Buffer<float> short_k(dev, n - 1);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, short_k, dv, count); }, "k.size()", std::to_string(n - 1));
  expect_invalid([&] { b.write_from_device(s(), 0, 2, dk, dv, count); }, "layer", "2");
  expect_invalid([&] { b.write_from_device(s(), 2, 0, dk, dv, count); }, "slot", "2");
  expect_invalid([&] { b.write_from_device(s(), 0, 0, dk, dv, 17); }, "count", "17");
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:3") : open("cpu");
  Buffer<float> far(other, n);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, far, dv, count); }, "k.device");
  // A source over the rows it is written to (slot 0's first kv head), in either of k and v; a
  // source elsewhere in the cache (slot 1 of layer 0, into slot 0 of layer 1) is a plain copy.
  auto over_dest = Buffer<float>::wrap(dev, b.k(0).data().get() + 8 * 32, n);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, over_dest, dv, count); }, "k",
                 "memory that overlaps the rows it is written to");
  auto v_over_dest = Buffer<float>::wrap(dev, b.v(0).data().get() + 16 * 32 + 5 * 32, n);
  expect_invalid([&] { b.write_from_device(s(), 0, 0, dk, v_over_dest, count); }, "v",
                 "memory that overlaps the rows it is written to");
  for (std::int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(same(before[std::size_t(2 * l)], b.k(l).to_vector(s()))) << l;
    EXPECT_TRUE(same(before[std::size_t(2 * l + 1)], b.v(l).to_vector(s()))) << l;
  }
  EXPECT_EQ(b.length(0), 0);
  EXPECT_EQ(b.length(1), count + 1);
  // From elsewhere in the cache: n floats from slot 1's rows of layer 0 into slot 0 of layer 1.
  auto from_k = Buffer<float>::wrap(dev, b.k(0).data().get() + 2 * 16 * 32, n);
  auto from_v = Buffer<float>::wrap(dev, b.v(0).data().get() + 2 * 16 * 32, n);
  b.write_from_device(s(), 0, 1, from_k, from_v, count);
  EXPECT_EQ(b.length(0), count);
  const auto src = b.k(0).to_vector(s()), dst = b.k(1).to_vector(s());
  for (std::size_t i = 0; i < std::size_t(count * 32); ++i)  // kv head 0's rows
    ASSERT_EQ(bits(dst[i]), bits(src[2 * 16 * 32 + i])) << i;
}

// copy_slot_from names the stream when it is the stream that is on another device (it named
// src.device, with the cache's own id as the value).
TEST_P(Attention, KvCacheCopySlotFromNamesAStreamOnAnotherDevice) {
  KvCache a(dev, small_config()), b(dev, small_config());
  std::vector<float> k(2 * 3 * 32, 1.0f), v(2 * 3 * 32, 2.0f);
  for (std::int64_t l = 0; l < 2; ++l) b.write_from_host(s(), 0, l, k, v, 3);
  auto other = dev->id().kind == DeviceKind::kCpu ? open("cpu:9") : open("cpu");
  expect_invalid([&] { a.copy_slot_from(other->default_stream(), 1, b, 0); }, "stream.device", other->id().str());
  EXPECT_EQ(a.length(1), 0);
  a.copy_slot_from(s(), 1, b, 0);
  EXPECT_EQ(a.length(1), 3);
}

// A done slot is not attended: its tokens (NaN here) never reach the output, which is zeros, and
// nothing is appended to it.
TEST_P(Attention, KvCacheDoneSlotsAreNotReadAndGiveZeros) {
  KvCache cache(dev, small_config());
  auto q = filled(3 * 4 * 32, 0.5f), kn = filled(3 * 2 * 32, 1.0f), vn = filled(3 * 2 * 32, 2.0f);
  auto out = filled(3 * 4 * 32, 42.0f);
  cache.mark_done(1);
  flash_decoding(s(), cache, 0, q, kn, vn, std::vector<std::int64_t>{0, 123, 0}, out);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{1, 0, 1}));
  const auto o = out.to_vector(s());
  for (int i = 0; i < 128; ++i) {
    ASSERT_EQ(o[i], 2.0f);            // one token: its value
    ASSERT_EQ(bits(o[128 + i]), 0u);  // done slot
  }
  // A done slot with tokens: still zeros, never NaN (its NaN tokens are not read), and no append.
  std::vector<float> nan_tokens(2 * 5 * 32, NAN);
  cache.write_from_host(s(), 1, 1, nan_tokens, nan_tokens, 5);
  cache.mark_done(1);
  const auto k_before = cache.k(1).to_vector(s());
  flash_decoding(s(), cache, 1, q, kn, vn, std::vector<std::int64_t>{0, 77, 0}, out);
  const auto o2 = out.to_vector(s());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(bits(o2[128 + i]), 0u);
  EXPECT_EQ(cache.length(1), 5);
  const std::size_t slot1 = 1 * 2 * 8 * 32;
  const auto k_after = cache.k(1).to_vector(s());
  for (std::size_t i = 0; i < 2 * 8 * 32; ++i) ASSERT_EQ(bits(k_after[slot1 + i]), bits(k_before[slot1 + i])) << i;
  cache.reset(1);
  EXPECT_FALSE(cache.done(1));
  // reset forgets the tokens in every layer: the slot takes a new sequence from position 0, whose
  // one token is all it attends.
  EXPECT_EQ(cache.length(1), 0);
  for (std::int64_t l = 0; l < 2; ++l) EXPECT_EQ(cache.length(1, l), 0);
  auto vn3 = filled(3 * 2 * 32, 3.0f);
  flash_decoding(s(), cache, 0, q, kn, vn3, std::vector<std::int64_t>{1, 0, 1}, out);
  const auto o3 = out.to_vector(s());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(o3[128 + i], 3.0f);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{2, 1, 2}));
  // mark_done(slot, false) undoes mark_done: the slot is attended and appended to again.
  cache.mark_done(1);
  cache.mark_done(1, false);
  EXPECT_FALSE(cache.done(1));
  flash_decoding(s(), cache, 1, q, kn, vn3, std::vector<std::int64_t>{1, 0, 1}, out);
  EXPECT_EQ(cache.length(1, 1), 1);
  const auto o4 = out.to_vector(s());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(o4[128 + i], 3.0f);
}

// A done slot costs nothing in attention: its 2000 tokens do not lengthen the launch. A live slot
// of 10 tokens beside it takes the kernels of that slot alone (one chunk: by default the merge
// folded into the chunk kernel, Note [folded merge]), where the same slot live takes others
// (eight chunks of two heads per block: by default a merge kernel of its own; with a decode knob
// set, as the CI's knob runs do, the kernels may be the same), and the live slot's output is the
// same bytes.
TEST_P(Attention, KvCacheDoneSlotsDoNotLengthenTheLaunch) {
  const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 2048, .slots = 2};
  Lcg rng{19};
  const auto long_k = rng.floats(2 * 2000 * 32), long_v = rng.floats(2 * 2000 * 32);
  const auto short_k = rng.floats(2 * 10 * 32), short_v = rng.floats(2 * 10 * 32);
  auto q = filled(2 * 4 * 32, 0.25f), kn = filled(2 * 2 * 32, 0.5f), vn = filled(2 * 2 * 32, 0.75f);
  // 0: slot 1 done with 2000 tokens; 1: slot 1 empty; 2: slot 1 live with 2000 tokens.
  std::uint64_t launches[3];
  std::vector<int> kernels[3];
  std::vector<float> outs[3];
  for (int i = 0; i < 3; ++i) {
    KvCache cache(dev, c);
    cache.write_from_host(s(), 0, 0, short_k, short_v, 10);
    if (i != 1) cache.write_from_host(s(), 1, 0, long_k, long_v, 2000);
    if (i == 0) cache.mark_done(1);
    auto out = filled(2 * 4 * 32, 42.0f);
    s().synchronize();
    const auto before = s().launches();
    {
      detail::LaunchRecorder rec;
      flash_decoding(s(), cache, 0, q, kn, vn, cache.lengths(), out);
      kernels[i] = rec.kernels();
    }
    launches[i] = s().launches() - before;
    outs[i] = out.to_vector(s());
  }
  EXPECT_EQ(launches[0], launches[1]);
  EXPECT_EQ(kernels[0], kernels[1]);
  // The same slot live: other kernels (a merge of its own, or with LOCKSTEP_DECODE_ONE_GRID=1 the
  // one-grid kernel), unless a knob decides the folding (FOLD, STAGES, SIGNALS).
  const bool fold_knobs = std::getenv("LOCKSTEP_DECODE_FOLD") != nullptr || std::getenv("LOCKSTEP_DECODE_STAGES") != nullptr ||
                          std::getenv("LOCKSTEP_DECODE_SIGNALS") != nullptr;
  if (!fold_knobs) {
    EXPECT_NE(kernels[2], kernels[1]);
    if (std::getenv("LOCKSTEP_DECODE_ONE_GRID") == nullptr) EXPECT_GT(launches[2], launches[1]);
  }
  for (std::size_t e = 0; e < 4 * 32; ++e) {
    ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
    ASSERT_EQ(bits(outs[2][e]), bits(outs[1][e])) << e;
  }
}

// Note [device positions]: the graph-capturable call gives the host-positions call's bytes (out
// and cache), skips -1 and out-of-range positions without writing, and records the latter.
TEST_P(Attention, FlashDecodingWithDevicePositionsGivesTheSameBytes) {
  const KvCacheConfig c{.num_layers = 2, .num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .max_len = 300, .slots = 3};
  KvCache a(dev, c), b(dev, c);
  const std::vector<std::int64_t> prefill{100, 0, 250};
  Lcg rng{7};
  auto rnd = [&](std::size_t n) { return rng.floats(n, 0.5f); };
  for (std::int64_t slot = 0; slot < 3; ++slot)
    for (std::int64_t l = 0; l < 2; ++l) {
      const std::size_t n = std::size_t(2 * prefill[std::size_t(slot)] * 64);
      const auto hk = rnd(n), hv = rnd(n);
      a.write_from_host(s(), slot, l, hk, hv, prefill[std::size_t(slot)]);
      b.write_from_host(s(), slot, l, hk, hv, prefill[std::size_t(slot)]);
    }
  auto buf = [&](std::size_t n) {
    Buffer<float> x(dev, n);
    x.copy_from_host(s(), rnd(n));
    return x;
  };
  auto ints = [&](std::vector<std::int32_t> v) {
    Buffer<std::int32_t> x(dev, v.size());
    x.copy_from_host(s(), v);
    return x;
  };
  Buffer<std::int32_t> status(dev, 1);
  status.copy_from_host(s(), std::vector<std::int32_t>{0});
  // The caches' tokens [0, len[slot]) of every kv head (the rest is uninitialized memory).
  std::vector<std::int64_t> len = prefill;
  auto written = [&](const Buffer<float>& b) {
    const auto h = b.to_vector(s());
    std::vector<float> w;
    for (std::size_t slot = 0; slot < 3; ++slot)
      for (std::size_t hk = 0; hk < 2; ++hk) {
        const auto* base = h.data() + ((slot * 2 + hk) * 300) * 64;
        w.insert(w.end(), base, base + len[slot] * 64);
      }
    return w;
  };
  // Two steps over both layers; in the second, slot 1 is done.
  for (int step = 0; step < 2; ++step) {
    if (step == 1) a.mark_done(1);
    std::vector<std::int64_t> hp{100 + step, step == 0 ? 0 : 5, 250 + step};
    const auto dpos = ints({100 + step, step == 0 ? 0 : -1, 250 + step});
    for (std::int64_t l = 0; l < 2; ++l) {
      const auto q = buf(3 * 8 * 64), kn = buf(3 * 2 * 64), vn = buf(3 * 2 * 64);
      auto oa = filled(3 * 8 * 64, 42.0f), ob = filled(3 * 8 * 64, 42.0f);
      flash_decoding(s(), a, l, q, kn, vn, hp, oa);
      flash_decoding(s(), b, l, q, kn, vn, dpos, ob, &status);
      SCOPED_TRACE("step " + std::to_string(step) + ", layer " + std::to_string(l));
      EXPECT_TRUE(same(oa.to_vector(s()), ob.to_vector(s())));
      for (std::size_t slot = 0; slot < 3; ++slot) len[slot] = a.length(std::int64_t(slot));
      EXPECT_TRUE(same(written(a.k(l)), written(b.k(l))));
      EXPECT_TRUE(same(written(a.v(l)), written(b.v(l))));
    }
  }
  EXPECT_EQ(status.to_vector(s())[0], 0) << "no position was out of range";
  EXPECT_EQ(b.lengths(), prefill) << "the device path leaves the host lengths alone";
  b.set_length(0, 102);
  EXPECT_EQ(b.length(0), 102);
  expect_invalid([&] { b.set_length(0, 301); }, "n");

  // Out of range: 300 (= max_len), 5000 and -7 write nothing (no byte of the caches changes) and
  // attend nothing.
  const auto k0 = b.k(0).to_vector(s()), v0 = b.v(0).to_vector(s());
  const auto q = buf(3 * 8 * 64), kn = buf(3 * 2 * 64), vn = buf(3 * 2 * 64);
  auto ob = filled(3 * 8 * 64, 42.0f);
  flash_decoding(s(), b, 0, q, kn, vn, ints({300, 5000, -7}), ob, &status);
  EXPECT_TRUE(same(k0, b.k(0).to_vector(s())));
  EXPECT_TRUE(same(v0, b.v(0).to_vector(s())));
  for (float x : ob.to_vector(s())) ASSERT_EQ(bits(x), 0u);
  // Every slot is out of range: the status holds the highest, 1 + slot 2, whichever of the
  // blocks that flag the three slots (in parallel, on the CPU device too) stores last.
  EXPECT_EQ(status.to_vector(s())[0], 3);
  // INT32_MAX: its length (position + 1) must not overflow into a valid one; -1 is a done slot,
  // not an error.
  status.fill(s(), 0);
  flash_decoding(s(), b, 0, q, kn, vn, ints({-1, 2147483647, -1}), ob, &status);
  EXPECT_TRUE(same(k0, b.k(0).to_vector(s())));
  for (float x : ob.to_vector(s())) ASSERT_EQ(bits(x), 0u);
  EXPECT_EQ(status.to_vector(s())[0], 2);
  // A later call never lowers it (the maximum over calls, until the caller clears it).
  flash_decoding(s(), b, 0, q, kn, vn, ints({-7, -1, -1}), ob, &status);
  EXPECT_EQ(status.to_vector(s())[0], 2);
  status.fill(s(), 0);
  flash_decoding(s(), b, 0, q, kn, vn, ints({-7, -1, -1}), ob, &status);
  EXPECT_EQ(status.to_vector(s())[0], 1);

  // Host-side checks: typed errors, nothing enqueued (the position buffers are uploaded first:
  // their copies are enqueued), nothing written.
  auto oc = filled(3 * 8 * 64, 42.0f);
  auto pos2 = ints({1, 2}), pos3 = ints({1, 2, 3});
  Buffer<std::int32_t> two(dev, 2);
  two.fill(s(), 7);
  const auto k_before = b.k(0).to_vector(s()), v_before = b.v(0).to_vector(s());
  const auto launches = s().launches();
  expect_invalid([&] { flash_decoding(s(), b, 0, q, kn, vn, pos2, oc); }, "positions.size()");
  expect_invalid([&] { flash_decoding(s(), b, 0, q, kn, vn, pos3, oc, &two); }, "status.size()");
  expect_invalid([&] { flash_decoding(s(), b, 2, q, kn, vn, pos3, oc); }, "layer");
  EXPECT_EQ(s().launches(), launches);
  expect_all(oc, 42.0f);
  EXPECT_EQ(two.to_vector(s()), (std::vector<std::int32_t>{7, 7}));
  EXPECT_TRUE(same(b.k(0).to_vector(s()), k_before));
  EXPECT_TRUE(same(b.v(0).to_vector(s()), v_before));
}

// Note [fused append]: flash_decoding appends each slot's new token in its chunk kernel. The cache
// then holds what KvCache::append (the KvScatter kernel) writes, and the attention takes the new
// token from k_new / v_new, never from the cache (a NaN left at the position changes no bit). At
// head_dim 128 with 8 query heads per kv head, two chunk blocks share each kv head's chunk (one
// of them writes). Positions: a chunk's first row, its last row, 0; then one further.
TEST_P(Attention, FlashDecodingAppendsInItsChunkKernel) {
  constexpr int H = 16, Hkv = 2, D = 128, M = 700;
  const KvCacheConfig c{.num_layers = 1, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D, .max_len = M, .slots = 3};
  KvCache fused(dev, c), scattered(dev, c), poisoned(dev, c);
  const std::vector<std::int64_t> prefill{256, 511, 0};
  Lcg rng{31};
  for (std::int64_t slot = 0; slot < 3; ++slot) {
    const std::int64_t n = prefill[std::size_t(slot)];
    const auto hk = rng.floats(std::size_t(Hkv * n * D)), hv = rng.floats(hk.size());
    fused.write_from_host(s(), slot, 0, hk, hv, n);
    scattered.write_from_host(s(), slot, 0, hk, hv, n);
    // The poisoned cache holds NaN at the position the call appends to.
    std::vector<float> pk(std::size_t(Hkv * (n + 1) * D), std::numeric_limits<float>::quiet_NaN()), pv = pk;
    for (std::int64_t hk_i = 0; hk_i < Hkv; ++hk_i)
      for (std::int64_t i = 0; i < n * D; ++i) {
        pk[std::size_t(hk_i * (n + 1) * D + i)] = hk[std::size_t(hk_i * n * D + i)];
        pv[std::size_t(hk_i * (n + 1) * D + i)] = hv[std::size_t(hk_i * n * D + i)];
      }
    poisoned.write_from_host(s(), slot, 0, pk, pv, n + 1);
    poisoned.set_length(slot, n);
  }
  auto written = [&](const KvCache& kc, bool v) {  // tokens [0, length) of every slot and kv head
    const auto h = (v ? kc.v(0) : kc.k(0)).to_vector(s());
    std::vector<float> w;
    for (std::int64_t slot = 0; slot < 3; ++slot)
      for (std::int64_t hk = 0; hk < Hkv; ++hk) {
        const auto* base = h.data() + std::size_t((slot * Hkv + hk) * M * D);
        w.insert(w.end(), base, base + kc.length(slot) * D);
      }
    return w;
  };
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<std::int64_t> pos{prefill[0] + step, prefill[1] + step, prefill[2] + step};
    Buffer<float> q(dev, 3 * H * D), kn(dev, 3 * Hkv * D), vn(dev, 3 * Hkv * D);
    for (auto* b : {&q, &kn, &vn}) b->copy_from_host(s(), rng.floats(b->size()));
    auto of = filled(3 * H * D, 42.0f), op = filled(3 * H * D, 42.0f);
    flash_decoding(s(), fused, 0, q, kn, vn, pos, of);
    flash_decoding(s(), poisoned, 0, q, kn, vn, pos, op);
    scattered.append(s(), 0, kn, vn, pos);
    const auto o = of.to_vector(s());
    for (float x : o) ASSERT_TRUE(std::isfinite(x));
    EXPECT_TRUE(same(o, op.to_vector(s()))) << "a NaN at the appended position reached the output";
    EXPECT_EQ(fused.lengths(), scattered.lengths());
    // The same bytes as incremental_attention over each slot of the scattered cache.
    const auto qh = q.to_vector(s()), sk = scattered.k(0).to_vector(s()), sv = scattered.v(0).to_vector(s());
    for (std::int64_t slot = 0; slot < 3; ++slot) {
      const auto at = [&](const std::vector<float>& h, std::int64_t off, std::int64_t n) {
        return std::vector<float>(h.begin() + off, h.begin() + off + n);
      };
      Buffer<float> q1(dev, H * D), k1(dev, std::size_t(Hkv * M * D)), v1(dev, std::size_t(Hkv * M * D)), o1(dev, H * D);
      q1.copy_from_host(s(), at(qh, slot * H * D, H * D));
      k1.copy_from_host(s(), at(sk, slot * Hkv * M * D, Hkv * M * D));
      v1.copy_from_host(s(), at(sv, slot * Hkv * M * D, Hkv * M * D));
      incremental_attention(s(), q1, k1, v1, pos[std::size_t(slot)] + 1, o1, DecodeShape{H, Hkv, D, M});
      EXPECT_TRUE(same(o1.to_vector(s()), at(o, slot * H * D, H * D))) << "slot " << slot;
    }
    for (bool v : {false, true}) {
      const auto ws = written(scattered, v);
      EXPECT_TRUE(same(written(fused, v), ws)) << (v ? "V" : "K") << ": the fused append differs from KvScatter's";
      EXPECT_TRUE(same(written(poisoned, v), ws)) << (v ? "V" : "K") << ": the poisoned row was not overwritten";
    }
    // The appended rows hold k_new / v_new.
    const auto kh = kn.to_vector(s()), kc = fused.k(0).to_vector(s());
    for (std::int64_t slot = 0; slot < 3; ++slot)
      for (std::int64_t hk = 0; hk < Hkv; ++hk)
        for (std::int64_t d = 0; d < D; ++d)
          ASSERT_EQ(bits(kc[std::size_t(((slot * Hkv + hk) * M + pos[std::size_t(slot)]) * D + d)]),
                    bits(kh[std::size_t((slot * Hkv + hk) * D + d)]));
  }
}

// Note [inline positions]: up to kInlineRows slots' positions travel in the launch's parameters;
// more are staged in device memory. Both give the bytes of the device-positions call.
TEST_P(Attention, FlashDecodingPastTheInlineRowsGivesTheSameBytes) {
  for (std::int64_t slots : {std::int64_t{kernels::kInlineRows}, std::int64_t{kernels::kInlineRows} + 2}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 40, .slots = slots};
    KvCache a(dev, c), b(dev, c), d(dev, c);
    Lcg rng{std::uint32_t(slots)};
    std::vector<std::int64_t> pos(static_cast<std::size_t>(slots));
    std::vector<std::int32_t> dpos(pos.size());
    for (std::int64_t slot = 0; slot < slots; ++slot) {
      const std::int64_t n = slot % 37;
      const auto hk = rng.floats(std::size_t(2 * n * 32)), hv = rng.floats(hk.size());
      for (KvCache* kc : {&a, &b, &d}) kc->write_from_host(s(), slot, 0, hk, hv, n);
      pos[std::size_t(slot)] = n;
      dpos[std::size_t(slot)] = std::int32_t(n);
    }
    Buffer<float> q(dev, std::size_t(slots) * 4 * 32), kn(dev, std::size_t(slots) * 2 * 32), vn(dev, kn.size());
    for (auto* buf : {&q, &kn, &vn}) buf->copy_from_host(s(), rng.floats(buf->size()));
    Buffer<std::int32_t> dp(dev, dpos.size());
    dp.copy_from_host(s(), dpos);
    auto oa = filled(q.size(), 42.0f), ob = filled(q.size(), 42.0f);
    flash_decoding(s(), a, 0, q, kn, vn, pos, oa);
    flash_decoding(s(), b, 0, q, kn, vn, dp, ob);
    d.append(s(), 0, kn, vn, pos);
    auto written = [&](const Buffer<float>& buf) {  // tokens [0, position] (the rest is not written)
      const auto h = buf.to_vector(s());
      std::vector<float> w;
      for (std::int64_t slot = 0; slot < slots; ++slot)
        for (std::int64_t hk = 0; hk < 2; ++hk) {
          const auto* base = h.data() + std::size_t((slot * 2 + hk) * 40 * 32);
          w.insert(w.end(), base, base + (pos[std::size_t(slot)] + 1) * 32);
        }
      return w;
    };
    EXPECT_TRUE(same(oa.to_vector(s()), ob.to_vector(s())));
    EXPECT_TRUE(same(written(a.k(0)), written(b.k(0))));
    EXPECT_TRUE(same(written(a.v(0)), written(b.v(0))));
    EXPECT_TRUE(same(written(a.v(0)), written(d.v(0)))) << "KvCache::append";
    EXPECT_TRUE(same(written(a.k(0)), written(d.k(0)))) << "KvCache::append";
  }
}

// The decode kernels read q, the caches and the new tokens as 16-byte vectors: a wrapped pointer
// that is not 16-byte aligned is a typed error naming it, and nothing is written.
TEST_P(Attention, DecodeRejectsMisalignedWrappedBuffers) {
  const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 8, .slots = 1};
  KvCache cache(dev, c);
  auto q = filled(4 * 32 + 4, 0.5f), kn = filled(2 * 32 + 4, 1.0f), vn = filled(2 * 32 + 4, 2.0f);
  auto out = filled(4 * 32, 42.0f);
  auto shifted = [&](Buffer<float>& b, std::size_t n) { return Buffer<float>::wrap(dev, b.data().get() + 1, n); };
  auto q1 = shifted(q, 4 * 32), k1 = shifted(kn, 2 * 32), v1 = shifted(vn, 2 * 32);
  Buffer<float> k0 = Buffer<float>::wrap(dev, kn.data().get(), 2 * 32), v0 = Buffer<float>::wrap(dev, vn.data().get(), 2 * 32);
  Buffer<float> q0 = Buffer<float>::wrap(dev, q.data().get(), 4 * 32);
  const std::vector<std::int64_t> pos{0};
  expect_invalid([&] { flash_decoding(s(), cache, 0, q1, k0, v0, pos, out); }, "q.data()");
  try {  // the size a new token's K must have, with the kv heads named
    flash_decoding(s(), cache, 0, q0, q0, v0, pos, out);
    ADD_FAILURE() << "accepted a k_new of num_heads rows";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.parameter(), "k_new.size()");
    EXPECT_EQ(e.limit(), "64 (slots * num_kv_heads * head_dim)");
  }
  expect_invalid([&] { flash_decoding(s(), cache, 0, q0, k1, v0, pos, out); }, "k_new.data()");
  expect_invalid([&] { flash_decoding(s(), cache, 0, q0, k0, v1, pos, out); }, "v_new.data()");
  expect_all(out, 42.0f);
  EXPECT_EQ(cache.length(0), 0);
  // incremental_attention: q and the caches.
  auto kc = filled(2 * 8 * 32 + 4, 1.0f), vc = filled(2 * 8 * 32 + 4, 1.0f);
  auto kc1 = shifted(kc, 2 * 8 * 32), kc0 = Buffer<float>::wrap(dev, kc.data().get(), 2 * 8 * 32);
  auto vc0 = Buffer<float>::wrap(dev, vc.data().get(), 2 * 8 * 32);
  const DecodeShape sh{4, 2, 32, 8};
  expect_invalid([&] { incremental_attention(s(), q1, kc0, vc0, 4, out, sh); }, "q.data()");
  expect_invalid([&] { incremental_attention(s(), q0, kc1, vc0, 4, out, sh); }, "k_cache.data()");
  auto vc1 = shifted(vc, 2 * 8 * 32);
  expect_invalid([&] { incremental_attention(s(), q0, kc0, vc1, 4, out, sh); }, "v_cache.data()");
  expect_all(out, 42.0f);
  incremental_attention(s(), q0, kc0, vc0, 4, out, sh);  // aligned wraps are accepted
  for (float x : out.to_vector(s())) ASSERT_EQ(x, 1.0f);
}

// No attention call is in place: an output sharing memory with an input (the same buffer, or a
// wrapped pointer into it) is InvalidArgument naming the output, and nothing is written.
TEST_P(Attention, OutputsMayNotShareMemoryWithInputs) {
  auto view = [&](Buffer<float>& b, std::size_t offset, std::size_t n) {
    return Buffer<float>::wrap(dev, b.data().get() + offset, n);
  };
  // incremental_attention: out over q, or inside a cache.
  {
    const DecodeShape sh{4, 2, 32, 8};
    auto q = filled(4 * 32, 0.5f), kc = filled(2 * 8 * 32, 1.0f), vc = filled(2 * 8 * 32, 2.0f);
    auto in_v = view(vc, 64, 4 * 32);
    expect_invalid([&] { incremental_attention(s(), q, kc, vc, 4, q, sh); }, "out", "memory that overlaps q");
    expect_invalid([&] { incremental_attention(s(), q, kc, vc, 4, in_v, sh); }, "out", "memory that overlaps v_cache");
    expect_all(q, 0.5f);
    expect_all(vc, 2.0f);
    // kv_cache_scatter: src inside the cache.
    auto src = view(kc, 2 * 8 * 32 - 64, 64);
    expect_invalid([&] { kv_cache_scatter(s(), src, kc, 0, sh); }, "cache", "memory that overlaps src");
    expect_all(kc, 1.0f);
  }
  // multihead_attention: out over v (partly).
  {
    auto q = filled(4 * 64, 0.25f), k = filled(4 * 64, 0.5f), v = filled(4 * 64 + 32, 1.0f);
    auto v0 = view(v, 0, 4 * 64), out = view(v, 32, 4 * 64);
    expect_invalid([&] { multihead_attention(s(), q, k, v0, out, MhaShape{4, 2, 32}); }, "out",
                   "memory that overlaps v");
    expect_invalid([&] { multihead_attention(s(), q, k, v0, q, MhaShape{4, 2, 32}); }, "out", "memory that overlaps q");
    expect_all(v, 1.0f);
    expect_all(q, 0.25f);
  }
  // Fused attention: out over q or k, log-sum-exp over out; in both precisions.
  for (auto precision : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    const AttentionShape sh{.batch = 1, .heads = 2, .kv_heads = 1, .seq_q = 3, .seq_kv = 5, .head_dim = 32};
    auto q = filled(2 * 3 * 32, 0.5f), k = filled(5 * 32, 0.25f), v = filled(5 * 32, 1.0f);
    auto out = filled(2 * 3 * 32 + 6, 42.0f);
    auto out0 = view(out, 0, 2 * 3 * 32), lse_in_out = view(out, 2 * 3 * 32 - 1, 6);
    AttentionOptions o;
    o.precision = precision;
    expect_invalid([&] { attention(s(), q, k, v, q, sh, o); }, "out", "memory that overlaps q");
    auto q5 = view(q, 0, 5 * 32);
    const AttentionShape sh5{.batch = 1, .heads = 1, .kv_heads = 1, .seq_q = 5, .seq_kv = 5, .head_dim = 32};
    expect_invalid([&] { attention(s(), q5, k, v, k, sh5, o); }, "out", "memory that overlaps k");
    o.lse = &lse_in_out;
    expect_invalid([&] { attention(s(), q, k, v, out0, sh, o); }, "lse", "memory that overlaps out");
    auto k6 = view(k, 0, 6);
    o.lse = &k6;
    expect_invalid([&] { attention(s(), q, k, v, out0, sh, o); }, "lse", "memory that overlaps k");
    expect_all(out, 42.0f);
    expect_all(q, 0.5f);
    expect_all(k, 0.25f);
  }
  // flash_decoding, both overloads: out over q; status over positions.
  {
    const KvCacheConfig c{.num_layers = 1, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32, .max_len = 8, .slots = 2};
    KvCache cache(dev, c);
    auto q = filled(2 * 4 * 32, 0.5f), kn = filled(2 * 2 * 32, 1.0f), vn = filled(2 * 2 * 32, 2.0f);
    auto out = filled(2 * 4 * 32, 42.0f);
    const std::vector<std::int64_t> pos{0, 0};
    const auto k_before = cache.k(0).to_vector(s()), v_before = cache.v(0).to_vector(s());
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, pos, q); }, "out", "memory that overlaps q");
    Buffer<std::int32_t> dpos(dev, 2);
    dpos.copy_from_host(s(), std::vector<std::int32_t>{0, 0});
    auto status = Buffer<std::int32_t>::wrap(dev, dpos.data().get() + 1, 1);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos, out, &status); }, "status",
                   "memory that overlaps positions");
    auto status_in_q = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(q.data().get()), 1);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos, out, &status_in_q); }, "status",
                   "memory that overlaps q");
    // A wrapped view of the cache itself, as out or status.
    auto out_in_k = Buffer<float>::wrap(dev, cache.k(0).data().get() + 64, 2 * 4 * 32);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, pos, out_in_k); }, "out",
                   "memory that overlaps the cache's K");
    auto status_in_v = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(cache.v(0).data().get()), 1);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos, out, &status_in_v); }, "status",
                   "memory that overlaps the cache's V");
    // Inputs inside the cache the call writes: the new tokens (also for append), q, positions.
    auto kn_in_v = Buffer<float>::wrap(dev, cache.v(0).data().get() + 32, 2 * 2 * 32);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn_in_v, vn, pos, out); }, "k_new",
                   "memory that overlaps the cache's V");
    expect_invalid([&] { cache.append(s(), 0, kn, kn_in_v, pos); }, "v_new", "memory that overlaps the cache's V");
    auto q_in_k = Buffer<float>::wrap(dev, cache.k(0).data().get(), 2 * 4 * 32);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q_in_k, kn, vn, pos, out); }, "q",
                   "memory that overlaps the cache's K");
    auto dpos_in_k = Buffer<std::int32_t>::wrap(dev, reinterpret_cast<std::int32_t*>(cache.k(0).data().get()), 2);
    expect_invalid([&] { flash_decoding(s(), cache, 0, q, kn, vn, dpos_in_k, out); }, "positions",
                   "memory that overlaps the cache's K");
    expect_all(out, 42.0f);
    expect_all(q, 0.5f);
    EXPECT_TRUE(same(cache.k(0).to_vector(s()), k_before)) << "the refused calls wrote no new token";
    EXPECT_TRUE(same(cache.v(0).to_vector(s()), v_before));
    EXPECT_EQ(cache.length(0), 0);
    EXPECT_EQ(cache.length(1), 0);
    flash_decoding(s(), cache, 0, q, kn, vn, pos, out);  // distinct buffers are accepted
    EXPECT_EQ(cache.length(0), 1);
    for (float x : out.to_vector(s())) ASSERT_EQ(x, 2.0f);
  }
  // rope: q and k rotated in place, so they may not share memory.
  {
    auto qk = filled(2 * 4 * 8, 0.75f);
    auto k = view(qk, 2 * 4 * 8 - 2 * 2 * 8, 2 * 2 * 8);
    const std::vector<std::int64_t> pos{1, 2};
    expect_invalid([&] { rope(s(), &qk, &k, pos, RopeConfig{4, 2, 8, 10000.0f, RopeStyle::kNorm}); }, "k",
                   "memory that overlaps q");
    expect_all(qk, 0.75f);
  }
}

TEST_P(Attention, KvCacheGrowKeepsContentsAndCopySlotWorks) {
  KvCache cache(dev, small_config());
  const std::size_t tok = 3 * 2 * 32;
  // Distinct values for every token, layer, K and V, so that a copy that mixed them up fails.
  for (std::int64_t t = 0; t < 3; ++t)
    for (std::int64_t l = 0; l < 2; ++l) {
      std::vector<float> hk(tok), hv(tok);
      for (std::size_t i = 0; i < tok; ++i) {
        hk[i] = float(t * 10000 + l * 1000) + float(i);
        hv[i] = -hk[i];
      }
      Buffer<float> kn(dev, tok), vn(dev, tok);
      kn.copy_from_host(s(), hk);
      vn.copy_from_host(s(), hv);
      cache.append(s(), l, kn, vn, std::vector<std::int64_t>{t, t, t});
    }
  cache.rollback(2, 1);
  cache.mark_done(1);
  std::vector<std::vector<float>> before;
  for (std::int64_t l = 0; l < 2; ++l) {
    before.push_back(cache.k(l).to_vector(s()));
    before.push_back(cache.v(l).to_vector(s()));
  }
  // An allocation failure while growing leaves the cache as it was.
  {
    CpuDeviceOptions o;
    o.memory_capacity = 4 * cache.bytes() / 3;  // room for 4 slots' worth, not 5 more
    auto small = make_cpu_device(o);
    KvCache c2(small, small_config());
    auto& s2 = small->default_stream();
    std::vector<float> hk(2 * 2 * 32, 3.0f);
    c2.write_from_host(s2, 0, 0, hk, hk, 2);
    const auto in_use = small->memory_stats().in_use;
    try {
      c2.grow(s2, 5);
      ADD_FAILURE() << "grow beyond the capacity succeeded";
    } catch (const OutOfMemory& e) {  // the whole request, and what was available before it
      EXPECT_EQ(e.requested(), 2ull * 2 * 5 * 2 * 8 * 32 * 4) << e.what();
      EXPECT_EQ(e.available(), o.memory_capacity - in_use) << e.what();
      EXPECT_NE(std::string(e.what()).find("growing a KvCache to 5 slots"), std::string::npos) << e.what();
    }
    try {  // a cache that does not fit: reported as one request
      KvCache too_big(small, small_config());
      ADD_FAILURE() << "a second cache fit";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.requested(), c2.bytes()) << e.what();
      EXPECT_EQ(e.available(), o.memory_capacity - in_use) << e.what();
    }
    // 2^40 layers: an OutOfMemory for the whole request before the first buffer on a capped
    // device, and on an uncapped one too (the host's list of 2^40 buffers cannot be had; it used to
    // escape as a std::bad_alloc).
    auto huge = small_config();
    huge.num_layers = std::int64_t(1) << 40;
    const std::uint64_t layer_bytes = c2.bytes() / std::uint64_t(c2.config().num_layers);  // K and V
    try {
      KvCache c3(small, huge);
      ADD_FAILURE() << "a cache of 2^40 layers fit";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.requested(), (std::uint64_t(1) << 40) * layer_bytes) << e.what();
      EXPECT_EQ(e.available(), o.memory_capacity - in_use) << e.what();
    }
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer aborts on an allocation of that size
    EXPECT_THROW(KvCache(dev, huge), OutOfMemory);
#endif
    EXPECT_EQ(c2.slots(), 3);
    EXPECT_EQ(c2.length(0), 2);
    EXPECT_EQ(small->memory_stats().in_use, in_use);
    EXPECT_EQ(c2.k(0).to_vector(s2)[33], 3.0f);
  }
  cache.grow(s(), 5);
  EXPECT_EQ(cache.slots(), 5);
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>{3, 3, 1, 0, 0}));
  EXPECT_TRUE(cache.done(1));
  EXPECT_FALSE(cache.done(0) || cache.done(2) || cache.done(3) || cache.done(4));
  EXPECT_EQ(cache.bytes(), 2ull * 2 * 5 * 2 * 8 * 32 * 4);
  for (std::int64_t l = 0; l < 2; ++l) {
    const auto k1 = cache.k(l).to_vector(s()), v1 = cache.v(l).to_vector(s());
    const auto& k0 = before[std::size_t(2 * l)];
    const auto& v0 = before[std::size_t(2 * l + 1)];
    ASSERT_EQ(k1.size(), k0.size() / 3 * 5);
    EXPECT_TRUE(same(k0, std::vector<float>(k1.begin(), k1.begin() + std::ptrdiff_t(k0.size())))) << "K, layer " << l;
    EXPECT_TRUE(same(v0, std::vector<float>(v1.begin(), v1.begin() + std::ptrdiff_t(v0.size())))) << "V, layer " << l;
  }
  expect_invalid([&] { cache.grow(s(), 2); }, "new_slots", "2");
  // A single-slot prefill cache copied into slot 4 (every layer, K and V).
  auto pc = small_config();
  pc.slots = 1;
  pc.max_len = 4;
  KvCache prefill(dev, pc);
  std::vector<float> hk(2 * 2 * 32), hv(2 * 2 * 32), hk1(2 * 2 * 32);
  std::iota(hk.begin(), hk.end(), 0.0f);
  std::iota(hv.begin(), hv.end(), 1000.0f);
  std::iota(hk1.begin(), hk1.end(), 5000.0f);
  prefill.write_from_host(s(), 0, 0, hk, hv, 2);
  prefill.write_from_host(s(), 0, 1, hk1, hv, 2);
  cache.mark_done(4);
  cache.copy_slot_from(s(), 4, prefill);
  EXPECT_EQ(cache.length(4), 2);
  EXPECT_FALSE(cache.done(4));
  const std::size_t slot4 = 4 * 2 * 8 * 32;
  const auto k2 = cache.k(0).to_vector(s()), v2 = cache.v(0).to_vector(s()), k3 = cache.k(1).to_vector(s());
  EXPECT_EQ(k2[slot4 + 0], 0.0f);
  EXPECT_EQ(k2[slot4 + 32 + 5], 37.0f);          // head 0, token 1
  EXPECT_EQ(k2[slot4 + 8 * 32 + 5], 64.0f + 5);  // head 1, token 0
  EXPECT_EQ(v2[slot4 + 8 * 32 + 32 + 7], 1000.0f + 96 + 7);  // head 1, token 1
  EXPECT_EQ(k3[slot4 + 32 + 5], 5037.0f);        // layer 1
  // Bad copies: named, nothing changed.
  const auto k_snapshot = cache.k(0).to_vector(s());
  expect_invalid([&] { cache.copy_slot_from(s(), 4, prefill, 1); }, "src_slot", "1");
  expect_invalid([&] { cache.copy_slot_from(s(), 5, prefill); }, "slot", "5");
  auto geo = small_config();
  geo.num_kv_heads = 1;
  geo.num_heads = 2;
  KvCache other_geometry(dev, geo);
  expect_invalid([&] { cache.copy_slot_from(s(), 4, other_geometry); }, "src geometry");
  auto longer = small_config();
  longer.max_len = 16;
  longer.slots = 1;
  KvCache long_src(dev, longer);
  long_src.set_length(0, 12);
  expect_invalid([&] { cache.copy_slot_from(s(), 4, long_src); }, "src length", "12");
  KvCache elsewhere(open("cpu:9"), pc);
  expect_invalid([&] { cache.copy_slot_from(s(), 4, elsewhere); }, "src.device");
  EXPECT_TRUE(same(cache.k(0).to_vector(s()), k_snapshot));
  EXPECT_EQ(cache.length(4), 2);
  // reset_all: every slot empty and live.
  cache.mark_done(3);
  cache.reset_all();
  EXPECT_EQ(cache.lengths(), (std::vector<std::int64_t>(5, 0)));
  for (std::int64_t sl = 0; sl < 5; ++sl) EXPECT_FALSE(cache.done(sl));
}

TEST_P(Attention, FusedEdgeCasesAndBadInput) {
  const AttentionShape sh{1, 4, 2, 8, 6, 32};
  auto q = filled(4 * 8 * 32, 0.5f), k = filled(2 * 6 * 32, 0.25f), v = filled(2 * 6 * 32, 2.0f);
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    SCOPED_TRACE(prec == AttentionPrecision::kExact ? "exact" : "tensor core");
    auto out = filled(4 * 8 * 32, 42.0f), lse = filled(4 * 8, 42.0f);
    AttentionOptions o;
    o.lse = &lse;
    o.precision = prec;
    attention(s(), q, k, v, out, sh, o);
    // Every value row is 2 and 0.5, 0.25, 2 are exact in fp16: exactly 2 in both precisions.
    for (float x : out.to_vector(s())) ASSERT_EQ(x, 2.0f);
    // Six equal scores s = 32 * 0.5 * 0.25 / sqrt(32): log-sum-exp = s + log(6).
    const float expect_lse = 0.5f * 0.25f * 32 / std::sqrt(32.0f) + std::log(6.0f);
    for (float x : lse.to_vector(s())) ASSERT_NEAR(x, expect_lse, 1e-5f);
    // Causal with seq_q > seq_kv (bottom-right): the first two rows see no key.
    o.causal = true;
    attention(s(), q, k, v, out, sh, o);
    const auto oc = out.to_vector(s()), lc = lse.to_vector(s());
    for (int h = 0; h < 4; ++h) {
      for (int d = 0; d < 32; ++d) {
        ASSERT_EQ(bits(oc[(h * 8 + 0) * 32 + d]), 0u);
        ASSERT_EQ(bits(oc[(h * 8 + 1) * 32 + d]), 0u);
        ASSERT_EQ(oc[(h * 8 + 2) * 32 + d], 2.0f);
      }
      ASSERT_TRUE(std::isinf(lc[h * 8]) && lc[h * 8] < 0);
      ASSERT_TRUE(std::isinf(lc[h * 8 + 1]) && lc[h * 8 + 1] < 0);
    }
  }
  // Bad input: typed, nothing written.
  auto out2 = filled(4 * 8 * 32, 42.0f);
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 3, 8, 6, 32}); }, "kv_heads");
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 9, 6, 32}); }, "q.size()");
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 8, 7, 32}); }, "k.size()");
  EXPECT_THROW(attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 8, 6, 48}), Unsupported);
  AttentionOptions tc;
  tc.precision = AttentionPrecision::kTensorCore;
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 3, 8, 6, 32}, tc); }, "kv_heads");
  expect_invalid([&] { attention(s(), q, k, v, out2, AttentionShape{1, 4, 2, 8, 7, 32}, tc); }, "k.size()");
  // TensorCore reads K and V as 16-byte vectors: a wrapped buffer 4 bytes off is refused, by
  // name; Exact takes it (and gives the same 2.0).
  auto kbig = filled(2 * 6 * 32 + 1, 0.25f), vbig = filled(2 * 6 * 32 + 1, 2.0f);
  auto k_off = Buffer<float>::wrap(dev, kbig.data().get() + 1, 2 * 6 * 32);
  auto v_off = Buffer<float>::wrap(dev, vbig.data().get() + 1, 2 * 6 * 32);
  expect_invalid([&] { attention(s(), q, k_off, v, out2, sh, tc); }, "k.data()");
  expect_invalid([&] { attention(s(), q, k, v_off, out2, sh, tc); }, "v.data()");
  expect_all(out2, 42.0f);
  attention(s(), q, k_off, v_off, out2, sh, AttentionOptions{});
  expect_all(out2, 2.0f);
  out2 = filled(4 * 8 * 32, 42.0f);
}

// Every bad argument of attention() is an InvalidArgument naming it and the value passed, in
// both precisions, and out and lse keep their bytes; seq_q == 0 enqueues nothing; seq_kv == 0
// gives zeros and log-sum-exp -inf in both precisions.
TEST_P(Attention, FusedRejectsBadInputByNameAndWritesNothing) {
  const AttentionShape sh{1, 4, 2, 8, 6, 32};
  auto q = filled(4 * 8 * 32, 0.5f), k = filled(2 * 6 * 32, 0.25f), v = filled(2 * 6 * 32, 2.0f);
  auto out = filled(4 * 8 * 32, 42.0f), lse = filled(4 * 8, 42.0f);
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    SCOPED_TRACE(prec == AttentionPrecision::kExact ? "exact" : "tensor core");
    AttentionOptions o;
    o.precision = prec;
    o.lse = &lse;
    auto bad = [&](AttentionShape b, const std::string& param, const std::string& value) {
      expect_invalid([&] { attention(s(), q, k, v, out, b, o); }, param, value);
    };
    auto edit = [&](auto f) {
      AttentionShape b = sh;
      f(b);
      return b;
    };
    bad(edit([](AttentionShape& b) { b.batch = 0; }), "batch", "0");
    bad(edit([](AttentionShape& b) { b.batch = 70000; }), "batch", "70000");
    bad(edit([](AttentionShape& b) { b.heads = 0; }), "heads", "0");
    bad(edit([](AttentionShape& b) { b.heads = 70000; b.kv_heads = 70000; }), "heads", "70000");
    bad(edit([](AttentionShape& b) { b.kv_heads = 0; }), "kv_heads", "0");
    bad(edit([](AttentionShape& b) { b.seq_q = -1; }), "seq_q", "-1");
    bad(edit([](AttentionShape& b) { b.seq_kv = -3; }), "seq_kv", "-3");
    bad(edit([](AttentionShape& b) { b.seq_q = std::int64_t{1} << 31; }), "seq_q", "2147483648");
    bad(edit([](AttentionShape& b) { b.seq_kv = std::int64_t{1} << 31; }), "seq_kv", "2147483648");
    // A head_dim below 1 is bad input, not a size without a kernel (that is Unsupported).
    bad(edit([](AttentionShape& b) { b.head_dim = 0; }), "head_dim", "0");
    bad(edit([](AttentionShape& b) { b.head_dim = -64; }), "head_dim", "-64");
    AttentionOptions o_bad = o;
    o_bad.precision = static_cast<AttentionPrecision>(3);
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_bad); }, "options.precision", "3");
    o_bad = o;
    o_bad.layout = static_cast<AttentionLayout>(2);
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_bad); }, "options.layout", "2");
    auto v_short = filled(2 * 6 * 32 - 1, 2.0f), out_short = filled(4 * 8 * 32 - 1, 0.0f);
    auto lse_short = filled(4 * 8 - 1, 0.0f);
    expect_invalid([&] { attention(s(), q, k, v_short, out, sh, o); }, "v.size()", std::to_string(2 * 6 * 32 - 1));
    expect_invalid([&] { attention(s(), q, k, v, out_short, sh, o); }, "out.size()", std::to_string(4 * 8 * 32 - 1));
    AttentionOptions o_short = o;
    o_short.lse = &lse_short;
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_short); }, "lse.size()", "31");
    auto other = open("cpu:9");
    Buffer<float> lse_elsewhere(other, 4 * 8), v_elsewhere(other, 2 * 6 * 32);
    AttentionOptions o_else = o;
    o_else.lse = &lse_elsewhere;
    expect_invalid([&] { attention(s(), q, k, v, out, sh, o_else); }, "lse.device");
    expect_invalid([&] { attention(s(), q, k, v_elsewhere, out, sh, o); }, "v.device");
    expect_all(out, 42.0f);
    expect_all(lse, 42.0f);

    // seq_q == 0: no error, no launch.
    Buffer<float> none(dev, 0), none_out(dev, 0), none_lse(dev, 0);
    AttentionOptions o0 = o;
    o0.lse = &none_lse;
    const auto launches = s().launches();
    attention(s(), none, k, v, none_out, AttentionShape{1, 4, 2, 0, 6, 32}, o0);
    EXPECT_EQ(s().launches(), launches);
    // seq_kv == 0 (also causal): every row fully masked, zeros and -inf.
    for (bool causal : {false, true}) {
      auto out0 = filled(4 * 8 * 32, 42.0f), lse0 = filled(4 * 8, 42.0f);
      AttentionOptions ok = o;
      ok.lse = &lse0;
      ok.causal = causal;
      attention(s(), q, none, none, out0, AttentionShape{1, 4, 2, 8, 0, 32}, ok);
      for (float x : out0.to_vector(s())) ASSERT_EQ(bits(x), 0u);
      for (float x : lse0.to_vector(s())) ASSERT_TRUE(std::isinf(x) && x < 0) << x;
    }
  }
}

// A NaN in a query row reaches that row's output as NaN in both precisions (never zeros, which
// would pass for a fully masked row); the other rows stay finite.
TEST_P(Attention, FusedNanQueryRowGivesNanOutput) {
  const AttentionShape sh{1, 2, 1, 70, 90, 64};
  Lcg rng{5};
  auto buf = [&](std::vector<float> h) {
    Buffer<float> x(dev, h.size());
    x.copy_from_host(s(), h);
    return x;
  };
  auto hq = rng.floats(2 * 70 * 64, 1.0f);
  hq[std::size_t((1 * 70 + 65) * 64 + 3)] = NAN;  // head 1, row 65, one element
  auto q = buf(hq), k = buf(rng.floats(90 * 64, 1.0f)), v = buf(rng.floats(90 * 64, 1.0f));
  for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
    SCOPED_TRACE(prec == AttentionPrecision::kExact ? "exact" : "tensor core");
    auto out = filled(2 * 70 * 64, 42.0f), lse = filled(2 * 70, 42.0f);
    AttentionOptions o;
    o.precision = prec;
    o.lse = &lse;
    attention(s(), q, k, v, out, sh, o);
    const auto ho = out.to_vector(s());
    for (std::size_t r = 0; r < 140; ++r)
      for (std::size_t d = 0; d < 64; ++d) {
        if (r == 70 + 65) ASSERT_TRUE(std::isnan(ho[r * 64 + d])) << d;
        else ASSERT_TRUE(std::isfinite(ho[r * 64 + d])) << r << " " << d;
      }
    EXPECT_TRUE(std::isnan(lse.to_vector(s())[70 + 65]));
  }
}

// Inputs beyond fp16's range (docs/numerics.md, "Input range of the tensor-core paths"): one
// V element of 1e5 (> 65504) at one key, then one K row of 1e5 at another. Exact stays finite
// everywhere; TensorCore rounds the value to infinity, so the output column that reads it (V), or
// every row's output (K: a score of inf), is not finite, while V's other columns stay finite.
TEST_P(Attention, FusedBeyondTheHalfRangeOnlyExactStaysFinite) {
  const std::int64_t S = 70, D = 64;
  const AttentionShape sh{1, 1, 1, S, S, D};
  Lcg rng{23};
  auto buf = [&](const std::vector<float>& h) {
    Buffer<float> x(dev, h.size());
    x.copy_from_host(s(), h);
    return x;
  };
  const auto hq = rng.floats(std::size_t(S * D), 1.0f);
  for (bool big_k : {false, true}) {
    auto hk = rng.floats(std::size_t(S * D), 1.0f), hv = rng.floats(std::size_t(S * D), 1.0f);
    if (big_k)
      for (std::int64_t d = 0; d < D; ++d) hk[std::size_t(11 * D + d)] = 1e5f;  // key 11
    else
      hv[std::size_t(7 * D + 5)] = 1e5f;  // key 7, column 5
    auto q = buf(hq), k = buf(hk), v = buf(hv);
    for (auto prec : {AttentionPrecision::kExact, AttentionPrecision::kTensorCore}) {
      SCOPED_TRACE(std::string(prec == AttentionPrecision::kExact ? "exact" : "tensor core") + (big_k ? " K" : " V"));
      auto out = filled(std::size_t(S * D), 42.0f);
      AttentionOptions o;
      o.precision = prec;
      attention(s(), q, k, v, out, sh, o);
      const auto ho = out.to_vector(s());
      for (std::int64_t r = 0; r < S; ++r)
        for (std::int64_t d = 0; d < D; ++d) {
          const float x = ho[std::size_t(r * D + d)];
          const bool reads_inf = big_k || d == 5;
          if (prec == AttentionPrecision::kExact || !reads_inf) ASSERT_TRUE(std::isfinite(x)) << r << " " << d;
          else ASSERT_FALSE(std::isfinite(x)) << r << " " << d;
        }
    }
  }
}

// Exact with no key tile at all: seq_kv == 0, and causal blocks whose rows see no key (seq_q -
// seq_kv >= 64 rows: the block walks no tile). Every such row is +0 with log-sum-exp -inf; the
// rows that see keys are finite, and the last row (which sees all 5 keys) equals non-causal
// attention of that row over the 5 keys.
TEST_P(Attention, FusedExactRowsWithoutKeys) {
  Lcg rng{17};
  for (std::int64_t D : {32, 64, 96, 128, 256}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    auto buf = [&](std::size_t n) {
      Buffer<float> x(dev, n);
      x.copy_from_host(s(), rng.floats(n, 1.0f));
      return x;
    };
    auto q = buf(std::size_t(2 * 200 * D)), k = buf(std::size_t(5 * D)), v = buf(std::size_t(5 * D));
    AttentionOptions o;
    o.precision = AttentionPrecision::kExact;
    {  // seq_kv == 0
      Buffer<float> k0(dev, 0), v0(dev, 0);
      auto out = filled(std::size_t(2 * 200 * D), 42.0f), lse = filled(2 * 200, 42.0f);
      o.lse = &lse;
      attention(s(), q, k0, v0, out, AttentionShape{1, 2, 1, 200, 0, D}, o);
      for (float x : out.to_vector(s())) ASSERT_EQ(bits(x), 0u);
      for (float x : lse.to_vector(s())) ASSERT_TRUE(std::isinf(x) && x < 0);
    }
    // causal, 200 queries and 5 keys: row i sees keys j <= i - 195.
    auto out = filled(std::size_t(2 * 200 * D), 42.0f), lse = filled(2 * 200, 42.0f);
    o.lse = &lse;
    o.causal = true;
    attention(s(), q, k, v, out, AttentionShape{1, 2, 1, 200, 5, D}, o);
    const auto ho = out.to_vector(s()), hl = lse.to_vector(s());
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 200; ++i) {
        const bool sees = i >= 195;
        ASSERT_EQ(std::isinf(hl[h * 200 + i]) && hl[h * 200 + i] < 0, !sees) << h << " " << i;
        for (std::int64_t d = 0; d < D; ++d) {
          const float x = ho[(h * 200 + i) * D + d];
          if (sees) ASSERT_TRUE(std::isfinite(x)) << h << " " << i << " " << d;
          else ASSERT_EQ(bits(x), 0u) << h << " " << i << " " << d;
        }
      }
    // The last row of each head against non-causal attention of that one query row.
    std::vector<float> hq = q.to_vector(s()), last(std::size_t(2 * D));
    for (std::int64_t h = 0; h < 2; ++h)
      std::copy_n(hq.begin() + (h * 200 + 199) * D, D, last.begin() + h * D);
    Buffer<float> q1(dev, last.size());
    q1.copy_from_host(s(), last);
    auto out1 = filled(std::size_t(2 * D), 42.0f), lse1 = filled(2, 42.0f);
    o.causal = false;
    o.lse = &lse1;
    attention(s(), q1, k, v, out1, AttentionShape{1, 2, 1, 1, 5, D}, o);
    const auto h1 = out1.to_vector(s()), l1 = lse1.to_vector(s());
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(bits(hl[h * 200 + 199]), bits(l1[h]));
      for (std::int64_t d = 0; d < D; ++d) ASSERT_EQ(bits(ho[(h * 200 + 199) * D + d]), bits(h1[h * D + d])) << d;
    }
  }
}

// Exact copies K and V tiles with 16-byte asynchronous copies when they are 16-byte aligned and
// with plain loads otherwise (Note [exact tile pipeline]): a K and V 4 bytes off give the same
// bytes as aligned ones holding the same values, out and lse, for every head_dim's kernel (at
// head_dim 64 both: P in K's memory and in its own buffer).
TEST_P(Attention, FusedExactMisalignedInputsGiveTheSameBytes) {
  Lcg rng{13};
  for (std::int64_t d : {32, 64, 96, 128, 256, -64})
    for (bool causal : {false, true}) {
      // -64: head_dim 64 with P in K's memory forced (this grid is small enough for the other).
      const ScopedEnv p_buffer("LOCKSTEP_FUSED_EXACT_P", d < 0 ? "0" : nullptr);
      const std::int64_t D = d < 0 ? -d : d;
      SCOPED_TRACE("D=" + std::to_string(D) + (causal ? " causal" : "") + (d < 0 ? " P in K" : ""));
      const AttentionShape sh{1, 2, 1, 70, 150, D};
      const std::size_t nq = std::size_t(2 * 70 * D), nkv = std::size_t(150 * D);
      const auto hq = rng.floats(nq, 1.0f), hk = rng.floats(nkv, 1.0f), hv = rng.floats(nkv, 1.0f);
      Buffer<float> q(dev, nq), k(dev, nkv), v(dev, nkv), kbig(dev, nkv + 1), vbig(dev, nkv + 1);
      q.copy_from_host(s(), hq);
      k.copy_from_host(s(), hk);
      v.copy_from_host(s(), hv);
      std::vector<float> hk1(1, 0.0f), hv1(1, 0.0f);
      hk1.insert(hk1.end(), hk.begin(), hk.end());
      hv1.insert(hv1.end(), hv.begin(), hv.end());
      kbig.copy_from_host(s(), hk1);
      vbig.copy_from_host(s(), hv1);
      auto k_off = Buffer<float>::wrap(dev, kbig.data().get() + 1, nkv);
      auto v_off = Buffer<float>::wrap(dev, vbig.data().get() + 1, nkv);
      std::vector<float> outs[2], lses[2];
      for (int i = 0; i < 2; ++i) {
        auto out = filled(nq, 42.0f), lse = filled(2 * 70, 42.0f);
        AttentionOptions o;
        o.precision = AttentionPrecision::kExact;
        o.causal = causal;
        o.lse = &lse;
        if (i == 0) attention(s(), q, k, v, out, sh, o);
        else attention(s(), q, k_off, v_off, out, sh, o);
        outs[i] = out.to_vector(s());
        lses[i] = lse.to_vector(s());
      }
      EXPECT_TRUE(same(outs[0], outs[1]));
      EXPECT_TRUE(same(lses[0], lses[1]));
      bool finite = true;
      for (float x : outs[0]) finite = finite && std::isfinite(x);
      EXPECT_TRUE(finite);
    }
}

// TensorCore at head_dim 64-128 runs 64 or 128 query rows per block (one or two m-tiles per
// warp, chosen by the grid size): a schedule choice, so both give the same bytes, out and lse.
TEST_P(Attention, FusedTensorCoreRowsPerBlockGiveTheSameBytes) {
  Lcg rng{11};
  for (std::int64_t D : {64, 128})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("D=" + std::to_string(D) + (causal ? " causal" : ""));
      const ScopedEnv mma("LOCKSTEP_FUSED_TC_WGMMA", "0");  // the mma.sync kernels (wgmma: its own test)
      expect_knob_gives_same_bytes("LOCKSTEP_FUSED_TC_ROWS", "64", "128", AttentionPrecision::kTensorCore,
                                   AttentionShape{2, 4, 2, 200, 230, D}, causal, rng, 1.0f);
    }
}

// Note [wgmma products]: on the CPU device the warpgroup-product kernel's emulation multiplies the
// same operands in the same order as FusedAttentionTensorCore's, so it gives that kernel's bytes,
// out and lse, with one and two warpgroups per block; 230 keys end with a partial tile (four
// tiles: both ways round the unrolled pair of score buffers), and 200 query rows with a partial
// block. (On CUDA it runs where the build has sm_90a, and the tensor-core properties hold it to
// the CPU within the bound.)
TEST_P(Attention, FusedWgmmaGivesTheTensorCoreBytesOnTheCpu) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "the CPU device's emulation (CUDA: the properties)";
  Lcg rng{15};
  for (const char* wg : {"1", "2"})
    for (std::int64_t D : {64, 128})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string("warpgroups ") + wg + " D=" + std::to_string(D) + (causal ? " causal" : ""));
        const ScopedEnv warpgroups("LOCKSTEP_FUSED_TC_WGMMA_WG", wg);
        expect_knob_gives_same_bytes("LOCKSTEP_FUSED_TC_WGMMA", "0", "1", AttentionPrecision::kTensorCore,
                                     AttentionShape{2, 4, 2, 200, 230, D}, causal, rng, 1.0f);
      }
}

// Note [four wgmma blocks per SM]: the serial schedule (LOCKSTEP_FUSED_TC_WGMMA_SERIAL=1, the
// default, here in its own order: LOCKSTEP_FUSED_TC_WGMMA_DEFER=0) gives the overlapping
// schedule's (=0) bytes, with its own packing blocks and after the packing launch, causal or
// not, with partial tiles, a single tile and many. The launch record shows that the variant ran.
// On the CPU device the wgmma kernel is forced (its emulation); on an sm_90a build on compute
// capability 9.0 it runs where the one-warpgroup head_dim 64 wgmma kernel would.
TEST_P(Attention, FusedWgmmaSerialGivesTheSameBytes) {
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  Lcg rng{17};
  std::optional<ScopedEnv> forced;  // on the CPU device the wgmma kernel's emulation
  if (cpu) forced.emplace("LOCKSTEP_FUSED_TC_WGMMA", "1");
  const ScopedEnv warpgroups("LOCKSTEP_FUSED_TC_WGMMA_WG", "1"), in_order("LOCKSTEP_FUSED_TC_WGMMA_DEFER", "0");
  for (const char* pack : {"0", "1"})
    for (const AttentionShape& sh : {AttentionShape{2, 4, 2, 200, 230, 64}, AttentionShape{3, 2, 1, 64, 700, 64},
                                     AttentionShape{1, 2, 2, 40, 17, 64}})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string("packing blocks ") + pack + " B=" + std::to_string(sh.batch) + " Skv=" +
                     std::to_string(sh.seq_kv) + (causal ? " causal" : ""));
        detail::LaunchRecorder rec;
        {
          const ScopedEnv packing("LOCKSTEP_FUSED_TC_PACK", pack);
          expect_knob_gives_same_bytes("LOCKSTEP_FUSED_TC_WGMMA_SERIAL", "0", "1", AttentionPrecision::kTensorCore,
                                       sh, causal, rng, 1.0f);
        }
        const bool pk = pack[0] == '1';
        const int serial = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false>>
                              : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false>>;
        const int overlapped = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true>>
                                  : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1>>;
        if (!cpu && !rec.launched(overlapped))
          GTEST_SKIP() << "no wgmma kernel here (a library built without sm_90a, or compute capability not 9.0)";
        EXPECT_TRUE(rec.launched(serial));
        EXPECT_TRUE(rec.launched(overlapped));
        // With the knob unset the serial schedule is the one that runs (the default since run 124;
        // in its own order here, LOCKSTEP_FUSED_TC_WGMMA_DEFER=0).
        {
          detail::LaunchRecorder by_default;
          tensor_core_attention(sh, causal, pack);
          EXPECT_TRUE(by_default.launched(serial));
          EXPECT_FALSE(by_default.launched(overlapped));
        }
      }
}

// Note [deferred P.V wait]: the serial schedule with tile j's softmax during tile j - 1's P.V
// (LOCKSTEP_FUSED_TC_WGMMA_DEFER=1, the default) gives the serial order's bytes, with its own packing blocks
// and after the packing launch, causal or not, partial tiles, one tile and many, and (200 queries
// over 17 keys, causal) blocks whose rows see no key at all (no tile). Inputs in [-4, 4]
// as well, so that a row's max moves past the lazy rescale's threshold after its first tile and
// o's rescale, which this schedule moves to just before the next P.V, runs with alpha < 1.
TEST_P(Attention, FusedWgmmaDeferredGivesTheSameBytes) {
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  Lcg rng{23};
  std::optional<ScopedEnv> forced;  // on the CPU device the wgmma kernel's emulation
  if (cpu) forced.emplace("LOCKSTEP_FUSED_TC_WGMMA", "1");
  std::optional<ScopedEnv> warpgroups(std::in_place, "LOCKSTEP_FUSED_TC_WGMMA_WG", "1");
  for (const char* pack : {"0", "1"})
    for (const AttentionShape& sh : {AttentionShape{2, 4, 2, 200, 230, 64}, AttentionShape{3, 2, 1, 64, 700, 64},
                                     AttentionShape{1, 2, 2, 40, 17, 64}, AttentionShape{1, 2, 1, 200, 17, 64}})
      for (bool causal : {false, true})
        for (float range : {1.0f, 4.0f}) {
          SCOPED_TRACE(std::string("packing blocks ") + pack + " B=" + std::to_string(sh.batch) + " Skv=" +
                       std::to_string(sh.seq_kv) + (causal ? " causal" : "") + " range " + std::to_string(range));
          detail::LaunchRecorder rec;
          {
            const ScopedEnv packing("LOCKSTEP_FUSED_TC_PACK", pack);
            expect_knob_gives_same_bytes("LOCKSTEP_FUSED_TC_WGMMA_DEFER", "0", "1", AttentionPrecision::kTensorCore,
                                         sh, causal, rng, range);
          }
          const bool pk = pack[0] == '1';
          const int serial = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false>>
                                : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false>>;
          const int deferred = pk ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, true, false, true>>
                                  : kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false, true>>;
          if (!cpu && !rec.launched(serial))
            GTEST_SKIP() << "no wgmma kernel here (a library built without sm_90a, or compute capability not 9.0)";
          EXPECT_TRUE(rec.launched(serial));
          EXPECT_TRUE(rec.launched(deferred));
          // With the knob unset the deferred order is the one that runs (the default since run 126).
          detail::LaunchRecorder by_default;
          tensor_core_attention(sh, causal, pack);
          EXPECT_TRUE(by_default.launched(deferred));
          EXPECT_FALSE(by_default.launched(serial));
        }
  warpgroups.reset();
  // Grids under two waves of 132 SMs (at 64 rows per block), by default: one warpgroup per block
  // at head_dim 64 (this kernel), two at head_dim 128 (wgmma_warpgroups; run 137).
  for (std::int64_t D : {64, 128}) {
    SCOPED_TRACE("small grid, D=" + std::to_string(D));
    detail::LaunchRecorder rec;
    tensor_core_attention(AttentionShape{1, 2, 1, 200, 230, D}, false, "0");
    const int one = D == 64 ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 1, false, false, true>>
                            : kernels::kernel_index_v<kernels::FusedAttentionWgmma<128, 1>>;
    const int two = D == 64 ? kernels::kernel_index_v<kernels::FusedAttentionWgmma<64, 2>>
                            : kernels::kernel_index_v<kernels::FusedAttentionWgmma<128, 2>>;
    EXPECT_EQ(rec.launched(one), D == 64);
    EXPECT_EQ(rec.launched(two), D == 128);
  }
}

// Note [packing blocks]: the wgmma kernel with K and V rounded to fp16 by its own blocks (kv head
// by kv head, behind tickets and signals) gives the bytes of the packing kernel before it. On the
// CPU device the wgmma kernel is forced (its emulation); on an sm_90a build on compute capability
// 9.0 it is the default at these head_dims' grids. Each shape is first run with other K and V by
// the packing kernel, so that the stream's scratch holds wrong tiles where the packing blocks must
// write. Shapes: several kv heads and batches (blocks wait on the heads before theirs), one
// packing block per kv head packing many tiles (64 query rows, 700 keys), one kv head in all
// (packed by the kernel before only), partial tiles, GQA. Repeated calls on one stream also check
// that the tickets and counters are zeros again after a call. The blocks pack the default 8, one
// and two kv heads ahead (LOCKSTEP_FUSED_TC_PACK_AHEAD, at most the kv heads per batch; the launch
// before packs that many; the last shape has 10 kv heads, so 8 ahead is not clamped there).
// Without split keys (Note [split keys]: the packing blocks never split; the knob keeps
// the packing launch from splitting too).
TEST_P(Attention, FusedWgmmaPackingBlocksGiveTheSameBytes) {
  Lcg rng{16};
  const bool cpu = dev->id().kind == DeviceKind::kCpu;
  std::optional<ScopedEnv> forced;  // on the CPU device the wgmma kernel's emulation
  if (cpu) forced.emplace("LOCKSTEP_FUSED_TC_WGMMA", "1");
  const ScopedEnv one_range("LOCKSTEP_FUSED_TC_SPLITS", "1");
  for (const char* ahead : {"", "1", "2"})  // "": the default (8, at most the kv heads per batch)
    for (const char* wg : {"1", "2"})
      for (const AttentionShape& sh : {AttentionShape{2, 4, 2, 200, 230, 128}, AttentionShape{3, 2, 1, 64, 700, 64},
                                       AttentionShape{1, 3, 1, 130, 90, 128}, AttentionShape{2, 8, 2, 70, 333, 64},
                                       AttentionShape{1, 40, 10, 64, 140, 64}})
        for (bool causal : {false, true}) {
          SCOPED_TRACE(std::string("ahead ") + (*ahead != '\0' ? ahead : "default") + " warpgroups " + wg +
                       " B=" + std::to_string(sh.batch) + " Hkv=" + std::to_string(sh.kv_heads) + " D=" +
                       std::to_string(sh.head_dim) + (causal ? " causal" : ""));
          const ScopedEnv warpgroups("LOCKSTEP_FUSED_TC_WGMMA_WG", wg);
          const ScopedEnv pack_ahead("LOCKSTEP_FUSED_TC_PACK_AHEAD", ahead);
          const std::size_t nq = std::size_t(sh.batch * sh.heads * sh.seq_q * sh.head_dim);
          const std::size_t nkv = std::size_t(sh.batch * sh.kv_heads * sh.seq_kv * sh.head_dim);
          auto buf = [&](std::size_t n) {
            Buffer<float> x(dev, n);
            x.copy_from_host(s(), rng.floats(n, 1.0f));
            return x;
          };
          auto q = buf(nq), k = buf(nkv), v = buf(nkv), k_other = buf(nkv), v_other = buf(nkv);
          std::vector<float> outs[3];
          for (int i = 0; i < 3; ++i) {  // the other K and V packed before; in the kernel; before
            auto out = filled(nq, 42.0f);
            AttentionOptions o;
            o.precision = AttentionPrecision::kTensorCore;
            o.causal = causal;
            const ScopedEnv packing("LOCKSTEP_FUSED_TC_PACK", i == 1 ? "1" : "0");
            attention(s(), q, i == 0 ? k_other : k, i == 0 ? v_other : v, out, sh, o);
            outs[i] = out.to_vector(s());
          }
          ASSERT_FALSE(same(outs[0], outs[2]));
          for (std::size_t e = 0; e < nq; ++e) ASSERT_EQ(bits(outs[1][e]), bits(outs[2][e])) << e;
        }
}

// batch_invariant (the default): one batch's rows of a large grid are the bytes of that batch
// alone, out and lse, by the default kernels. On sm_90a CUDA the grid's size picks the kernel's
// variant: 384 blocks of 64 rows (two waves of 132 SMs or more) run one warpgroup per block at
// head_dim 128 and the packing blocks at head_dim 64, the batch alone (96 blocks) two warpgroups
// and the packing launch (Notes [wgmma products], [packing blocks]); Exact's variants follow the
// grid too. (The property FusedRowsDoNotDependOnTheBatchHeadsOrQueryRows draws small grids.)
TEST_P(Attention, FusedBatchRowsOfALargeGridAreTheBatchAlone) {
  Lcg rng{18};
  const std::int64_t B = 4, H = 32, Hk = 8, Sq = 192, Skv = 256, b = 2;
  for (const auto prec : {AttentionPrecision::kTensorCore, AttentionPrecision::kExact})
    for (const std::int64_t D : {64, 128})
      for (const bool causal : {false, true}) {
        SCOPED_TRACE(std::string(prec == AttentionPrecision::kExact ? "exact" : "tensor core") +
                     " D=" + std::to_string(D) + (causal ? " causal" : ""));
        const std::size_t nq = std::size_t(B * H * Sq * D), nkv = std::size_t(B * Hk * Skv * D);
        const auto hq = rng.floats(nq, 1.0f), hk = rng.floats(nkv, 1.0f), hv = rng.floats(nkv, 1.0f);
        auto run = [&](std::int64_t batch, std::size_t q0, std::size_t kv0) {
          const std::size_t mq = nq / std::size_t(B) * std::size_t(batch), mkv = nkv / std::size_t(B) * std::size_t(batch);
          Buffer<float> q(dev, mq), k(dev, mkv), v(dev, mkv), lse(dev, std::size_t(batch * H * Sq));
          q.copy_from_host(s(), std::span<const float>(hq).subspan(q0, mq));
          k.copy_from_host(s(), std::span<const float>(hk).subspan(kv0, mkv));
          v.copy_from_host(s(), std::span<const float>(hv).subspan(kv0, mkv));
          auto out = filled(mq, 42.0f);
          AttentionOptions o;
          o.precision = prec;
          o.causal = causal;
          o.lse = &lse;
          attention(s(), q, k, v, out, AttentionShape{batch, H, Hk, Sq, Skv, D}, o);
          return std::pair{out.to_vector(s()), lse.to_vector(s())};
        };
        const auto full = run(B, 0, 0);
        const auto alone = run(1, nq / B * std::size_t(b), nkv / B * std::size_t(b));
        const std::size_t per_q = nq / std::size_t(B), per_lse = std::size_t(H * Sq);
        for (std::size_t e = 0; e < per_q; ++e)
          ASSERT_EQ(bits(alone.first[e]), bits(full.first[std::size_t(b) * per_q + e])) << e;
        for (std::size_t e = 0; e < per_lse; ++e)
          ASSERT_EQ(bits(alone.second[e]), bits(full.second[std::size_t(b) * per_lse + e])) << e;
      }
}

// TensorCore: within fp16's rounding of Q, K (scores within 2 uh qmag), P and V (a few uh); on the
// CPU device the wgmma kernel (forced, one and two warpgroups) gives FusedAttentionTensorCore's
// bytes with splits too, and FusedAttentionTensorCore<D, 2> (128 rows) those of <D, 1>.
TEST_P(Attention, FusedTensorCoreSplitKeys) {
  const double uh = std::ldexp(1.0, -11);
  split_keys_case(
      AttentionPrecision::kTensorCore, "LOCKSTEP_FUSED_TC_SPLITS",
      [uh](double qmag, std::int64_t, std::int64_t) { return 4.0 * qmag * uh + 8.0 * uh; },
      [](const AttentionShape&) { return false; },  // TensorCore: only when the knob asks (run 137)
      [this](const AttentionShape& sh, bool causal, Lcg& rng, float range) {
        for (const char* wg : {"1", "2"}) {
          const ScopedEnv warpgroups("LOCKSTEP_FUSED_TC_WGMMA_WG", wg);
          expect_knob_gives_same_bytes("LOCKSTEP_FUSED_TC_WGMMA", "0", "1", AttentionPrecision::kTensorCore, sh,
                                       causal, rng, range);
        }
        const ScopedEnv mma("LOCKSTEP_FUSED_TC_WGMMA", "0");
        expect_knob_gives_same_bytes("LOCKSTEP_FUSED_TC_ROWS", "64", "128", AttentionPrecision::kTensorCore, sh,
                                     causal, rng, range);
      });
}

// Exact: within fp32's bound (every score's error, (D + 4) u qmag, and the sums', (keys + D + 40)
// u; the merge adds a few u); the CUDA bytes are the CPU's (the property FusedExactSplitKeys). On
// the CPU device the row-major path gives the lane path's bytes with splits too
// (LOCKSTEP_CPU_EXACT_LANES), and P in its own buffer those of P in K's memory (head_dim 64).
TEST_P(Attention, FusedExactSplitKeys) {
  const double u = std::ldexp(1.0, -24);
  split_keys_case(
      AttentionPrecision::kExact, "LOCKSTEP_FUSED_EXACT_SPLITS",
      [u](double qmag, std::int64_t keys, std::int64_t D) {
        return 4.0 * (qmag * double(D + 4) + double(keys + D + 40)) * u;
      },
      [](const AttentionShape&) { return true; },  // fewer than 12 warps per SM of 132
      [this](const AttentionShape& sh, bool causal, Lcg& rng, float range) {
        expect_knob_gives_same_bytes("LOCKSTEP_CPU_EXACT_LANES", "0", "1", AttentionPrecision::kExact, sh, causal,
                                     rng, range);
        if (sh.head_dim == 64)
          expect_knob_gives_same_bytes("LOCKSTEP_FUSED_EXACT_P", "0", "1", AttentionPrecision::kExact, sh, causal,
                                       rng, range);
      });
}

// Exact skips the mask on tiles whose every key is visible to every row of a full 64-row block.
// Rows do not interact, so a block of 63 rows (every tile masked) must give the same bytes for
// its rows as a block of 64 (full tiles unmasked): non-causal, and causal with the diagonal two
// tiles to the right (the extra row of the 64-row call sees one more key that no other row sees).
// Also with the keys cut into three ranges (Note [split keys]: the ranges depend on Skv's tiles
// only, the same for both calls), where the unmasked tiles are inside a range and the merge follows.
TEST_P(Attention, FusedExactUnmaskedTilesGiveTheMaskedBytes) {
  Lcg rng{14};
  for (const char* splits : {"1", "3"})
    for (std::int64_t D : {64, 128})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string("splits ") + splits + " D=" + std::to_string(D) + (causal ? " causal" : ""));
        const ScopedEnv ranges("LOCKSTEP_FUSED_EXACT_SPLITS", splits);
        const std::int64_t skv = causal ? 192 : 200;
        const auto hq = rng.floats(std::size_t(64 * D), 2.0f);
        const auto hk = rng.floats(std::size_t(skv * D), 2.0f), hv = rng.floats(std::size_t(skv * D), 2.0f);
        std::vector<float> outs[2], lses[2];
        for (int i = 0; i < 2; ++i) {
          const std::int64_t sq = 64 - i, sk = causal ? skv - i : skv;  // causal: the same shift
          const AttentionShape sh{1, 1, 1, sq, sk, D};
          Buffer<float> q(dev, std::size_t(sq * D)), k(dev, std::size_t(sk * D)), v(dev, std::size_t(sk * D));
          q.copy_from_host(s(), std::vector<float>(hq.begin(), hq.begin() + sq * D));
          k.copy_from_host(s(), std::vector<float>(hk.begin(), hk.begin() + sk * D));
          v.copy_from_host(s(), std::vector<float>(hv.begin(), hv.begin() + sk * D));
          auto out = filled(std::size_t(sq * D), 42.0f), lse = filled(std::size_t(sq), 42.0f);
          AttentionOptions o;
          o.precision = AttentionPrecision::kExact;
          o.causal = causal;
          o.lse = &lse;
          attention(s(), q, k, v, out, sh, o);
          outs[i] = out.to_vector(s());
          lses[i] = lse.to_vector(s());
        }
        for (std::size_t e = 0; e < outs[1].size(); ++e) ASSERT_EQ(bits(outs[0][e]), bits(outs[1][e])) << e;
        for (std::size_t e = 0; e < lses[1].size(); ++e) ASSERT_EQ(bits(lses[0][e]), bits(lses[1][e])) << e;
        ASSERT_NE(outs[1][0], 42.0f);
      }
}

// Exact at head_dim 64 with P in K's memory and with P in a buffer of its own (the host picks by
// grid size; LOCKSTEP_FUSED_EXACT_P forces either): the same bytes, out and log-sum-exp.
TEST_P(Attention, FusedExactPBuffersGiveTheSameBytes) {
  Lcg rng{12};
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    expect_knob_gives_same_bytes("LOCKSTEP_FUSED_EXACT_P", "0", "1", AttentionPrecision::kExact,
                                 AttentionShape{2, 4, 2, 150, 201, 64}, causal, rng, 2.0f);
  }
}

// Note [row-major exact]: on the CPU's avx2 and avx3 variants FusedAttentionExact's blocks run
// row by row (x.exact_rows); LOCKSTEP_CPU_EXACT_LANES=1 runs the lane path. The same bytes, out
// and log-sum-exp (NaN payloads aside, outside the contract), on the device's variant and on
// avx2 (two key and column vectors per register block), at every head_dim, causal or not, GQA,
// lengths that are not multiples of the 64-row blocks or the key tiles, rows that see no key
// (causal with seq_q > seq_kv), the interleaved layout, a NaN query element, scores that
// overflow to inf, and inf and NaN values in V at the last keys, which causal rows before them
// weight 0 (0 x inf is NaN on both paths: a path that skipped zero weights would differ).
TEST_P(Attention, FusedExactRowMajorGivesTheLaneBytes) {
  if (dev->id().kind != DeviceKind::kCpu) GTEST_SKIP() << "a CPU device path (Note [row-major exact])";
  if (dev->name().find("AVX2") == std::string::npos && dev->name().find("AVX3") == std::string::npos)
    GTEST_SKIP() << dev->name() << ": this SIMD variant has no row-major path (it runs the lane path)";
  std::vector<std::shared_ptr<Device>> devices{dev};
  if (dev->name().find("AVX3") != std::string::npos) devices.push_back(make_cpu_device({.index = 7, .simd = "avx2"}));
  struct Case {
    AttentionShape sh;
    AttentionLayout layout;
  };
  Lcg rng{31};
  for (const auto& d : devices)
    for (std::int64_t D : {32, 64, 96, 128, 256}) {
      const Case cases[] = {{{2, 4, 2, 70, 130, D}, AttentionLayout::kHeadsFirst},
                            {{1, 2, 1, 150, 40, D}, AttentionLayout::kHeadsFirst},
                            {{1, 4, 4, 65, 65, D}, AttentionLayout::kInterleaved}};
      for (const Case& c : cases)
        for (bool causal : {false, true}) {
          const AttentionShape& sh = c.sh;
          SCOPED_TRACE(d->name() + ": D " + std::to_string(D) + " Sq " + std::to_string(sh.seq_q) + " Skv " +
                       std::to_string(sh.seq_kv) + (causal ? " causal" : "") +
                       (c.layout == AttentionLayout::kInterleaved ? " interleaved" : ""));
          Stream& st = d->default_stream();
          const std::size_t nq = std::size_t(sh.batch * sh.heads * sh.seq_q * D);
          const std::size_t nkv = std::size_t(sh.batch * sh.kv_heads * sh.seq_kv * D);
          const std::size_t nl = std::size_t(sh.batch * sh.heads * sh.seq_q);
          auto hq = rng.floats(nq, 2.0f), hv = rng.floats(nkv, 2.0f);
          hq[1] = std::numeric_limits<float>::quiet_NaN();  // a row of head 0 (or row 0's heads): NaN
          hq[std::size_t(D) * 3 + 2] = 3e38f;                // another: scores overflow to +-inf
          // The last two keys' first values (the first kv head's, or every head's when
          // interleaved): inf and NaN.
          const std::int64_t vrow = c.layout == AttentionLayout::kInterleaved ? sh.kv_heads * D : D;
          hv[std::size_t((sh.seq_kv - 1) * vrow)] = std::numeric_limits<float>::infinity();
          hv[std::size_t((sh.seq_kv - 2) * vrow + 1)] = std::numeric_limits<float>::quiet_NaN();
          Buffer<float> q(d, nq), k(d, nkv), v(d, nkv);
          q.copy_from_host(st, hq);
          k.copy_from_host(st, rng.floats(nkv, 2.0f));
          v.copy_from_host(st, hv);
          std::vector<float> outs[2], lses[2];
          for (int i = 0; i < 2; ++i) {
            Buffer<float> out(d, nq), lse(d, nl);
            out.fill(st, 42.0f);
            lse.fill(st, 42.0f);
            AttentionOptions o;
            o.precision = AttentionPrecision::kExact;
            o.causal = causal;
            o.layout = c.layout;
            o.lse = &lse;
            const ScopedEnv path("LOCKSTEP_CPU_EXACT_LANES", i == 0 ? "0" : "1");  // until the reads below
            attention(st, q, k, v, out, sh, o);
            outs[i] = out.to_vector(st);
            lses[i] = lse.to_vector(st);
          }
          for (std::size_t e = 0; e < nq; ++e)
            ASSERT_TRUE(same_bits(outs[0][e], outs[1][e])) << "out " << e << ": " << outs[0][e] << " vs " << outs[1][e];
          for (std::size_t e = 0; e < nl; ++e)
            ASSERT_TRUE(same_bits(lses[0][e], lses[1][e])) << "lse " << e << ": " << lses[0][e] << " vs " << lses[1][e];
          for (float x : outs[0]) ASSERT_NE(bits(x), bits(42.0f)) << "every output written";
        }
    }
}

LOCKSTEP_INSTANTIATE_BACKENDS(Attention);


}  // namespace
}  // namespace lockstep::testing
