#pragma once
// KvScatter: one token's K and V appended for many rows in one launch.

#include "lockstep/kernels/decode/params.hpp"

namespace lockstep::kernels {

// Appends one token's K and V for many rows in one launch: cache[slot, h, pos, :] = src[r, h, :].
// Grid: x = kv head, y = row (loops past 65535), z = 0 for K, 1 for V.
struct KvScatterParams {
  const void* src_k;             // [rows, Hkv, D] in act_format (Note [decode formats])
  const void* src_v;
  void* k;                       // cache bases, in the kernel's cache format
  void* v;
  std::int32_t act_format;
  const float* kv_scales;        // null, or [2, Hkv]: K's then V's scales (fp8 caches)
  const std::int32_t* positions; // [rows]; null: every row uses `position`
  const std::int32_t* slots;     // [rows]; null: row r uses slot r
  std::int64_t slot_stride, head_stride;
  std::int32_t rows, Hkv, D, position;
  std::int32_t max_len;          // positions at or past it (or below -1) write nothing
  std::int32_t* status;          // null, or raised to 1 + each row whose position is out of range
  InlineInts inline_positions;   // when positions is null and count > 0 (Note [inline positions])
};

// C: the cache's format; each value is stored as from_float<C>(x / scale) (x itself without scales).
template <class C = float>
struct KvScatter {
  static constexpr const char* kName = "kv_scatter";
  static constexpr int kThreads = 128;
  static constexpr bool kOverlapsPrior = true;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = KvScatterParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using F = typename X::template Lanes<float>;
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    x.wait_prior_grids();
    x.allow_dependent_grids();
    const int h = x.block_x();
    const bool is_v = x.block_z() == 1;
    const void* src = is_v ? p.src_v : p.src_k;
    C* cache = static_cast<C*>(is_v ? p.v : p.k);
    if (src == nullptr) return;
    const float s = p.kv_scales != nullptr ? x.load_uniform(p.kv_scales + (is_v ? p.Hkv : 0) + h) : 0.0f;
    for (int r = x.block_y(); r < p.rows; r += x.grid_y()) {
      const int pos = p.positions != nullptr           ? x.load_uniform(p.positions + r)
                      : p.inline_positions.count > 0 ? p.inline_positions.v[r]
                                                     : p.position;
      if (pos < 0 || pos >= p.max_len) {  // a done slot (-1), or out of range: nothing to write
        if ((pos < -1 || pos >= p.max_len) && p.status != nullptr)
          x.status_max(p.status, r + 1);  // Note [device positions]
        continue;
      }
      const int slot = p.slots != nullptr ? x.load_uniform(p.slots + r) : r;
      const void* row = act_at(src, p.act_format, (std::int64_t{r} * p.Hkv + h) * p.D);
      C* d = cache + slot * p.slot_stride + h * p.head_stride + std::int64_t{pos} * p.D;
      for (int c = 0; c < p.D; c += kThreads) {
        const I i = x.thread() + c;
        const B ok = i < p.D;
        F v = load_act(x, row, p.act_format, i, ok);
        if (s != 0.0f) v = v / s;
        x.store(d, i, v, ok);
      }
    }
  }
};

}  // namespace lockstep::kernels
