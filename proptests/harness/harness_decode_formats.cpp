// Harness case of Flash-Decoding in the formats (Note [decode formats] in
// kernels/decode/params.hpp): q, out and the new tokens in float, half or bfloat16, the cache in
// float, half, bfloat16, fp8 e4m3 or e5m2 (fp8 with a scale per kv head, drawn).

#include <cmath>
#include <sstream>

#include "harness.hpp"
#include "harness_cache.hpp"
#include "harness_decode.hpp"
#include "harness_decode_formats.hpp"
#include "lockstep/attention/decode.hpp"

namespace lockstep::harness {
namespace {

// The code the cache stores for x (scale s, 0 for none), as an integer value (exact in a float).
float code_of(float x, Format f, float s) {
  const float v = s != 0.0f ? x / s : x;
  switch (f) {
    case Format::f16: return float(to_half(v).bits);
    case Format::bf16: return float(to_bfloat16(v).bits);
    case Format::fp8_e4m3: return float(to_fp8_e4m3(v).bits);
    case Format::fp8_e5m2: return float(to_fp8_e5m2(v).bits);
    default: return v;
  }
}
// The value a code (as code_of returns it) stands for, times the scale, in double.
double value_of(float code, Format f, float s) {
  const auto c = static_cast<std::uint32_t>(code);
  double v = 0;
  switch (f) {
    case Format::f16: v = to_float(half{static_cast<std::uint16_t>(c)}); break;
    case Format::bf16: v = to_float(bfloat16{static_cast<std::uint16_t>(c)}); break;
    case Format::fp8_e4m3: v = to_float(fp8_e4m3{static_cast<std::uint8_t>(c)}); break;
    case Format::fp8_e5m2: v = to_float(fp8_e5m2{static_cast<std::uint8_t>(c)}); break;
    default: return code;
  }
  return s != 0.0f ? v * double(s) : v;
}
// x rounded to the activation format a (float, half or bfloat16), as a float.
float act_round(float x, Format a) {
  if (a == Format::f16) return to_float(to_half(x));
  if (a == Format::bf16) return to_float(to_bfloat16(x));
  return x;
}
// Half an ulp of the activation format, relative; and half its smallest subnormal step, the
// rounding error of a value below its normal range.
double act_unit(Format a) { return a == Format::f16 ? 0x1p-11 : a == Format::bf16 ? 0x1p-8 : 0x1p-24; }
double act_tiny(Format a) { return a == Format::f16 ? 0x1p-25 : a == Format::bf16 ? 0x1p-134 : 0x1p-150; }

// A layer's codes as integer values (floats for an f32 cache).
template <class C>
std::vector<float> codes(Stream& st, const Buffer<C>& b) {
  const auto h = b.to_vector(st);
  std::vector<float> r(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    if constexpr (std::is_same_v<C, float>) r[i] = h[i];
    else r[i] = float(h[i].bits);
  }
  return r;
}

class FormatFlashCase final : public Case {
 public:
  explicit FormatFlashCase(const FormatWorldShape& s) : FormatFlashCase(DecodeWorld(s.world), s.act, s.cache) {}
  FormatFlashCase(const DecodeWorld& w, Format act, Format cache) : s_{w.shape, act, cache}, w_(w) {
    const FormatWorldShape& s = s_;
    // The world's q and new tokens as the activation format holds them.
    for (auto* v : {&w_.q, &w_.k_new, &w_.v_new})
      for (auto& x : *v) x = act_round(x, s.act);
    if (is_fp8(s.cache)) {
      std::mt19937_64 g(s.world.seed ^ 0x9e3779b97f4a7c15ull);
      for (std::int64_t h = 0; h < 2 * s.world.kv_heads; ++h)  // 2^-8 .. 2^2, not powers of two
        scales_.push_back(std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(g),
                                     std::uniform_int_distribution<int>(-8, 1)(g)));
    }
    for (std::int64_t m = 0; m < s.world.slots; ++m) {
      const bool d = w_.done[std::size_t(m)];
      n_.push_back(w_.lengths[std::size_t(m)] + (d ? 0 : 1));
      pos_.push_back(d ? -1 : w_.lengths[std::size_t(m)]);
    }
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "flash_decoding q/out " << format_name(s_.act) << ", cache " << format_name(s_.cache) << " "
       << w_.text() << " lengths=[";
    for (std::size_t i = 0; i < w_.lengths.size(); ++i)
      os << (i ? "," : "") << w_.lengths[i] << (w_.done[i] ? "(done)" : "");
    os << "]";
    return os.str();
  }
  float scale(int kv, std::int64_t h) const {
    return scales_.empty() ? 0.0f : scales_[std::size_t(kv * w_.shape.kv_heads + h)];
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    return with_act(s_.act, [&](auto t) { return run_as<decltype(t)>(dev); });
  }
  template <class T>
  Run run_as(const std::shared_ptr<Device>& dev) const {
    switch (s_.cache) {
      case Format::f16: return run_pair<T, half>(dev);
      case Format::bf16: return run_pair<T, bfloat16>(dev);
      case Format::fp8_e4m3: return run_pair<T, fp8_e4m3>(dev);
      case Format::fp8_e5m2: return run_pair<T, fp8_e5m2>(dev);
      default: return run_pair<T, float>(dev);
    }
  }
  template <class T, class C>
  Run run_pair(const std::shared_ptr<Device>& dev) const {
    auto& st = dev->default_stream();
    const auto& sh = w_.shape;
    KvCacheConfig c = w_.config();
    c.num_layers = 1;
    c.format = s_.cache;
    if (!scales_.empty()) {
      c.k_scales.assign(scales_.begin(), scales_.begin() + std::ptrdiff_t(sh.kv_heads));
      c.v_scales.assign(scales_.begin() + std::ptrdiff_t(sh.kv_heads), scales_.end());
    }
    KvCache cache(dev, c);
    const std::size_t per_slot = CacheGeometry{sh.kv_heads, sh.max_len, sh.dim}.slot_elems();
    for (std::int64_t m = 0; m < sh.slots; ++m) {
      cache.write_from_host(st, m, 0, std::span<const float>(w_.k).subspan(std::size_t(m) * per_slot, per_slot),
                            std::span<const float>(w_.v).subspan(std::size_t(m) * per_slot, per_slot), sh.max_len);
      cache.rollback(m, w_.lengths[std::size_t(m)]);
      if (w_.done[std::size_t(m)]) cache.mark_done(m);
    }
    Buffer<T> q(dev, w_.q.size()), kn(dev, w_.k_new.size()), vn(dev, w_.v_new.size()), out(dev, w_.q.size());
    q.copy_from_host(st, encode<T>(w_.q));
    kn.copy_from_host(st, encode<T>(w_.k_new));
    vn.copy_from_host(st, encode<T>(w_.v_new));
    out.copy_from_host(st, encode<T>(std::vector<float>(w_.q.size(), 12345.0f)));  // overwritten
    flash_decoding(st, cache, 0, q, kn, vn, w_.lengths, out, w_.options());
    Run r;
    r.out = widen(out.to_vector(st));
    // The codes below each slot's new length, K then V.
    const CacheGeometry g{sh.kv_heads, sh.max_len, sh.dim};
    for (int kv = 0; kv < 2; ++kv) {
      const auto b = codes(st, kv ? cache.v_as<C>(0) : cache.k_as<C>(0));
      for (std::int64_t m = 0; m < sh.slots; ++m)
        for (std::int64_t h = 0; h < g.Hk; ++h)
          r.out.insert(r.out.end(), b.begin() + std::ptrdiff_t(g.at(m, h, 0)),
                       b.begin() + std::ptrdiff_t(g.at(m, h, 0) + std::size_t(n_[std::size_t(m)] * g.D)));
    }
    return r;
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const auto& sh = w_.shape;
    const std::int64_t H = sh.heads, Hk = sh.kv_heads, L = sh.max_len, D = sh.dim, gq = H / Hk;
    const std::size_t nout = w_.q.size();
    // The codes: each token as the conversion of x / scale.
    std::vector<float> want;
    for (int kv = 0; kv < 2; ++kv) {
      const auto& old = kv ? w_.v : w_.k;
      const auto& fresh = kv ? w_.v_new : w_.k_new;
      for (std::int64_t m = 0; m < sh.slots; ++m)
        for (std::int64_t h = 0; h < Hk; ++h)
          for (std::int64_t t = 0; t < n_[std::size_t(m)]; ++t)
            for (std::int64_t d = 0; d < D; ++d) {
              const float x = t == pos_[std::size_t(m)] ? fresh[std::size_t((m * Hk + h) * D + d)]
                                                        : old[std::size_t(((m * Hk + h) * L + t) * D + d)];
              want.push_back(code_of(x, s_.cache, scale(kv, h)));
            }
    }
    expect_bits(rep, std::vector<float>(r.out.begin() + std::ptrdiff_t(std::min(nout, r.out.size())), r.out.end()),
                want, "the cache's codes below each slot's new length (K then V)");
    if (r.out.size() < nout + want.size()) return rep;
    // The outputs against the float64 oracle on the values the cache holds.
    const double ua = act_unit(s_.act);
    double naive_err = 0, ours_err = 0, ref_max = 0;  // over the whole output
    const std::size_t vbase = nout + want.size() / 2;
    for (std::int64_t m = 0; m < sh.slots; ++m) {
      if (pos_[std::size_t(m)] < 0) {
        for (std::int64_t i = 0; i < H * D; ++i)
          if (float_bits(r.out[std::size_t(m * H * D + i)]) != 0) {
            add_violation(rep, "slot " + std::to_string(m) + " (done): output not zero");
            break;
          }
        continue;
      }
      // Where slot m's codes start in the K block (the V block follows at vbase).
      std::size_t off = nout;
      for (std::int64_t j = 0; j < m; ++j) off += std::size_t(Hk * n_[std::size_t(j)] * D);
      const std::int64_t n = n_[std::size_t(m)];
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t hk = h / gq;
        std::vector<float> kk(std::size_t(n * D)), vv(std::size_t(n * D));
        for (std::int64_t i = 0; i < n * D; ++i) {
          const std::size_t at = off + std::size_t(hk * n * D + i);
          kk[std::size_t(i)] = float(value_of(r.out[at], s_.cache, scale(0, hk)));
          vv[std::size_t(i)] = float(value_of(r.out[at - nout + vbase], s_.cache, scale(1, hk)));
        }
        const std::size_t o = std::size_t((m * H + h) * D);
        const auto ref = attention_reference(w_.q.data() + o, D, kk.data(), vv.data(), D, 1, n, D, false, w_.scale);
        // FlashAttention's rule: no worse than twice a naive reference in the same format
        // (scores, probabilities and output each rounded to it; float sums in order).
        const auto naive = naive_reference(w_.q.data() + o, kk, vv, n, D);
        for (std::int64_t d = 0; d < D; ++d) {
          naive_err = std::max(naive_err, std::fabs(double(naive[std::size_t(d)]) - ref.out[std::size_t(d)]));
          ours_err = std::max(ours_err, std::fabs(double(r.out[o + std::size_t(d)]) - ref.out[std::size_t(d)]));
          ref_max = std::max(ref_max, std::fabs(ref.out[std::size_t(d)]));
        }
        for (std::int64_t d = 0; d < D; ++d) {
          const double rv = ref.out[std::size_t(d)];
          const double b = attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], n, D) * (1 + ua) +
                           ua * std::fabs(rv) + act_tiny(s_.act);
          const float got = r.out[o + std::size_t(d)];
          const double err = std::fabs(double(got) - rv);
          rep.max_ulp = std::max(rep.max_ulp, ulp_distance(got, rv));
          if (std::fabs(rv) > kRelFloor) rep.max_rel = std::max(rep.max_rel, err / std::fabs(rv));
          if (b > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / b);
          if (!(err <= b)) {
            std::ostringstream os;
            os << "slot " << m << " head " << h << " d " << d << ": got " << got << ", reference " << rv
               << ", bound " << b;
            add_violation(rep, os.str());
          }
        }
      }
    }
    // Twice the naive reference's largest error, plus what float arithmetic alone may cost at
    // the output's magnitude. For half and bfloat16 outputs only: with float outputs the naive
    // reference is itself float, and which of two float schedules errs more (scores of 1000 and
    // more, q_scale 300) is luck; the oracle bound above holds those.
    const double allowed = 2 * naive_err + 1e-5 * ref_max + act_tiny(s_.act);
    if (s_.act != Format::f32 && !(ours_err <= allowed)) {
      std::ostringstream os;
      os << "largest error " << ours_err << " against twice the naive " << format_name(s_.act)
         << " reference's " << naive_err << " (allowed " << allowed << ")";
      add_violation(rep, os.str());
    }
    return rep;
  }

  // Attention of one query row over n keys, computed as a naive implementation in the activation
  // format computes it: scores q . k in float (in order) rounded to the format, softmax in float
  // over the rounded scores with its probabilities rounded, then sum p v in float rounded.
  std::vector<float> naive_reference(const float* q, const std::vector<float>& k, const std::vector<float>& v,
                                     std::int64_t n, std::int64_t D) const {
    const float sc = w_.scale != 0.0f ? w_.scale : 1.0f / std::sqrt(float(D));
    std::vector<float> s(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(D), 0.0f);
    float m = -INFINITY;
    for (std::int64_t t = 0; t < n; ++t) {
      float dot = 0;
      for (std::int64_t d = 0; d < D; ++d) dot += q[d] * k[std::size_t(t * D + d)];
      s[std::size_t(t)] = act_round(dot * sc, s_.act);
      m = std::max(m, s[std::size_t(t)]);
    }
    float l = 0;
    for (auto& e : s) l += (e = std::exp(e - m));
    for (std::int64_t t = 0; t < n; ++t) {
      const float p = act_round(s[std::size_t(t)] / l, s_.act);
      for (std::int64_t d = 0; d < D; ++d) out[std::size_t(d)] += p * v[std::size_t(t * D + d)];
    }
    for (auto& o : out) o = act_round(o, s_.act);
    return out;
  }

 private:
  FormatWorldShape s_;
  DecodeWorld w_;
  std::vector<float> scales_;  // fp8: K's then V's, per kv head
  std::vector<std::int64_t> n_, pos_;
};

}  // namespace

namespace {
std::optional<std::pair<Format, Format>> g_fixed_formats;
}
void fix_decode_formats(std::optional<std::pair<Format, Format>> pair) { g_fixed_formats = pair; }
std::optional<std::pair<Format, Format>> fixed_decode_formats() { return g_fixed_formats; }

std::unique_ptr<Case> format_flash_case(const FormatWorldShape& s) { return std::make_unique<FormatFlashCase>(s); }

std::vector<float> format_flash_outputs(const DecodeWorld& w, Format act, Format cache,
                                        const std::shared_ptr<Device>& dev) {
  const FormatFlashCase c(w, act, cache);
  auto r = c.run(dev);
  r.out.resize(std::size_t(w.shape.slots * w.shape.heads * w.shape.dim));
  return r.out;
}

}  // namespace lockstep::harness
