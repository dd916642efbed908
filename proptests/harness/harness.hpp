#pragma once
// The cross-backend harness (docs/kernels.md, "Registering a kernel"): every kernel has a Case
// that draws inputs from a seed, runs on any device, and is checked against a float64 oracle and
// the documented error bound. The property tests (RapidCheck) and `lockstep parity` both use it.

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lockstep/formats.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::harness {

// What one run produced: every output element, and how many still held the poison pattern
// (outputs are poisoned before the launch on every backend).
struct Run {
  std::vector<float> out;
  std::size_t unwritten = 0;
};

struct OracleReport {
  double max_ulp = 0;       // largest distance to the float64 reference, in float ulps
  double max_rel = 0;       // largest relative error (|ref| > tiny)
  double max_bound_ratio = 0;  // largest |error| / documented bound (<= 1 passes)
  std::size_t violations = 0;  // elements outside the documented bound
  std::string first_violation;
};

class Case {
 public:
  virtual ~Case() = default;
  virtual std::string describe() const = 0;
  // Generates the inputs from the case's seed, runs on `dev` and synchronizes.
  virtual Run run(const std::shared_ptr<Device>& dev) const = 0;
  // Checks a run against the float64 oracle and the documented bound.
  virtual OracleReport check(const Run& r) const = 0;
  // Output elements a correct run leaves untouched (poisoned); 0 for most kernels.
  virtual std::size_t expected_unwritten() const { return 0; }
  // False for tensor-core paths: CUDA and CPU then agree within the documented bound only
  // (both are checked against the oracle, and their distance is reported).
  virtual bool bitwise_across_backends() const { return true; }
};

// Runs `c` on the CPU device (and on the portable SIMD variant, and on CUDA when present) and
// returns "" when every check passes, else what failed: the oracle bound, unwritten outputs, or
// a CPU/CUDA (or SIMD variant) bit mismatch.
struct Verdict {
  std::string failure;
  OracleReport oracle;
  bool compared_cuda = false;
  bool compared_variant = false;
  double cuda_cpu_max_ulp = 0;   // for cases that are not bitwise across backends
  double cuda_cpu_nmse = 0;
};
Verdict verify(const Case& c, bool with_variant, bool with_cuda);

// LOCKSTEP_TEST_REQUIRE_CUDA=1 (the GPU runs set it, tools/gpu/): a CUDA device that is not
// usable fails verify() (with the reason) instead of leaving the CUDA comparison out, so that a
// GPU run whose driver or runtime broke cannot pass on the CPU's checks alone.
bool cuda_required();
// "" when CUDA is usable here, else why not.
std::string cuda_unusable_reason();

struct KernelEntry {
  std::string name;
  std::function<std::unique_ptr<Case>(std::mt19937_64&)> random_case;
  // Fixed large shapes that reach the variants the library picks only for large grids (H200:
  // 132 SMs; the CPU device: one "multiprocessor" per worker thread); `lockstep parity` runs each
  // once after the random cases.
  std::vector<std::function<std::unique_ptr<Case>()>> fixed = {};
  // The kernel runs launch_decode: `lockstep parity` reruns it in a child process with
  // the Tuning decode.one_grid=1 (Note [one grid]), whose CPU bytes must equal the first run's.
  bool decode = false;
};
// Every registered kernel (softmax, scale, layout, transpose, gemm, math, attention, decode, the
// KV-cache operations).
const std::vector<KernelEntry>& kernel_entries();

// Sizes every shape generator draws often (the issue list): 1, 31, 32, 33, 97, 1025.
inline constexpr std::int64_t kEdgeSizes[] = {1, 31, 32, 33, 97, 1025};
std::int64_t draw_size(std::mt19937_64& rng, std::int64_t max);
// A head dimension: 32, 64, 96, 128 or 256.
std::int64_t draw_head_dim(std::mt19937_64& rng);

// Bitwise comparison with every NaN equal to every other (NaN payloads are not part of the
// contract, docs/numerics.md).
struct Compare {
  std::size_t mismatches = 0;
  std::string first;
};
Compare compare_bits(const Run& a, const Run& b);
// The distance between two runs of a case that is not bitwise across backends (tensor-core
// paths): the largest ulp distance and the normalized mean squared error, over the elements that
// are finite in both (infinities, e.g. a masked row's log-sum-exp, are the oracle's to check).
struct Distance {
  double max_ulp = 0, num = 0, den = 0;
  void add(const Run& got, const Run& ref);
  double nmse() const { return den > 0 ? num / den : num; }
};

// Distance between a float and a float64 reference in units of the float ulp at the reference.
double ulp_distance(float got, double ref);
std::uint32_t float_bits(float f);

// Helpers for Case implementations.
std::vector<float> uniform(std::uint64_t seed, std::size_t n, float lo, float hi);
void poison(Stream& s, Buffer<float>& b);
Run collect(Stream& s, const Buffer<float>& b);
std::size_t count_poison(const std::vector<float>& v);
// The relative error is recorded where |reference| > this.
inline constexpr double kRelFloor = 1e-6;
// Counts a violation; the first one's text is kept.
void add_violation(OracleReport& rep, const std::string& what);
// Exact results (copies): every element of `got` must have the bits of `want`.
void expect_bits(OracleReport& rep, const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& label);

// Each kernel's entry point for RapidCheck and unit tests.
struct SoftmaxShape {
  std::int64_t rows = 1, n = 1;
  float range = 8.0f;
  int special = 0;  // 0: none, 1: one row all -inf, 2: a NaN in one row
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> softmax_case(const SoftmaxShape& s);

struct ScaleShape {
  std::int64_t n = 1;
  float scale = 1.0f;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> scale_case(const ScaleShape& s);

// ops::convert between float and format 0 half, 1 bfloat16, 2 fp8_e4m3, 3 fp8_e5m2; to_format:
// float -> format (inputs of every kind: random bit patterns, values in the format's range,
// midpoints), else format -> float (random codes, every code once when n allows). The outputs
// are each element's code (or float) bits, held to lockstep/formats.hpp's exactly.
struct ConvertShape {
  int format = 0;
  bool to_format = true;
  std::int64_t n = 1;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> convert_case(const ConvertShape& s);

// kind: 0 interleaved->batched, 1 batched->interleaved, 2 extract head, 3 copy head back.
struct LayoutShape {
  int kind = 0;
  std::int64_t seq = 1, heads = 1, dim = 1, head = 0;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> layout_case(const LayoutShape& s);

struct TransposeShape {
  std::int64_t batch = 1, rows = 1, cols = 1;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> transpose_case(const TransposeShape& s);

struct GemmShape {
  std::int64_t batch = 1, m = 1, n = 1, k = 1;
  float alpha = 1.0f;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> gemm_case(const GemmShape& s);

// Attention (the attention-algorithms issue). gemm: 0 fp32, 1 tensor core; impl: 0 batched, 1 per head.
struct MhaCaseShape {
  std::int64_t seq = 1, heads = 1, dim = 32;
  bool causal = false;
  int gemm = 0;
  int impl = 0;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> mha_case(const MhaCaseShape& s);

struct DecodeCaseShape {
  std::int64_t len = 1, max_len = 1, heads = 1, kv_heads = 1, dim = 32;
  std::uint64_t seed = 0;
};
// incremental_attention; the cache past `len` is poisoned with NaN (never read).
std::unique_ptr<Case> decode_case(const DecodeCaseShape& s);

struct ScatterCaseShape {
  std::int64_t kv_heads = 1, dim = 32, max_len = 1, pos = 0;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> scatter_case(const ScatterCaseShape& s);

// Float64 references shared by the cases and tests: attention of one head, q [Sq, D],
// k/v [Skv, D] (row strides given), causal bottom-right aligned. Returns out [Sq, D] and, per
// element, the error scale sum_j p_j |v_j| and the score error scale max_j sum_i |q_i k_ji|.
struct AttentionRef {
  std::vector<double> out, pv_mag, qk_mag;
  std::vector<double> lse;  // natural log-sum-exp of the scaled scores (-inf: no key visible)
};
// scale: the softmax scale the call used (0: 1 / sqrt(D), the calls' default).
AttentionRef attention_reference(const float* q, std::int64_t q_stride, const float* k,
                                 const float* v, std::int64_t kv_stride, std::int64_t Sq,
                                 std::int64_t Skv, std::int64_t D, bool causal, double scale = 0);
// The softmax scale an attention case passes in its options, from the case's seed (so that the
// draws of every other parameter stay as they are): 0, unset (the default 1 / sqrt(head_dim)),
// for three seeds in four, else a float in [1/64, 1/2].
float softmax_scale_of(std::uint64_t seed);
// The documented bounds (docs/numerics.md, Note [attention bound]). uh: the unit roundoff of the
// tensor cores' element format (fp16 2^-11; bfloat16 2^-8).
double attention_bound_fp32(double pv_mag, double qk_mag, std::int64_t Skv, std::int64_t D);
double attention_bound_tc(double pv_mag, double qk_mag, std::int64_t Skv, std::int64_t D, double uh = 0x1p-11);

struct FusedCaseShape {
  std::int64_t batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_kv = 1, dim = 32;
  bool causal = false, interleaved = false;
  bool tensor_core = false;  // precision TensorCore (else Exact)
  // Key j scaled by 1 + key_ramp * j: scores whose row max rises from tile to tile by more or less
  // than the tensor-core kernel's lazy-rescale threshold (Note [lazy rescale]).
  float key_ramp = 0.0f;
  // q uniform in [-q_scale, q_scale]: 300 gives scores of about +-100, past exp's range, which an
  // online softmax or a split merge that forgot to subtract its running max turns into inf or NaN.
  float q_scale = 1.0f;
  bool batch_invariant = true;  // AttentionOptions::batch_invariant (false: Note [split keys])
  // q, k, v and out in f32, f16 or bf16 (Exact only: Note [exact formats]); the inputs are drawn,
  // rounded to the format, and the oracle attends the rounded values.
  Format act = Format::f32;
  std::uint64_t seed = 0;
};
// attention() with precision Exact or TensorCore (and the log-sum-exp appended to the output).
std::unique_ptr<Case> fused_case(const FusedCaseShape& s);

struct MathShape {
  int fn = 0;  // kernels::MathFn
  std::int64_t n = 1;
  float lo = -10.0f, hi = 10.0f;
  std::uint64_t seed = 0;
};
std::unique_ptr<Case> math_case(const MathShape& s);
// The documented max ulp of each math function over the ranges math_case draws (kExp2Tc: over
// [-126, 8], DeviceMath.Exp2TcIsWithinItsBoundOnTheWeightsDomain; math_case never draws it).
double math_ulp_bound(int fn);
// The float64 reference of strict-math function `fn` (glibc's double functions; round_to_half
// computed exactly).
double math_reference(int fn, float x);
const char* math_name(int fn);

}  // namespace lockstep::harness
