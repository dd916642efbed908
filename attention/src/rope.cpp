// rope: rotary position embedding of q and k in place, one launch.
#include "lockstep/attention/kv_cache.hpp"
#include "lockstep/attention/rope.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "checks.hpp"
#include "kv_cache_detail.hpp"
#include "lockstep/kernels/launch.hpp"
#include "lockstep/kernels/math.hpp"
#include "lockstep/kernels/rope.hpp"

namespace lockstep {

namespace {
template <class T>
void rope_in(Stream& stream, Buffer<T>* q, Buffer<T>* k, std::span<const std::int64_t> positions,
             const RopeConfig& c) {
  constexpr std::string_view w = "rope";
  detail::check_enum(w, "config.style", c.style, {RopeStyle::kNorm, RopeStyle::kNeox}, "RopeStyle::kNorm or kNeox");
  detail::check_positive(w, "head_dim", c.head_dim);
  LOCKSTEP_CHECK_ARG(c.head_dim % 2 == 0, w, "head_dim", c.head_dim, "even");
  LOCKSTEP_CHECK_ARG(c.theta > 1.0f && std::isfinite(c.theta), w, "theta", double(c.theta), "finite and > 1");
  const std::int64_t rows = std::int64_t(positions.size());
  LOCKSTEP_CHECK_ARG(rows <= 0x7fffffff, w, "positions.size()", rows, "<= 2147483647");
  std::vector<std::int32_t> pos(positions.size());
  for (std::size_t i = 0; i < positions.size(); ++i) {
    LOCKSTEP_CHECK_ARG(positions[i] >= 0 && positions[i] < kernels::kRopeMaxPosition, w,
              "positions[" + std::to_string(i) + "]", positions[i],
              "in [0, 2^20 = " + std::to_string(kernels::kRopeMaxPosition) +
                  "): the angles' domain where the project's sin and cos are accurate (docs/numerics.md)");
    pos[i] = static_cast<std::int32_t>(positions[i]);
  }
  if (q != nullptr) {
    detail::check_positive(w, "num_heads", c.num_heads);
    detail::check_on(w, "q", *q, stream);
    detail::check_size(w, "q", *q, checked_product({std::uint64_t(rows), std::uint64_t(c.num_heads), std::uint64_t(c.head_dim)}, w, "rows * num_heads * head_dim"), "positions.size() * num_heads * head_dim");
  }
  if (k != nullptr) {
    detail::check_positive(w, "num_kv_heads", c.num_kv_heads);
    detail::check_on(w, "k", *k, stream);
    detail::check_size(w, "k", *k, checked_product({std::uint64_t(rows), std::uint64_t(c.num_kv_heads), std::uint64_t(c.head_dim)}, w, "rows * num_kv_heads * head_dim"), "positions.size() * num_kv_heads * head_dim");
  }
  if (q != nullptr && k != nullptr) detail::check_no_overlap(w, "k", *k, "q", *q);  // both rotated in place
  LOCKSTEP_CHECK_ARG(c.num_heads <= 65535, w, "num_heads", c.num_heads, "<= 65535");
  LOCKSTEP_CHECK_ARG(c.num_kv_heads <= 65535, w, "num_kv_heads", c.num_kv_heads, "<= 65535");
  check_fits(std::uint64_t(std::max(c.num_heads, c.num_kv_heads)) * std::uint64_t(c.head_dim), kMaxLaneOffset, w, "heads * head_dim");
  if (rows == 0 || (q == nullptr && k == nullptr)) return;
  const detail::Staged st = detail::stage(stream, pos, 0);
  kernels::RopeParams p{};
  p.q = q ? q->data().get() : nullptr;
  p.k = k ? k->data().get() : nullptr;
  p.act_format = static_cast<std::int32_t>(format_of<T>());
  p.positions = st.ints;
  p.rows = static_cast<std::int32_t>(rows);
  p.Hq = static_cast<std::int32_t>(q ? c.num_heads : 0);
  p.Hk = static_cast<std::int32_t>(k ? c.num_kv_heads : 0);
  p.D = static_cast<std::int32_t>(c.head_dim);
  p.neox = c.style == RopeStyle::kNeox ? 1 : 0;
  p.log2_theta = math::log2(c.theta);
  p.inv_d = 1.0f / static_cast<float>(c.head_dim);
  const Dim3 grid{static_cast<std::uint32_t>(std::max(p.Hq, p.Hk)),
                  static_cast<std::uint32_t>(std::min<std::int64_t>(rows, 65535)), 2};
  launch<kernels::Rope>(stream, grid, 0, p);
}
}  // namespace

void rope(Stream& stream, Buffer<float>* q, Buffer<float>* k, std::span<const std::int64_t> positions,
          const RopeConfig& c) {
  rope_in(stream, q, k, positions, c);
}
void rope(Stream& stream, Buffer<half>* q, Buffer<half>* k, std::span<const std::int64_t> positions,
          const RopeConfig& c) {
  rope_in(stream, q, k, positions, c);
}
void rope(Stream& stream, Buffer<bfloat16>* q, Buffer<bfloat16>* k, std::span<const std::int64_t> positions,
          const RopeConfig& c) {
  rope_in(stream, q, k, positions, c);
}

}  // namespace lockstep
