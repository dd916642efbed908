// `lockstep parity`: every kernel of the harness (proptests/harness) and of apps/parity_cases.cpp
// on random shapes, plus fixed large shapes that reach the variants the library picks only for
// large grids, on every device; compared bitwise with the CPU device and with a float64 oracle.
// The decode entries run a second time in a child process with LOCKSTEP_DECODE_ONE_GRID=1
// (Note [one grid]: the knob is read once per process), whose CPU bytes must equal this run's.

#include "parity.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/harness.hpp"
#include "harness/harness_decode.hpp"
#include "lockstep/lockstep.hpp"
#include "parity_cases.hpp"

extern char** environ;

namespace lockstep::parity {

namespace {

using CaseFn = std::function<std::unique_ptr<harness::Case>()>;

struct Entry {
  std::string name;
  std::function<std::unique_ptr<harness::Case>(std::mt19937_64&)> random_case;
  std::vector<CaseFn> fixed;  // run once per `parity` run, after the random cases
  bool decode = false;        // runs launch_decode: rerun with the one grid
};

std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// --- fixed large shapes -----------------------------------------------------------------------
// Each reaches a variant that attention/src/fused.cpp or attention/src/decode_launch.cpp picks
// only for large grids (H200: 132 SMs; the CPU device: one "multiprocessor" per worker thread).

harness::DecodeWorldShape world(std::int64_t slots, std::int64_t heads, std::int64_t kv_heads, std::int64_t dim,
                                std::int64_t max_len, std::vector<std::int64_t> lengths, std::vector<bool> done,
                                std::uint64_t seed) {
  harness::DecodeWorldShape s;
  s.slots = slots, s.heads = heads, s.kv_heads = kv_heads, s.dim = dim, s.max_len = max_len;
  s.lengths = std::move(lengths), s.done = std::move(done), s.seed = seed;
  return s;
}

// flash_decoding, host positions: max_chunks follows the longest position.
std::vector<CaseFn> large_flash() {
  return {
      // 4 query heads per block, 4 chunks (not folded: 4 x 4 > 8), 32 x 5 merge blocks >= 132:
      // DecodeMerge<128, 2> (max_chunks <= 8).
      [] { return flash_cache_case(world(5, 32, 2, 128, 1024, {1023, 600, 7, 0, 300}, {false, false, false, false, true}, 11)); },
      // 9 chunks: DecodeMerge<128, 4> (max_chunks <= 16).
      [] { return flash_cache_case(world(5, 32, 2, 128, 2304, {2303, 1100, 256, 1, 2000}, {false, false, false, false, true}, 12)); },
      // 8 query heads per block (DecodeChunk<64, 8>), 10 chunks: not folded (one grid: its pair).
      [] { return flash_cache_case(world(3, 8, 1, 64, 2400, {2399, 513, 0}, {false, false, false}, 13)); },
      // One head per block at 128 (DecodeChunk<128, 1, 2, 3>), 9 chunks: not folded.
      [] { return flash_cache_case(world(2, 3, 3, 128, 2304, {2303, 10}, {false, false}, 14)); },
      // head_dim 256, 2 heads per block, 6 chunks: not folded.
      [] { return flash_cache_case(world(2, 4, 2, 256, 1300, {1299, 40}, {false, false}, 15)); },
      // 130 slots: more than kInlineRows (128), so the positions are copied to the device.
      [] {
        auto s = world(130, 2, 1, 32, 40, {}, {}, 16);
        return flash_cache_case(s);
      },
  };
}

// flash_decoding, device positions: max_chunks follows the cache's capacity.
std::vector<CaseFn> large_device_positions() {
  auto dp = [](harness::DecodeWorldShape w) {
    DevicePositionsShape s;
    s.world = std::move(w);
    return device_positions_case(s);
  };
  return {
      [dp] { return dp(world(5, 32, 2, 128, 1024, {1023, 600, 7, 0, 300}, {}, 21)); },   // DecodeMerge<128, 2>
      [dp] { return dp(world(5, 32, 2, 128, 2304, {2303, 1100, 256, 1, 2000}, {}, 22)); },  // DecodeMerge<128, 4>
      [dp] { return dp(world(3, 8, 1, 64, 2400, {2399, 513, 0}, {}, 23)); },
      [dp] { return dp(world(130, 2, 1, 32, 40, {}, {}, 24)); },  // positions past kInlineRows
  };
}

harness::FusedCaseShape fused(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t seq_q,
                              std::int64_t seq_kv, std::int64_t dim, bool causal, bool interleaved, bool tc,
                              std::uint64_t seed) {
  harness::FusedCaseShape s;
  s.batch = batch, s.heads = heads, s.kv_heads = kv_heads, s.seq_q = seq_q, s.seq_kv = seq_kv, s.dim = dim;
  s.causal = causal, s.interleaved = interleaved, s.tensor_core = tc, s.seed = seed;
  return s;
}

// Few query rows, many (batch, head) pairs: large grids at little arithmetic.
std::vector<CaseFn> large_fused_exact() {
  return {
      // 26 x 16 = 416 blocks > 3 x 132: FusedAttentionExact<64> with P in K's memory (on the CPU
      // device every grid above 3 blocks per worker thread takes it).
      [] { return harness::fused_case(fused(26, 16, 4, 3, 37, 64, true, false, false, 31)); },
      [] { return harness::fused_case(fused(26, 16, 4, 3, 37, 64, false, true, false, 32)); },
  };
}
std::vector<CaseFn> large_fused_tc() {
  return {
      // 17 x 32 = 544 blocks of 128 rows >= 2 x 2 x 132: FusedAttentionTensorCore<128, 2> (without
      // wgmma; with it, FusedAttentionWgmma<128, 1>).
      [] { return harness::fused_case(fused(17, 32, 4, 3, 37, 128, true, false, true, 41)); },
      // 17 x 16 = 272 blocks of 64 rows >= 2 x 132 at head_dim 64: on sm_90a
      // FusedAttentionWgmma<64, 1, true> (packing blocks); FusedAttentionTensorCore<64> elsewhere.
      [] { return harness::fused_case(fused(17, 16, 4, 5, 70, 64, false, true, true, 42)); },
  };
}

// --- entries ----------------------------------------------------------------------------------

std::vector<Entry> all_entries() {
  std::vector<Entry> r;
  bool flash = false, rope = false;
  const auto flash_random = [](std::mt19937_64& g) {
    harness::DecodeWorldShape s;
    static const std::int64_t dims[] = {32, 64, 96, 128, 256};
    s.dim = dims[std::uniform_int_distribution<int>(0, 4)(g)];
    s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
    s.heads = s.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 4)(g);
    s.slots = std::uniform_int_distribution<std::int64_t>(1, 5)(g);
    s.max_len = harness::draw_size(g, 700);
    s.seed = g();
    return flash_cache_case(s);
  };
  const auto rope_random = [](std::mt19937_64& g) {
    harness::RopeCaseShape s;
    s.rows = harness::draw_size(g, 40);
    s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
    s.heads = s.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 4)(g);
    s.dim = 2 * std::uniform_int_distribution<std::int64_t>(1, 128)(g);
    s.theta = std::uniform_int_distribution<int>(0, 1)(g) ? 10000.0f : 1e6f;
    s.neox = std::uniform_int_distribution<int>(0, 1)(g);
    s.max_pos = std::uniform_int_distribution<int>(0, 1)(g) ? 64 : 4096;
    s.seed = g();
    return rope_rel_case(s);
  };
  for (const auto& k : harness::kernel_entries()) {
    Entry e{k.name, k.random_case, {}, false};
    if (k.name == "flash_decoding") {
      // The harness's draws (proptests/harness/harness_decode.cpp), with the appended cache
      // tokens compared and the relative error filled (apps/parity_cases.cpp).
      flash = true;
      e.random_case = flash_random;
      e.fixed = large_flash();
      e.decode = true;
    } else if (k.name == "rope") {
      rope = true;  // the harness's draws, the relative error filled
      e.random_case = rope_random;
    } else if (k.name == "attention_fused_exact") {
      e.fixed = large_fused_exact();
    } else if (k.name == "attention_fused_tensor_core") {
      e.fixed = large_fused_tc();
    } else if (k.name == "incremental_attention") {
      e.decode = true;
    }
    r.push_back(std::move(e));
  }
  // Were the harness's entries renamed, these still run (as rows of their own).
  if (!flash) r.push_back({"flash_decoding (apps)", flash_random, large_flash(), true});
  if (!rope) r.push_back({"rope (apps)", rope_random, {}, false});
  r.push_back({"flash_decoding_device_positions",
               [](std::mt19937_64& g) {
                 DevicePositionsShape s;
                 static const std::int64_t dims[] = {32, 64, 96, 128, 256};
                 s.world.dim = dims[std::uniform_int_distribution<int>(0, 4)(g)];
                 s.world.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
                 s.world.heads = s.world.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 4)(g);
                 s.world.slots = std::uniform_int_distribution<std::int64_t>(1, 6)(g);
                 s.world.max_len = harness::draw_size(g, 700);
                 s.with_skip = std::uniform_int_distribution<int>(0, 3)(g) != 0;
                 s.with_out_of_range = std::uniform_int_distribution<int>(0, 3)(g) != 0;
                 s.with_rewind = std::uniform_int_distribution<int>(0, 1)(g) != 0;
                 s.world.seed = g();
                 return device_positions_case(s);
               },
               large_device_positions(), true});
  static const std::int64_t dims[] = {32, 64, 96, 128, 256};
  r.push_back({"kv_cache_append",
               [](std::mt19937_64& g) {
                 AppendShape s;
                 s.layers = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
                 s.dim = dims[std::uniform_int_distribution<int>(0, 4)(g)];
                 s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
                 s.steps = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
                 s.slots = std::uniform_int_distribution<std::int64_t>(1, 9)(g);
                 s.max_len = s.steps + harness::draw_size(g, 100);
                 s.seed = g();
                 return append_case(s);
               },
               {[] {  // more slots than kInlineRows: the positions are copied to the device
                 AppendShape s{2, 133, 2, 32, 9, 2, 51};
                 return append_case(s);
               }},
               false});
  r.push_back({"kv_cache_copy_slot_from",
               [](std::mt19937_64& g) {
                 CopySlotShape s;
                 s.layers = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
                 s.dim = dims[std::uniform_int_distribution<int>(0, 4)(g)];
                 s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
                 s.src_slots = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
                 s.dst_slots = std::uniform_int_distribution<std::int64_t>(1, 6)(g);
                 s.src_max_len = harness::draw_size(g, 200);
                 s.dst_max_len = std::uniform_int_distribution<int>(0, 2)(g) == 0 ? s.src_max_len : harness::draw_size(g, 200);
                 s.copies = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
                 s.seed = g();
                 return copy_slot_case(s);
               },
               {}, false});
  r.push_back({"kv_cache_grow",
               [](std::mt19937_64& g) {
                 GrowShape s;
                 s.layers = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
                 s.dim = dims[std::uniform_int_distribution<int>(0, 4)(g)];
                 s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
                 s.slots = std::uniform_int_distribution<std::int64_t>(1, 5)(g);
                 s.new_slots = s.slots + std::uniform_int_distribution<std::int64_t>(0, 4)(g);
                 s.max_len = 1 + harness::draw_size(g, 150);
                 s.seed = g();
                 return grow_case(s);
               },
               {}, false});
  return r;
}

std::string device_label(const Device& d) {
  return d.id().kind == DeviceKind::kCpu ? d.id().str() + " (" + d.caps().simd_target + ")" : d.id().str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, sep);)
    if (!x.empty()) r.push_back(x);
  return r;
}

// Runs this program again as `parity` over the decode entries with LOCKSTEP_DECODE_ONE_GRID=1;
// returns its exit code.
int rerun_one_grid(const Options& o, const std::vector<std::string>& names,
                   const std::map<std::string, std::uint64_t>& digests) {
  std::string only, expect;
  for (const auto& n : names) {
    only += (only.empty() ? "" : ",") + n;
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digests.at(n)));
    expect += (expect.empty() ? "" : ",") + n + "=" + hex;
  }
  std::vector<std::string> args = {"lockstep", "parity", "--device", o.device, "--cases", std::to_string(o.cases),
                                    "--seed", std::to_string(o.seed), "--only", only, "--expect-digests", expect,
                                    "--label", "LOCKSTEP_DECODE_ONE_GRID=1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string knob = "LOCKSTEP_DECODE_ONE_GRID=1";
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(knob.data());
  envp.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
    std::printf("parity: could not start the one-grid rerun (%s)\n", std::strerror(errno));
    return 1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int run(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Device>> others;
  if (o.device == "all") {
    for (const auto& b : devices())
      if (b.usable && b.kind != DeviceKind::kCpu)
        for (const auto& d : b.devices) others.push_back(open(d.id));
  } else if (DeviceSpec::parse(o.device).is_auto || DeviceSpec::parse(o.device).id.kind != DeviceKind::kCpu) {
    auto d = open(o.device);
    if (d->id().kind != DeviceKind::kCpu) others.push_back(d);
  }
  auto cpu = open("cpu");
  // The CPU device's portable SIMD variant too (where the host runs a wider one), so that a host
  // without a GPU still compares two backends' bytes.
  {
    CpuDeviceOptions co;
    co.index = 61;
    co.simd = "generic";
    auto variant = make_cpu_device(co);
    if (variant->caps().simd_target != cpu->caps().simd_target) others.push_back(variant);
  }
  const bool child = !o.label.empty();
  std::map<std::string, std::uint64_t> expected;
  for (const auto& kv : split(o.expect_digests, ',')) {
    const auto eq = kv.find('=');
    if (eq != std::string::npos) expected[kv.substr(0, eq)] = std::strtoull(kv.c_str() + eq + 1, nullptr, 16);
  }
  const auto only = split(o.only, ',');
  if (child)
    std::printf("\nparity again with %s: the decode entries (the same cases; their CPU bytes must equal the run above's)\n",
                o.label.c_str());
  else
    std::printf("parity: %d random cases per kernel (and fixed large ones), seed %llu; reference device %s (%s)\n",
                o.cases, static_cast<unsigned long long>(o.seed), cpu->id().str().c_str(),
                cpu->caps().simd_target.c_str());
  std::printf("\n| kernel | cases (random+large) | byte-identical to CPU | max ulp vs float64 | max rel err vs float64 | max error / documented bound | oracle check |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  std::map<std::string, std::uint64_t> digests;  // CPU bytes of every case, per entry
  std::vector<std::string> decode_names;
  for (const auto& k : all_entries()) {
    if (!only.empty() && std::find(only.begin(), only.end(), k.name) == only.end()) continue;
    if (k.decode) decode_names.push_back(k.name);
    // Each entry draws from its own generator, so that a subset of entries (the one-grid rerun)
    // draws the same cases.
    std::mt19937_64 rng(o.seed ^ fnv1a(k.name.data(), k.name.size()));
    double max_ulp = 0, max_rel = 0, max_ratio = 0;
    std::vector<harness::Distance> tc_dist(others.size());  // per device
    bool bitwise = true;
    std::size_t bound_fail = 0, unwritten_fail = 0;
    std::vector<std::size_t> identical(others.size(), 0);
    std::string first_problem;
    std::uint64_t digest = fnv1a(nullptr, 0);
    const int total = o.cases + int(k.fixed.size());
    for (int i = 0; i < total; ++i) {
      auto c = i < o.cases ? k.random_case(rng) : k.fixed[std::size_t(i - o.cases)]();
      const auto r = c->run(cpu);
      digest = fnv1a(r.out.data(), r.out.size() * sizeof(float), digest);
      const auto rep = c->check(r);
      max_ulp = std::max(max_ulp, rep.max_ulp);
      max_rel = std::max(max_rel, rep.max_rel);
      max_ratio = std::max(max_ratio, rep.max_bound_ratio);
      if (rep.violations) {
        ++bound_fail;
        if (first_problem.empty()) first_problem = c->describe() + ": " + rep.first_violation;
      }
      if (r.unwritten != c->expected_unwritten()) {
        ++unwritten_fail;
        if (first_problem.empty()) first_problem = c->describe() + ": unwritten outputs";
      }
      for (std::size_t d = 0; d < others.size(); ++d) {
        const auto g = c->run(others[d]);
        if (!c->bitwise_across_backends()) {
          // Tensor-core paths: both within the documented bound; their distance is reported.
          const auto grep = c->check(g);
          if (grep.violations == 0 && g.unwritten == c->expected_unwritten()) ++identical[d];
          else if (first_problem.empty())
            first_problem = c->describe() + " on " + others[d]->id().str() + ": " + grep.first_violation;
          tc_dist[d].add(g, r);
          continue;
        }
        const auto cmp = harness::compare_bits(r, g);
        if (cmp.mismatches == 0 && g.unwritten == c->expected_unwritten())
          ++identical[d];
        else if (first_problem.empty())
          first_problem = c->describe() + " on " + others[d]->id().str() + ": " + cmp.first;
      }
      bitwise = c->bitwise_across_backends();
    }
    digests[k.name] = digest;
    std::string ident;
    if (others.empty()) ident = "n/a (no GPU, no other SIMD variant)";
    for (std::size_t d = 0; d < others.size(); ++d) {
      if (bitwise) {
        ident += (d ? ", " : "") + device_label(*others[d]) + " " + std::to_string(identical[d]) + "/" +
                 std::to_string(total);
      } else {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s not bitwise by design: %zu/%d within bound, max %.0f ulp, NMSE %.2g",
                      device_label(*others[d]).c_str(), identical[d], total, tc_dist[d].max_ulp, tc_dist[d].nmse());
        ident += (d ? ", " : "") + std::string(buf);
      }
      ok = ok && identical[d] == std::size_t(total);
    }
    ok = ok && bound_fail == 0 && unwritten_fail == 0;
    const std::string name = child ? k.name + " [one grid]" : k.name;
    std::printf("| %s | %d+%zu | %s | %.2f | %.3g | %.3g | %s |\n", name.c_str(), o.cases, k.fixed.size(),
                ident.c_str(), max_ulp, max_rel, max_ratio,
                (bound_fail || unwritten_fail)
                    ? ("FAIL (" + std::to_string(bound_fail + unwritten_fail) + ")").c_str()
                    : "ok");
    if (!first_problem.empty()) std::printf("  first problem: %s\n", first_problem.c_str());
    if (const auto it = expected.find(k.name); it != expected.end()) {
      const bool same = it->second == digest;
      std::printf("  CPU bytes equal to the two-launch run's: %s\n", same ? "yes" : "NO");
      ok = ok && same;
    }
  }
  if (!child && !decode_names.empty()) {
    if (const char* v = std::getenv("LOCKSTEP_DECODE_ONE_GRID"); v != nullptr) {
      std::printf("\nLOCKSTEP_DECODE_ONE_GRID=%s is set: the decode entries above ran with it; no rerun.\n", v);
    } else {
      const int rc = rerun_one_grid(o, decode_names, digests);
      ok = ok && rc == 0;
    }
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s%s (%.1f s)\n", child ? "parity, one grid: " : "parity: ",
              ok ? "every case passed" : "MISMATCH (see above)", sec);
  return ok ? 0 : 1;
}

}  // namespace lockstep::parity
