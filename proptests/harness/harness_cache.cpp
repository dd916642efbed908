// Harness cases of the KV-cache operations: KvCache::append, copy_slot_from and grow, each
// against a host model of the cache (copies are exact: every compared element bit for bit).

#include "harness_cache.hpp"

#include <algorithm>
#include <sstream>
#include <string>

namespace lockstep::harness {

std::vector<float> cache_tokens(Stream& st, const KvCache& c, const std::vector<std::int64_t>& n, std::int64_t layer) {
  const auto& cfg = c.config();
  const CacheGeometry g{cfg.num_kv_heads, cfg.max_len, cfg.head_dim};
  std::vector<float> r;
  for (int kv = 0; kv < 2; ++kv) {
    const auto b = (kv ? c.v(layer) : c.k(layer)).to_vector(st);
    for (std::int64_t s = 0; s < cfg.slots; ++s)
      for (std::int64_t h = 0; h < g.Hk; ++h)
        r.insert(r.end(), b.begin() + std::ptrdiff_t(g.at(s, h, 0)),
                 b.begin() + std::ptrdiff_t(g.at(s, h, 0) + std::size_t(n[std::size_t(s)] * g.D)));
  }
  return r;
}

namespace {

KvCacheConfig cache_config(std::int64_t layers, std::int64_t kv_heads, std::int64_t dim, std::int64_t max_len,
                           std::int64_t slots) {
  KvCacheConfig c;
  c.num_layers = layers;
  c.num_heads = c.num_kv_heads = kv_heads;
  c.head_dim = dim;
  c.max_len = max_len;
  c.slots = slots;
  return c;
}

// Writes every byte of slot s of every layer from host (whole slots), then sets the lengths and
// done flags.
void fill_cache(Stream& st, KvCache& c, const std::vector<std::vector<float>>& k,
                const std::vector<std::vector<float>>& v, const std::vector<std::int64_t>& len,
                const std::vector<bool>& done) {
  const auto& cfg = c.config();
  const std::size_t n = CacheGeometry{cfg.num_kv_heads, cfg.max_len, cfg.head_dim}.slot_elems();
  for (std::int64_t s = 0; s < cfg.slots; ++s) {
    for (std::int64_t l = 0; l < cfg.num_layers; ++l)
      c.write_from_host(st, s, l, std::span<const float>(k[std::size_t(l)]).subspan(std::size_t(s) * n, n),
                        std::span<const float>(v[std::size_t(l)]).subspan(std::size_t(s) * n, n), cfg.max_len);
    c.rollback(s, len[std::size_t(s)]);
    if (done[std::size_t(s)]) c.mark_done(s);
  }
}

// Per slot: the length and the done flag (1 or 0).
void push_lengths(std::vector<float>& out, const std::vector<std::int64_t>& len, const std::vector<bool>& done) {
  for (std::size_t s = 0; s < len.size(); ++s) {
    out.push_back(float(len[s]));
    out.push_back(done[s] ? 1.0f : 0.0f);
  }
}
void push_lengths(std::vector<float>& out, const KvCache& c) {
  std::vector<bool> done;
  for (std::int64_t s = 0; s < c.slots(); ++s) done.push_back(c.done(s));
  push_lengths(out, c.lengths(), done);
}

// Every layer's K then V, whole, then the lengths.
Run whole_cache(Stream& st, const KvCache& c) {
  Run r;
  for (std::int64_t l = 0; l < c.config().num_layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      const auto b = (kv ? c.v(l) : c.k(l)).to_vector(st);
      r.out.insert(r.out.end(), b.begin(), b.end());
    }
  push_lengths(r.out, c);
  r.unwritten = count_poison(r.out);
  return r;
}

std::vector<std::vector<float>> layers_of(std::uint64_t seed, std::int64_t layers, std::size_t n) {
  std::vector<std::vector<float>> r;
  for (std::int64_t l = 0; l < layers; ++l) r.push_back(uniform(seed + std::uint64_t(l), n, -1.0f, 1.0f));
  return r;
}

// Writes token src [slot, kv_heads, dim] of slot m into a host layer at position pos.
void put_token(std::vector<float>& layer, const CacheGeometry& g, const std::vector<float>& src, std::int64_t m,
               std::int64_t pos) {
  for (std::int64_t h = 0; h < g.Hk; ++h)
    std::copy_n(src.begin() + std::ptrdiff_t((m * g.Hk + h) * g.D), g.D, layer.begin() + std::ptrdiff_t(g.at(m, h, pos)));
}

// Appends each layer's token (k_new, v_new: [layer][slots * kv_heads * dim]) at `pos`.
void append_layers(const std::shared_ptr<Device>& dev, KvCache& c, const std::vector<std::vector<float>>& k_new,
                   const std::vector<std::vector<float>>& v_new, const std::vector<std::int64_t>& pos) {
  auto& st = dev->default_stream();
  for (std::size_t l = 0; l < k_new.size(); ++l) {
    Buffer<float> kn(dev, k_new[l].size()), vn(dev, v_new[l].size());
    kn.copy_from_host(st, k_new[l]);
    vn.copy_from_host(st, v_new[l]);
    c.append(st, std::int64_t(l), kn, vn, pos);
  }
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
    KvCache c(dev, cache_config(s_.layers, s_.kv_heads, s_.dim, s_.max_len, s_.slots));
    fill_cache(st, c, k_, v_, len_, done_);
    for (std::int64_t t = 0; t < s_.steps; ++t)
      append_layers(dev, c, kn_[std::size_t(t)], vn_[std::size_t(t)], positions(t));
    return whole_cache(st, c);
  }
  OracleReport check(const Run& r) const override {
    std::vector<float> want;
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        auto layer = kv ? v_[std::size_t(l)] : k_[std::size_t(l)];
        for (std::int64_t t = 0; t < s_.steps; ++t) {
          const auto& src = kv ? vn_[std::size_t(t)][std::size_t(l)] : kn_[std::size_t(t)][std::size_t(l)];
          const auto pos = positions(t);
          for (std::int64_t m = 0; m < s_.slots; ++m)
            if (!done_[std::size_t(m)]) put_token(layer, g_, src, m, pos[std::size_t(m)]);
        }
        want.insert(want.end(), layer.begin(), layer.end());
      }
    auto len = len_;
    for (std::size_t m = 0; m < len.size(); ++m) len[m] += done_[m] ? 0 : s_.steps;
    push_lengths(want, len, done_);
    OracleReport rep;
    expect_bits(rep, r.out, want, "cache (layers x K,V) then lengths");
    return rep;
  }

 private:
  AppendShape s_;
  CacheGeometry g_;
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
    KvCache src(dev, cache_config(s_.layers, s_.kv_heads, s_.dim, s_.src_max_len, s_.src_slots));
    KvCache dst(dev, cache_config(s_.layers, s_.kv_heads, s_.dim, s_.dst_max_len, s_.dst_slots));
    fill_cache(st, src, sk_, sv_, slen_, std::vector<bool>(std::size_t(s_.src_slots), false));
    fill_cache(st, dst, dk_, dv_, dlen_, ddone_);
    for (const auto& [d, s] : copies_) dst.copy_slot_from(st, d, src, s);
    return whole_cache(st, dst);
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
    push_lengths(want, len, done);
    OracleReport rep;
    expect_bits(rep, r.out, want, "destination cache (layers x K,V) then lengths");
    return rep;
  }

 private:
  CopySlotShape s_;
  CacheGeometry gs_, gd_;
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
  // The old slots of a [new_slots, ...] layer, whole, then the new slots' first token.
  void push_compared(std::vector<float>& out, const std::vector<float>& layer) const {
    out.insert(out.end(), layer.begin(), layer.begin() + std::ptrdiff_t(std::size_t(s_.slots) * g_.slot_elems()));
    for (std::int64_t m = s_.slots; m < s_.new_slots; ++m)
      for (std::int64_t h = 0; h < s_.kv_heads; ++h)
        out.insert(out.end(), layer.begin() + std::ptrdiff_t(g_.at(m, h, 0)),
                   layer.begin() + std::ptrdiff_t(g_.at(m, h, 0) + std::size_t(s_.dim)));
  }
  Run run(const std::shared_ptr<Device>& dev) const override {
    auto& st = dev->default_stream();
    KvCache c(dev, cache_config(s_.layers, s_.kv_heads, s_.dim, s_.max_len, s_.slots));
    fill_cache(st, c, k_, v_, len_, done_);
    c.grow(st, s_.new_slots);
    append_layers(dev, c, kn_, vn_, positions());
    Run r;
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) push_compared(r.out, (kv ? c.v(l) : c.k(l)).to_vector(st));
    push_lengths(r.out, c);
    r.unwritten = count_poison(r.out);
    return r;
  }
  OracleReport check(const Run& r) const override {
    std::vector<float> want;
    const auto pos = positions();
    for (std::int64_t l = 0; l < s_.layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        auto layer = kv ? v_[std::size_t(l)] : k_[std::size_t(l)];
        layer.resize(std::size_t(s_.new_slots) * g_.slot_elems());
        for (std::int64_t m = 0; m < s_.new_slots; ++m)
          if (m >= s_.slots || !done_[std::size_t(m)])
            put_token(layer, g_, kv ? vn_[std::size_t(l)] : kn_[std::size_t(l)], m, pos[std::size_t(m)]);
        push_compared(want, layer);
      }
    std::vector<std::int64_t> len;
    std::vector<bool> done;
    for (std::int64_t m = 0; m < s_.new_slots; ++m) {
      const bool old = m < s_.slots, d = old && done_[std::size_t(m)];
      len.push_back(old ? len_[std::size_t(m)] + (d ? 0 : 1) : 1);
      done.push_back(d);
    }
    push_lengths(want, len, done);
    OracleReport rep;
    expect_bits(rep, r.out, want, "grown cache (old slots whole, new slots' first token) then lengths");
    return rep;
  }

 private:
  GrowShape s_;
  CacheGeometry g_;
  std::vector<std::vector<float>> k_, v_, kn_, vn_;
  std::vector<std::int64_t> len_;
  std::vector<bool> done_;
};

}  // namespace

std::unique_ptr<Case> append_case(const AppendShape& s) { return std::make_unique<AppendCase>(s); }
std::unique_ptr<Case> copy_slot_case(const CopySlotShape& s) { return std::make_unique<CopySlotCase>(s); }
std::unique_ptr<Case> grow_case(const GrowShape& s) { return std::make_unique<GrowCase>(s); }

std::vector<KernelEntry> cache_entries() {
  return {
      {"kv_cache_append",
       [](std::mt19937_64& g) {
         AppendShape s;
         s.layers = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
         s.dim = draw_head_dim(g);
         s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.steps = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
         s.slots = std::uniform_int_distribution<std::int64_t>(1, 9)(g);
         s.max_len = s.steps + draw_size(g, 100);
         s.seed = g();
         return append_case(s);
       },
       // More slots than kInlineRows (128): the positions are copied to the device.
       {[] { return append_case(AppendShape{2, 133, 2, 32, 9, 2, 51}); }}},
      {"kv_cache_copy_slot_from",
       [](std::mt19937_64& g) {
         CopySlotShape s;
         s.layers = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
         s.dim = draw_head_dim(g);
         s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.src_slots = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.dst_slots = std::uniform_int_distribution<std::int64_t>(1, 6)(g);
         s.src_max_len = draw_size(g, 200);
         s.dst_max_len = std::uniform_int_distribution<int>(0, 2)(g) == 0 ? s.src_max_len : draw_size(g, 200);
         s.copies = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.seed = g();
         return copy_slot_case(s);
       }},
      {"kv_cache_grow",
       [](std::mt19937_64& g) {
         GrowShape s;
         s.layers = std::uniform_int_distribution<std::int64_t>(1, 3)(g);
         s.dim = draw_head_dim(g);
         s.kv_heads = std::uniform_int_distribution<std::int64_t>(1, 4)(g);
         s.slots = std::uniform_int_distribution<std::int64_t>(1, 5)(g);
         s.new_slots = s.slots + std::uniform_int_distribution<std::int64_t>(0, 4)(g);
         s.max_len = 1 + draw_size(g, 150);
         s.seed = g();
         return grow_case(s);
       }},
  };
}

}  // namespace lockstep::harness
