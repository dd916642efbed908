#pragma once
// Fused attention, the whole family (kernels/fused/): Exact (strict fp32), TensorCore (mma.sync),
// Wgmma (warpgroup products) and the packing kernels.

#include "lockstep/kernels/fused/common.hpp"
#include "lockstep/kernels/fused/exact.hpp"
#include "lockstep/kernels/fused/mma_sync.hpp"
#include "lockstep/kernels/fused/pack.hpp"
#include "lockstep/kernels/fused/wgmma.hpp"
