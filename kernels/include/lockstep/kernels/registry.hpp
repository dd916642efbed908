#pragma once
// The list of every kernel. Each backend instantiates every entry (CPU: one function per SIMD
// variant; CUDA: one __global__ trampoline), and lockstep::launch<K> finds K's slot here. Adding
// a kernel = writing it in kernels/ and appending it to AllKernels. It holds what the calls and
// their plans launch (attention/plan/: each schedule variant a plan or a Tuning field can
// choose), and the kernels that lockstep-bench (ceilings) and lockstep mathacc run on a device;
// no variant that only a measurement needed (docs/kernels.md, rule 11).

#include "lockstep/kernels/ceilings.hpp"
#include "lockstep/kernels/decode.hpp"
#include "lockstep/kernels/elementwise.hpp"
#include "lockstep/kernels/fused_attention.hpp"
#include "lockstep/kernels/gemm_tc.hpp"
#include "lockstep/kernels/gemm.hpp"
#include "lockstep/kernels/layout.hpp"
#include "lockstep/kernels/math_eval.hpp"
#include "lockstep/kernels/rope.hpp"
#include "lockstep/kernels/softmax.hpp"

#include <type_traits>

namespace lockstep::kernels {

// The registered decode chunk kernels of cache format C (the float ones are listed below).
#define LOCKSTEP_DECODE_CHUNKS(C)                                                                  \
  DecodeChunk<32, 1, 1, 4, C>, DecodeChunk<32, 2, 1, 4, C>, DecodeChunk<32, 4, 1, 4, C>,           \
      DecodeChunk<32, 8, 1, 4, C>, DecodeChunk<64, 1, 1, 4, C>, DecodeChunk<64, 2, 1, 4, C>,       \
      DecodeChunk<64, 4, 1, 4, C>, DecodeChunk<64, 8, 1, 4, C>, DecodeChunk<96, 1, 1, 4, C>,       \
      DecodeChunk<96, 2, 1, 4, C>, DecodeChunk<96, 4, 1, 4, C>, DecodeChunk<128, 1, 2, 3, C>,      \
      DecodeChunk<128, 2, 1, 4, C>, DecodeChunk<128, 4, 1, 4, C>, DecodeChunk<256, 1, 1, 4, C>,    \
      DecodeChunk<256, 2, 1, 4, C>

// The tensor-core fused kernels for inputs of type E (float, half or bfloat16: Note [tensor-core
// formats]) and their packing kernels.
#define LOCKSTEP_FUSED_TC(E)                                                                                    \
  FusedAttentionTensorCore<32, 1, E>, FusedAttentionTensorCore<64, 1, E>, FusedAttentionTensorCore<96, 1, E>,   \
      FusedAttentionTensorCore<128, 1, E>, FusedAttentionTensorCore<256, 1, E>,                                \
      FusedAttentionTensorCore<64, 2, E>, FusedAttentionTensorCore<96, 2, E>, FusedAttentionTensorCore<128, 2, E>, \
      /* Note [wgmma products]: (head_dim, warpgroups per block) */                                           \
      FusedAttentionWgmma<64, 1, false, true, false, E>, FusedAttentionWgmma<64, 2, false, true, false, E>,     \
      FusedAttentionWgmma<128, 1, false, true, false, E>, FusedAttentionWgmma<128, 2, false, true, false, E>,   \
      /* with packing blocks (Note [packing blocks]) */                                                        \
      FusedAttentionWgmma<64, 1, true, true, false, E>, FusedAttentionWgmma<64, 2, true, true, false, E>,       \
      FusedAttentionWgmma<128, 1, true, true, false, E>, FusedAttentionWgmma<128, 2, true, true, false, E>,     \
      /* Note [four wgmma blocks per SM] (fused.wgmma_deferred = 0), without and with packing blocks */        \
      FusedAttentionWgmma<64, 1, false, false, false, E>, FusedAttentionWgmma<64, 1, true, false, false, E>,    \
      /* Note [deferred P.V wait] (the default at head_dim 64, one warpgroup), without and with packing */     \
      FusedAttentionWgmma<64, 1, false, false, true, E>, FusedAttentionWgmma<64, 1, true, false, true, E>,      \
      FusedHalfPack<32, E>, FusedHalfPack<64, E>, FusedHalfPack<96, E>, FusedHalfPack<128, E>,                 \
      FusedHalfPack<256, E>, FusedHalfPackTiled<64, E>, FusedHalfPackTiled<128, E>

// Note [wide tiles]: head_dim 128 chunk kernels of cache format C with W times the rows per tile.
#define LOCKSTEP_DECODE_WIDE(C, W) \
  DecodeChunk<128, 4, W, 4, C>, DecodeChunk<128, 2, W, 4, C>, DecodeChunk<128, 1, 2 * W, 3, C>

template <class... Ks>
struct KernelList {
  static constexpr int size = sizeof...(Ks);
};

using AllKernels = KernelList<
    Fill32, SoftmaxRows<>, SoftmaxRows<half>, SoftmaxRows<bfloat16>, Scale, Copy3D, Transpose, Gemm, MathEval, ReadSum, ReadTiles, FmaPeak,
    GemmTensorCore, ScaleMask, KvScatter<>, Rope, Add,
    // Note [decode formats]: the append into each cache format
    KvScatter<half>, KvScatter<bfloat16>, KvScatter<fp8_e4m3>, KvScatter<fp8_e5m2>,
    // float to each storage format and back (ops::convert)
    Convert<float, half>, Convert<float, bfloat16>, Convert<float, fp8_e4m3>, Convert<float, fp8_e5m2>,
    Convert<half, float>, Convert<bfloat16, float>, Convert<fp8_e4m3, float>, Convert<fp8_e5m2, float>,
    // decode (what plan_decode chooses among): head_dim x query heads per block (G * D <= 512),
    // async tiles of 16 rows in a ring of 4 (Note [async tiles]); one head per block at head_dim
    // 128: 32-row tiles in a ring of 3 (Note [row batches])
    DecodeChunk<32, 1, 1, 4>, DecodeChunk<32, 2, 1, 4>, DecodeChunk<32, 4, 1, 4>, DecodeChunk<32, 8, 1, 4>,
    DecodeChunk<64, 1, 1, 4>, DecodeChunk<64, 2, 1, 4>, DecodeChunk<64, 4, 1, 4>, DecodeChunk<64, 8, 1, 4>,
    DecodeChunk<96, 1, 1, 4>, DecodeChunk<96, 2, 1, 4>, DecodeChunk<96, 4, 1, 4>,
    DecodeChunk<128, 1, 2, 3>, DecodeChunk<128, 2, 1, 4>, DecodeChunk<128, 4, 1, 4>,
    DecodeChunk<256, 1, 1, 4>, DecodeChunk<256, 2, 1, 4>,
    // the same for each cache format but float (Note [decode formats])
    LOCKSTEP_DECODE_CHUNKS(half), LOCKSTEP_DECODE_CHUNKS(bfloat16), LOCKSTEP_DECODE_CHUNKS(fp8_e4m3),
    LOCKSTEP_DECODE_CHUNKS(fp8_e5m2),
    LOCKSTEP_DECODE_WIDE(half, 2), LOCKSTEP_DECODE_WIDE(bfloat16, 2), LOCKSTEP_DECODE_WIDE(fp8_e4m3, 4),
    LOCKSTEP_DECODE_WIDE(fp8_e5m2, 4),
    DecodeMerge<32>, DecodeMerge<64>, DecodeMerge<96>, DecodeMerge<128>, DecodeMerge<256>,
    DecodeMerge<128, 32, 4, 1>,  // short rows (few merge blocks): Note [merge schedule]
    DecodeMerge<128, 2>, DecodeMerge<128, 4>,  // 2- and 4-chunk merge batches of short rows
    // Note [one grid]: the default chunk kernels with the merges launch_decode picks for them
    // (the 2- and 4-chunk merge batches only with 4 heads per block; the others take DecodeMerge<D>)
    DecodeOneGrid<DecodeChunk<32, 1, 1, 4>, DecodeMerge<32>>, DecodeOneGrid<DecodeChunk<32, 2, 1, 4>, DecodeMerge<32>>,
    DecodeOneGrid<DecodeChunk<32, 4, 1, 4>, DecodeMerge<32>>, DecodeOneGrid<DecodeChunk<32, 8, 1, 4>, DecodeMerge<32>>,
    DecodeOneGrid<DecodeChunk<64, 1, 1, 4>, DecodeMerge<64>>, DecodeOneGrid<DecodeChunk<64, 2, 1, 4>, DecodeMerge<64>>,
    DecodeOneGrid<DecodeChunk<64, 4, 1, 4>, DecodeMerge<64>>, DecodeOneGrid<DecodeChunk<64, 8, 1, 4>, DecodeMerge<64>>,
    DecodeOneGrid<DecodeChunk<96, 1, 1, 4>, DecodeMerge<96>>, DecodeOneGrid<DecodeChunk<96, 2, 1, 4>, DecodeMerge<96>>,
    DecodeOneGrid<DecodeChunk<96, 4, 1, 4>, DecodeMerge<96>>,
    DecodeOneGrid<DecodeChunk<128, 1, 2, 3>, DecodeMerge<128>>, DecodeOneGrid<DecodeChunk<128, 1, 2, 3>, DecodeMerge<128, 32, 4, 1>>,
    DecodeOneGrid<DecodeChunk<128, 2, 1, 4>, DecodeMerge<128>>, DecodeOneGrid<DecodeChunk<128, 2, 1, 4>, DecodeMerge<128, 32, 4, 1>>,
    DecodeOneGrid<DecodeChunk<128, 4, 1, 4>, DecodeMerge<128>>, DecodeOneGrid<DecodeChunk<128, 4, 1, 4>, DecodeMerge<128, 32, 4, 1>>,
    DecodeOneGrid<DecodeChunk<128, 4, 1, 4>, DecodeMerge<128, 2>>, DecodeOneGrid<DecodeChunk<128, 4, 1, 4>, DecodeMerge<128, 4>>,
    DecodeOneGrid<DecodeChunk<256, 1, 1, 4>, DecodeMerge<256>>, DecodeOneGrid<DecodeChunk<256, 2, 1, 4>, DecodeMerge<256>>,
    FusedAttentionExact<32>, FusedAttentionExact<64>, FusedAttentionExact<64, 8, 1>, FusedAttentionExact<96>,
    FusedAttentionExact<128>, FusedAttentionExact<256>,
    LOCKSTEP_FUSED_TC(float), LOCKSTEP_FUSED_TC(half), LOCKSTEP_FUSED_TC(bfloat16)>;

template <class K, class List>
struct kernel_index;
template <class K, class... Ks>
struct kernel_index<K, KernelList<Ks...>> {
  static constexpr int value = [] {
    int i = 0, found = -1;
    ((std::is_same_v<K, Ks> ? (found = i, ++i) : ++i), ...);
    return found;
  }();
  static_assert(value >= 0, "kernel missing from lockstep::kernels::AllKernels");
};
template <class K>
inline constexpr int kernel_index_v = kernel_index<K, AllKernels>::value;

// Whether K is in AllKernels (a choice among template variants at compile time).
template <class K, class List>
struct in_kernel_list;
template <class K, class... Ks>
struct in_kernel_list<K, KernelList<Ks...>> : std::bool_constant<(std::is_same_v<K, Ks> || ...)> {};
template <class K>
inline constexpr bool registered_v = in_kernel_list<K, AllKernels>::value;

}  // namespace lockstep::kernels
