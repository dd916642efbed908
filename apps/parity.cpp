// `lockstep parity`: every kernel entry of the harness (harness::kernel_entries(),
// proptests/harness) on random shapes, plus each entry's fixed large shapes (the variants the
// library picks only for large grids), on every device; compared bitwise with the CPU device and
// with a float64 oracle. The decode entries (KernelEntry::decode) run again in a child process
// under the Tuning decode.one_grid=1 (Note [one grid]; LOCKSTEP_TUNING, read when the child opens
// its devices), and with --knob-reruns all under every decode schedule set (schedule_sets), whose
// CPU bytes must equal this run's. This file is the driver only; the cases live in the harness.

#include "parity.hpp"
#include "format_names.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/harness.hpp"
#include "harness/harness_decode_formats.hpp"
#include "lockstep/lockstep.hpp"

extern char** environ;

namespace lockstep::parity {

namespace {

std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
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

// The child's exit code when it cannot open the device (the parent reports a skipped rerun).
constexpr int kChildNoDevice = 3;

// The decode schedules, every one of which gives the same bits (docs/api.md, "Tuning"): each set
// reruns the decode entries in a child process, whose devices read it when they open, and whose
// CPU bytes must equal this run's. Sets that act on the CPU device's lane path (the ring, the
// copies' L2 policy) run it there (LOCKSTEP_CPU_DECODE_LANES=1), so that the CPU reaches the code
// they choose; the lane path alone is a set of its own.
std::vector<std::vector<std::string>> schedule_sets(const std::string& which) {
  std::vector<std::vector<std::string>> sets = {{"LOCKSTEP_TUNING=decode.one_grid=1"}};
  if (which != "all") return sets;
  for (auto set : std::vector<std::vector<std::string>>{
           {"LOCKSTEP_CPU_DECODE_LANES=1"},
           {"LOCKSTEP_TUNING=decode.block_signals=0,decode.fold_merge=0"},
           {"LOCKSTEP_TUNING=decode.fold_merge=1,decode.max_heads_x_dim=256"},
           {"LOCKSTEP_CPU_DECODE_LANES=1", "LOCKSTEP_TUNING=decode.l2_policy=evict_first"},
           {"LOCKSTEP_CPU_DECODE_LANES=1", "LOCKSTEP_TUNING=decode.l2_policy=evict_normal,decode.one_grid=1"}})
    sets.push_back(std::move(set));
  return sets;
}

// How an entry's outputs are held to the float64 oracle, as its table row says.
enum class Check {
  kExact,  // the oracle's bytes (copies and scatters): no error figure to print
  kUlps,   // a bound in float ulps (the math functions; scale: one correct rounding, 0.5 ulp)
  kBound,  // |error| <= the documented bound (docs/numerics.md), printed as a % of it
};
// The entries checked in ulps, by name; the others are told apart by what their check recorded
// (a check against a documented bound records the error's ratio to it; an exact one, nothing).
Check check_of(const std::string& name, const harness::OracleReport& worst) {
  if (name == "math" || name == "scale") return Check::kUlps;
  if (worst.max_bound_ratio > 0) return Check::kBound;
  if (worst.max_ulp > 0) return Check::kUlps;
  return Check::kExact;
}

std::string joined(const std::vector<std::string>& v) {
  std::string r;
  for (const auto& x : v) r += (r.empty() ? "" : " ") + x;
  return r;
}

// Runs this program again as `parity` over the decode entries with the variables `set` in its
// environment (replacing those variables); returns its exit code.
int rerun_with(const Options& o, const std::vector<std::string>& set, const std::vector<std::string>& names,
               const std::map<std::string, std::uint64_t>& digests) {
  std::string only, expect;
  for (const auto& n : names) {
    only += (only.empty() ? "" : ",") + n;
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digests.at(n)));
    expect += (expect.empty() ? "" : ",") + n + "=" + hex;
  }
  std::vector<std::string> args = {"lockstep", "parity", "--device", o.device, "--cases", std::to_string(o.cases),
                                    "--seed", std::to_string(o.seed), "--formats", o.formats, "--only", only,
                                    "--expect-digests", expect,
                                    "--label", joined(set)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> knobs = set;  // owned here: envp points into them
  std::vector<char*> envp;  // this environment, the set's variables replaced
  for (char** e = environ; *e != nullptr; ++e) {
    bool replaced = false;
    for (const auto& k : set) replaced = replaced || std::strncmp(*e, k.c_str(), k.find('=') + 1) == 0;
    if (!replaced) envp.push_back(*e);
  }
  for (auto& k : knobs) envp.push_back(k.data());
  envp.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  if (const int err = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()); err != 0) {
    std::printf("parity: could not start the rerun with %s (%s)\n", joined(set).c_str(),
                std::strerror(err));  // returned, not errno
    return 1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int run(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.formats == "any") {
    harness::fix_decode_formats(std::nullopt);
  } else {
    const auto slash = o.formats.find('/');
    const auto parse = [&](const std::string& n, bool cache) {
      if (const auto f = format_named(n); f && (cache || !is_fp8(*f))) return *f;
      throw InvalidArgument("lockstep parity", "--formats", o.formats,
                            "ACTIVATIONS/CACHE (float, half or bfloat16 / float, half, bfloat16, fp8_e4m3 or "
                            "fp8_e5m2), or any");
    };
    if (slash == std::string::npos) parse("", false);
    harness::fix_decode_formats(std::pair{parse(o.formats.substr(0, slash), false), parse(o.formats.substr(slash + 1), true)});
  }
  const bool child = !o.label.empty();
  std::vector<std::shared_ptr<Device>> others;
  try {
    if (o.device == "all") {
      for (const auto& b : devices())
        if (b.usable && b.kind != DeviceKind::kCpu)
          for (const auto& d : b.devices) others.push_back(open(d.id));
    } else {
      // Opened whatever its kind, so that a CPU id the library refuses (cpu:99) is an error here
      // too; the CPU device itself is the reference, not another device to compare.
      auto d = open(o.device);
      if (d->id().kind != DeviceKind::kCpu) others.push_back(d);
    }
  } catch (const Error& e) {
    if (!child) throw;
    std::printf("parity, %s: %s\n", o.label.c_str(), e.what());  // the parent holds the device
    return kChildNoDevice;
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
  std::printf("\n| kernel | cases: random + large | same bytes as %s: cases per device | float64 oracle: check | worst error | result |\n",
              cpu->id().str().c_str());
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  std::map<std::string, std::uint64_t> digests;  // CPU bytes of every case, per entry
  std::vector<std::string> decode_names;
  for (const auto& k : harness::kernel_entries()) {
    if (!only.empty() && std::find(only.begin(), only.end(), k.name) == only.end()) continue;
    if (k.decode) decode_names.push_back(k.name);
    // Each entry draws from its own generator, so that a subset of entries (a knob rerun)
    // draws the same cases.
    std::mt19937_64 rng(o.seed ^ fnv1a(k.name.data(), k.name.size()));
    double max_ulp = 0, max_ratio = 0;
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
    // Each other device: the cases with the reference's bytes; a kernel that is not bitwise by
    // design (tensor cores), the cases within the bound and the distance to the reference.
    std::string ident;
    if (others.empty()) ident = "none here (no GPU, no other SIMD variant)";
    std::size_t device_fail = 0;
    for (std::size_t d = 0; d < others.size(); ++d) {
      ident += (d ? ", " : "") + device_label(*others[d]) + ": " + std::to_string(identical[d]) + "/" +
               std::to_string(total);
      if (!bitwise) {
        char buf[160];
        if (tc_dist[d].num == 0 && tc_dist[d].max_ulp == 0)
          std::snprintf(buf, sizeof buf, " within the bound (tensor cores: not bitwise by design; here the bytes matched)");
        else
          std::snprintf(buf, sizeof buf, " within the bound (tensor cores: not bitwise by design; NMSE %.2g)",
                        tc_dist[d].nmse());
        ident += buf;
      }
      device_fail += std::size_t(total) - identical[d];
      ok = ok && identical[d] == std::size_t(total);
    }
    ok = ok && bound_fail == 0 && unwritten_fail == 0;
    harness::OracleReport worst;
    worst.max_ulp = max_ulp;
    worst.max_bound_ratio = max_ratio;
    std::string check, error;
    char buf[64];
    switch (check_of(k.name, worst)) {
      case Check::kExact:
        check = "exact bytes", error = "-";
        break;
      case Check::kUlps:
        std::snprintf(buf, sizeof buf, "%.2f ulp", max_ulp);
        check = "ulps", error = buf;
        break;
      case Check::kBound:
        std::snprintf(buf, sizeof buf, "%.3g%% of the bound", 100 * max_ratio);
        check = "documented bound", error = buf;
        break;
    }
    std::string result = "ok";
    if (bound_fail || unwritten_fail || device_fail) {
      result = "FAIL:";
      if (bound_fail) result += " " + std::to_string(bound_fail) + " outside the bound";
      if (unwritten_fail) result += " " + std::to_string(unwritten_fail) + " with unwritten outputs";
      if (device_fail) result += " " + std::to_string(device_fail) + " unlike the reference";
    }
    const std::string name = child ? k.name + " [" + o.label + "]" : k.name;
    std::printf("| %s | %d + %zu | %s | %s | %s | %s |\n", name.c_str(), o.cases, k.fixed.size(), ident.c_str(),
                check.c_str(), error.c_str(), result.c_str());
    if (!first_problem.empty()) std::printf("  first problem: %s\n", first_problem.c_str());
    if (const auto it = expected.find(k.name); it != expected.end()) {
      const bool same = it->second == digest;
      std::printf("  CPU bytes equal to the default schedule's: %s\n", same ? "yes" : "NO");
      ok = ok && same;
    }
  }
  if (!child)
    std::printf("\nsame bytes: the cases whose every output has the reference's bytes (tensor-core kernels: "
                "the cases within the documented bound). check: the oracle's exact bytes, a bound in float ulps "
                "(worst error: the largest distance), or the documented error bound of docs/numerics.md (worst "
                "error: the largest |error| as a %% of the bound).\n");
  if (!child) {
    // The CPU's bytes per kernel, for comparing two builds or versions: equal digests at the
    // same --cases and --seed mean every case gave the same bytes.
    std::printf("\nCPU bytes per kernel (FNV-1a over every case's outputs; compare across builds at the same "
                "--cases and --seed):\n");
    for (const auto& [name, d] : digests)
      std::printf("  %-36s %016llx\n", name.c_str(), static_cast<unsigned long long>(d));
  }
  if (!child && !decode_names.empty()) {
    for (const auto& set : schedule_sets(o.knob_reruns)) {
      const int rc = rerun_with(o, set, decode_names, digests);
      if (rc == kChildNoDevice) {
        std::printf("\nparity: the rerun with %s was skipped: its process could not open %s (a GPU in an "
                    "exclusive compute mode?); rerun with those variables set instead\n",
                    joined(set).c_str(), o.device.c_str());
      } else {
        ok = ok && rc == 0;
      }
    }
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s%s (%.1f s)\n", child ? ("parity, " + o.label + ": ").c_str() : "parity: ",
              ok ? "every case passed" : "MISMATCH (see above)", sec);
  return ok ? 0 : 1;
}

}  // namespace lockstep::parity
