#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "lockstep/attention/ops.hpp"
#include "lockstep/kernels/launch.hpp"
#include "lockstep/kernels/math_eval.hpp"

namespace lockstep::harness {

// --- utilities ----------------------------------------------------------------------------------

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::int64_t draw_size(std::mt19937_64& rng, std::int64_t max) {
  std::uniform_int_distribution<int> pick(0, 2);
  if (pick(rng) == 0) {
    std::vector<std::int64_t> edges;
    for (auto e : kEdgeSizes)
      if (e <= max) edges.push_back(e);
    return edges[std::uniform_int_distribution<std::size_t>(0, edges.size() - 1)(rng)];
  }
  return std::uniform_int_distribution<std::int64_t>(1, max)(rng);
}

std::int64_t draw_head_dim(std::mt19937_64& rng) {
  static const std::int64_t dims[] = {32, 64, 96, 128, 256};
  return dims[std::uniform_int_distribution<int>(0, 4)(rng)];
}

Compare compare_bits(const Run& a, const Run& b) {
  Compare c;
  if (a.out.size() != b.out.size()) {
    c.mismatches = std::max(a.out.size(), b.out.size());
    c.first = "different sizes " + std::to_string(a.out.size()) + " vs " + std::to_string(b.out.size());
    return c;
  }
  for (std::size_t i = 0; i < a.out.size(); ++i) {
    const float x = a.out[i], y = b.out[i];
    if ((x != x && y != y) || float_bits(x) == float_bits(y)) continue;
    if (c.mismatches++ == 0) {
      std::ostringstream os;
      os << "element " << i << ": " << x << " (0x" << std::hex << float_bits(x) << ") vs " << y
         << " (0x" << float_bits(y) << ")";
      c.first = os.str();
    }
  }
  return c;
}

void Distance::add(const Run& got, const Run& ref) {
  for (std::size_t i = 0; i < ref.out.size() && i < got.out.size(); ++i) {
    if (!std::isfinite(ref.out[i]) || !std::isfinite(got.out[i])) continue;
    const double e = double(got.out[i]) - double(ref.out[i]);
    num += e * e;
    den += double(ref.out[i]) * double(ref.out[i]);
    max_ulp = std::max(max_ulp, ulp_distance(got.out[i], ref.out[i]));
  }
}

double ulp_distance(float got, double ref) {
  if (std::isnan(ref) || std::isnan(got)) return (std::isnan(ref) && std::isnan(got)) ? 0 : INFINITY;
  if (std::isinf(static_cast<float>(ref)) || std::isinf(got))  // overflow of the float format
    return (got == static_cast<float>(ref)) ? 0 : INFINITY;
  const double a = std::fabs(ref);
  // ulp of the float format at |ref| (subnormal spacing below 2^-126; FLT_MAX's ulp above it).
  double ulp;
  if (a < 0x1p-126)
    ulp = 0x1p-149;
  else
    ulp = std::ldexp(1.0, std::min(std::ilogb(a), 127) - 23);
  return std::fabs(double(got) - ref) / ulp;
}

std::vector<float> uniform(std::uint64_t seed, std::size_t n, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void poison(Stream& s, Buffer<float>& b) {
  float p;
  const std::uint32_t bits = kPoisonPattern;
  std::memcpy(&p, &bits, 4);
  if (!b.empty()) b.fill(s, p);
}

std::size_t count_poison(const std::vector<float>& v) {
  return static_cast<std::size_t>(
      std::count_if(v.begin(), v.end(), [](float x) { return float_bits(x) == kPoisonPattern; }));
}

Run collect(Stream& s, const Buffer<float>& b) {
  Run r;
  r.out = b.to_vector(s);
  r.unwritten = count_poison(r.out);
  return r;
}

void add_violation(OracleReport& rep, const std::string& what) {
  if (rep.violations++ == 0) rep.first_violation = what;
}

void expect_bits(OracleReport& rep, const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& label) {
  if (got.size() != want.size()) {
    add_violation(rep, label + ": " + std::to_string(got.size()) + " elements, expected " +
                           std::to_string(want.size()));
    return;
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    if (float_bits(got[i]) != float_bits(want[i]) && rep.violations++ == 0) {
      std::ostringstream os;
      os.precision(9);
      os << label << ": element " << i << " is " << got[i] << " (0x" << std::hex << float_bits(got[i])
         << "), expected " << std::dec << want[i] << " (0x" << std::hex << float_bits(want[i]) << ")";
      rep.first_violation = os.str();
    }
}

namespace {

void note(OracleReport& rep, std::size_t i, float got, double ref, double bound_abs) {
  if (rep.violations++ == 0) {
    std::ostringstream os;
    os.precision(9);
    os << "element " << i << ": got " << got << ", float64 reference " << ref
       << ", allowed |error| <= " << bound_abs;
    rep.first_violation = os.str();
  }
}

// Records one element: ulp and relative error, and whether |got - ref| <= bound.
void account(OracleReport& rep, std::size_t i, float got, double ref, double bound_abs) {
  const double u = ulp_distance(got, ref);
  if (std::isfinite(u)) rep.max_ulp = std::max(rep.max_ulp, u);
  if (std::fabs(ref) > 1e-30 && std::isfinite(ref))
    rep.max_rel = std::max(rep.max_rel, std::fabs(double(got) - ref) / std::fabs(ref));
  if (bound_abs > 0 && std::isfinite(ref))
    rep.max_bound_ratio = std::max(rep.max_bound_ratio, std::fabs(double(got) - ref) / bound_abs);
  const bool nan_ok = std::isnan(ref) && std::isnan(got);
  const bool inf_ok = std::isinf(ref) && double(got) == ref;
  if (nan_ok || inf_ok) return;
  if (!(std::fabs(double(got) - ref) <= bound_abs)) note(rep, i, got, ref, bound_abs);
}

// --- softmax --------------------------------------------------------------------------------------
class SoftmaxCase final : public Case {
 public:
  explicit SoftmaxCase(const SoftmaxShape& s) : s_(s) {
    in_ = uniform(s.seed, std::size_t(s.rows * s.n), -s.range, s.range);
    if (s.special == 1) std::fill_n(in_.begin() + special_row() * s.n, s.n, -INFINITY);
    if (s.special == 2) in_[special_row() * s.n + s.n / 2] = NAN;
  }
  std::string describe() const override {
    return "softmax rows=" + std::to_string(s_.rows) + " n=" + std::to_string(s_.n) +
           " range=" + std::to_string(s_.range) + " special=" + std::to_string(s_.special);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> in(dev, in_.size()), out(dev, in_.size());
    in.copy_from_host(st, in_);
    poison(st, out);
    ops::softmax_rows(st, in, out, s_.rows, s_.n);
    return collect(st, out);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::size_t n = std::size_t(s_.n);
    const double lanes = std::ceil(double(n) / 32.0);
    for (std::int64_t row = 0; row < s_.rows; ++row) {
      const float* x = in_.data() + row * n;
      const float* y = r.out.data() + row * n;
      bool has_nan = false;
      double m = -INFINITY;
      for (std::size_t j = 0; j < n; ++j) {
        if (std::isnan(x[j])) has_nan = true;
        m = std::max(m, double(x[j]));
      }
      if (has_nan) {
        for (std::size_t j = 0; j < n; ++j)
          if (!std::isnan(y[j])) note(rep, row * n + j, y[j], NAN, 0);
        continue;
      }
      if (m == -INFINITY) {
        for (std::size_t j = 0; j < n; ++j)
          if (float_bits(y[j]) != 0) note(rep, row * n + j, y[j], 0.0, 0);
        continue;
      }
      double sum = 0, spread = 0;
      for (std::size_t j = 0; j < n; ++j) {
        sum += std::exp(double(x[j]) - m);
        spread = std::max(spread, m - double(x[j]));
      }
      for (std::size_t j = 0; j < n; ++j) {
        const double ref = std::exp(double(x[j]) - m) / sum;
        // Note [softmax bound] (docs/numerics.md).
        const double rel = (m - double(x[j]) + spread + lanes + 12) * 0x1p-24;
        account(rep, row * n + j, y[j], ref, ref * rel + 0x1p-146);
      }
    }
    return rep;
  }

 private:
  std::int64_t special_row() const { return s_.rows / 2; }
  SoftmaxShape s_;
  std::vector<float> in_;
};

// --- scale ----------------------------------------------------------------------------------------
class ScaleCase final : public Case {
 public:
  explicit ScaleCase(const ScaleShape& s) : s_(s), in_(uniform(s.seed, std::size_t(s.n), -1e3f, 1e3f)) {}
  std::string describe() const override {
    return "scale n=" + std::to_string(s_.n) + " scale=" + std::to_string(s_.scale);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> in(dev, in_.size()), out(dev, in_.size());
    in.copy_from_host(st, in_);
    poison(st, out);
    ops::scale(st, in, out, s_.scale);
    return collect(st, out);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    // One rounding of the exact product: the float64 product rounded to float, bit for bit.
    for (std::size_t i = 0; i < in_.size(); ++i) {
      const float e = static_cast<float>(double(in_[i]) * double(s_.scale));
      account(rep, i, r.out[i], double(in_[i]) * double(s_.scale), 1.0);
      if (float_bits(r.out[i]) != float_bits(e)) note(rep, i, r.out[i], e, 0);
    }
    return rep;
  }

 private:
  ScaleShape s_;
  std::vector<float> in_;
};

// --- convert --------------------------------------------------------------------------------------
class ConvertCase final : public Case {
 public:
  explicit ConvertCase(const ConvertShape& s) : s_(s) {
    std::mt19937_64 g(s.seed);
    const std::uint32_t codes = s.format < 2 ? 65536u : 256u;
    for (std::int64_t i = 0; i < s.n; ++i) {
      if (!s.to_format) {  // codes: each once while they last, then random ones
        in_.push_back(float_of(std::uint32_t(i) < codes ? std::uint32_t(i) : std::uint32_t(g() % codes)));
        continue;
      }
      const std::uint32_t kind = std::uint32_t(g() % 3);
      if (kind == 0) {
        in_.push_back(float_of(std::uint32_t(g())));  // any bit pattern: NaNs, infinities, subnormals
      } else {  // the format's range, and the midpoint of two neighbouring codes
        const std::uint32_t c = std::uint32_t(g() % (codes / 2 - 1));
        const float a = widen(c), b = widen(c + 1);
        in_.push_back((kind == 1 ? a + (b - a) * float(g() % 1000) / 1000.0f : 0.5f * (a + b)) * (g() % 2 ? -1.0f : 1.0f));
      }
    }
  }
  std::string describe() const override {
    static const char* const names[] = {"half", "bfloat16", "fp8_e4m3", "fp8_e5m2"};
    return std::string("convert ") + (s_.to_format ? "float -> " : "") + names[s_.format] +
           (s_.to_format ? "" : " -> float") + " n=" + std::to_string(s_.n);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    switch (s_.format) {
      case 0: return run_as<half>(dev);
      case 1: return run_as<bfloat16>(dev);
      case 2: return run_as<fp8_e4m3>(dev);
      default: return run_as<fp8_e5m2>(dev);
    }
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    for (std::size_t i = 0; i < in_.size(); ++i) {
      const float want = s_.to_format ? float_of(narrow(in_[i])) : widen(float_bits(in_[i]));
      if (float_bits(r.out[i]) != float_bits(want)) note(rep, i, r.out[i], want, 0);
    }
    return rep;
  }

 private:
  static float float_of(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // The format's conversions on the host (lockstep/formats.hpp), the oracle.
  float widen(std::uint32_t code) const {
    switch (s_.format) {
      case 0: return to_float(half{std::uint16_t(code)});
      case 1: return to_float(bfloat16{std::uint16_t(code)});
      case 2: return to_float(fp8_e4m3{std::uint8_t(code)});
      default: return to_float(fp8_e5m2{std::uint8_t(code)});
    }
  }
  std::uint32_t narrow(float x) const {
    switch (s_.format) {
      case 0: return to_half(x).bits;
      case 1: return to_bfloat16(x).bits;
      case 2: return to_fp8_e4m3(x).bits;
      default: return to_fp8_e5m2(x).bits;
    }
  }
  // Codes travel as their bits in the low half of a float's pattern (compared bit for bit).
  template <class S>
  Run run_as(const std::shared_ptr<Device>& dev) const {
    auto& st = dev->default_stream();
    const std::size_t n = in_.size();
    if (s_.to_format) {
      Buffer<float> in(dev, n);
      in.copy_from_host(st, in_);
      Buffer<S> out(dev, n);
      std::vector<S> sentinel(n);
      for (auto& c : sentinel) c.bits = static_cast<decltype(c.bits)>(0x5a5a);
      out.copy_from_host(st, std::span<const S>(sentinel));
      ops::convert(st, in, out);
      const auto codes = out.to_vector(st);
      Run r;
      for (const auto& c : codes) r.out.push_back(float_of(c.bits));
      return r;
    }
    std::vector<S> codes(n);
    for (std::size_t i = 0; i < n; ++i) codes[i].bits = static_cast<decltype(codes[i].bits)>(float_bits(in_[i]));
    Buffer<S> in(dev, n);
    in.copy_from_host(st, std::span<const S>(codes));
    Buffer<float> out(dev, n);
    poison(st, out);
    ops::convert(st, in, out);
    return collect(st, out);
  }
  ConvertShape s_;
  std::vector<float> in_;  // floats, or codes (as float bit patterns) when !to_format
};

// --- layouts --------------------------------------------------------------------------------------
class LayoutCase final : public Case {
 public:
  explicit LayoutCase(const LayoutShape& s) : s_(s) {
    const std::size_t full = std::size_t(s.seq * s.heads * s.dim), one = std::size_t(s.seq * s.dim);
    in_ = uniform(s.seed, s.kind == 3 ? one : full, -1.0f, 1.0f);
    out_size_ = s.kind == 2 ? one : full;
  }
  std::string describe() const override {
    static const char* names[] = {"interleaved_to_batched", "batched_to_interleaved",
                                  "extract_head", "copy_head_back"};
    return std::string(names[s_.kind]) + " seq=" + std::to_string(s_.seq) +
           " heads=" + std::to_string(s_.heads) + " dim=" + std::to_string(s_.dim) +
           " head=" + std::to_string(s_.head);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> in(dev, in_.size()), out(dev, out_size_);
    in.copy_from_host(st, in_);
    poison(st, out);
    switch (s_.kind) {
      case 0: ops::interleaved_to_batched(st, in, out, s_.seq, s_.heads, s_.dim); break;
      case 1: ops::batched_to_interleaved(st, in, out, s_.seq, s_.heads, s_.dim); break;
      case 2: ops::extract_head(st, in, out, s_.seq, s_.heads, s_.dim, s_.head); break;
      default: ops::copy_head_back(st, in, out, s_.seq, s_.heads, s_.dim, s_.head); break;
    }
    return collect(st, out);
  }
  std::size_t expected_unwritten() const override {
    return s_.kind == 3 ? std::size_t(s_.seq * (s_.heads - 1) * s_.dim) : 0;
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::int64_t S = s_.seq, H = s_.heads, D = s_.dim;
    for (std::int64_t t = 0; t < S; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::size_t inter = std::size_t((t * H + h) * D + d);
          const std::size_t batched = std::size_t((h * S + t) * D + d);
          const std::size_t single = std::size_t(t * D + d);
          std::size_t o;
          float expect;
          bool poisoned = false;
          switch (s_.kind) {
            case 0: o = batched, expect = in_[inter]; break;
            case 1: o = inter, expect = in_[batched]; break;
            case 2:
              if (h != s_.head) continue;
              o = single, expect = in_[inter];
              break;
            default:
              o = inter;
              poisoned = h != s_.head;
              expect = poisoned ? 0.0f : in_[single];
              break;
          }
          if (poisoned) {
            if (float_bits(r.out[o]) != kPoisonPattern) note(rep, o, r.out[o], NAN, 0);
          } else if (float_bits(r.out[o]) != float_bits(expect)) {
            note(rep, o, r.out[o], expect, 0);
          }
        }
    return rep;
  }

 private:
  LayoutShape s_;
  std::vector<float> in_;
  std::size_t out_size_;
};

// --- transpose ------------------------------------------------------------------------------------
class TransposeCase final : public Case {
 public:
  explicit TransposeCase(const TransposeShape& s)
      : s_(s), in_(uniform(s.seed, std::size_t(s.batch * s.rows * s.cols), -1.0f, 1.0f)) {}
  std::string describe() const override {
    return "transpose batch=" + std::to_string(s_.batch) + " rows=" + std::to_string(s_.rows) +
           " cols=" + std::to_string(s_.cols);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> in(dev, in_.size()), out(dev, in_.size());
    in.copy_from_host(st, in_);
    poison(st, out);
    ops::transpose(st, in, out, s_.batch, s_.rows, s_.cols);
    return collect(st, out);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::int64_t R = s_.rows, C = s_.cols;
    for (std::int64_t b = 0; b < s_.batch; ++b)
      for (std::int64_t i = 0; i < R; ++i)
        for (std::int64_t j = 0; j < C; ++j) {
          const std::size_t o = std::size_t(b * R * C + j * R + i);
          const float e = in_[std::size_t(b * R * C + i * C + j)];
          if (float_bits(r.out[o]) != float_bits(e)) note(rep, o, r.out[o], e, 0);
        }
    return rep;
  }

 private:
  TransposeShape s_;
  std::vector<float> in_;
};

// --- gemm -----------------------------------------------------------------------------------------
class GemmCase final : public Case {
 public:
  explicit GemmCase(const GemmShape& s)
      : s_(s),
        a_(uniform(s.seed, std::size_t(s.batch * s.m * s.k), -1.0f, 1.0f)),
        b_(uniform(s.seed ^ 0x9e3779b97f4a7c15ull, std::size_t(s.batch * s.k * s.n), -1.0f, 1.0f)) {}
  std::string describe() const override {
    return "gemm batch=" + std::to_string(s_.batch) + " m=" + std::to_string(s_.m) +
           " n=" + std::to_string(s_.n) + " k=" + std::to_string(s_.k);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> a(dev, a_.size()), b(dev, b_.size()), c(dev, std::size_t(s_.batch * s_.m * s_.n));
    a.copy_from_host(st, a_);
    b.copy_from_host(st, b_);
    poison(st, c);
    ops::gemm(st, a, b, c, s_.batch, s_.m, s_.n, s_.k, s_.alpha);
    return collect(st, c);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::int64_t M = s_.m, N = s_.n, K = s_.k;
    for (std::int64_t bt = 0; bt < s_.batch; ++bt)
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          double ref = 0, mag = 0;
          for (std::int64_t l = 0; l < K; ++l) {
            const double p = double(a_[std::size_t((bt * M + i) * K + l)]) *
                             double(b_[std::size_t((bt * K + l) * N + j)]);
            ref += p;
            mag += std::fabs(p);
          }
          ref *= s_.alpha;
          // Note [gemm bound]: one fma chain of length k, then the alpha multiply.
          const double bound = (double(K) + 3) * 0x1p-24 * mag * std::fabs(s_.alpha) + 0x1p-140;
          const std::size_t o = std::size_t((bt * M + i) * N + j);
          account(rep, o, r.out[o], ref, bound);
        }
    return rep;
  }

 private:
  GemmShape s_;
  std::vector<float> a_, b_;
};

// --- strict math ----------------------------------------------------------------------------------
double reference_half(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  double r;
  if (a >= 65520.0)
    r = INFINITY;
  else if (a < 0x1p-14)
    r = std::nearbyint(a * 0x1p24) * 0x1p-24;
  else {
    const double q = std::ldexp(1.0, std::ilogb(a) - 10);
    r = std::nearbyint(a / q) * q;
  }
  return std::copysign(r, x);
}

}  // namespace

double math_reference(int fn, float x) {
  const double d = x;
  switch (static_cast<kernels::MathFn>(fn)) {
    case kernels::MathFn::kExp: return std::exp(d);
    case kernels::MathFn::kExp2: return std::exp2(d);
    case kernels::MathFn::kLog: return std::log(d);
    case kernels::MathFn::kSin: return std::sin(d);
    case kernels::MathFn::kCos: return std::cos(d);
    case kernels::MathFn::kExp2Weight:  // its domain: y <= 127; 0 below -126.5 (math.hpp)
      return (std::isnan(d) || d > 127.0) ? NAN : d < -126.5 ? 0.0 : std::exp2(d);
    case kernels::MathFn::kExp2Tc:  // on [-126, 8] only (the CPU's exp2_weight and CUDA's ex2.approx
      // differ outside: a subnormal or 0 below -126, NaN or a finite value above 127)
      return (std::isnan(d) || d > 127.0) ? NAN : d < -126.0 ? 0.0 : std::exp2(d);
    default: return reference_half(d);
  }
}

namespace {

class MathCase final : public Case {
 public:
  explicit MathCase(const MathShape& s) : s_(s) {
    std::mt19937_64 rng(s.seed);
    in_.resize(std::size_t(s.n));
    std::uniform_real_distribution<double> u(s.lo, s.hi);
    for (auto& x : in_) x = static_cast<float>(u(rng));
    if (static_cast<kernels::MathFn>(s.fn) == kernels::MathFn::kLog) {
      // Positive values across every binade, subnormals included, plus zero and negatives.
      std::uniform_real_distribution<double> e(-149.0, 128.0);
      for (auto& x : in_) x = static_cast<float>(std::exp2(e(rng)));
      if (!in_.empty()) in_[0] = 0.0f;
      if (in_.size() > 1) in_[1] = -1.0f;
    }
    static const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-45f, -1e-45f};
    for (std::size_t i = 0; i < std::size(specials) && 2 * i + 3 < in_.size(); ++i)
      in_[2 * i + 3] = specials[i];
  }
  // kExp2Tc's bits differ between backends by design (never drawn; a guard all the same).
  bool bitwise_across_backends() const override {
    return static_cast<kernels::MathFn>(s_.fn) != kernels::MathFn::kExp2Tc;
  }
  std::string describe() const override {
    return std::string("math ") + math_name(s_.fn) + " n=" + std::to_string(s_.n) +
           " range=[" + std::to_string(s_.lo) + ", " + std::to_string(s_.hi) + "]";
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> in(dev, in_.size()), out(dev, in_.size());
    in.copy_from_host(st, in_);
    poison(st, out);
    using K = kernels::MathEval;
    const auto blocks = static_cast<std::uint32_t>((in_.size() + K::kPerBlock - 1) / K::kPerBlock);
    if (!in_.empty())
      launch<K>(st, Dim3{blocks, 1, 1}, 0,
                K::Params{in.data().get(), out.data().get(), std::int64_t(in_.size()), 0,
                          static_cast<kernels::MathFn>(s_.fn)});
    return collect(st, out);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const double bound = math_ulp_bound(s_.fn);
    for (std::size_t i = 0; i < in_.size(); ++i) {
      const double ref = math_reference(s_.fn, in_[i]);
      const double u = ulp_distance(r.out[i], ref);
      if (std::isfinite(u)) rep.max_ulp = std::max(rep.max_ulp, u);
      if (!(u <= bound)) note(rep, i, r.out[i], ref, bound);
    }
    return rep;
  }

 private:
  MathShape s_;
  std::vector<float> in_;
};

}  // namespace

std::unique_ptr<Case> softmax_case(const SoftmaxShape& s) { return std::make_unique<SoftmaxCase>(s); }
std::unique_ptr<Case> scale_case(const ScaleShape& s) { return std::make_unique<ScaleCase>(s); }
std::unique_ptr<Case> convert_case(const ConvertShape& s) { return std::make_unique<ConvertCase>(s); }
std::unique_ptr<Case> layout_case(const LayoutShape& s) { return std::make_unique<LayoutCase>(s); }
std::unique_ptr<Case> transpose_case(const TransposeShape& s) { return std::make_unique<TransposeCase>(s); }
std::unique_ptr<Case> gemm_case(const GemmShape& s) { return std::make_unique<GemmCase>(s); }
std::unique_ptr<Case> math_case(const MathShape& s) { return std::make_unique<MathCase>(s); }

const char* math_name(int fn) {
  static const char* names[] = {"exp", "exp2", "log", "sin", "cos", "round_to_half", "exp2_weight", "exp2_tc"};
  return (fn >= 0 && fn < 8) ? names[fn] : "?";
}

// Note [math bounds]: the measured worst cases are in docs/numerics.md; these are the bounds the
// properties enforce (exp, exp2, log over their whole domain; sin and cos for |x| <= 1e5).
double math_ulp_bound(int fn) {
  switch (static_cast<kernels::MathFn>(fn)) {
    case kernels::MathFn::kExp:
    case kernels::MathFn::kExp2:
    case kernels::MathFn::kLog: return 1.0;
    case kernels::MathFn::kSin:
    case kernels::MathFn::kCos: return 2.0;
    case kernels::MathFn::kExp2Weight: return 2.5;  // measured 2.04 over every float in [-126, 2]
    // Note [hardware exp2 on the tensor-core path]: the bound the tensor-core softmax's weights are
    // held to on [-126, 8] (DeviceMath.Exp2TcIsWithinItsBoundOnTheWeightsDomain); docs/numerics.md
    // has the measured figure.
    case kernels::MathFn::kExp2Tc: return 3.0;
    default: return 0.5;  // round_to_half is exact rounding: at most half an fp16 ulp, checked exactly
  }
}

std::vector<KernelEntry> attention_entries();
std::vector<KernelEntry> decode_entries();
std::vector<KernelEntry> fused_entries();
std::vector<KernelEntry> cache_entries();

const std::vector<KernelEntry>& kernel_entries() {
  static const std::vector<KernelEntry> entries = [] {
  std::vector<KernelEntry> e = {
      {"softmax_rows",
       [](std::mt19937_64& g) {
         SoftmaxShape s;
         s.rows = draw_size(g, 300);
         s.n = std::uniform_int_distribution<int>(0, 20)(g) == 0 ? 100000 : draw_size(g, 3000);
         if (s.rows * s.n > 2000000) s.rows = std::max<std::int64_t>(1, 2000000 / s.n);
         static const float ranges[] = {1.0f, 8.0f, 80.0f};
         s.range = ranges[std::uniform_int_distribution<int>(0, 2)(g)];
         s.special = std::uniform_int_distribution<int>(0, 5)(g) % 3 == 0
                         ? std::uniform_int_distribution<int>(1, 2)(g)
                         : 0;
         s.seed = g();
         return softmax_case(s);
       }},
      {"scale",
       [](std::mt19937_64& g) {
         ScaleShape s;
         s.n = draw_size(g, 300000);
         s.scale = std::uniform_real_distribution<float>(-4.0f, 4.0f)(g);
         s.seed = g();
         return scale_case(s);
       }},
      {"convert",
       [](std::mt19937_64& g) {
         ConvertShape s;
         s.format = std::uniform_int_distribution<int>(0, 3)(g);
         s.to_format = std::uniform_int_distribution<int>(0, 1)(g) == 0;
         s.n = draw_size(g, 70000);
         s.seed = g();
         return convert_case(s);
       }},
      {"layout",
       [](std::mt19937_64& g) {
         LayoutShape s;
         s.kind = std::uniform_int_distribution<int>(0, 3)(g);
         s.seq = draw_size(g, 1100);
         s.heads = std::uniform_int_distribution<std::int64_t>(1, 12)(g);
         s.dim = std::uniform_int_distribution<int>(0, 1)(g) ? draw_size(g, 160)
                                                             : std::int64_t(32) << std::uniform_int_distribution<int>(0, 3)(g);
         if (s.seq * s.heads * s.dim > 3000000) s.seq = std::max<std::int64_t>(1, 3000000 / (s.heads * s.dim));
         s.head = std::uniform_int_distribution<std::int64_t>(0, s.heads - 1)(g);
         s.seed = g();
         return layout_case(s);
       }},
      {"transpose",
       [](std::mt19937_64& g) {
         TransposeShape s;
         s.batch = std::uniform_int_distribution<std::int64_t>(1, 6)(g);
         s.rows = draw_size(g, 1100);
         s.cols = draw_size(g, 1100);
         if (s.batch * s.rows * s.cols > 3000000) s.batch = 1;
         if (s.rows * s.cols > 3000000) s.rows = std::max<std::int64_t>(1, 3000000 / s.cols);
         s.seed = g();
         return transpose_case(s);
       }},
      {"gemm_f32",
       [](std::mt19937_64& g) {
         GemmShape s;
         s.batch = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.m = draw_size(g, 200);
         s.n = draw_size(g, 200);
         s.k = draw_size(g, 300);
         while (s.batch * s.m * s.n * s.k > 20000000) s.k = std::max<std::int64_t>(1, s.k / 2), s.m = std::max<std::int64_t>(1, s.m / 2);
         s.alpha = std::uniform_int_distribution<int>(0, 1)(g) ? 1.0f : 0.125f;
         s.seed = g();
         return gemm_case(s);
       }},
      {"math",
       [](std::mt19937_64& g) {
         MathShape s;
         s.fn = std::uniform_int_distribution<int>(0, 6)(g);
         s.n = draw_size(g, 50000);
         switch (static_cast<kernels::MathFn>(s.fn)) {
           case kernels::MathFn::kExp: s.lo = -104.0f, s.hi = 89.0f; break;
           case kernels::MathFn::kExp2: s.lo = -152.0f, s.hi = 129.0f; break;
           case kernels::MathFn::kSin:
           case kernels::MathFn::kCos: s.lo = -1e5f, s.hi = 1e5f; break;
           case kernels::MathFn::kRoundHalf: s.lo = -70000.0f, s.hi = 70000.0f; break;
           case kernels::MathFn::kExp2Weight: s.lo = -140.0f, s.hi = 127.0f; break;
           default: break;
         }
         s.seed = g();
         return math_case(s);
       }},
  };
  for (auto& a : attention_entries()) e.push_back(std::move(a));
  for (auto& a : decode_entries()) e.push_back(std::move(a));
  for (auto& a : fused_entries()) e.push_back(std::move(a));
  for (auto& a : cache_entries()) e.push_back(std::move(a));
  return e;
  }();
  return entries;
}

}  // namespace lockstep::harness

namespace lockstep::harness {

namespace {
std::shared_ptr<Device> portable_variant_device() {
  static std::shared_ptr<Device> d = [] {
    CpuDeviceOptions o;
    o.index = 63;
    o.simd = "generic";
    return make_cpu_device(o);
  }();
  return d;
}
bool cuda_usable() { return cuda_unusable_reason().empty(); }
}  // namespace

std::string cuda_unusable_reason() {
  static const std::string why = [] {
    for (const auto& b : devices())
      if (b.kind == DeviceKind::kCuda) return b.usable ? std::string() : b.reason;
    return std::string("no CUDA backend");
  }();
  return why;
}

bool cuda_required() {
  const char* v = std::getenv("LOCKSTEP_TEST_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

Verdict verify(const Case& c, bool with_variant, bool with_cuda) {
  Verdict v;
  const Run cpu = c.run(open("cpu"));
  if (cpu.unwritten != c.expected_unwritten()) {
    v.failure = "CPU left " + std::to_string(cpu.unwritten) + " output elements unwritten (expected " +
                std::to_string(c.expected_unwritten()) + ")";
    return v;
  }
  v.oracle = c.check(cpu);
  if (v.oracle.violations != 0) {
    v.failure = "CPU outside the documented bound in " + std::to_string(v.oracle.violations) +
                " elements; first: " + v.oracle.first_violation;
    return v;
  }
  if (with_variant && open("cpu")->caps().simd_target != portable_variant_device()->caps().simd_target) {
    v.compared_variant = true;
    const Run var = c.run(portable_variant_device());
    if (var.unwritten != c.expected_unwritten()) {
      v.failure = "SIMD variant " + portable_variant_device()->caps().simd_target + " left " +
                  std::to_string(var.unwritten) + " output elements unwritten (expected " +
                  std::to_string(c.expected_unwritten()) + ")";
      return v;
    }
    const Compare cmp = compare_bits(cpu, var);
    if (cmp.mismatches != 0) {
      v.failure = "SIMD variants " + open("cpu")->caps().simd_target + " and " +
                  portable_variant_device()->caps().simd_target + " differ in " +
                  std::to_string(cmp.mismatches) + " elements; first: " + cmp.first;
      return v;
    }
  }
  if (with_cuda && !cuda_usable() && cuda_required()) {
    v.failure = "LOCKSTEP_TEST_REQUIRE_CUDA=1, but CUDA is not usable here: " + cuda_unusable_reason();
    return v;
  }
  if (with_cuda && cuda_usable()) {
    v.compared_cuda = true;
    const Run gpu = c.run(open("cuda:0"));
    if (gpu.unwritten != c.expected_unwritten()) {
      v.failure = "CUDA left " + std::to_string(gpu.unwritten) + " output elements unwritten";
      return v;
    }
    if (!c.bitwise_across_backends()) {
      const OracleReport g = c.check(gpu);
      Distance dist;
      dist.add(gpu, cpu);
      v.cuda_cpu_max_ulp = dist.max_ulp;
      v.cuda_cpu_nmse = dist.nmse();
      if (g.violations != 0)
        v.failure = "CUDA outside the documented bound in " + std::to_string(g.violations) +
                    " elements; first: " + g.first_violation;
      return v;
    }
    const Compare cmp = compare_bits(cpu, gpu);
    if (cmp.mismatches != 0) {
      v.failure = "CUDA and CPU differ in " + std::to_string(cmp.mismatches) +
                  " elements; first: " + cmp.first;
      return v;
    }
  }
  return v;
}

}  // namespace lockstep::harness
