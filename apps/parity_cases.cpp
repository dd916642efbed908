// Parity cases of the `lockstep` tool (apps/parity_cases.hpp): KV-cache operations, Flash-Decoding
// with its appended cache bytes and with device positions, RoPE with the relative error.

#include "parity_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>

#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::parity {

using harness::Case;
using harness::OracleReport;
using harness::Run;
using harness::float_bits;

namespace {

// The relative error is recorded where |reference| > this (as the harness's attention cases do).
constexpr double kRelFloor = 1e-6;

std::size_t count_poison(const std::vector<float>& v) {
  return std::size_t(std::count_if(v.begin(), v.end(), [](float x) { return float_bits(x) == kPoisonPattern; }));
}

float int_as_float(std::int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

void violation(OracleReport& rep, const std::string& what) {
  if (rep.violations++ == 0) rep.first_violation = what;
}

// Copies are exact: every compared element must have the expected bits.
void expect_bits(OracleReport& rep, const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& label) {
  if (got.size() != want.size()) {
    violation(rep, label + ": " + std::to_string(got.size()) + " elements, expected " + std::to_string(want.size()));
    return;
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    if (float_bits(got[i]) != float_bits(want[i])) {
      std::ostringstream os;
      os.precision(9);
      os << label << ": element " << i << " is " << got[i] << " (0x" << std::hex << float_bits(got[i])
         << "), expected " << std::dec << want[i] << " (0x" << std::hex << float_bits(want[i]) << ")";
      violation(rep, os.str());
    }
}

// One decode query q [D] over n tokens kk, vv [n, D] against out [D]: ulp, relative error and
// the documented bound (docs/numerics.md, Note [attention bound]).
void check_attention(OracleReport& rep, const float* q, const std::vector<float>& kk,
                     const std::vector<float>& vv, std::int64_t n, std::int64_t D, const float* out,
                     const std::string& where) {
  const auto ref = harness::attention_reference(q, D, kk.data(), vv.data(), D, 1, n, D, false);
  for (std::int64_t d = 0; d < D; ++d) {
    const double r = ref.out[std::size_t(d)];
    const double b = harness::attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], n, D);
    const float got = out[d];
    const double err = std::fabs(double(got) - r);
    rep.max_ulp = std::max(rep.max_ulp, harness::ulp_distance(got, r));
    if (std::fabs(r) > kRelFloor) rep.max_rel = std::max(rep.max_rel, err / std::fabs(r));
    if (b > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / b);
    if (!(err <= b)) {
      std::ostringstream os;
      os << where << " d " << d << ": got " << got << ", reference " << r << ", bound " << b;
      violation(rep, os.str());
    }
  }
}

void check_zeros(OracleReport& rep, const float* out, std::int64_t n, const std::string& where) {
  for (std::int64_t i = 0; i < n; ++i)
    if (float_bits(out[i]) != 0) {
      violation(rep, where + " not zero");
      return;
    }
}

// Host model of a [slots, kv_heads, max_len, dim] layer.
struct Geometry {
  std::int64_t Hk, L, D;
  std::size_t at(std::int64_t s, std::int64_t h, std::int64_t t) const {
    return std::size_t(((s * Hk + h) * L + t) * D);
  }
  std::size_t slot_elems() const { return std::size_t(Hk * L * D); }
};

// Writes every byte of slot s of every layer from host (whole slots), then sets the lengths and
// done flags.
void fill_cache(Stream& st, KvCache& c, const std::vector<std::vector<float>>& k,
                const std::vector<std::vector<float>>& v, const std::vector<std::int64_t>& len,
                const std::vector<bool>& done) {
  const auto& cfg = c.config();
  const Geometry g{cfg.num_kv_heads, cfg.max_len, cfg.head_dim};
  const std::size_t n = g.slot_elems();
  for (std::int64_t s = 0; s < cfg.slots; ++s) {
    for (std::int64_t l = 0; l < cfg.num_layers; ++l)
      c.write_from_host(st, s, l, std::span<const float>(k[std::size_t(l)]).subspan(std::size_t(s) * n, n),
                        std::span<const float>(v[std::size_t(l)]).subspan(std::size_t(s) * n, n), cfg.max_len);
    c.rollback(s, len[std::size_t(s)]);
    if (done[std::size_t(s)]) c.mark_done(s);
  }
}

void append_lengths(std::vector<float>& out, const KvCache& c) {
  for (std::int64_t s = 0; s < c.slots(); ++s) {
    out.push_back(float(c.length(s)));
    out.push_back(c.done(s) ? 1.0f : 0.0f);
  }
}

std::vector<std::vector<float>> layers_of(std::uint64_t seed, std::int64_t layers, std::size_t n) {
  std::vector<std::vector<float>> r;
  for (std::int64_t l = 0; l < layers; ++l) r.push_back(harness::uniform(seed + std::uint64_t(l), n, -1.0f, 1.0f));
  return r;
}

// --- KvCache::append ----------------------------------------------------------------------------

class AppendCase final : public Case {
 public:
  explicit AppendCase(const AppendShape& s) : s_(s), g_{s.kv_heads, s.max_len, s.dim} {
    const std::size_t n = std::size_t(s.slots) * g_.slot_elems();
    k_ = layers_of(s.seed, s.layers, n);
    v_ = layers_of(s.seed + 100, s.layers, n);
    std::mt19937_64 r(s.seed + 200);
    for (std::int64_t m = 0; m < s.slots; ++m) {
      len_.push_back(std::uniform_int_distribution<std::int64_t>(0, s.max_len - s.steps)(r));
      done_.push_back(s.slots > 1 && std::uniform_int_distribution<int>(0, 5)(r) == 0);
    }
    const std::size_t tok = std::size_t(s.slots * s.kv_heads * s.dim);
    for (std::int64_t t = 0; t < s.steps; ++t) {
      kn_.push_back(layers_of(s.seed + 300 + 10 * std::uint64_t(t), s.layers, tok));
      vn_.push_back(layers_of(s.seed + 600 + 10 * std::uint64_t(t), s.layers, tok));
    }
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "KvCache::append layers=" << s_.layers << " slots=" << s_.slots << " kv_heads=" << s_.kv_heads
       << " dim=" << s_.dim << " max_len=" << s_.max_len << " steps=" << s_.steps << " seed=" << s_.seed;
    return os.str();
  }
  // A done slot's position is garbage: append must ignore it.
  std::vector<std::int64_t> positions(std::int64_t step) const {
    std::vector<std::int64_t> p(std::size_t(s_.slots));
    for (std::int64_t m = 0; m < s_.slots; ++m)
      p[std::size_t(m)] = done_[std::size_t(m)] ? s_.max_len + 7 : len_[std::size_t(m)] + step;
    return p;
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    KvCacheConfig cfg;
    cfg.num_layers = s_.layers;
    cfg.num_heads = cfg.num_kv_heads = s_.kv_heads;
    cfg.head_dim = s_.dim;
    cfg.max_len = s_.max_len;
    cfg.slots = s_.slots;
    KvCache c(dev, cfg);
    fill_cache(st, c, k_, v_, len_, done_);
    for (std::int64_t t = 0; t < s_.steps; ++t) {
      const auto pos = positions(t);
      for (std::int64_t l = 0; l < s_.layers; ++l) {
        Buffer<float> kn(dev, kn_[std::size_t(t)][std::size_t(l)].size()), vn(dev, kn.size());
        kn.copy_from_host(st, kn_[std::size_t(t)][std::size_t(l)]);
        vn.copy_from_host(st, vn_[std::size_t(t)][std::size_t(l)]);
        c.append(st, l, kn, vn, pos);
      }
    }
    Run r;
    for (std::int64_t l = 0; l < s_.layers; ++l) {
      const auto k = c.k(l).to_vector(st), v = c.v(l).to_vector(st);
      r.out.insert(r.out.end(), k.begin(), k.end());
      r.out.insert(r.out.end(), v.begin(), v.end());
    }
    append_lengths(r.out, c);
    r.unwritten = count_poison(r.out);
    return r;
  }
  OracleReport check(const Run& r) const override {
    std::vector<float> want;
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        auto layer = kv ? v_[std::size_t(l)] : k_[std::size_t(l)];
        for (std::int64_t t = 0; t < s_.steps; ++t) {
          const auto& src = kv ? vn_[std::size_t(t)][std::size_t(l)] : kn_[std::size_t(t)][std::size_t(l)];
          const auto pos = positions(t);
          for (std::int64_t m = 0; m < s_.slots; ++m) {
            if (done_[std::size_t(m)]) continue;
            for (std::int64_t h = 0; h < s_.kv_heads; ++h)
              std::copy_n(src.begin() + std::ptrdiff_t((m * s_.kv_heads + h) * s_.dim), s_.dim,
                          layer.begin() + std::ptrdiff_t(g_.at(m, h, pos[std::size_t(m)])));
          }
        }
        want.insert(want.end(), layer.begin(), layer.end());
      }
    for (std::int64_t m = 0; m < s_.slots; ++m) {
      want.push_back(float(len_[std::size_t(m)] + (done_[std::size_t(m)] ? 0 : s_.steps)));
      want.push_back(done_[std::size_t(m)] ? 1.0f : 0.0f);
    }
    OracleReport rep;
    expect_bits(rep, r.out, want, "cache (layers x K,V) then lengths");
    return rep;
  }

 private:
  AppendShape s_;
  Geometry g_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::int64_t> len_;
  std::vector<bool> done_;
  std::vector<std::vector<std::vector<float>>> kn_, vn_;  // [step][layer]
};

// --- KvCache::copy_slot_from --------------------------------------------------------------------

class CopySlotCase final : public Case {
 public:
  explicit CopySlotCase(const CopySlotShape& s)
      : s_(s), gs_{s.kv_heads, s.src_max_len, s.dim}, gd_{s.kv_heads, s.dst_max_len, s.dim} {
    sk_ = layers_of(s.seed, s.layers, std::size_t(s.src_slots) * gs_.slot_elems());
    sv_ = layers_of(s.seed + 100, s.layers, sk_[0].size());
    dk_ = layers_of(s.seed + 200, s.layers, std::size_t(s.dst_slots) * gd_.slot_elems());
    dv_ = layers_of(s.seed + 300, s.layers, dk_[0].size());
    std::mt19937_64 r(s.seed + 400);
    const std::int64_t longest = std::min(s.src_max_len, s.dst_max_len);
    for (std::int64_t m = 0; m < s.src_slots; ++m) {
      // Lengths 0 and `longest` are drawn often (empty and full copies).
      const int e = std::uniform_int_distribution<int>(0, 5)(r);
      slen_.push_back(e == 0 ? 0 : e == 1 ? longest : std::uniform_int_distribution<std::int64_t>(0, longest)(r));
    }
    for (std::int64_t m = 0; m < s.dst_slots; ++m) {
      dlen_.push_back(std::uniform_int_distribution<std::int64_t>(0, s.dst_max_len)(r));
      ddone_.push_back(std::uniform_int_distribution<int>(0, 3)(r) == 0);
    }
    for (std::int64_t i = 0; i < s.copies; ++i)
      copies_.emplace_back(std::uniform_int_distribution<std::int64_t>(0, s.dst_slots - 1)(r),
                           std::uniform_int_distribution<std::int64_t>(0, s.src_slots - 1)(r));
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "KvCache::copy_slot_from layers=" << s_.layers << " kv_heads=" << s_.kv_heads << " dim=" << s_.dim
       << " src " << s_.src_slots << "x" << s_.src_max_len << " -> dst " << s_.dst_slots << "x" << s_.dst_max_len
       << " copies=[";
    for (std::size_t i = 0; i < copies_.size(); ++i)
      os << (i ? "," : "") << copies_[i].first << "<-" << copies_[i].second << "(" << slen_[std::size_t(copies_[i].second)] << ")";
    os << "] seed=" << s_.seed;
    return os.str();
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    KvCacheConfig cs;
    cs.num_layers = s_.layers;
    cs.num_heads = cs.num_kv_heads = s_.kv_heads;
    cs.head_dim = s_.dim;
    cs.max_len = s_.src_max_len;
    cs.slots = s_.src_slots;
    KvCacheConfig cd = cs;
    cd.max_len = s_.dst_max_len;
    cd.slots = s_.dst_slots;
    KvCache src(dev, cs), dst(dev, cd);
    fill_cache(st, src, sk_, sv_, slen_, std::vector<bool>(std::size_t(s_.src_slots), false));
    fill_cache(st, dst, dk_, dv_, dlen_, ddone_);
    for (const auto& [d, s] : copies_) dst.copy_slot_from(st, d, src, s);
    Run r;
    for (std::int64_t l = 0; l < s_.layers; ++l) {
      const auto k = dst.k(l).to_vector(st), v = dst.v(l).to_vector(st);
      r.out.insert(r.out.end(), k.begin(), k.end());
      r.out.insert(r.out.end(), v.begin(), v.end());
    }
    append_lengths(r.out, dst);
    r.unwritten = count_poison(r.out);
    return r;
  }
  OracleReport check(const Run& r) const override {
    std::vector<float> want;
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        auto layer = kv ? dv_[std::size_t(l)] : dk_[std::size_t(l)];
        const auto& src = kv ? sv_[std::size_t(l)] : sk_[std::size_t(l)];
        for (const auto& [d, s] : copies_)
          for (std::int64_t h = 0; h < s_.kv_heads; ++h)
            std::copy_n(src.begin() + std::ptrdiff_t(gs_.at(s, h, 0)), slen_[std::size_t(s)] * s_.dim,
                        layer.begin() + std::ptrdiff_t(gd_.at(d, h, 0)));
        want.insert(want.end(), layer.begin(), layer.end());
      }
    auto len = dlen_;
    auto done = ddone_;
    for (const auto& [d, s] : copies_) len[std::size_t(d)] = slen_[std::size_t(s)], done[std::size_t(d)] = false;
    for (std::int64_t m = 0; m < s_.dst_slots; ++m) {
      want.push_back(float(len[std::size_t(m)]));
      want.push_back(done[std::size_t(m)] ? 1.0f : 0.0f);
    }
    OracleReport rep;
    expect_bits(rep, r.out, want, "destination cache (layers x K,V) then lengths");
    return rep;
  }

 private:
  CopySlotShape s_;
  Geometry gs_, gd_;
  std::vector<std::vector<float>> sk_, sv_, dk_, dv_;
  std::vector<std::int64_t> slen_, dlen_;
  std::vector<bool> ddone_;
  std::vector<std::pair<std::int64_t, std::int64_t>> copies_;
};

// --- KvCache::grow ------------------------------------------------------------------------------

class GrowCase final : public Case {
 public:
  explicit GrowCase(const GrowShape& s) : s_(s), g_{s.kv_heads, s.max_len, s.dim} {
    k_ = layers_of(s.seed, s.layers, std::size_t(s.slots) * g_.slot_elems());
    v_ = layers_of(s.seed + 100, s.layers, k_[0].size());
    std::mt19937_64 r(s.seed + 200);
    for (std::int64_t m = 0; m < s.slots; ++m) {
      len_.push_back(std::uniform_int_distribution<std::int64_t>(0, s.max_len - 1)(r));
      done_.push_back(std::uniform_int_distribution<int>(0, 4)(r) == 0);
    }
    const std::size_t tok = std::size_t(s.new_slots * s.kv_heads * s.dim);
    kn_ = layers_of(s.seed + 300, s.layers, tok);
    vn_ = layers_of(s.seed + 400, s.layers, tok);
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "KvCache::grow layers=" << s_.layers << " slots " << s_.slots << " -> " << s_.new_slots
       << " kv_heads=" << s_.kv_heads << " dim=" << s_.dim << " max_len=" << s_.max_len << " seed=" << s_.seed;
    return os.str();
  }
  std::vector<std::int64_t> positions() const {
    std::vector<std::int64_t> p(std::size_t(s_.new_slots), 0);
    for (std::int64_t m = 0; m < s_.slots; ++m) p[std::size_t(m)] = len_[std::size_t(m)];
    return p;
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    KvCacheConfig cfg;
    cfg.num_layers = s_.layers;
    cfg.num_heads = cfg.num_kv_heads = s_.kv_heads;
    cfg.head_dim = s_.dim;
    cfg.max_len = s_.max_len;
    cfg.slots = s_.slots;
    KvCache c(dev, cfg);
    fill_cache(st, c, k_, v_, len_, done_);
    c.grow(st, s_.new_slots);
    const auto pos = positions();
    for (std::int64_t l = 0; l < s_.layers; ++l) {
      Buffer<float> kn(dev, kn_[std::size_t(l)].size()), vn(dev, kn.size());
      kn.copy_from_host(st, kn_[std::size_t(l)]);
      vn.copy_from_host(st, vn_[std::size_t(l)]);
      c.append(st, l, kn, vn, pos);
    }
    Run r;
    const std::size_t old = std::size_t(s_.slots) * g_.slot_elems();
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        const auto b = (kv ? c.v(l) : c.k(l)).to_vector(st);
        r.out.insert(r.out.end(), b.begin(), b.begin() + std::ptrdiff_t(old));  // the old slots, whole
        for (std::int64_t m = s_.slots; m < s_.new_slots; ++m)  // the new slots' first token
          for (std::int64_t h = 0; h < s_.kv_heads; ++h)
            r.out.insert(r.out.end(), b.begin() + std::ptrdiff_t(g_.at(m, h, 0)),
                         b.begin() + std::ptrdiff_t(g_.at(m, h, 0) + std::size_t(s_.dim)));
      }
    append_lengths(r.out, c);
    r.unwritten = count_poison(r.out);
    return r;
  }
  OracleReport check(const Run& r) const override {
    std::vector<float> want;
    const auto pos = positions();
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        auto layer = kv ? v_[std::size_t(l)] : k_[std::size_t(l)];
        const auto& src = kv ? vn_[std::size_t(l)] : kn_[std::size_t(l)];
        layer.resize(std::size_t(s_.new_slots) * g_.slot_elems());
        for (std::int64_t m = 0; m < s_.new_slots; ++m) {
          if (m < s_.slots && done_[std::size_t(m)]) continue;
          for (std::int64_t h = 0; h < s_.kv_heads; ++h)
            std::copy_n(src.begin() + std::ptrdiff_t((m * s_.kv_heads + h) * s_.dim), s_.dim,
                        layer.begin() + std::ptrdiff_t(g_.at(m, h, pos[std::size_t(m)])));
        }
        want.insert(want.end(), layer.begin(), layer.begin() + std::ptrdiff_t(std::size_t(s_.slots) * g_.slot_elems()));
        for (std::int64_t m = s_.slots; m < s_.new_slots; ++m)
          for (std::int64_t h = 0; h < s_.kv_heads; ++h)
            want.insert(want.end(), layer.begin() + std::ptrdiff_t(g_.at(m, h, 0)),
                        layer.begin() + std::ptrdiff_t(g_.at(m, h, 0) + std::size_t(s_.dim)));
      }
    for (std::int64_t m = 0; m < s_.new_slots; ++m) {
      const bool old = m < s_.slots, d = old && done_[std::size_t(m)];
      want.push_back(float(old ? len_[std::size_t(m)] + (d ? 0 : 1) : 1));
      want.push_back(d ? 1.0f : 0.0f);
    }
    OracleReport rep;
    expect_bits(rep, r.out, want, "grown cache (old slots whole, new slots' first token) then lengths");
    return rep;
  }

 private:
  GrowShape s_;
  Geometry g_;
  std::vector<std::vector<float>> k_, v_, kn_, vn_;
  std::vector<std::int64_t> len_;
  std::vector<bool> done_;
};

// --- flash_decoding -----------------------------------------------------------------------------

// The world's cache tokens [0, n[s]) of every slot and kv head, K then V, from a cache's layer 0.
std::vector<float> cache_tokens(Stream& st, const KvCache& c, const std::vector<std::int64_t>& n) {
  const auto& cfg = c.config();
  const Geometry g{cfg.num_kv_heads, cfg.max_len, cfg.head_dim};
  std::vector<float> r;
  for (int kv = 0; kv < 2; ++kv) {
    const auto b = (kv ? c.v(0) : c.k(0)).to_vector(st);
    for (std::int64_t s = 0; s < cfg.slots; ++s)
      for (std::int64_t h = 0; h < g.Hk; ++h)
        r.insert(r.end(), b.begin() + std::ptrdiff_t(g.at(s, h, 0)),
                 b.begin() + std::ptrdiff_t(g.at(s, h, 0) + std::size_t(n[std::size_t(s)] * g.D)));
  }
  return r;
}

// What those tokens must hold: the world's cache, with slot s's new token at pos[s] (< 0: none).
std::vector<float> expected_tokens(const harness::DecodeWorld& w, const std::vector<std::int64_t>& n,
                                   const std::vector<std::int64_t>& pos) {
  const auto& sh = w.shape;
  const Geometry g{sh.kv_heads, sh.max_len, sh.dim};
  std::vector<float> r;
  for (int kv = 0; kv < 2; ++kv) {
    const auto& old = kv ? w.v : w.k;
    const auto& fresh = kv ? w.v_new : w.k_new;
    for (std::int64_t s = 0; s < sh.slots; ++s)
      for (std::int64_t h = 0; h < g.Hk; ++h)
        for (std::int64_t t = 0; t < n[std::size_t(s)]; ++t)
          for (std::int64_t d = 0; d < g.D; ++d)
            r.push_back(t == pos[std::size_t(s)] ? fresh[std::size_t((s * g.Hk + h) * g.D + d)]
                                                  : old[g.at(s, h, t) + std::size_t(d)]);
  }
  return r;
}

// Slot s's query heads against tokens [0, p) of the world's cache and the new token at p.
void check_slot(OracleReport& rep, const harness::DecodeWorld& w, std::int64_t s, std::int64_t p,
                const float* out) {
  const auto& sh = w.shape;
  const std::int64_t Hk = sh.kv_heads, D = sh.dim, H = sh.heads, L = sh.max_len, grp = H / Hk, n = p + 1;
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t hk = h / grp;
    std::vector<float> kk(std::size_t(n * D)), vv(std::size_t(n * D));
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t d = 0; d < D; ++d) {
        const bool fresh = t == p;
        kk[std::size_t(t * D + d)] = fresh ? w.k_new[std::size_t((s * Hk + hk) * D + d)]
                                           : w.k[std::size_t(((s * Hk + hk) * L + t) * D + d)];
        vv[std::size_t(t * D + d)] = fresh ? w.v_new[std::size_t((s * Hk + hk) * D + d)]
                                           : w.v[std::size_t(((s * Hk + hk) * L + t) * D + d)];
      }
    check_attention(rep, w.q.data() + (s * H + h) * D, kk, vv, n, D, out + (s * H + h) * D,
                    "slot " + std::to_string(s) + " head " + std::to_string(h));
  }
}

std::string world_text(const harness::DecodeWorld& w) {
  std::ostringstream os;
  os << "slots=" << w.shape.slots << " heads=" << w.shape.heads << " kv_heads=" << w.shape.kv_heads
     << " dim=" << w.shape.dim << " max_len=" << w.shape.max_len << " seed=" << w.shape.seed;
  return os.str();
}

class FlashCacheCase final : public Case {
 public:
  explicit FlashCacheCase(const harness::DecodeWorldShape& s) : w_(s) {
    for (std::int64_t m = 0; m < s.slots; ++m) {
      const bool d = w_.done[std::size_t(m)];
      n_.push_back(w_.lengths[std::size_t(m)] + (d ? 0 : 1));
      pos_.push_back(d ? -1 : w_.lengths[std::size_t(m)]);
    }
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "flash_decoding " << world_text(w_) << " lengths=[";
    for (std::size_t i = 0; i < w_.lengths.size(); ++i)
      os << (i ? "," : "") << w_.lengths[i] << (w_.done[i] ? "(done)" : "");
    os << "]";
    return os.str();
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto cache = w_.make_cache(dev);
    auto& st = dev->default_stream();
    Buffer<float> q(dev, w_.q.size()), kn(dev, w_.k_new.size()), vn(dev, w_.v_new.size()), out(dev, w_.q.size());
    q.copy_from_host(st, w_.q);
    kn.copy_from_host(st, w_.k_new);
    vn.copy_from_host(st, w_.v_new);
    harness::poison(st, out);
    flash_decoding(st, cache, 0, q, kn, vn, w_.lengths, out);
    Run r = harness::collect(st, out);
    // Note [fused append]: the chunk kernel wrote the new tokens; below each slot's new length
    // every token is defined (past it, CUDA memory is uninitialized), so those are compared too.
    const auto tokens = cache_tokens(st, cache, n_);
    r.out.insert(r.out.end(), tokens.begin(), tokens.end());
    for (std::int64_t m = 0; m < cache.slots(); ++m) r.out.push_back(float(cache.length(m)));
    return r;
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const auto& sh = w_.shape;
    const std::size_t per = std::size_t(sh.heads * sh.dim), nout = std::size_t(sh.slots) * per;
    for (std::int64_t m = 0; m < sh.slots; ++m) {
      const float* o = r.out.data() + std::size_t(m) * per;
      if (w_.done[std::size_t(m)]) check_zeros(rep, o, std::int64_t(per), "done slot " + std::to_string(m));
      else check_slot(rep, w_, m, w_.lengths[std::size_t(m)], r.out.data());
    }
    auto want = expected_tokens(w_, n_, pos_);
    for (std::int64_t m = 0; m < sh.slots; ++m) want.push_back(float(n_[std::size_t(m)]));
    expect_bits(rep, std::vector<float>(r.out.begin() + std::ptrdiff_t(std::min(nout, r.out.size())), r.out.end()), want,
                "cache tokens below each slot's new length (K then V), then lengths");
    return rep;
  }

 private:
  harness::DecodeWorld w_;
  std::vector<std::int64_t> n_, pos_;
};

class DevicePositionsCase final : public Case {
 public:
  explicit DevicePositionsCase(DevicePositionsShape s) : w_([&] {
    s.world.done.assign(std::size_t(s.world.slots), false);  // device positions ignore done flags
    return s.world;
  }()) {
    const auto& sh = w_.shape;
    pos_.assign(w_.lengths.begin(), w_.lengths.end());
    std::mt19937_64 g(sh.seed + 77);
    std::vector<std::int64_t> order(std::size_t(sh.slots));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), g);
    std::size_t next = 0;
    // The first slot keeps its length (a plain step) where there are other slots to vary.
    if (sh.slots > 1) ++next;
    if (s.with_skip && next < order.size()) pos_[std::size_t(order[next++])] = -1;
    if (s.with_out_of_range && next < order.size()) {
      oob_ = order[next++];
      static const std::int64_t bad[] = {0, -2, 1 << 30};
      const int b = std::uniform_int_distribution<int>(0, 2)(g);
      pos_[std::size_t(oob_)] = b == 0 ? sh.max_len : bad[b];
    }
    if (s.with_rewind && next < order.size() && w_.lengths[std::size_t(order[next])] > 0) {
      const std::int64_t m = order[next++];
      pos_[std::size_t(m)] = std::uniform_int_distribution<std::int64_t>(0, w_.lengths[std::size_t(m)] - 1)(g);
    }
    for (std::int64_t m = 0; m < sh.slots; ++m) {
      const std::int64_t p = pos_[std::size_t(m)], len = w_.lengths[std::size_t(m)];
      const bool ok = p >= 0 && p < sh.max_len;
      n_.push_back(ok ? std::max(len, p + 1) : len);
      written_.push_back(ok ? p : -1);
    }
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "flash_decoding (device positions, status) " << world_text(w_) << " lengths/positions=[";
    for (std::size_t i = 0; i < w_.lengths.size(); ++i) os << (i ? "," : "") << w_.lengths[i] << "/" << pos_[i];
    os << "]";
    return os.str();
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto cache = w_.make_cache(dev);
    auto& st = dev->default_stream();
    Buffer<float> q(dev, w_.q.size()), kn(dev, w_.k_new.size()), vn(dev, w_.v_new.size()), out(dev, w_.q.size());
    q.copy_from_host(st, w_.q);
    kn.copy_from_host(st, w_.k_new);
    vn.copy_from_host(st, w_.v_new);
    harness::poison(st, out);
    std::vector<std::int32_t> p32(pos_.size());
    for (std::size_t i = 0; i < pos_.size(); ++i)
      p32[i] = std::int32_t(std::clamp<std::int64_t>(pos_[i], INT32_MIN, INT32_MAX));
    Buffer<std::int32_t> pos(dev, p32.size()), status(dev, 1);
    pos.copy_from_host(st, p32);
    const std::vector<std::int32_t> zero{0};
    status.copy_from_host(st, zero);
    flash_decoding(st, cache, 0, q, kn, vn, pos, out, &status);
    Run r = harness::collect(st, out);
    r.out.push_back(int_as_float(status.to_vector(st)[0]));
    const auto tokens = cache_tokens(st, cache, n_);
    r.out.insert(r.out.end(), tokens.begin(), tokens.end());
    return r;
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const auto& sh = w_.shape;
    const std::size_t per = std::size_t(sh.heads * sh.dim), nout = std::size_t(sh.slots) * per;
    for (std::int64_t m = 0; m < sh.slots; ++m) {
      const std::int64_t p = written_[std::size_t(m)];
      if (p < 0) check_zeros(rep, r.out.data() + std::size_t(m) * per, std::int64_t(per),
                             "skipped slot " + std::to_string(m) + " (position " + std::to_string(pos_[std::size_t(m)]) + ")");
      else check_slot(rep, w_, m, p, r.out.data());
    }
    std::int32_t status;
    std::memcpy(&status, r.out.data() + nout, 4);
    const std::int32_t want_status = oob_ >= 0 ? std::int32_t(1 + oob_) : 0;
    if (status != want_status)
      violation(rep, "status " + std::to_string(status) + ", expected " + std::to_string(want_status));
    expect_bits(rep, std::vector<float>(r.out.begin() + std::ptrdiff_t(nout + 1), r.out.end()),
                expected_tokens(w_, n_, written_), "cache tokens below each slot's new length (K then V)");
    return rep;
  }

 private:
  harness::DecodeWorld w_;
  std::vector<std::int64_t> pos_, n_, written_;
  std::int64_t oob_ = -1;
};

// --- rope ---------------------------------------------------------------------------------------

// The harness's RopeCase (proptests/harness/harness_decode.cpp) with the same inputs and bound,
// and the relative error recorded.
class RopeRelCase final : public Case {
 public:
  explicit RopeRelCase(const harness::RopeCaseShape& s) : s_(s) {
    q_ = harness::uniform(s.seed, std::size_t(s.rows * s.heads * s.dim), -2.0f, 2.0f);
    k_ = harness::uniform(s.seed + 1, std::size_t(s.rows * s.kv_heads * s.dim), -2.0f, 2.0f);
    std::mt19937_64 g(s.seed + 2);
    pos_.resize(std::size_t(s.rows));
    for (auto& p : pos_) p = std::uniform_int_distribution<std::int64_t>(0, s.max_pos)(g);
  }
  std::string describe() const override {
    return "rope rows=" + std::to_string(s_.rows) + " heads=" + std::to_string(s_.heads) + "/" +
           std::to_string(s_.kv_heads) + " dim=" + std::to_string(s_.dim) + " theta=" + std::to_string(s_.theta) +
           (s_.neox ? " neox" : " norm") + " max_pos=" + std::to_string(s_.max_pos);
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    Buffer<float> q(dev, q_.size()), k(dev, k_.size());
    q.copy_from_host(st, q_);
    k.copy_from_host(st, k_);
    RopeConfig c{s_.heads, s_.kv_heads, s_.dim, s_.theta, s_.neox ? RopeStyle::kNeox : RopeStyle::kNorm};
    rope(st, &q, &k, pos_, c);
    Run r = harness::collect(st, q);
    const Run rk = harness::collect(st, k);
    r.out.insert(r.out.end(), rk.out.begin(), rk.out.end());
    r.unwritten += rk.unwritten;
    return r;
  }
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
            // Note [rope bound] (docs/numerics.md), as the harness's case.
            const double bound = (std::fabs(a) + std::fabs(b)) * ((8.0 * double(pos_[std::size_t(row)] + 1) + 16.0) * 0x1p-24);
            for (int c = 0; c < 2; ++c) {
              const double ref = c ? rb : ra;
              const float got = r.out[base + (c ? ib : ia)];
              const double err = std::fabs(double(got) - ref);
              rep.max_ulp = std::max(rep.max_ulp, harness::ulp_distance(got, ref));
              if (std::fabs(ref) > kRelFloor) rep.max_rel = std::max(rep.max_rel, err / std::fabs(ref));
              if (bound > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / bound);
              if (!(err <= bound))
                violation(rep, "row " + std::to_string(row) + " pair " + std::to_string(i) + ": error " +
                                   std::to_string(err) + " > " + std::to_string(bound));
            }
          }
    };
    one(q_, s_.heads, 0);
    one(k_, s_.kv_heads, q_.size());
    return rep;
  }

 private:
  harness::RopeCaseShape s_;
  std::vector<float> q_, k_;
  std::vector<std::int64_t> pos_;
};

}  // namespace

std::unique_ptr<Case> append_case(const AppendShape& s) { return std::make_unique<AppendCase>(s); }
std::unique_ptr<Case> copy_slot_case(const CopySlotShape& s) { return std::make_unique<CopySlotCase>(s); }
std::unique_ptr<Case> grow_case(const GrowShape& s) { return std::make_unique<GrowCase>(s); }
std::unique_ptr<Case> flash_cache_case(const harness::DecodeWorldShape& s) {
  return std::make_unique<FlashCacheCase>(s);
}
std::unique_ptr<Case> device_positions_case(const DevicePositionsShape& s) {
  return std::make_unique<DevicePositionsCase>(s);
}
std::unique_ptr<Case> rope_rel_case(const harness::RopeCaseShape& s) { return std::make_unique<RopeRelCase>(s); }

}  // namespace lockstep::parity
