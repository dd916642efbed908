// Harness cases of batched decoding: Flash-Decoding over a KV cache with many slots, and RoPE.

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness.hpp"
#include "harness_decode.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/kernels/math.hpp"

namespace lockstep::harness {

DecodeWorld::DecodeWorld(const DecodeWorldShape& s) : shape(s) {
  const std::int64_t M = s.slots, Hk = s.kv_heads, L = s.max_len, D = s.dim;
  std::mt19937_64 g(s.seed);
  lengths.resize(std::size_t(M));
  done.resize(std::size_t(M));
  for (std::int64_t m = 0; m < M; ++m) {
    lengths[std::size_t(m)] = std::uniform_int_distribution<std::int64_t>(0, L - 1)(g);
    done[std::size_t(m)] = std::uniform_int_distribution<int>(0, 7)(g) == 0;
  }
  if (!s.lengths.empty()) lengths = s.lengths;
  if (!s.done.empty()) done = s.done;
  k = uniform(s.seed + 1, std::size_t(M * Hk * L * D), -1.0f, 1.0f);
  v = uniform(s.seed + 2, std::size_t(M * Hk * L * D), -1.0f, 1.0f);
  // Past each length: NaN, which must never reach an output.
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t h = 0; h < Hk; ++h)
      for (std::int64_t t = lengths[std::size_t(m)]; t < L; ++t)
        for (std::int64_t d = 0; d < D; ++d) {
          k[std::size_t(((m * Hk + h) * L + t) * D + d)] = NAN;
          v[std::size_t(((m * Hk + h) * L + t) * D + d)] = NAN;
        }
  q = uniform(s.seed + 3, std::size_t(M * s.heads * D), -1.0f, 1.0f);
  k_new = uniform(s.seed + 4, std::size_t(M * Hk * D), -1.0f, 1.0f);
  v_new = uniform(s.seed + 5, std::size_t(M * Hk * D), -1.0f, 1.0f);
}

KvCacheConfig DecodeWorld::config() const {
  KvCacheConfig c;
  c.num_layers = 1;
  c.num_heads = shape.heads;
  c.num_kv_heads = shape.kv_heads;
  c.head_dim = shape.dim;
  c.max_len = shape.max_len;
  c.slots = shape.slots;
  return c;
}

KvCache DecodeWorld::make_cache(const std::shared_ptr<Device>& dev) const {
  KvCache cache(dev, config());
  auto& st = dev->default_stream();
  const std::int64_t Hk = shape.kv_heads, L = shape.max_len, D = shape.dim;
  const std::size_t per_slot = std::size_t(Hk * L * D);
  for (std::int64_t m = 0; m < shape.slots; ++m) {
    // Write the whole slot (NaN past the length), then roll back to the length.
    cache.write_from_host(st, m, 0, std::span<const float>(k).subspan(std::size_t(m) * per_slot, per_slot),
                          std::span<const float>(v).subspan(std::size_t(m) * per_slot, per_slot), L);
    cache.rollback(m, lengths[std::size_t(m)]);
    if (done[std::size_t(m)]) cache.mark_done(m);
  }
  return cache;
}

std::vector<float> DecodeWorld::decode(const std::shared_ptr<Device>& dev) const {
  auto cache = make_cache(dev);
  auto& st = dev->default_stream();
  Buffer<float> bq(dev, q.size()), bk(dev, k_new.size()), bv(dev, v_new.size()), out(dev, q.size());
  bq.copy_from_host(st, q);
  bk.copy_from_host(st, k_new);
  bv.copy_from_host(st, v_new);
  poison(st, out);
  flash_decoding(st, cache, 0, bq, bk, bv, lengths, out);
  return out.to_vector(st);
}

OracleReport DecodeWorld::check(const std::vector<float>& out) const {
  OracleReport rep;
  const std::int64_t Hk = shape.kv_heads, L = shape.max_len, D = shape.dim, H = shape.heads;
  const std::int64_t g = H / Hk;
  for (std::int64_t m = 0; m < shape.slots; ++m) {
    const std::int64_t n = lengths[std::size_t(m)] + 1;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::size_t o = std::size_t((m * H + h) * D);
      if (done[std::size_t(m)]) {
        for (std::int64_t d = 0; d < D; ++d)
          if (float_bits(out[o + std::size_t(d)]) != 0) {
            if (rep.violations++ == 0) rep.first_violation = "done slot " + std::to_string(m) + " not zero";
          }
        continue;
      }
      // The slot's tokens plus the new one, as one [n, D] sequence.
      std::vector<float> kk(std::size_t(n * D)), vv(std::size_t(n * D));
      const std::int64_t hk = h / g;
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t d = 0; d < D; ++d) {
          const bool fresh = t == n - 1;
          kk[std::size_t(t * D + d)] = fresh ? k_new[std::size_t((m * Hk + hk) * D + d)]
                                             : k[std::size_t(((m * Hk + hk) * L + t) * D + d)];
          vv[std::size_t(t * D + d)] = fresh ? v_new[std::size_t((m * Hk + hk) * D + d)]
                                             : v[std::size_t(((m * Hk + hk) * L + t) * D + d)];
        }
      const auto ref = attention_reference(q.data() + o, D, kk.data(), vv.data(), D, 1, n, D, false);
      for (std::int64_t d = 0; d < D; ++d) {
        const double b = attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], n, D);
        const float got = out[o + std::size_t(d)];
        const double err = std::fabs(double(got) - ref.out[std::size_t(d)]);
        rep.max_ulp = std::max(rep.max_ulp, ulp_distance(got, ref.out[std::size_t(d)]));
        if (b > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / b);
        if (!(err <= b) && rep.violations++ == 0) {
          std::ostringstream os;
          os << "slot " << m << " head " << h << " d " << d << ": got " << got << ", reference "
             << ref.out[std::size_t(d)] << ", bound " << b;
          rep.first_violation = os.str();
        }
      }
    }
  }
  return rep;
}

namespace {

class FlashCase final : public Case {
 public:
  explicit FlashCase(const DecodeWorldShape& s) : w_(s) {}
  std::string describe() const override {
    std::ostringstream os;
    os << "flash_decoding slots=" << w_.shape.slots << " heads=" << w_.shape.heads
       << " kv_heads=" << w_.shape.kv_heads << " dim=" << w_.shape.dim << " max_len=" << w_.shape.max_len
       << " lengths=[";
    for (std::size_t i = 0; i < w_.lengths.size(); ++i)
      os << (i ? "," : "") << w_.lengths[i] << (w_.done[i] ? "(done)" : "");
    os << "]";
    return os.str();
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    Run r;
    r.out = w_.decode(dev);
    r.unwritten = std::size_t(std::count_if(r.out.begin(), r.out.end(),
                                            [](float v) { return float_bits(v) == kPoisonPattern; }));
    return r;
  }
  OracleReport check(const Run& r) const override { return w_.check(r.out); }

 private:
  DecodeWorld w_;
};

class RopeCase final : public Case {
 public:
  explicit RopeCase(const RopeCaseShape& s) : s_(s) {
    q_ = uniform(s.seed, std::size_t(s.rows * s.heads * s.dim), -2.0f, 2.0f);
    k_ = uniform(s.seed + 1, std::size_t(s.rows * s.kv_heads * s.dim), -2.0f, 2.0f);
    std::mt19937_64 g(s.seed + 2);
    pos_.resize(std::size_t(s.rows));
    for (auto& p : pos_) p = std::uniform_int_distribution<std::int64_t>(0, s.max_pos)(g);
  }
  std::string describe() const override {
    return "rope rows=" + std::to_string(s_.rows) + " heads=" + std::to_string(s_.heads) + "/" +
           std::to_string(s_.kv_heads) + " dim=" + std::to_string(s_.dim) + " theta=" +
           std::to_string(s_.theta) + (s_.neox ? " neox" : " norm");
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> q(dev, q_.size()), k(dev, k_.size());
    q.copy_from_host(st, q_);
    k.copy_from_host(st, k_);
    RopeConfig c{s_.heads, s_.kv_heads, s_.dim, s_.theta, s_.neox ? RopeStyle::kNeox : RopeStyle::kNorm};
    rope(st, &q, &k, pos_, c);
    Run r = collect(st, q);
    const Run rk = collect(st, k);
    r.out.insert(r.out.end(), rk.out.begin(), rk.out.end());
    r.unwritten += rk.unwritten;
    return r;
  }
  // float64 reference with the same float angle inputs (the rotation itself in float64).
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    auto one = [&](const std::vector<float>& in, std::int64_t heads, std::size_t base) {
      const std::int64_t D = s_.dim, half = D / 2;
      for (std::int64_t row = 0; row < s_.rows; ++row)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t i = 0; i < half; ++i) {
            const std::size_t o = std::size_t((row * heads + h) * D);
            const std::size_t ia = o + std::size_t(s_.neox ? i : 2 * i), ib = o + std::size_t(s_.neox ? i + half : 2 * i + 1);
            const double freq = std::pow(double(s_.theta), -double(2 * i) / double(D));
            const double ang = double(pos_[std::size_t(row)]) * freq;
            const double a = in[ia], b = in[ib];
            const double ra = a * std::cos(ang) - b * std::sin(ang), rb = a * std::sin(ang) + b * std::cos(ang);
            // Note [rope bound]: the float angle pos * freq carries ~2 (pos + 1) u radians of
            // error, sin and cos 2 ulp each, the rotation 3 roundings.
            const double bound = (std::fabs(a) + std::fabs(b)) * ((8.0 * double(pos_[std::size_t(row)] + 1) + 16.0) * 0x1p-24);
            for (int c = 0; c < 2; ++c) {
              const double ref = c ? rb : ra;
              const float got = r.out[base + (c ? ib : ia)];
              const double err = std::fabs(double(got) - ref);
              rep.max_ulp = std::max(rep.max_ulp, ulp_distance(got, ref));
              if (bound > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / bound);
              if (!(err <= bound) && rep.violations++ == 0)
                rep.first_violation = "row " + std::to_string(row) + " pair " + std::to_string(i) +
                                      ": error " + std::to_string(err) + " > " + std::to_string(bound);
            }
          }
    };
    one(q_, s_.heads, 0);
    one(k_, s_.kv_heads, q_.size());
    return rep;
  }

 private:
  RopeCaseShape s_;
  std::vector<float> q_, k_;
  std::vector<std::int64_t> pos_;
};

}  // namespace

std::unique_ptr<Case> flash_case(const DecodeWorldShape& s) { return std::make_unique<FlashCase>(s); }
std::unique_ptr<Case> rope_case(const RopeCaseShape& s) { return std::make_unique<RopeCase>(s); }

std::vector<KernelEntry> decode_entries() {
  return {
      {"flash_decoding",
       [](std::mt19937_64& g) {
         DecodeWorldShape s;
         static const std::int64_t dims[] = {32, 64, 96, 128, 256};
         s.dim = dims[std::uniform_int_distribution<int>(0, 4)(g)];
         s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
         s.heads = s.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.slots = std::uniform_int_distribution<std::int64_t>(1, 5)(g);
         s.max_len = draw_size(g, 700);
         s.seed = g();
         return flash_case(s);
       }},
      {"rope",
       [](std::mt19937_64& g) {
         RopeCaseShape s;
         s.rows = draw_size(g, 40);
         s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.heads = s.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.dim = 2 * std::uniform_int_distribution<std::int64_t>(1, 128)(g);
         s.theta = std::uniform_int_distribution<int>(0, 1)(g) ? 10000.0f : 1e6f;
         s.neox = std::uniform_int_distribution<int>(0, 1)(g);
         s.max_pos = std::uniform_int_distribution<int>(0, 1)(g) ? 64 : 4096;
         s.seed = g();
         return rope_case(s);
       }},
  };
}

}  // namespace lockstep::harness
