// The lockstep command-line tool: devices, demo, parity.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>

#include "demo.hpp"
#include "mathacc.hpp"
#include "harness/harness.hpp"
#include "lockstep/lockstep.hpp"

using namespace lockstep;

namespace {

std::string human_bytes(std::uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(b) / double(1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1ull << 20));
  return buf;
}

int cmd_devices(bool json) {
  const auto list = devices();
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& b : list) {
      nlohmann::json bj = {{"backend", std::string(to_string(b.kind))},
                           {"built", b.built},
                           {"usable", b.usable},
                           {"reason", b.reason},
                           {"devices", nlohmann::json::array()}};
      for (const auto& d : b.devices)
        bj["devices"].push_back({{"id", d.id.str()},
                                 {"name", d.name},
                                 {"memory_bytes", d.caps.total_memory},
                                 {"multiprocessors", d.caps.multiprocessors},
                                 {"max_threads_per_block", d.caps.max_threads_per_block},
                                 {"max_shared_bytes_per_block", d.caps.max_shared_bytes_per_block},
                                 {"tensor_cores", d.caps.tensor_cores},
                                 {"bit_faithful", d.caps.bit_faithful},
                                 {"simd_target", d.caps.simd_target},
                                 {"compute_capability", d.caps.compute_capability}});
      j.push_back(bj);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-8s %-10s %-10s %s\n", "device", "memory", "units", "name / status");
  for (const auto& b : list) {
    if (!b.usable) {
      std::printf("%-8s %-10s %-10s unavailable: %s\n", std::string(to_string(b.kind)).c_str(), "-",
                  "-", b.reason.c_str());
      continue;
    }
    for (const auto& d : b.devices) {
      std::string caps;
      if (d.caps.tensor_cores) caps += ", tensor cores";
      if (d.caps.bit_faithful) caps += ", bit-faithful SIMT kernels";
      std::printf("%-8s %-10s %-10d %s%s\n", d.id.str().c_str(),
                  human_bytes(d.caps.total_memory).c_str(), d.caps.multiprocessors, d.name.c_str(),
                  caps.c_str());
    }
  }
  std::printf("auto -> %s (LOCKSTEP_DEVICE overrides)\n", resolve_auto().str().c_str());
  return 0;
}

int cmd_parity(const std::string& device, int cases, std::uint64_t seed) {
  std::vector<std::shared_ptr<Device>> others;
  if (device == "all") {
    for (const auto& b : devices())
      if (b.usable && b.kind != DeviceKind::kCpu)
        for (const auto& d : b.devices) others.push_back(open(d.id));
  } else if (DeviceSpec::parse(device).is_auto || DeviceSpec::parse(device).id.kind != DeviceKind::kCpu) {
    auto d = open(device);
    if (d->id().kind != DeviceKind::kCpu) others.push_back(d);
  }
  auto cpu = open("cpu");
  std::printf("parity: %d random cases per kernel, seed %llu; reference device %s (%s)\n", cases,
              static_cast<unsigned long long>(seed), cpu->id().str().c_str(), cpu->caps().simd_target.c_str());
  std::printf("\n| kernel | cases | byte-identical to CPU | max ulp vs float64 | max rel err vs float64 | max error / documented bound | oracle check |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  std::mt19937_64 rng(seed);
  for (const auto& k : harness::kernel_entries()) {
    double max_ulp = 0, max_rel = 0, max_ratio = 0;
    harness::Distance tc_dist;
    bool bitwise = true;
    std::size_t bound_fail = 0, unwritten_fail = 0;
    std::vector<std::size_t> identical(others.size(), 0);
    std::string first_problem;
    for (int i = 0; i < cases; ++i) {
      auto c = k.random_case(rng);
      const auto r = c->run(cpu);
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
          tc_dist.add(g, r);
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
    std::string ident;
    if (others.empty()) ident = "n/a (no GPU)";
    for (std::size_t d = 0; d < others.size(); ++d) {
      if (bitwise) {
        ident += (d ? ", " : "") + others[d]->id().str() + " " + std::to_string(identical[d]) + "/" +
                 std::to_string(cases);
      } else {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s not bitwise by design: %zu/%d within bound, max %.0f ulp, NMSE %.2g",
                      others[d]->id().str().c_str(), identical[d], cases, tc_dist.max_ulp,
                      tc_dist.nmse());
        ident += (d ? ", " : "") + std::string(buf);
      }
      ok = ok && identical[d] == std::size_t(cases);
    }
    ok = ok && bound_fail == 0 && unwritten_fail == 0;
    std::printf("| %s | %d | %s | %.2f | %.3g | %.3g | %s |\n", k.name.c_str(), cases, ident.c_str(),
                max_ulp, max_rel, max_ratio,
                (bound_fail || unwritten_fail)
                    ? ("FAIL (" + std::to_string(bound_fail + unwritten_fail) + ")").c_str()
                    : "ok");
    if (!first_problem.empty()) std::printf("  first problem: %s\n", first_problem.c_str());
  }
  std::printf("\n%s\n", ok ? "parity: every case passed" : "parity: MISMATCH (see above)");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lockstep: bit-faithful attention kernels on CUDA and a simulated CPU device"};
  app.require_subcommand(1);

  bool json = false;
  auto* dev_cmd = app.add_subcommand("devices", "list backends and devices");
  dev_cmd->add_flag("--json", json, "machine-readable output");

  std::string demo_device = "auto";
  demo::Options demo_opts;
  auto* demo_cmd = app.add_subcommand("demo", "run the main job on a device and check it against the CPU");
  demo_cmd->add_option("--device", demo_device, "cpu, cpu:N, cuda, cuda:N or auto");
  demo_cmd->add_option("--layers", demo_opts.layers, "transformer layers");
  demo_cmd->add_option("--slots", demo_opts.slots, "sequences decoded together");
  demo_cmd->add_option("--steps", demo_opts.steps, "decode steps");
  demo_cmd->add_option("--seed", demo_opts.seed, "random weights and inputs");

  std::string parity_device = "all";
  int cases = 20;
  std::uint64_t seed = 1;
  auto* par_cmd = app.add_subcommand("parity", "every kernel on random shapes on every device, compared bitwise with the CPU and with a float64 oracle");
  par_cmd->add_option("--device", parity_device, "device to compare with the CPU (all: every usable GPU)");
  par_cmd->add_option("--cases", cases, "random cases per kernel")->check(CLI::PositiveNumber);
  par_cmd->add_option("--seed", seed, "random seed");

  std::string acc_device = "cpu";
  std::uint64_t stride = 1;
  auto* acc_cmd = app.add_subcommand("mathacc", "accuracy of the strict math library over float bit patterns");
  acc_cmd->add_option("--device", acc_device, "device evaluating the functions");
  acc_cmd->add_option("--stride", stride, "every stride-th bit pattern (1: all 2^32)")->check(CLI::PositiveNumber);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*dev_cmd) return cmd_devices(json);
    if (*demo_cmd) return demo::run(demo_device, demo_opts);
    if (*par_cmd) return cmd_parity(parity_device, cases, seed);
    if (*acc_cmd) return mathacc::run(acc_device, stride);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
