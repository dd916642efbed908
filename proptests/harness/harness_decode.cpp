// Harness cases of batched decoding: Flash-Decoding over a KV cache with many slots (host or
// device positions; the output and the cache tokens its chunk kernel appends), and RoPE.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <tuple>

#include "harness.hpp"
#include "harness_cache.hpp"
#include "harness_decode.hpp"
#include "harness_decode_formats.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/kernels/math.hpp"

namespace lockstep::harness {

DecodeWorld::DecodeWorld(const DecodeWorldShape& s) : shape(s), scale(softmax_scale_of(s.seed)) {
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
  q = uniform(s.seed + 3, std::size_t(M * s.heads * D), -s.q_scale, s.q_scale);
  k_new = uniform(s.seed + 4, std::size_t(M * Hk * D), -1.0f, 1.0f);
  v_new = uniform(s.seed + 5, std::size_t(M * Hk * D), -1.0f, 1.0f);
}

std::vector<float> DecodeWorld::layer_data(std::int64_t layer, int kv) const {
  if (layer == shape.layer) return kv ? v : k;
  return uniform(shape.seed + 1000 + std::uint64_t(2 * layer + kv), k.size(), -1.0f, 1.0f);
}

std::string DecodeWorld::text() const {
  std::ostringstream os;
  os << "slots=" << shape.slots << " heads=" << shape.heads << " kv_heads=" << shape.kv_heads
     << " dim=" << shape.dim << " max_len=" << shape.max_len;
  if (shape.layers > 1) os << " layer=" << shape.layer << "/" << shape.layers;
  if (shape.q_scale != 1.0f) os << " q_scale=" << shape.q_scale;
  if (scale != 0.0f) os << " scale=" << scale;
  os << " seed=" << shape.seed;
  return os.str();
}

DecodeOptions DecodeWorld::options() const {
  DecodeOptions o;
  if (scale != 0.0f) o.scale = scale;
  return o;
}

KvCacheConfig DecodeWorld::config() const {
  KvCacheConfig c;
  c.num_layers = shape.layers;
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
  const std::size_t per_slot = CacheGeometry{shape.kv_heads, shape.max_len, shape.dim}.slot_elems();
  for (std::int64_t l = 0; l < shape.layers; ++l) {
    const auto lk = layer_data(l, 0), lv = layer_data(l, 1);
    for (std::int64_t m = 0; m < shape.slots; ++m)
      // Write the whole slot (NaN past the length in the decoded layer), every layer.
      cache.write_from_host(st, m, l, std::span<const float>(lk).subspan(std::size_t(m) * per_slot, per_slot),
                            std::span<const float>(lv).subspan(std::size_t(m) * per_slot, per_slot), shape.max_len);
  }
  for (std::int64_t m = 0; m < shape.slots; ++m) {
    // Then roll back to the length.
    cache.rollback(m, lengths[std::size_t(m)]);
    if (done[std::size_t(m)]) cache.mark_done(m);
  }
  return cache;
}

DecodeWorld::Inputs DecodeWorld::upload(const std::shared_ptr<Device>& dev) const {
  auto& st = dev->default_stream();
  Inputs in{Buffer<float>(dev, q.size()), Buffer<float>(dev, k_new.size()), Buffer<float>(dev, v_new.size()),
            Buffer<float>(dev, q.size())};
  in.q.copy_from_host(st, q);
  in.k_new.copy_from_host(st, k_new);
  in.v_new.copy_from_host(st, v_new);
  poison(st, in.out);
  return in;
}

std::vector<float> DecodeWorld::decode(const std::shared_ptr<Device>& dev) const {
  auto cache = make_cache(dev);
  return decode(dev, cache);
}

std::vector<float> DecodeWorld::decode(const std::shared_ptr<Device>& dev, KvCache& cache) const {
  auto& st = dev->default_stream();
  auto in = upload(dev);
  flash_decoding(st, cache, shape.layer, in.q, in.k_new, in.v_new, lengths, in.out, options());
  return in.out.to_vector(st);
}

void DecodeWorld::check_slot(OracleReport& rep, std::int64_t s, std::int64_t pos, const float* out) const {
  const std::int64_t Hk = shape.kv_heads, L = shape.max_len, D = shape.dim, H = shape.heads;
  const std::int64_t g = H / Hk, n = pos + 1;
  if (pos < 0) {
    for (std::int64_t i = 0; i < H * D; ++i)
      if (float_bits(out[s * H * D + i]) != 0) {
        add_violation(rep, "slot " + std::to_string(s) + " (done or skipped): output not zero");
        return;
      }
    return;
  }
  for (std::int64_t h = 0; h < H; ++h) {
    const std::size_t o = std::size_t((s * H + h) * D);
    // The slot's tokens [0, pos) plus the new one, as one [n, D] sequence.
    std::vector<float> kk(std::size_t(n * D)), vv(std::size_t(n * D));
    const std::int64_t hk = h / g;
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t d = 0; d < D; ++d) {
        const bool fresh = t == pos;
        kk[std::size_t(t * D + d)] = fresh ? k_new[std::size_t((s * Hk + hk) * D + d)]
                                           : k[std::size_t(((s * Hk + hk) * L + t) * D + d)];
        vv[std::size_t(t * D + d)] = fresh ? v_new[std::size_t((s * Hk + hk) * D + d)]
                                           : v[std::size_t(((s * Hk + hk) * L + t) * D + d)];
      }
    const auto ref = attention_reference(q.data() + o, D, kk.data(), vv.data(), D, 1, n, D, false, scale);
    for (std::int64_t d = 0; d < D; ++d) {
      const double b = attention_bound_fp32(ref.pv_mag[std::size_t(d)], ref.qk_mag[0], n, D);
      const double r = ref.out[std::size_t(d)];
      const float got = out[o + std::size_t(d)];
      const double err = std::fabs(double(got) - r);
      rep.max_ulp = std::max(rep.max_ulp, ulp_distance(got, r));
      if (std::fabs(r) > kRelFloor) rep.max_rel = std::max(rep.max_rel, err / std::fabs(r));
      if (b > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / b);
      if (!(err <= b)) {
        std::ostringstream os;
        os << "slot " << s << " head " << h << " d " << d << ": got " << got << ", reference " << r
           << ", bound " << b;
        add_violation(rep, os.str());
      }
    }
  }
}

OracleReport DecodeWorld::check(const std::vector<float>& out) const {
  OracleReport rep;
  for (std::int64_t m = 0; m < shape.slots; ++m)
    check_slot(rep, m, done[std::size_t(m)] ? -1 : lengths[std::size_t(m)], out.data());
  return rep;
}

std::vector<float> DecodeWorld::expected_tokens(const std::vector<std::int64_t>& n,
                                                const std::vector<std::int64_t>& pos) const {
  const CacheGeometry g{shape.kv_heads, shape.max_len, shape.dim};
  std::vector<float> r;
  for (int kv = 0; kv < 2; ++kv) {
    const auto& old = kv ? v : k;
    const auto& fresh = kv ? v_new : k_new;
    for (std::int64_t s = 0; s < shape.slots; ++s)
      for (std::int64_t h = 0; h < g.Hk; ++h)
        for (std::int64_t t = 0; t < n[std::size_t(s)]; ++t)
          for (std::int64_t d = 0; d < g.D; ++d)
            r.push_back(t == pos[std::size_t(s)] ? fresh[std::size_t((s * g.Hk + h) * g.D + d)]
                                                  : old[g.at(s, h, t) + std::size_t(d)]);
  }
  return r;
}

namespace {

class FlashCase final : public Case {
 public:
  explicit FlashCase(const DecodeWorldShape& s) : w_(s) {
    for (std::int64_t m = 0; m < s.slots; ++m) {
      const bool d = w_.done[std::size_t(m)];
      n_.push_back(w_.lengths[std::size_t(m)] + (d ? 0 : 1));
      pos_.push_back(d ? -1 : w_.lengths[std::size_t(m)]);
    }
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "flash_decoding " << w_.text() << " lengths=[";
    for (std::size_t i = 0; i < w_.lengths.size(); ++i)
      os << (i ? "," : "") << w_.lengths[i] << (w_.done[i] ? "(done)" : "");
    os << "]";
    return os.str();
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto cache = w_.make_cache(dev);
    Run r;
    r.out = w_.decode(dev, cache);
    r.unwritten = count_poison(r.out);
    // Note [fused append]: the chunk kernel wrote the new tokens; below each slot's new length
    // every token is defined (past it, CUDA memory is uninitialized), so those are compared too.
    auto& st = dev->default_stream();
    const auto tokens = cache_tokens(st, cache, n_, w_.shape.layer);
    r.out.insert(r.out.end(), tokens.begin(), tokens.end());
    for (std::int64_t m = 0; m < cache.slots(); ++m) r.out.push_back(float(cache.length(m)));
    for (std::int64_t l = 0; l < w_.shape.layers; ++l)
      for (std::int64_t m = 0; m < cache.slots(); ++m) r.out.push_back(float(cache.length(m, l)));
    for (std::int64_t l = 0; l < w_.shape.layers; ++l)
      if (l != w_.shape.layer)
        for (int kv = 0; kv < 2; ++kv) {
          const auto b = (kv ? cache.v(l) : cache.k(l)).to_vector(st);
          r.out.insert(r.out.end(), b.begin(), b.end());
        }
    return r;
  }
  OracleReport check(const Run& r) const override {
    const std::size_t nout = w_.q.size();
    OracleReport rep = w_.check(r.out);
    auto want = w_.expected_tokens(n_, pos_);
    for (const auto n : n_) want.push_back(float(n));
    // Each layer's lengths: the decoded layer's grew with the slot's, the others' did not.
    for (std::int64_t l = 0; l < w_.shape.layers; ++l)
      for (std::size_t m = 0; m < n_.size(); ++m)
        want.push_back(float(l == w_.shape.layer ? n_[m] : w_.lengths[m]));
    for (std::int64_t l = 0; l < w_.shape.layers; ++l)
      if (l != w_.shape.layer)
        for (int kv = 0; kv < 2; ++kv) {
          const auto d = w_.layer_data(l, kv);
          want.insert(want.end(), d.begin(), d.end());
        }
    expect_bits(rep, std::vector<float>(r.out.begin() + std::ptrdiff_t(std::min(nout, r.out.size())), r.out.end()),
                want, "cache tokens below each slot's new length (K then V), the lengths, each layer's lengths, "
                      "the other layers' K and V");
    return rep;
  }

 private:
  DecodeWorld w_;
  std::vector<std::int64_t> n_, pos_;  // per slot: the new length, where the new token goes (-1: none)
};

float int_as_float(std::int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

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
    // One to three slots out of range (blocks that flag them may run in any order): the status
    // is 1 + the highest of them (Note [device positions]).
    if (s.with_out_of_range && next < order.size()) {
      const int n_bad = std::uniform_int_distribution<int>(1, 3)(g);
      for (int i = 0; i < n_bad && next < order.size(); ++i) {
        const std::int64_t m = order[next++];
        oob_ = std::max(oob_, m);
        static const std::int64_t bad[] = {0, -2, 1 << 30};
        const int b = std::uniform_int_distribution<int>(0, 2)(g);
        pos_[std::size_t(m)] = b == 0 ? sh.max_len : bad[b];
      }
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
    os << "flash_decoding (device positions, status) " << w_.text() << " lengths/positions=[";
    for (std::size_t i = 0; i < w_.lengths.size(); ++i) os << (i ? "," : "") << w_.lengths[i] << "/" << pos_[i];
    os << "]";
    return os.str();
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto cache = w_.make_cache(dev);
    auto& st = dev->default_stream();
    auto in = w_.upload(dev);
    std::vector<std::int32_t> p32(pos_.size());
    for (std::size_t i = 0; i < pos_.size(); ++i)
      p32[i] = std::int32_t(std::clamp<std::int64_t>(pos_[i], INT32_MIN, INT32_MAX));
    Buffer<std::int32_t> pos(dev, p32.size()), status(dev, 1);
    pos.copy_from_host(st, p32);
    const std::vector<std::int32_t> zero{0};
    status.copy_from_host(st, zero);
    DecodeOptions o = w_.options();
    o.status = &status;
    flash_decoding(st, cache, 0, in.q, in.k_new, in.v_new, pos, in.out, o);
    Run r = collect(st, in.out);
    r.out.push_back(int_as_float(status.to_vector(st)[0]));
    const auto tokens = cache_tokens(st, cache, n_);
    r.out.insert(r.out.end(), tokens.begin(), tokens.end());
    return r;
  }
  OracleReport check(const Run& r) const override {
    OracleReport rep;
    const std::size_t nout = w_.q.size();
    if (r.out.size() < nout + 1) {  // a malformed run: no output, status or tokens to read
      add_violation(rep, "the run returned " + std::to_string(r.out.size()) + " values, expected at least " +
                             std::to_string(nout + 1));
      return rep;
    }
    for (std::int64_t m = 0; m < w_.shape.slots; ++m) w_.check_slot(rep, m, written_[std::size_t(m)], r.out.data());
    std::int32_t status;
    std::memcpy(&status, r.out.data() + nout, 4);
    const std::int32_t want_status = oob_ >= 0 ? std::int32_t(1 + oob_) : 0;
    if (status != want_status)
      add_violation(rep, "status " + std::to_string(status) + ", expected " + std::to_string(want_status));
    expect_bits(rep, std::vector<float>(r.out.begin() + std::ptrdiff_t(nout + 1), r.out.end()),
                w_.expected_tokens(n_, written_), "cache tokens below each slot's new length (K then V)");
    return rep;
  }

 private:
  DecodeWorld w_;
  std::vector<std::int64_t> pos_, n_, written_;
  std::int64_t oob_ = -1;  // the highest out-of-range slot, or -1
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
           std::to_string(s_.theta) + (s_.neox ? " neox" : " norm") + " max_pos=" + std::to_string(s_.max_pos);
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
            // And at the kernel's own float angle (its freq and pos * freq, computed here with
            // the same functions and operations), where the only errors are sin and cos (2 ulp
            // each) and the rotation's roundings: a bound that does not grow with the position,
            // which an error in the rotation itself (a wrong sign, a swapped pair, a rope that
            // does nothing) cannot pass at any position but 0.
            const float freq_f = math::exp2(-(static_cast<float>(2 * i) * (1.0f / static_cast<float>(D))) *
                                            math::log2(s_.theta));
            const double ang_f = double(freq_f * static_cast<float>(pos_[std::size_t(row)]));
            const double fa = a * std::cos(ang_f) - b * std::sin(ang_f), fb = a * std::sin(ang_f) + b * std::cos(ang_f);
            const double fbound = (std::fabs(a) + std::fabs(b)) * (16.0 * 0x1p-24);
            for (int c = 0; c < 2; ++c) {
              const double ref = c ? rb : ra;
              const float got = r.out[base + (c ? ib : ia)];
              const double err = std::fabs(double(got) - ref);
              rep.max_ulp = std::max(rep.max_ulp, ulp_distance(got, ref));
              if (std::fabs(ref) > kRelFloor) rep.max_rel = std::max(rep.max_rel, err / std::fabs(ref));
              if (bound > 0) rep.max_bound_ratio = std::max(rep.max_bound_ratio, err / bound);
              if (!(err <= bound))
                add_violation(rep, "row " + std::to_string(row) + " pair " + std::to_string(i) + ": error " +
                                       std::to_string(err) + " > " + std::to_string(bound));
              const double ferr = std::fabs(double(got) - (c ? fb : fa));
              if (!(ferr <= fbound))
                add_violation(rep, "row " + std::to_string(row) + " pair " + std::to_string(i) +
                                       ": error at the kernel's float angle " + std::to_string(ferr) + " > " +
                                       std::to_string(fbound));
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
std::unique_ptr<Case> device_positions_case(const DevicePositionsShape& s) {
  return std::make_unique<DevicePositionsCase>(s);
}
std::unique_ptr<Case> rope_case(const RopeCaseShape& s) { return std::make_unique<RopeCase>(s); }

namespace {

// The random worlds of both Flash-Decoding entries (the seed is drawn by the caller).
DecodeWorldShape draw_world(std::mt19937_64& g, std::int64_t max_slots) {
  DecodeWorldShape s;
  s.dim = draw_head_dim(g);
  s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
  s.heads = s.kv_heads * std::uniform_int_distribution<std::int64_t>(1, 4)(g);
  s.slots = std::uniform_int_distribution<std::int64_t>(1, max_slots)(g);
  // One world in five up to 2500 tokens (up to 10 chunks: with device positions the merge covers
  // the cache's capacity, which at most 700 kept within 3 chunks).
  s.max_len = std::uniform_int_distribution<int>(0, 4)(g) == 0 ? 700 + draw_size(g, 1800) : draw_size(g, 700);
  return s;
}

DecodeWorldShape world(std::int64_t slots, std::int64_t heads, std::int64_t kv_heads, std::int64_t dim,
                       std::int64_t max_len, std::vector<std::int64_t> lengths, std::vector<bool> done,
                       std::uint64_t seed) {
  DecodeWorldShape s;
  s.slots = slots, s.heads = heads, s.kv_heads = kv_heads, s.dim = dim, s.max_len = max_len;
  s.lengths = std::move(lengths), s.done = std::move(done), s.seed = seed;
  return s;
}

std::unique_ptr<Case> device_positions(DecodeWorldShape w) {
  DevicePositionsShape s;
  s.world = std::move(w);
  return device_positions_case(s);
}

}  // namespace

// The fixed large shapes reach variants that attention/src/decode_launch.cpp picks only for large
// grids (H200: 132 SMs; the CPU device: one "multiprocessor" per worker thread).
std::vector<KernelEntry> decode_entries() {
  const std::vector<bool> last_done = {false, false, false, false, true};
  return {
      {"flash_decoding",
       [](std::mt19937_64& g) {
         DecodeWorldShape s = draw_world(g, 5);
         s.seed = g();
         return flash_case(s);
       },
       // Host positions: max_chunks follows the longest position.
       {// 4 query heads per block, 4 chunks (not folded: 4 x 4 > 8), 32 x 5 merge blocks >= 132:
        // DecodeMerge<128, 2> (max_chunks <= 8).
        [=] { return flash_case(world(5, 32, 2, 128, 1024, {1023, 600, 7, 0, 300}, last_done, 11)); },
        // 9 chunks: DecodeMerge<128, 4> (max_chunks <= 16).
        [=] { return flash_case(world(5, 32, 2, 128, 2304, {2303, 1100, 256, 1, 2000}, last_done, 12)); },
        // 8 query heads per block (DecodeChunk<64, 8>), 10 chunks: not folded (one grid: its pair).
        [] { return flash_case(world(3, 8, 1, 64, 2400, {2399, 513, 0}, {false, false, false}, 13)); },
        // One head per block at 128 (DecodeChunk<128, 1, 2, 3>), 9 chunks: not folded.
        [] { return flash_case(world(2, 3, 3, 128, 2304, {2303, 10}, {false, false}, 14)); },
        // head_dim 256, 2 heads per block, 6 chunks: not folded.
        [] { return flash_case(world(2, 4, 2, 256, 1300, {1299, 40}, {false, false}, 15)); },
        // 130 slots: more than kInlineRows (128), so the positions are copied to the device.
        [] { return flash_case(world(130, 2, 1, 32, 40, {}, {}, 16)); }},
       true},
      {"flash_decoding_formats",
       [](std::mt19937_64& g) {
         FormatWorldShape s;
         s.world = draw_world(g, 5);
         s.act = Format(std::uniform_int_distribution<int>(0, 2)(g));
         s.cache = Format(std::uniform_int_distribution<int>(0, 4)(g));
         s.world.seed = g();
         if (const auto f = fixed_decode_formats()) std::tie(s.act, s.cache) = *f;
         return format_flash_case(s);
       },
       {[] {  // bfloat16 with an fp8 cache, 4 heads per block, 9 chunks
          FormatWorldShape s;
          s.world = world(5, 32, 2, 128, 2304, {2303, 1100, 256, 1, 2000}, {false, false, false, false, true}, 17);
          return format_flash_case(s);
        }},
       true},
      {"flash_decoding_device_positions",
       [](std::mt19937_64& g) {
         DevicePositionsShape s;
         s.world = draw_world(g, 6);
         s.with_skip = std::uniform_int_distribution<int>(0, 3)(g) != 0;
         s.with_out_of_range = std::uniform_int_distribution<int>(0, 3)(g) != 0;
         s.with_rewind = std::uniform_int_distribution<int>(0, 1)(g) != 0;
         s.world.seed = g();
         return device_positions_case(s);
       },
       // Device positions: max_chunks follows the cache's capacity.
       {[] { return device_positions(world(5, 32, 2, 128, 1024, {1023, 600, 7, 0, 300}, {}, 21)); },  // DecodeMerge<128, 2>
        [] { return device_positions(world(5, 32, 2, 128, 2304, {2303, 1100, 256, 1, 2000}, {}, 22)); },  // DecodeMerge<128, 4>
        [] { return device_positions(world(3, 8, 1, 64, 2400, {2399, 513, 0}, {}, 23)); },
        [] { return device_positions(world(130, 2, 1, 32, 40, {}, {}, 24)); }},  // positions past kInlineRows
       true},
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
