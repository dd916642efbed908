// `lockstep mathacc`: the strict math library's accuracy over float bit patterns (every 97th by
// default, all of them with --all), evaluated on a device by the MathEval kernel and compared with float64 references
// (glibc's exp/exp2/log/sin/cos, correctly rounded in practice at float precision).
#include "mathacc.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness/harness.hpp"
#include "lockstep/kernels/launch.hpp"
#include "lockstep/kernels/math_eval.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::mathacc {

namespace {
using kernels::MathFn;

const char* names[] = {"exp", "exp2", "log", "sin", "cos"};

struct Range {
  const char* label;
  double lo, hi;
};
}  // namespace

int run(const std::string& device, std::uint64_t stride) {
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_report = 0;  // when progress was last printed
  auto dev = open(device);
  auto& s = dev->default_stream();
  const std::int64_t chunk = std::int64_t(1) << 24;
  Buffer<float> out(dev, std::size_t(chunk));
  std::vector<float> host(static_cast<std::size_t>(chunk));
  const std::uint64_t patterns = ((1ull << 32) + stride - 1) / stride;
  if (stride == 1)
    std::printf("strict math accuracy on %s over every float bit pattern (%llu), against float64 references\n",
                dev->id().str().c_str(), (unsigned long long)patterns);
  else
    std::printf("strict math accuracy on %s over one float bit pattern in %llu (%llu patterns; --all: every one), "
                "against float64 references\n",
                dev->id().str().c_str(), (unsigned long long)stride, (unsigned long long)patterns);
  std::printf("| function | domain | samples | max ulp | at x | specials |\n| --- | --- | --- | --- | --- | --- |\n");
  for (int f = 0; f < 5; ++f) {
    const auto fn = static_cast<MathFn>(f);
    std::vector<Range> ranges;
    if (f == 3 || f == 4)
      ranges = {{"|x| <= 2^17", 0, 131072}, {"|x| <= 2^20", 131072, 1048576}, {"|x| <= 2^24", 1048576, 16777216}, {"all finite", 16777216, 3.5e38}};
    else
      ranges = {{"all", 0, 3.5e38}};
    std::vector<double> worst(ranges.size(), 0);
    std::vector<float> worst_x(ranges.size(), 0);
    std::uint64_t special_fail = 0, special_seen = 0;
    std::vector<std::uint64_t> seen(ranges.size(), 0);
    const unsigned T = std::max(1u, std::thread::hardware_concurrency());
    for (std::uint64_t start = 0; start < (1ull << 32); start += std::uint64_t(chunk) * stride) {
      // Progress on stderr (the table on stdout stays a table), at most every 5 seconds.
      if (seconds() - last_report >= 5) {
        last_report = seconds();
        std::fprintf(stderr, "  ... %s: %.0f%% of its patterns (%.0f s)\n", names[f], 100.0 * double(start) / double(1ull << 32),
                     last_report);
      }
      const std::int64_t n = std::min<std::int64_t>(chunk, std::int64_t(((1ull << 32) - start + stride - 1) / stride));
      if (stride == 1) {
        using K = kernels::MathEval;
        launch<K>(s, Dim3{std::uint32_t((n + K::kPerBlock - 1) / K::kPerBlock), 1, 1}, 0,
                  K::Params{nullptr, out.data().get(), n, std::uint32_t(start), fn});
        out.copy_to_host(s, std::span<float>(host.data(), std::size_t(n)));
        s.synchronize();
      } else {
        std::vector<float> in(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          const std::uint32_t b = std::uint32_t(start + std::uint64_t(i) * stride);
          std::memcpy(&in[std::size_t(i)], &b, 4);
        }
        Buffer<float> bin(dev, in.size());
        bin.copy_from_host(s, in);
        using K = kernels::MathEval;
        launch<K>(s, Dim3{std::uint32_t((n + K::kPerBlock - 1) / K::kPerBlock), 1, 1}, 0,
                  K::Params{bin.data().get(), out.data().get(), n, 0, fn});
        out.copy_to_host(s, std::span<float>(host.data(), std::size_t(n)));
        s.synchronize();
      }
      std::vector<std::vector<double>> tw(T, std::vector<double>(ranges.size(), 0));
      std::vector<std::vector<float>> tx(T, std::vector<float>(ranges.size(), 0));
      std::vector<std::uint64_t> tsf(T, 0), tss(T, 0);
      std::vector<std::vector<std::uint64_t>> tseen(T, std::vector<std::uint64_t>(ranges.size(), 0));
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < T; ++t)
        pool.emplace_back([&, t] {
          for (std::int64_t i = t; i < n; i += T) {
            const std::uint32_t b = std::uint32_t(start + std::uint64_t(i) * stride);
            float x;
            std::memcpy(&x, &b, 4);
            const float got = host[std::size_t(i)];
            const double ref = harness::math_reference(f, x);
            if (!std::isfinite(x)) {
              ++tss[t];
              if (!(std::isnan(ref) ? std::isnan(got) : double(got) == ref)) ++tsf[t];
              continue;
            }
            const double ax = std::fabs(double(x));
            for (std::size_t r = 0; r < ranges.size(); ++r)
              if (ax >= ranges[r].lo && ax < ranges[r].hi) {
                ++tseen[t][r];
                const double u = harness::ulp_distance(got, ref);
                if (u > tw[t][r]) tw[t][r] = u, tx[t][r] = x;
              }
          }
        });
      for (auto& th : pool) th.join();
      for (unsigned t = 0; t < T; ++t) {
        special_fail += tsf[t];
        special_seen += tss[t];
        for (std::size_t r = 0; r < ranges.size(); ++r) {
          seen[r] += tseen[t][r];
          if (tw[t][r] > worst[r]) worst[r] = tw[t][r], worst_x[r] = tx[t][r];
        }
      }
    }
    // A range or the specials without a sample say so (a coarse stride can miss them).
    const std::string specials =
        special_seen == 0 ? "inf/NaN not sampled"
                          : (special_fail ? "MISMATCH at inf/NaN" : "inf/NaN exact") + std::string(" (") +
                                std::to_string(special_seen) + ")";
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (seen[r] == 0)
        std::printf("| %s | %s | 0 | - | - | %s |\n", names[f], ranges[r].label, r == 0 ? specials.c_str() : "");
      else
        std::printf("| %s | %s | %llu | %.3f | %.9g | %s |\n", names[f], ranges[r].label,
                    (unsigned long long)seen[r], worst[r], double(worst_x[r]), r == 0 ? specials.c_str() : "");
    }
    last_report = seconds();  // the rows just printed are progress too
  }
  std::printf("\n(%.0f s)\n", seconds());
  return 0;
}

}  // namespace lockstep::mathacc
