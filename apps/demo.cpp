// `lockstep demo`, the main job: a small multi-layer GQA transformer decode loop (random weights)
// over several sequence slots on the chosen device: projections (fp32 GEMM), RoPE, Flash-Decoding
// against the KV cache (by default on bfloat16 activations over an fp8 e4m3 cache), output
// projection and residual add. One slot finishes early (marked
// done), and one speculative token per slot is appended and rolled back midway: that step's
// output must have the bytes of the same step computed before the token was appended. The same
// loop then runs on the CPU device and the final hidden states are compared bit for bit. Both runs
// print their progress as they go.

#include "demo.hpp"
#include "format_names.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"
#include "lockstep/attention/decode.hpp"
#include "lockstep/attention/ops.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::demo {

namespace {

struct Model {
  std::int64_t hidden, heads = 8, kv_heads = 2, dim = 64, vocab = 256;
  std::vector<float> emb;                       // [vocab, hidden]
  std::vector<std::vector<float>> wq, wk, wv, wo;  // per layer
};

Model make_model(const Options& o) {
  Model m;
  m.hidden = m.heads * m.dim;
  std::mt19937_64 g(o.seed);
  const float s = 1.0f / std::sqrt(float(m.hidden));
  std::uniform_real_distribution<float> u(-s, s), e(-1.0f, 1.0f);
  auto fill = [&](std::size_t n, auto& d) {
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
  };
  m.emb = fill(std::size_t(m.vocab * m.hidden), e);
  for (int l = 0; l < o.layers; ++l) {
    m.wq.push_back(fill(std::size_t(m.hidden * m.heads * m.dim), u));
    m.wk.push_back(fill(std::size_t(m.hidden * m.kv_heads * m.dim), u));
    m.wv.push_back(fill(std::size_t(m.hidden * m.kv_heads * m.dim), u));
    m.wo.push_back(fill(std::size_t(m.heads * m.dim * m.hidden), u));
  }
  return m;
}

struct Result {
  std::vector<float> hidden;  // final hidden states [slots, hidden]
  // Hidden states after the speculative step's real step: computed before the speculative token
  // was appended, and after it was rolled back.
  std::vector<float> before_spec, after_spec;
  double seconds = 0;
  std::int64_t tokens = 0;
};

// Attention's buffers in T: q, k, v from the fp32 projections converted to T, its output
// converted back (T float: the projections' own buffers).
template <class T>
struct AttnIo {
  Buffer<T> q, k, v, out;
  AttnIo(const std::shared_ptr<Device>& dev, std::int64_t nq, std::int64_t nkv)
      : q(dev, nq), k(dev, nkv), v(dev, nkv), out(dev, nq) {}
};

// `first`: the run being demonstrated (it also reports the speculative step); the reference run
// prints its progress only.
template <class T>
Result run_loop(const std::shared_ptr<Device>& dev, const Model& m, const Options& o, bool first, Format cache_format) {
  auto& st = dev->default_stream();
  const std::int64_t M = o.slots, Hd = m.hidden, Q = m.heads * m.dim, KV = m.kv_heads * m.dim;
  auto upload = [&](const std::vector<float>& h) {
    Buffer<float> b(dev, h.size());
    b.copy_from_host(st, h);
    return b;
  };
  std::vector<Buffer<float>> wq, wk, wv, wo;
  for (int l = 0; l < o.layers; ++l) {
    wq.push_back(upload(m.wq[std::size_t(l)]));
    wk.push_back(upload(m.wk[std::size_t(l)]));
    wv.push_back(upload(m.wv[std::size_t(l)]));
    wo.push_back(upload(m.wo[std::size_t(l)]));
  }
  KvCacheConfig cfg;
  cfg.num_layers = o.layers;
  cfg.num_heads = m.heads;
  cfg.num_kv_heads = m.kv_heads;
  cfg.head_dim = m.dim;
  cfg.max_len = o.steps + 4;
  cfg.slots = M;
  cfg.format = cache_format;
  if (is_fp8(cache_format))
    cfg.k_scales = cfg.v_scales = std::vector<float>(std::size_t(o.layers * m.kv_heads), 1.0f / 32.0f);
  KvCache cache(dev, cfg);
  AttnIo<T> io(dev, M * Q, M * KV);
  Buffer<float> x(dev, std::size_t(M * Hd)), q(dev, std::size_t(M * Q)), k(dev, std::size_t(M * KV)),
      v(dev, std::size_t(M * KV)), attn(dev, std::size_t(M * Q)), proj(dev, std::size_t(M * Hd));
  const RopeConfig rc{m.heads, m.kv_heads, m.dim, 10000.0f, RopeStyle::kNeox};
  std::vector<float> xin(std::size_t(M * Hd));
  Result r;

  // One decode step for every live slot at `positions`, with token ids `tokens`.
  auto step = [&](const std::vector<std::int64_t>& positions, const std::vector<int>& tokens) {
    for (std::int64_t s = 0; s < M; ++s)
      std::memcpy(xin.data() + s * Hd, m.emb.data() + std::int64_t(tokens[std::size_t(s)]) * Hd, Hd * 4);
    x.copy_from_host(st, xin);
    for (int l = 0; l < o.layers; ++l) {
      ops::gemm(st, x, wq[std::size_t(l)], q, 1, M, Q, Hd);
      ops::gemm(st, x, wk[std::size_t(l)], k, 1, M, KV, Hd);
      ops::gemm(st, x, wv[std::size_t(l)], v, 1, M, KV, Hd);
      if constexpr (std::is_same_v<T, float>) {
        rope(st, &q, &k, positions, rc);
        flash_decoding(st, cache, l, q, k, v, positions, attn);
      } else {
        ops::convert(st, q, io.q);
        ops::convert(st, k, io.k);
        ops::convert(st, v, io.v);
        rope(st, &io.q, &io.k, positions, rc);
        flash_decoding(st, cache, l, io.q, io.k, io.v, positions, io.out);
        ops::convert(st, io.out, attn);
      }
      ops::gemm(st, attn, wo[std::size_t(l)], proj, 1, M, Hd, Q);
      ops::add(st, proj, x);
    }
  };

  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_line = 0;
  for (int t = 0; t < o.steps; ++t) {
    if (t == (3 * o.steps) / 4 && M > 1) cache.mark_done(M - 1);  // the last slot finishes early
    std::vector<std::int64_t> pos(static_cast<std::size_t>(M));
    std::vector<int> tok(static_cast<std::size_t>(M));
    for (std::int64_t s = 0; s < M; ++s) {
      pos[std::size_t(s)] = cache.done(s) ? 0 : cache.length(s);
      tok[std::size_t(s)] = int((t * 31 + s * 7 + 3) % m.vocab);
    }
    if (t == o.steps / 2) {
      // The step as a run without speculation computes it (then taken back), a speculative token
      // per slot, rolled back, and the step again: it must give the same bytes.
      step(pos, tok);
      r.before_spec = x.to_vector(st);
      for (std::int64_t s = 0; s < M; ++s)
        if (!cache.done(s)) cache.rollback(s, pos[std::size_t(s)]);
      std::vector<int> spec(tok);
      for (auto& v2 : spec) v2 = (v2 + 101) % int(m.vocab);
      step(pos, spec);
      for (std::int64_t s = 0; s < M; ++s)
        if (!cache.done(s)) cache.rollback(s, pos[std::size_t(s)]);
      // The positions from the cache again, so that a rollback that does not take the token back
      // shows in the bytes (the step would attend to it).
      for (std::int64_t s = 0; s < M; ++s) pos[std::size_t(s)] = cache.done(s) ? 0 : cache.length(s);
      if (first) std::printf("    step %d: speculative token appended to every slot and rolled back\n", t + 1);
    }
    step(pos, tok);
    if (t == o.steps / 2) r.after_spec = x.to_vector(st);
    for (std::int64_t s = 0; s < M; ++s) r.tokens += cache.done(s) ? 0 : 1;
    // A line every 8 steps, at the last, and (the reference run, which may be much slower: it
    // waits for each step) whenever 2 seconds passed without one.
    if (!first) st.synchronize();
    if ((t + 1) % 8 == 0 || t + 1 == o.steps || seconds() - last_line >= 2) {
      st.synchronize();
      const double sec = seconds();
      last_line = sec;
      std::printf("    step %3d/%d: slot lengths", t + 1, o.steps);
      for (std::int64_t s = 0; s < M; ++s) std::printf(" %lld%s", (long long)cache.length(s), cache.done(s) ? "(done)" : "");
      std::printf(", %.0f tokens/s\n", double(r.tokens) / sec);
    }
  }
  r.hidden = x.to_vector(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Format parse_format(const std::string& name, bool cache) {
  if (const auto f = format_named(name); f && (cache || !is_fp8(*f))) return *f;
  throw InvalidArgument("lockstep demo", cache ? "--cache" : "--activations", name,
                        cache ? "float, half, bfloat16, fp8_e4m3 or fp8_e5m2" : "float, half or bfloat16");
}

Result run_in(Format act, const std::shared_ptr<Device>& dev, const Model& m, const Options& o, bool first,
              Format cache) {
  if (act == Format::f16) return run_loop<half>(dev, m, o, first, cache);
  if (act == Format::bf16) return run_loop<bfloat16>(dev, m, o, first, cache);
  return run_loop<float>(dev, m, o, first, cache);
}

}  // namespace

int run(const std::string& device, const Options& o) {
  const Format act = parse_format(o.activations, false), cache = parse_format(o.cache, true);
  auto dev = open(device);
  // The reference: the CPU device (for a CPU run, its portable SIMD variant).
  std::shared_ptr<Device> ref;
  if (dev->id().kind == DeviceKind::kCpu) {
    CpuDeviceOptions co;
    co.index = dev->id().index == 62 ? 63 : 62;  // a separate device; an id unlike the run's
    co.simd = "generic";
    ref = make_cpu_device(co);
  } else {
    ref = open("cpu");
  }
  std::printf("lockstep demo: the main job on %s, then on %s, and their bytes compared\n", dev->id().str().c_str(),
              ref->id().str().c_str());
  std::printf("  %s: %s\n  %s: %s\n", dev->id().str().c_str(), dev->name().c_str(), ref->id().str().c_str(),
              ref->name().c_str());
  const Model m = make_model(o);
  std::printf("  %d layers, %d slots, GQA %lld query / %lld kv heads x %lld, RoPE (NEOX), %d steps\n",
              o.layers, o.slots, (long long)m.heads, (long long)m.kv_heads, (long long)m.dim, o.steps);
  std::printf("  attention in %s, KV cache in %s (%llu bytes per token and layer)\n", format_name(act),
              format_name(cache),
              (unsigned long long)(2 * m.kv_heads * m.dim * format_bytes(cache)));
  std::printf("  1. on %s:\n", dev->id().str().c_str());
  Result a = run_in(act, dev, m, o, true, cache);  // not const: --inject-fault may flip a bit
  std::printf("    %lld tokens in %.3f s: %.0f tokens/s\n", (long long)a.tokens, a.seconds,
              double(a.tokens) / a.seconds);
  std::printf("  2. the same on %s, the reference:\n", ref->id().str().c_str());
  const Result b = run_in(act, ref, m, o, false, cache);
  auto flip_first_bit = [](std::vector<float>& v) {
    if (v.empty()) return;
    std::uint32_t w;
    std::memcpy(&w, &v[0], 4);
    w ^= 1u;
    std::memcpy(&v[0], &w, 4);
  };
  if (o.inject_fault == "hidden") flip_first_bit(a.hidden);
  if (o.inject_fault == "rollback") flip_first_bit(a.after_spec);
  const bool same = a.hidden.size() == b.hidden.size() &&
                    std::memcmp(a.hidden.data(), b.hidden.data(), a.hidden.size() * 4) == 0;
  double sum = 0;
  for (float v : a.hidden) sum += v;
  std::printf("  %s against %s: bytes match: %s (hidden-state checksum %.6f)\n", dev->id().str().c_str(),
              ref->id().str().c_str(), same ? "yes" : "NO", sum);
  // The step after the rolled-back speculative token against the same step before the token was
  // appended (what a run that never speculated computes), on both devices.
  auto restored = [](const Result& r) {
    return !r.before_spec.empty() && r.before_spec.size() == r.after_spec.size() &&
           std::memcmp(r.before_spec.data(), r.after_spec.data(), r.before_spec.size() * 4) == 0;
  };
  const bool rolled_back = restored(a) && restored(b);
  std::printf("  rollback restores the bytes: %s (step %d after the speculative token's rollback against "
              "the same step computed before the token was appended, on %s and on %s)\n",
              rolled_back ? "yes" : "no", o.steps / 2 + 1, dev->id().str().c_str(), ref->id().str().c_str());
  return same && rolled_back ? 0 : 1;
}

}  // namespace lockstep::demo
