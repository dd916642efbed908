// The CPU execution model: lanes, lane expressions and CpuExec<N>, the context a kernel template
// is instantiated with on the simulated device (docs/kernels.md, docs/architecture.md).
//
// Deliberately no #pragma once: this header is compiled once per SIMD variant (cpu_variant.cpp is
// built with -mavx512*, -mavx2 -mfma, or baseline flags) inside the namespace LOCKSTEP_CPU_NS, so
// every variant gets its own types and no inline function is shared between variants.
//
// A block of N threads runs in lockstep, statement by statement. A per-thread value is a
// LaneArray<T, N>: N values in memory. Arithmetic on lanes builds a small expression tree that is
// evaluated, when assigned, one SIMD chunk (kL lanes) at a time, so a statement such as
//   s = s + x.exp(v - m);
// runs as one loop with everything in registers. Every operation maps to an IEEE-exact
// Highway operation, and fma is a real fused multiply-add (never multiply + add, see fma in lanes/chunks.hpp).
//
// The model is split by concept into parts, which this header includes in order inside this
// variant's namespace (each part relies on the ones before it):
//   lanes/chunks.hpp       SIMD chunk values (VF, VI, VM): kL lanes in one register
//   lanes/expressions.hpp  lane expressions, LaneArray, and the lane-wise math
//   lanes/memory.hpp       loads, stores and asynchronous copies of lanes
//   lanes/cross_lane.hpp   shuffles and butterfly reductions within a warp
//   lanes/matrix.hpp       fp16 storage and the tensor-core instructions, emulated
//   rows/simd.hpp          the SIMD vocabulary of the kernels' CPU row forms (kernels/row_form.hpp)
//   rows/*.hpp             the row forms of the decode chunk kernel, Exact attention and softmax
//                          (kernels/decode/rows.hpp, fused/exact_rows.hpp, softmax_rows.hpp) in
//                          CpuExec, over rows/simd.hpp
//   lanes/cpu_exec.hpp     CpuExec<N>: the execution context of one block, built from the above

#ifndef LOCKSTEP_CPU_NS
#error "define LOCKSTEP_CPU_NS (the SIMD variant namespace) before including lanes.hpp"
#endif

#include <hwy/highway.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/error.hpp"
#include "lockstep/formats.hpp"
#include "lockstep/kernels/decode/rows.hpp"
#include "lockstep/kernels/fused/exact_rows.hpp"
#include "lockstep/kernels/math.hpp"
#include "lockstep/kernels/softmax_rows.hpp"
#include "kernel_table.hpp"  // CpuPaths

#include "lanes/chunks.hpp"
#include "lanes/expressions.hpp"
#include "lanes/memory.hpp"
#include "lanes/cross_lane.hpp"
#include "lanes/matrix.hpp"
#include "rows/simd.hpp"
#include "rows/decode.hpp"
#include "rows/exact.hpp"
#include "rows/softmax.hpp"
#include "lanes/cpu_exec.hpp"

#undef LS_INLINE
