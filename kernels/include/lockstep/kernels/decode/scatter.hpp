#pragma once
// KvScatter: one token's K and V appended for many rows in one launch.

#include "lockstep/kernels/decode/params.hpp"

namespace lockstep::kernels {

// Appends one token's K and V for many rows in one launch: cache[slot, h, pos, :] = src[r, h, :].
// Grid: x = kv head, y = row (loops past 65535), z = 0 for K, 1 for V.
struct KvScatterParams {
  const float* src_k;            // [rows, Hkv, D]
  const float* src_v;
  float* k;                      // cache bases
  float* v;
  const std::int32_t* positions; // [rows]; null: every row uses `position`
  const std::int32_t* slots;     // [rows]; null: row r uses slot r
  std::int64_t slot_stride, head_stride;
  std::int32_t rows, Hkv, D, position;
  std::int32_t max_len;          // positions at or past it (or below -1) write nothing
  std::int32_t* status;          // null, or raised to 1 + each row whose position is out of range
  InlineInts inline_positions;   // when positions is null and count > 0 (Note [inline positions])
};

struct KvScatter {
  static constexpr const char* kName = "kv_scatter";
  static constexpr int kThreads = 128;
  static constexpr bool kOverlapsPrior = true;
  static constexpr bool kWarpIndependent = true;  // hd.hpp: the CPU may run it a warp at a time
  using Params = KvScatterParams;

  template <class X>
  LOCKSTEP_HD static void run(X& x, const Params& p) {
    using I = typename X::template Lanes<lane_int>;
    using B = typename X::template Lanes<bool>;
    x.wait_prior_grids();
    x.allow_dependent_grids();
    const int h = x.block_x();
    const bool is_v = x.block_z() == 1;
    const float* src = is_v ? p.src_v : p.src_k;
    float* cache = is_v ? p.v : p.k;
    if (src == nullptr) return;
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
      const float* s = src + (std::int64_t{r} * p.Hkv + h) * p.D;
      float* d = cache + slot * p.slot_stride + h * p.head_stride + std::int64_t{pos} * p.D;
      for (int c = 0; c < p.D; c += kThreads) {
        const I i = x.thread() + c;
        const B ok = i < p.D;
        x.store(d, i, x.load(s, i, ok, 0.0f), ok);
      }
    }
  }
};

}  // namespace lockstep::kernels
