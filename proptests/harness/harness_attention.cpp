// Harness cases of the attention algorithms: multi-head attention (fp32 and tensor-core GEMMs,
// per-head and batched), incremental decode attention, the KV-cache scatter.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "harness.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/multihead.hpp"

namespace lockstep::harness {

namespace {
constexpr double kU = 0x1p-24;   // fp32 unit roundoff
constexpr double kUh = 0x1p-11;  // fp16 unit roundoff

void note_violation(OracleReport& rep, std::size_t i, float got, double ref, double bound) {
  if (rep.violations++ == 0) {
    std::ostringstream os;
    os.precision(9);
    os << "element " << i << ": got " << got << ", float64 reference " << ref << ", bound " << bound;
    rep.first_violation = os.str();
  }
}
void account(OracleReport& rep, std::size_t i, float got, double ref, double bound) {
  rep.max_ulp = std::max(rep.max_ulp, ulp_distance(got, ref));
  if (std::fabs(ref) > kRelFloor) rep.max_rel = std::max(rep.max_rel, std::fabs(got - ref) / std::fabs(ref));
  if (bound > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, std::fabs(double(got) - ref) / bound);
  if (!(std::fabs(double(got) - ref) <= bound)) note_violation(rep, i, got, ref, bound);
}
}  // namespace

AttentionRef attention_reference(const float* q, std::int64_t q_stride, const float* k,
                                 const float* v, std::int64_t kv_stride, std::int64_t Sq,
                                 std::int64_t Skv, std::int64_t D, bool causal, double scale_or_0) {
  AttentionRef r;
  r.out.assign(std::size_t(Sq * D), 0.0);
  r.pv_mag.assign(std::size_t(Sq * D), 0.0);
  r.qk_mag.assign(std::size_t(Sq), 0.0);
  r.lse.assign(std::size_t(Sq), -INFINITY);
  const double scale = scale_or_0 != 0 ? scale_or_0 : 1.0 / std::sqrt(double(D));
  std::vector<double> s(std::size_t(std::max<std::int64_t>(Skv, 1)));
  for (std::int64_t i = 0; i < Sq; ++i) {
    const std::int64_t visible = causal ? std::min(Skv, i + 1 + (Skv - Sq)) : Skv;
    if (visible <= 0) continue;
    double m = -INFINITY, mag = 0;
    for (std::int64_t j = 0; j < visible; ++j) {
      double dot = 0, a = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        dot += double(q[i * q_stride + d]) * double(k[j * kv_stride + d]);
        a += std::fabs(double(q[i * q_stride + d]) * double(k[j * kv_stride + d]));
      }
      s[std::size_t(j)] = dot * scale;
      m = std::max(m, s[std::size_t(j)]);
      mag = std::max(mag, a * scale);
    }
    r.qk_mag[std::size_t(i)] = mag;
    double sum = 0;
    for (std::int64_t j = 0; j < visible; ++j) sum += std::exp(s[std::size_t(j)] - m);
    r.lse[std::size_t(i)] = m + std::log(sum);
    for (std::int64_t j = 0; j < visible; ++j) {
      const double p = std::exp(s[std::size_t(j)] - m) / sum;
      for (std::int64_t d = 0; d < D; ++d) {
        r.out[std::size_t(i * D + d)] += p * double(v[j * kv_stride + d]);
        r.pv_mag[std::size_t(i * D + d)] += p * std::fabs(double(v[j * kv_stride + d]));
      }
    }
  }
  return r;
}

// A naive attention in the 16-bit format act, the reference of FlashAttention's rule (its tests
// hold a kernel in a format to at most twice the error that a naive implementation in the same
// format makes against a float32 reference): each scaled score rounded to act, the softmax of
// those in float, each weight rounded to act, the weighted sum of V in float, the output rounded
// to act. Sq x D outputs; rows that see no key are 0.
std::vector<float> naive_in_format(Format act, const float* q, std::int64_t q_stride, const float* k, const float* v,
                                   std::int64_t kv_stride, std::int64_t Sq, std::int64_t Skv, std::int64_t D,
                                   bool causal, double scale_or_0) {
  const auto round = [act](float x) {
    return act == Format::bf16 ? to_float(to_bfloat16(x)) : act == Format::f16 ? to_float(to_half(x)) : x;
  };
  const float scale = float(scale_or_0 != 0 ? scale_or_0 : 1.0 / std::sqrt(double(D)));
  std::vector<float> out(std::size_t(Sq * D), 0.0f), s(std::size_t(std::max<std::int64_t>(Skv, 1)));
  std::vector<double> acc(static_cast<std::size_t>(D));
  for (std::int64_t i = 0; i < Sq; ++i) {
    const std::int64_t visible = causal ? std::min(Skv, i + 1 + (Skv - Sq)) : Skv;
    if (visible <= 0) continue;
    float m = -INFINITY;
    for (std::int64_t j = 0; j < visible; ++j) {
      float dot = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) dot += q[i * q_stride + d] * k[j * kv_stride + d];
      s[std::size_t(j)] = round(dot * scale);
      m = std::max(m, s[std::size_t(j)]);
    }
    float sum = 0.0f;
    for (std::int64_t j = 0; j < visible; ++j) sum += std::exp(s[std::size_t(j)] - m);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::int64_t j = 0; j < visible; ++j) {
      const float p = round(std::exp(s[std::size_t(j)] - m) / sum);
      for (std::int64_t d = 0; d < D; ++d) acc[std::size_t(d)] += double(p * v[j * kv_stride + d]);
    }
    for (std::int64_t d = 0; d < D; ++d) out[std::size_t(i * D + d)] = round(float(acc[std::size_t(d)]));
  }
  return out;
}

float softmax_scale_of(std::uint64_t seed) {
  const std::uint64_t h = seed * 0x9e3779b97f4a7c15ull;  // spread the seed's bits
  if ((h >> 62) != 0) return 0.0f;
  return float(1.0 / 64.0 + (31.0 / 64.0) * double((h >> 20) & 0xffff) / 65535.0);
}

// The bound of Note [attention bound] (docs/numerics.md), as computed here: a score carries at most (D + 4) u of the sum of |q_i k_i| (an fma
// chain and a butterfly of at most D terms, the scale); a softmax weight then at most twice that,
// relative, plus the softmax's own sums; the weighted sum of V at most (Skv + D + 30) u of
// sum_j p_j |v_j|. The tensor-core path adds the fp16 rounding of Q, K, P and V.
double attention_bound_fp32(double pv_mag, double qk_mag, std::int64_t Skv, std::int64_t D) {
  return pv_mag * (2.0 * qk_mag * double(D + 4) * kU +
                   (double(Skv) + std::ceil(double(Skv) / 32.0) + double(D) + 30.0) * kU) +
         1e-30;
}
double attention_bound_tc(double pv_mag, double qk_mag, std::int64_t Skv, std::int64_t D, double uh) {
  return pv_mag * (2.0 * qk_mag * (2.0 * uh + double(D + 4) * kU) + 4.0 * uh +
                   4.0 * (double(Skv) + double(D) + 40.0) * kU) +
         1e-30;
}

namespace {

// --- multi-head attention -----------------------------------------------------------------------
class MhaCase final : public Case {
 public:
  explicit MhaCase(const MhaCaseShape& s) : s_(s), scale_(softmax_scale_of(s.seed)) {
    const std::size_t n = std::size_t(s.seq * s.heads * s.dim);
    q_ = uniform(s.seed, n, -1.0f, 1.0f);
    k_ = uniform(s.seed + 1, n, -1.0f, 1.0f);
    v_ = uniform(s.seed + 2, n, -1.0f, 1.0f);
  }
  std::string describe() const override {
    return "multihead seq=" + std::to_string(s_.seq) + " heads=" + std::to_string(s_.heads) +
           " dim=" + std::to_string(s_.dim) + (s_.causal ? " causal" : "") +
           (s_.gemm ? " tensor-core" : " fp32") + (s_.impl ? " per-head" : " batched") +
           (scale_ != 0.0f ? " scale " + std::to_string(scale_) : std::string());
  }
  bool bitwise_across_backends() const override { return s_.gemm == 0; }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> q(dev, q_.size()), k(dev, k_.size()), v(dev, v_.size()), o(dev, q_.size());
    q.copy_from_host(st, q_);
    k.copy_from_host(st, k_);
    v.copy_from_host(st, v_);
    poison(st, o);
    MhaOptions opt;
    opt.causal = s_.causal;
    opt.gemm = s_.gemm ? GemmKind::kTensorCore : GemmKind::kExact;
    opt.impl = s_.impl ? MhaImpl::kPerHead : MhaImpl::kBatched;
    if (scale_ != 0.0f) opt.scale = scale_;
    multihead_attention(st, q, k, v, o, MhaShape{s_.seq, s_.heads, s_.dim}, opt);
    return collect(st, o);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::int64_t S = s_.seq, H = s_.heads, D = s_.dim;
    for (std::int64_t h = 0; h < H; ++h) {
      const auto ref = attention_reference(q_.data() + h * D, H * D, k_.data() + h * D,
                                           v_.data() + h * D, H * D, S, S, D, s_.causal, scale_);
      for (std::int64_t i = 0; i < S; ++i)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::size_t o = std::size_t((i * H + h) * D + d), e = std::size_t(i * D + d);
          const std::int64_t visible = s_.causal ? i + 1 : S;
          const double b = s_.gemm ? attention_bound_tc(ref.pv_mag[e], ref.qk_mag[std::size_t(i)], visible, D)
                                   : attention_bound_fp32(ref.pv_mag[e], ref.qk_mag[std::size_t(i)], visible, D);
          account(rep, o, r.out[o], ref.out[e], b);
        }
    }
    return rep;
  }

 private:
  MhaCaseShape s_;
  float scale_;  // options.scale (0: unset): softmax_scale_of(seed)
  std::vector<float> q_, k_, v_;
};

// --- incremental decode -------------------------------------------------------------------------
class DecodeCase final : public Case {
 public:
  explicit DecodeCase(const DecodeCaseShape& s) : s_(s), scale_(softmax_scale_of(s.seed)) {
    const std::size_t cache = std::size_t(s.kv_heads * s.max_len * s.dim);
    q_ = uniform(s.seed, std::size_t(s.heads * s.dim), -1.0f, 1.0f);
    k_ = uniform(s.seed + 1, cache, -1.0f, 1.0f);
    v_ = uniform(s.seed + 2, cache, -1.0f, 1.0f);
    // Never read: everything at or beyond the length is NaN.
    for (std::int64_t h = 0; h < s.kv_heads; ++h)
      for (std::int64_t t = s.len; t < s.max_len; ++t)
        for (std::int64_t d = 0; d < s.dim; ++d) {
          k_[std::size_t((h * s.max_len + t) * s.dim + d)] = NAN;
          v_[std::size_t((h * s.max_len + t) * s.dim + d)] = NAN;
        }
  }
  std::string describe() const override {
    return "incremental_attention len=" + std::to_string(s_.len) + " max_len=" +
           std::to_string(s_.max_len) + " heads=" + std::to_string(s_.heads) + " kv_heads=" +
           std::to_string(s_.kv_heads) + " dim=" + std::to_string(s_.dim) +
           (scale_ != 0.0f ? " scale " + std::to_string(scale_) : std::string());
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> q(dev, q_.size()), k(dev, k_.size()), v(dev, v_.size()), o(dev, q_.size());
    q.copy_from_host(st, q_);
    k.copy_from_host(st, k_);
    v.copy_from_host(st, v_);
    poison(st, o);
    DecodeOptions opt;
    if (scale_ != 0.0f) opt.scale = scale_;
    incremental_attention(st, q, k, v, s_.len, o, DecodeShape{s_.heads, s_.kv_heads, s_.dim, s_.max_len}, opt);
    return collect(st, o);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::int64_t D = s_.dim, g = s_.heads / s_.kv_heads;
    for (std::int64_t h = 0; h < s_.heads; ++h) {
      const std::int64_t hk = h / g;
      if (s_.len == 0) {
        for (std::int64_t d = 0; d < D; ++d)
          if (float_bits(r.out[std::size_t(h * D + d)]) != 0)
            note_violation(rep, std::size_t(h * D + d), r.out[std::size_t(h * D + d)], 0.0, 0.0);
        continue;
      }
      const auto ref = attention_reference(q_.data() + h * D, D, k_.data() + hk * s_.max_len * D,
                                           v_.data() + hk * s_.max_len * D, D, 1, s_.len, D, false, scale_);
      for (std::int64_t d = 0; d < D; ++d)
        account(rep, std::size_t(h * D + d), r.out[std::size_t(h * D + d)], ref.out[std::size_t(d)],
                attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], s_.len, D));
    }
    return rep;
  }

 private:
  DecodeCaseShape s_;
  float scale_;  // options.scale (0: unset): softmax_scale_of(seed)
  std::vector<float> q_, k_, v_;
};

// --- KV-cache scatter ---------------------------------------------------------------------------
class ScatterCase final : public Case {
 public:
  explicit ScatterCase(const ScatterCaseShape& s) : s_(s) {
    cache_ = uniform(s.seed, std::size_t(s.kv_heads * s.max_len * s.dim), -1.0f, 1.0f);
    src_ = uniform(s.seed + 1, std::size_t(s.kv_heads * s.dim), 2.0f, 3.0f);
  }
  std::string describe() const override {
    return "kv_cache_scatter kv_heads=" + std::to_string(s_.kv_heads) + " dim=" +
           std::to_string(s_.dim) + " max_len=" + std::to_string(s_.max_len) + " pos=" +
           std::to_string(s_.pos);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> cache(dev, cache_.size()), src(dev, src_.size());
    cache.copy_from_host(st, cache_);
    src.copy_from_host(st, src_);
    kv_cache_scatter(st, src, s_.pos, cache, DecodeShape{s_.kv_heads, s_.kv_heads, s_.dim, s_.max_len});
    return collect(st, cache);
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    for (std::int64_t h = 0; h < s_.kv_heads; ++h)
      for (std::int64_t t = 0; t < s_.max_len; ++t)
        for (std::int64_t d = 0; d < s_.dim; ++d) {
          const std::size_t i = std::size_t((h * s_.max_len + t) * s_.dim + d);
          const float e = t == s_.pos ? src_[std::size_t(h * s_.dim + d)] : cache_[i];
          if (float_bits(r.out[i]) != float_bits(e)) note_violation(rep, i, r.out[i], e, 0);
        }
    return rep;
  }

 private:
  ScatterCaseShape s_;
  std::vector<float> cache_, src_;
};

}  // namespace

std::unique_ptr<Case> mha_case(const MhaCaseShape& s) { return std::make_unique<MhaCase>(s); }
std::unique_ptr<Case> decode_case(const DecodeCaseShape& s) { return std::make_unique<DecodeCase>(s); }
std::unique_ptr<Case> scatter_case(const ScatterCaseShape& s) { return std::make_unique<ScatterCase>(s); }

namespace {
std::int64_t pick_heads(std::mt19937_64& g, std::int64_t& kv) {
  static const std::int64_t groups[] = {1, 2, 3, 4, 6, 8};
  kv = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
  return kv * groups[std::uniform_int_distribution<int>(0, 5)(g)];
}
}  // namespace

std::vector<KernelEntry> attention_entries() {
  return {
      {"multihead_fp32",
       [](std::mt19937_64& g) {
         MhaCaseShape s;
         s.seq = draw_size(g, 150);
         s.heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.dim = std::uniform_int_distribution<int>(0, 1)(g) ? draw_head_dim(g) : draw_size(g, 80);
         s.causal = std::uniform_int_distribution<int>(0, 1)(g);
         s.impl = std::uniform_int_distribution<int>(0, 1)(g);
         s.seed = g();
         return mha_case(s);
       }},
      {"multihead_tensor_core",
       [](std::mt19937_64& g) {
         MhaCaseShape s;
         s.seq = draw_size(g, 100);
         s.heads = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
         s.dim = std::uniform_int_distribution<int>(0, 1)(g) ? 64 : draw_size(g, 70);
         s.causal = std::uniform_int_distribution<int>(0, 1)(g);
         s.gemm = 1;
         s.seed = g();
         return mha_case(s);
       }},
      {"incremental_attention",
       [](std::mt19937_64& g) {
         DecodeCaseShape s;
         s.dim = draw_head_dim(g);
         s.heads = pick_heads(g, s.kv_heads);
         s.max_len = draw_size(g, 1100);
         s.len = std::uniform_int_distribution<std::int64_t>(0, s.max_len)(g);
         s.seed = g();
         return decode_case(s);
       },
       {},
       true},
      {"kv_cache_scatter",
       [](std::mt19937_64& g) {
         ScatterCaseShape s;
         s.dim = draw_head_dim(g);
         s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 8)(g);
         s.max_len = draw_size(g, 300);
         s.pos = std::uniform_int_distribution<std::int64_t>(0, s.max_len - 1)(g);
         s.seed = g();
         return scatter_case(s);
       }},
  };
}

}  // namespace lockstep::harness

// --- fused attention (prefill) ------------------------------------------------------------------
#include "lockstep/attention/fused.hpp"
#include "harness_decode_formats.hpp"  // encode, widen

namespace lockstep::harness {
namespace {

class FusedCase final : public Case {
 public:
  explicit FusedCase(const FusedCaseShape& s) : s_(s), scale_(softmax_scale_of(s.seed)) {
    q_ = uniform(s.seed, std::size_t(s.batch * s.heads * s.seq_q * s.dim), -s.q_scale, s.q_scale);
    k_ = uniform(s.seed + 1, std::size_t(s.batch * s.kv_heads * s.seq_kv * s.dim), -1.0f, 1.0f);
    v_ = uniform(s.seed + 2, k_.size(), -1.0f, 1.0f);
    if (s.key_ramp != 0.0f) {  // key j (of each batch and kv head) times 1 + key_ramp * j
      for (std::int64_t b = 0; b < s.batch; ++b)
        for (std::int64_t h = 0; h < s.kv_heads; ++h)
          for (std::int64_t j = 0; j < s.seq_kv; ++j)
            for (std::int64_t d = 0; d < s.dim; ++d)
              k_[at(b, h, j, s.kv_heads, s.seq_kv) + std::size_t(d)] *= 1.0f + s.key_ramp * float(j);
    }
    for (auto* x : {&q_, &k_, &v_})  // the values the call receives
      for (float& e : *x) {
        if (s.act == Format::f16) e = to_float(to_half(e));
        if (s.act == Format::bf16) e = to_float(to_bfloat16(e));
      }
  }
  std::string describe() const override {
    return std::string("attention (fused, ") + (s_.tensor_core ? "tensor core" : "exact") + ") B=" + std::to_string(s_.batch) + " H=" + std::to_string(s_.heads) +
           " Hkv=" + std::to_string(s_.kv_heads) + " Sq=" + std::to_string(s_.seq_q) + " Skv=" +
           std::to_string(s_.seq_kv) + " D=" + std::to_string(s_.dim) + (s_.causal ? " causal" : "") +
           (s_.interleaved ? " interleaved" : " heads-first") +
           (s_.key_ramp != 0.0f ? " key ramp " + std::to_string(s_.key_ramp) : std::string()) +
           (s_.q_scale != 1.0f ? " q_scale " + std::to_string(s_.q_scale) : std::string()) +
           (s_.batch_invariant ? std::string() : " batch_invariant=false") +
           (s_.act != Format::f32 ? std::string(" in ") + format_name(s_.act) : std::string()) +
           (scale_ != 0.0f ? " scale " + std::to_string(scale_) : std::string());
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    return with_act(s_.act, [&](auto t) { return run_as<decltype(t)>(dev); });
  }
  template <class T>
  Run run_as(const std::shared_ptr<Device>& dev) const {
    auto& st = dev->default_stream();
    Buffer<T> q(dev, q_.size()), k(dev, k_.size()), v(dev, v_.size()), o(dev, q_.size());
    Buffer<float> lse(dev, std::size_t(s_.batch * s_.heads * s_.seq_q));
    q.copy_from_host(st, encode<T>(q_));
    k.copy_from_host(st, encode<T>(k_));
    v.copy_from_host(st, encode<T>(v_));
    constexpr float kMarker = 12345.0f;  // no output reaches it (|v| <= 1)
    if constexpr (std::is_same_v<T, float>) {
      poison(st, o);
    } else {
      o.copy_from_host(st, encode<T>(std::vector<float>(q_.size(), kMarker)));
    }
    poison(st, lse);
    AttentionOptions opt;
    opt.causal = s_.causal;
    opt.precision = s_.tensor_core ? AttentionPrecision::kTensorCore : AttentionPrecision::kExact;
    opt.layout = s_.interleaved ? AttentionLayout::kInterleaved : AttentionLayout::kHeadsFirst;
    opt.lse = &lse;
    opt.batch_invariant = s_.batch_invariant;
    if (scale_ != 0.0f) opt.scale = scale_;
    attention(st, q, k, v, o, AttentionShape{s_.batch, s_.heads, s_.kv_heads, s_.seq_q, s_.seq_kv, s_.dim}, opt);
    Run r;
    if constexpr (std::is_same_v<T, float>) {
      r = collect(st, o);
    } else {
      r.out = widen(o.to_vector(st));
      r.unwritten = std::size_t(std::count(r.out.begin(), r.out.end(), widen(from_float<T>(kMarker))));
    }
    const Run rl = collect(st, lse);
    r.out.insert(r.out.end(), rl.out.begin(), rl.out.end());
    r.unwritten += rl.unwritten;
    return r;
  }
  // Element (b, h, i, d) of a [B, heads, S, D] or [B, S, heads * D] tensor.
  std::size_t at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t heads, std::int64_t S) const {
    const std::int64_t D = s_.dim;
    return std::size_t(s_.interleaved ? ((b * S + i) * heads + h) * D : ((b * heads + h) * S + i) * D);
  }
  bool bitwise_across_backends() const override { return !s_.tensor_core; }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::int64_t D = s_.dim, g = s_.heads / s_.kv_heads;
    const std::int64_t qstride = s_.interleaved ? s_.heads * D : D, kstride = s_.interleaved ? s_.kv_heads * D : D;
    const std::size_t lse0 = q_.size();
    // The tensor cores' element format: bfloat16 for bfloat16 inputs, else fp16 (Note
    // [tensor-core formats]); P is rounded to it.
    const double uh = s_.act == Format::bf16 ? 0x1p-8 : kUh;
    // FlashAttention's rule in a 16-bit format: the largest error against the float64 oracle at
    // most twice a naive same-format attention's (naive_in_format), plus an ulp of the format at
    // the largest |ref|: the output's own rounding, and on the tensor cores that of the
    // unnormalized weights (up to 2^8, Note [lazy rescale]), where the naive one rounds weights
    // in [0, 1] (a one-hot row is exact there).
    double err = 0, naive_err = 0, ref_max = 0;
    for (std::int64_t b = 0; b < s_.batch; ++b)
      for (std::int64_t h = 0; h < s_.heads; ++h) {
        const std::int64_t hk = h / g;
        const auto ref = attention_reference(q_.data() + at(b, h, 0, s_.heads, s_.seq_q), qstride,
                                             k_.data() + at(b, hk, 0, s_.kv_heads, s_.seq_kv),
                                             v_.data() + at(b, hk, 0, s_.kv_heads, s_.seq_kv), kstride,
                                             s_.seq_q, s_.seq_kv, D, s_.causal, scale_);
        if (s_.act != Format::f32) {
          const auto naive = naive_in_format(s_.act, q_.data() + at(b, h, 0, s_.heads, s_.seq_q), qstride,
                                             k_.data() + at(b, hk, 0, s_.kv_heads, s_.seq_kv),
                                             v_.data() + at(b, hk, 0, s_.kv_heads, s_.seq_kv), kstride,
                                             s_.seq_q, s_.seq_kv, D, s_.causal, scale_);
          for (std::int64_t i = 0; i < s_.seq_q; ++i)
            for (std::int64_t d = 0; d < D; ++d) {
              const std::size_t o = at(b, h, i, s_.heads, s_.seq_q) + std::size_t(d), e = std::size_t(i * D + d);
              err = std::max(err, std::fabs(double(r.out[o]) - ref.out[e]));
              naive_err = std::max(naive_err, std::fabs(double(naive[e]) - ref.out[e]));
              ref_max = std::max(ref_max, std::fabs(ref.out[e]));
            }
        }
        for (std::int64_t i = 0; i < s_.seq_q; ++i) {
          const std::int64_t visible =
              s_.causal ? std::clamp<std::int64_t>(i + 1 + s_.seq_kv - s_.seq_q, 0, s_.seq_kv) : s_.seq_kv;
          for (std::int64_t d = 0; d < D; ++d) {
            const std::size_t o = at(b, h, i, s_.heads, s_.seq_q) + std::size_t(d), e = std::size_t(i * D + d);
            double bound = s_.tensor_core ? attention_bound_tc(ref.pv_mag[e], ref.qk_mag[std::size_t(i)], visible, D, uh)
                                          : attention_bound_fp32(ref.pv_mag[e], ref.qk_mag[std::size_t(i)], visible, D);
            if (s_.act != Format::f32) {  // then the output's one rounding (Note [exact formats])
              const double ua = s_.act == Format::f16 ? 0x1p-11 : 0x1p-8;
              bound = bound * (1 + ua) + ua * std::fabs(ref.out[e]) + (s_.act == Format::f16 ? 0x1p-25 : 0x1p-134);
            }
            account(rep, o, r.out[o], ref.out[e], visible == 0 ? 0.0 : bound);
          }
          const float got = r.out[lse0 + std::size_t((b * s_.heads + h) * s_.seq_q + i)];
          if (visible == 0) {
            if (!(std::isinf(got) && got < 0)) note_violation(rep, lse0, got, -INFINITY, 0);
          } else {
            // Note [attention bound]: every score within qk_mag (D + 4) u (plus the fp16 rounding
            // of Q and K on the tensor cores), so the log-sum-exp within that plus the sum's
            // relative error and the final m * scale + log(l) roundings.
            const double ref_lse = ref.lse[std::size_t(i)], qk = ref.qk_mag[std::size_t(i)];
            const double lse_bound = qk * ((s_.tensor_core ? 2.0 * uh : 0.0) + double(D + 4) * kU) +
                                     (double(visible) + double(D) + 40.0) * kU + 4.0 * kU * std::fabs(ref_lse);
            account(rep, lse0 + std::size_t((b * s_.heads + h) * s_.seq_q + i), got, ref_lse, lse_bound);
          }
        }
      }
    if (s_.act != Format::f32 && !(err <= 2.0 * naive_err + 2.0 * uh * ref_max)) {
      std::ostringstream os;
      os.precision(9);
      os << "largest error " << err << " against the float64 oracle, more than twice a naive "
         << format_name(s_.act) << " attention's " << naive_err << " plus " << 2.0 * uh << " x " << ref_max;
      if (rep.violations++ == 0) rep.first_violation = os.str();
    }
    return rep;
  }

 private:
  FusedCaseShape s_;
  float scale_;  // options.scale (0: unset): softmax_scale_of(seed)
  std::vector<float> q_, k_, v_;
};

}  // namespace

std::unique_ptr<Case> fused_case(const FusedCaseShape& s) { return std::make_unique<FusedCase>(s); }

std::vector<KernelEntry> fused_entries() {
  auto draw = [](std::mt19937_64& g, bool tc, Format act = Format::f32) {
    FusedCaseShape s;
    s.act = act;
    s.dim = draw_head_dim(g);
    s.batch = std::uniform_int_distribution<std::int64_t>(1, 2)(g);
    s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 2)(g);
    s.heads = s.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 3)(g);
    s.seq_q = draw_size(g, 150);
    s.seq_kv = std::uniform_int_distribution<int>(0, 1)(g) ? s.seq_q : draw_size(g, 150);
    s.causal = std::uniform_int_distribution<int>(0, 1)(g);
    s.interleaved = std::uniform_int_distribution<int>(0, 1)(g);
    s.tensor_core = tc;
    s.seed = g();
    return fused_case(s);
  };
  // Fixed large shapes: few query rows, many (batch, head) pairs, so large grids at little
  // arithmetic, reaching variants that attention/src/fused.cpp picks only for large grids (H200:
  // 132 SMs; the CPU device: one "multiprocessor" per worker thread).
  auto fixed = [](std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t dim,
                  bool causal, bool interleaved, bool tc, std::uint64_t seed, bool batch_invariant = true) {
    return [=] {
      FusedCaseShape s;
      s.batch = batch, s.heads = heads, s.kv_heads = 4, s.seq_q = seq_q, s.seq_kv = seq_kv, s.dim = dim;
      s.causal = causal, s.interleaved = interleaved, s.tensor_core = tc, s.seed = seed;
      s.batch_invariant = batch_invariant;
      return fused_case(s);
    };
  };
  return {{"attention_fused_exact",
           [draw](std::mt19937_64& g) { return draw(g, false); },
           // 26 x 16 = 416 blocks > 3 x 132: FusedAttentionExact<64> with P in K's memory (on the
           // CPU device every grid above 3 blocks per worker thread takes it).
           {fixed(26, 16, 3, 37, 64, true, false, false, 31), fixed(26, 16, 3, 37, 64, false, true, false, 32),
            // Split keys (batch_invariant = false, Note [split keys]): 12 query tiles over 15 key
            // tiles, S = 3; 8 over 11 at head_dim 128, S = 2.
            fixed(1, 4, 130, 900, 64, true, false, false, 33, false),
            fixed(1, 4, 100, 700, 128, false, true, false, 34, false)}},
          {"attention_fused_exact_formats",  // Note [exact formats]: half or bfloat16
           [draw](std::mt19937_64& g) {
             const Format act = std::uniform_int_distribution<int>(0, 1)(g) != 0 ? Format::bf16 : Format::f16;
             return draw(g, false, act);
           },
           {}},
          {"attention_fused_tensor_core_formats",  // Note [tensor-core formats]: half or bfloat16
           [draw](std::mt19937_64& g) {
             const Format act = std::uniform_int_distribution<int>(0, 1)(g) != 0 ? Format::bf16 : Format::f16;
             return draw(g, true, act);
           },
           {}},
          {"attention_fused_tensor_core",
           [draw](std::mt19937_64& g) { return draw(g, true); },
           // 17 x 32 = 544 blocks of 128 rows >= 2 x 2 x 132: FusedAttentionTensorCore<128, 2>
           // (without wgmma; with it, FusedAttentionWgmma<128, 1>).
           {fixed(17, 32, 3, 37, 128, true, false, true, 41),
            // 17 x 16 = 272 blocks of 64 rows >= 2 x 132 at head_dim 64: on sm_90a
            // FusedAttentionWgmma<64, 1, true> (packing blocks); FusedAttentionTensorCore<64> elsewhere.
            fixed(17, 16, 5, 70, 64, false, true, true, 42),
            // batch_invariant = false, which TensorCore ignores (it splits keys only when
            // the Tuning fused.tc_splits asks, Note [split keys]): 12 query tiles over 15 key
            // tiles at head_dim 64, 8 over 11 at head_dim 128.
            fixed(1, 4, 130, 900, 64, true, false, true, 43, false),
            fixed(1, 4, 100, 700, 128, false, true, true, 44, false)}}};
}

}  // namespace lockstep::harness
