// The lockstep command-line tool: devices, demo, parity, mathacc.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>

#include "demo.hpp"
#include "mathacc.hpp"
#include "parity.hpp"
#include "lockstep/lockstep.hpp"
#include "lockstep/version.hpp"

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
      // "id", "name" and every DeviceCaps field under its C++ name (printed in key order).
      for (const auto& d : b.devices)
        bj["devices"].push_back({{"id", d.id.str()},
                                 {"name", d.name},
                                 {"multiprocessors", d.caps.multiprocessors},
                                 {"max_threads_per_block", d.caps.max_threads_per_block},
                                 {"warp_size", d.caps.warp_size},
                                 {"max_shared_bytes_per_block", d.caps.max_shared_bytes_per_block},
                                 {"total_memory", d.caps.total_memory},
                                 {"tensor_cores", d.caps.tensor_cores},
                                 {"bit_faithful", d.caps.bit_faithful},
                                 {"simd_target", d.caps.simd_target},
                                 {"compute_capability", d.caps.compute_capability},
                                 {"l2_bytes", d.caps.l2_bytes},
                                 {"simulated", d.caps.simulated},
                                 {"warpgroup_mma", d.caps.warpgroup_mma}});
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
  // What auto resolves to, and whether that device can be opened (LOCKSTEP_DEVICE may name one
  // that cannot: then say why, rather than list it as if it could).
  const DeviceId a = resolve_auto();
  const char* env = std::getenv("LOCKSTEP_DEVICE");
  const bool from_env = env != nullptr && *env != '\0' && std::string_view(env) != "auto";
  std::string problem;
  try {
    (void)open(a);
  } catch (const Error& e) {
    problem = e.what();
  }
  std::printf("auto -> %s (%s)%s%s\n", a.str().c_str(),
              from_env ? "from LOCKSTEP_DEVICE" : "LOCKSTEP_DEVICE is not set; setting it overrides this",
              problem.empty() ? "" : ", which cannot be opened: ", problem.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every line as it is printed, also into a pipe or a file (progress of the long commands).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // A 64-bit unsigned seed written in decimal digits: CLI11 reads it with strtoull, which takes
  // "-1" as 2^64 - 1 and saturates an overflow, so that different seeds would run the same case.
  const CLI::Validator seed_digits(
      [](std::string& text) -> std::string {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size())
          return "Value " + text + " is not a seed: decimal digits, at most 18446744073709551615";
        return {};
      },
      "UINT64");
  // Counts are written in decimal digits: CLI11's Range alone said "Value abc not in range 1 to
  // 4096", and read "0x2" as hexadecimal.
  const CLI::Validator whole_number(
      [](std::string& text) -> std::string {
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || text[0] == '-' || ec != std::errc() || end != text.data() + text.size())
          return "Value " + text + " is not a count: decimal digits only";
        return {};
      },
      "UINT");
  CLI::App app{"lockstep: bit-faithful attention kernels on CUDA and a simulated CPU device"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lockstep " LOCKSTEP_VERSION_STRING, "print the version and exit");

  bool json = false;
  auto* dev_cmd = app.add_subcommand("devices", "list backends and devices");
  dev_cmd->add_flag("--json", json, "machine-readable output");

  std::string demo_device = "auto";
  demo::Options demo_opts;
  auto* demo_cmd = app.add_subcommand("demo", "run the main job on a device and check it against the CPU");
  demo_cmd->add_option("--device", demo_device, "cpu, cpu:N, cuda, cuda:N or auto")->capture_default_str();
  // Ranges with readable messages ("Value 0 not in range 1 to 4096"); defaults shown in --help.
  demo_cmd->add_option("--layers", demo_opts.layers, "transformer layers")->check(whole_number)->check(CLI::Range(1, 4096))->capture_default_str();
  demo_cmd->add_option("--slots", demo_opts.slots, "sequences decoded together")->check(whole_number)->check(CLI::Range(1, 4096))->capture_default_str();
  demo_cmd->add_option("--steps", demo_opts.steps, "decode steps")->check(whole_number)->check(CLI::Range(1, 100000))->capture_default_str();
  demo_cmd->add_option("--seed", demo_opts.seed, "random weights and inputs")->check(seed_digits)->capture_default_str();
  demo_cmd->add_option("--activations", demo_opts.activations, "attention's q, k, v and output: float, half, bfloat16")
      ->check(CLI::IsMember({"float", "half", "bfloat16"}))->capture_default_str();
  demo_cmd->add_option("--cache", demo_opts.cache, "the KV cache: float, half, bfloat16, fp8_e4m3, fp8_e5m2")
      ->check(CLI::IsMember({"float", "half", "bfloat16", "fp8_e4m3", "fp8_e5m2"}))->capture_default_str();
  demo_cmd->add_option("--inject-fault", demo_opts.inject_fault)  // a self-test of the checks (demo.hpp)
      ->check(CLI::IsMember({"hidden", "rollback"}))
      ->group("");

  parity::Options par;
  auto* par_cmd = app.add_subcommand("parity", "every kernel on random shapes (and fixed large ones) on every device, compared bitwise with the CPU and with a float64 oracle");
  par_cmd->add_option("--device", par.device, "device to compare with the CPU (all: every usable GPU)")->capture_default_str();
  par_cmd->add_option("--cases", par.cases, "random cases per kernel")->check(whole_number)->check(CLI::Range(1, 1000000))->capture_default_str();
  par_cmd->add_option("--seed", par.seed, "random seed")->check(seed_digits)->capture_default_str();
  par_cmd->add_option("--knob-reruns", par.knob_reruns,
                      "the decode entries again in child processes: one-grid (the Tuning decode.one_grid=1) or "
                      "all (every decode schedule set), each giving the same CPU bytes")
      ->check(CLI::IsMember({"one-grid", "all"}))
      ->capture_default_str();
  // A knob rerun's (a child process of parity; apps/parity.cpp).
  par_cmd->add_option("--formats", par.formats,
                      "flash_decoding_formats' pair ACTIVATIONS/CACHE (e.g. half/fp8_e5m2), or any: drawn per case")
      ->capture_default_str();
  par_cmd->add_option("--only", par.only)->group("");
  par_cmd->add_option("--expect-digests", par.expect_digests)->group("");
  par_cmd->add_option("--label", par.label)->group("");

  std::string acc_device = "cpu";
  std::uint64_t stride = mathacc::kDefaultStride;
  bool every_float = false;
  auto* acc_cmd = app.add_subcommand("mathacc", "accuracy of the strict math library over float bit patterns");
  acc_cmd->add_option("--device", acc_device, "device evaluating the functions")->capture_default_str();
  auto* stride_opt = acc_cmd->add_option("--stride", stride, "every stride-th bit pattern (the default: a sample of a few seconds per function)")->check(whole_number)->check(CLI::Range(1, 1 << 30))->capture_default_str();
  acc_cmd->add_flag("--all", every_float, "every one of the 2^32 bit patterns (--stride 1; about 17 minutes on 2 CPU cores)")->excludes(stride_opt);

  // What the first word is not: a command is required, and the only options before it are --help
  // and --version (CLI11 said only "A subcommand is required" for all three).
  const char* commands = "devices, demo, parity, mathacc";
  if (argc < 2) {
    std::fprintf(stderr, "lockstep: a command is required (commands: %s; see lockstep --help)\n", commands);
    return 2;
  }
  if (const std::string_view first = argv[1]; first != "-h" && first != "--help" && first != "--version") {
    bool known = false;
    for (const auto* c : app.get_subcommands([](CLI::App*) { return true; })) known = known || c->check_name(argv[1]);
    if (!known) {
      std::fprintf(stderr, "lockstep: unknown %s \"%s\" (commands: %s; see lockstep --help)\n",
                   first[0] == '-' ? "option" : "command", argv[1], commands);
      return 2;
    }
  }
  // Usage errors: one line naming what is wrong, and exit status 2 (CLI11's own are 105-114 and
  // add a second line); --help and --version print to stdout and exit 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string where = "lockstep";
    for (const auto* c : app.get_subcommands()) where += " " + c->get_name();
    std::fprintf(stderr, "lockstep: %s (see %s --help)\n", e.what(), where.c_str());
    return 2;
  }
  try {
    if (*dev_cmd) return cmd_devices(json);
    if (*demo_cmd) return demo::run(demo_device, demo_opts);
    if (*par_cmd) return parity::run(par);
    if (*acc_cmd) return mathacc::run(acc_device, every_float ? 1 : stride);
  } catch (const Error& e) {
    std::fflush(stdout);  // what the command printed first, then the error
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // e.g. std::bad_alloc building a large demo model on the host
    std::fflush(stdout);
    std::fprintf(stderr, "lockstep: %s\n", e.what());
    return 2;
  }
  return 0;
}
