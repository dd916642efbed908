#include "lockstep/tuning.hpp"

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/error.hpp"

namespace lockstep {

namespace {

thread_local const Tuning* t_scope = nullptr;

// One settable field: its name, the values it takes (for messages), how to set it from text
// (false: not a value it takes) and how to print it when it differs from the default.
struct Field {
  const char* name;
  const char* values;
  std::function<bool(Tuning&, std::string_view)> set;
  std::function<std::string(const Tuning&)> get;
};

bool parse_int(std::string_view s, int lo, int hi, int& out) {
  if (s.empty() || s.size() > 6) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  out = v;
  return true;
}

Field flag(const char* name, bool& (*ref)(Tuning&)) {
  return {name, "0, 1",
          [ref](Tuning& t, std::string_view v) {
            if (v != "0" && v != "1") return false;
            ref(t) = v == "1";
            return true;
          },
          [ref](const Tuning& t) { return std::string(ref(const_cast<Tuning&>(t)) ? "1" : "0"); }};
}
Field maybe_flag(const char* name, std::optional<bool>& (*ref)(Tuning&)) {
  return {name, "auto, 0, 1",
          [ref](Tuning& t, std::string_view v) {
            if (v == "auto") ref(t).reset();
            else if (v == "0" || v == "1") ref(t) = v == "1";
            else return false;
            return true;
          },
          [ref](const Tuning& t) {
            const auto& o = ref(const_cast<Tuning&>(t));
            return std::string(!o ? "auto" : *o ? "1" : "0");
          }};
}
Field number(const char* name, const char* values, int lo, int hi, int& (*ref)(Tuning&)) {
  return {name, values,
          [=](Tuning& t, std::string_view v) { return parse_int(v, lo, hi, ref(t)); },
          [ref](const Tuning& t) { return std::to_string(ref(const_cast<Tuning&>(t))); }};
}
// allowed: {lo, hi} with `range` (any value in [lo, hi]), or the values it takes.
Field maybe_number(const char* name, const char* values, std::vector<int> allowed, bool range,
                   std::optional<int>& (*ref)(Tuning&)) {
  return {name, values,
          [=](Tuning& t, std::string_view v) {
            if (v == "auto") {
              ref(t).reset();
              return true;
            }
            int n = 0;
            if (!parse_int(v, allowed.front(), allowed.back(), n)) return false;
            bool ok = range;
            for (int a : allowed) ok = ok || a == n;
            if (!ok) return false;
            ref(t) = n;
            return true;
          },
          [ref](const Tuning& t) {
            const auto& o = ref(const_cast<Tuning&>(t));
            return o ? std::to_string(*o) : std::string("auto");
          }};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      maybe_flag("decode.one_grid", [](Tuning& t) -> auto& { return t.decode.one_grid; }),
      maybe_flag("decode.fold_merge", [](Tuning& t) -> auto& { return t.decode.fold_merge; }),
      flag("decode.block_signals", [](Tuning& t) -> auto& { return t.decode.block_signals; }),
      Field{"decode.l2_policy", "auto, unchanged, evict_first, evict_normal",
            [](Tuning& t, std::string_view v) {
              if (v == "auto") t.decode.l2_policy.reset();
              else if (v == "unchanged") t.decode.l2_policy = L2Policy::kUnchanged;
              else if (v == "evict_first") t.decode.l2_policy = L2Policy::kEvictFirst;
              else if (v == "evict_normal") t.decode.l2_policy = L2Policy::kEvictNormal;
              else return false;
              return true;
            },
            [](const Tuning& t) {
              if (!t.decode.l2_policy) return std::string("auto");
              switch (*t.decode.l2_policy) {
                case L2Policy::kUnchanged: return std::string("unchanged");
                case L2Policy::kEvictFirst: return std::string("evict_first");
                default: return std::string("evict_normal");
              }
            }},
      number("decode.max_heads_x_dim", "32 .. 512", 32, 512,
             [](Tuning& t) -> auto& { return t.decode.max_heads_x_dim; }),
      maybe_flag("decode.wide_tiles", [](Tuning& t) -> auto& { return t.decode.wide_tiles; }),
      maybe_flag("fused.exact_separate_p", [](Tuning& t) -> auto& { return t.fused.exact_separate_p; }),
      maybe_number("fused.exact_splits", "auto, 1 .. 16", {1, 16}, true,
                   [](Tuning& t) -> auto& { return t.fused.exact_splits; }),
      maybe_number("fused.tc_rows", "auto, 64, 128", {64, 128}, false,
                   [](Tuning& t) -> auto& { return t.fused.tc_rows; }),
      number("fused.tc_splits", "1 .. 16", 1, 16, [](Tuning& t) -> auto& { return t.fused.tc_splits; }),
      maybe_flag("fused.wgmma", [](Tuning& t) -> auto& { return t.fused.wgmma; }),
      maybe_number("fused.wgmma_warpgroups", "auto, 1, 2", {1, 2}, false,
                   [](Tuning& t) -> auto& { return t.fused.wgmma_warpgroups; }),
      maybe_flag("fused.pack_in_kernel", [](Tuning& t) -> auto& { return t.fused.pack_in_kernel; }),
      number("fused.pack_ahead", "1 .. 16", 1, 16, [](Tuning& t) -> auto& { return t.fused.pack_ahead; }),
      flag("fused.wgmma_serial", [](Tuning& t) -> auto& { return t.fused.wgmma_serial; }),
      flag("fused.wgmma_deferred", [](Tuning& t) -> auto& { return t.fused.wgmma_deferred; }),
  };
  return f;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string field_names() {
  std::string s;
  for (const Field& f : fields()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

}  // namespace

void Tuning::apply(std::string_view settings, std::string_view what) {
  Tuning t = *this;
  std::size_t b = 0;
  while (b < settings.size()) {
    std::size_t e = settings.find(',', b);
    if (e == std::string_view::npos) e = settings.size();
    const std::string_view item = trimmed(settings.substr(b, e - b));
    b = e + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string_view name = trimmed(item.substr(0, eq)),
                           value = eq == std::string_view::npos ? "" : trimmed(item.substr(eq + 1));
    const Field* f = nullptr;
    for (const Field& c : fields())
      if (name == c.name) f = &c;
    if (f == nullptr)
      throw InvalidArgument(what, "setting", "\"" + std::string(item) + "\"",
                            "name=value with a name among " + field_names());
    if (eq == std::string_view::npos || !f->set(t, value))
      throw InvalidArgument(what, f->name, "\"" + std::string(value) + "\"", std::string("one of ") + f->values);
  }
  *this = t;
}

std::string Tuning::str() const {
  const Tuning d;
  std::string s;
  for (const Field& f : fields()) {
    const std::string v = f.get(*this);
    if (v != f.get(d)) s += (s.empty() ? "" : ",") + std::string(f.name) + "=" + v;
  }
  return s;
}

void Tuning::check(std::string_view where) const {
  // Explicit range checks: a call with its own Tuning runs this on its host path.
  const auto refuse = [&](const char* name, const std::string& value, const char* values) {
    throw InvalidArgument(where, std::string("tuning.") + name, value, std::string("one of ") + values);
  };
  if (decode.max_heads_x_dim < 32 || decode.max_heads_x_dim > 512)
    refuse("decode.max_heads_x_dim", std::to_string(decode.max_heads_x_dim), "32 .. 512");
  if (decode.l2_policy && (static_cast<int>(*decode.l2_policy) < 0 || static_cast<int>(*decode.l2_policy) > 2))
    refuse("decode.l2_policy", std::to_string(static_cast<int>(*decode.l2_policy)),
           "auto, unchanged, evict_first, evict_normal");
  if (fused.exact_splits && (*fused.exact_splits < 1 || *fused.exact_splits > 16))
    refuse("fused.exact_splits", std::to_string(*fused.exact_splits), "auto, 1 .. 16");
  if (fused.tc_rows && *fused.tc_rows != 64 && *fused.tc_rows != 128)
    refuse("fused.tc_rows", std::to_string(*fused.tc_rows), "auto, 64, 128");
  if (fused.tc_splits < 1 || fused.tc_splits > 16) refuse("fused.tc_splits", std::to_string(fused.tc_splits), "1 .. 16");
  if (fused.wgmma_warpgroups && *fused.wgmma_warpgroups != 1 && *fused.wgmma_warpgroups != 2)
    refuse("fused.wgmma_warpgroups", std::to_string(*fused.wgmma_warpgroups), "auto, 1, 2");
  if (fused.pack_ahead < 1 || fused.pack_ahead > 16) refuse("fused.pack_ahead", std::to_string(fused.pack_ahead), "1 .. 16");
}

TuningScope::TuningScope(const Tuning& tuning) : tuning_(tuning), outer_(t_scope) {
  tuning_.check("TuningScope");
  t_scope = &tuning_;
}
TuningScope::~TuningScope() { t_scope = outer_; }

namespace detail {
const Tuning* scoped_tuning() noexcept { return t_scope; }

Tuning tuning_from_environment(std::string_view where) {
  Tuning t;
  if (const char* v = std::getenv("LOCKSTEP_TUNING"); v != nullptr && *v != '\0')
    t.apply(v, std::string(where) + ": LOCKSTEP_TUNING");
  return t;
}
}  // namespace detail

}  // namespace lockstep
