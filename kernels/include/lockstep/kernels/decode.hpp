#pragma once
// Decode attention, the whole family (kernels/decode/): the parameters, the chunk kernel, the
// merge, both in one grid, and the KV-cache scatter.

#include "lockstep/kernels/decode/chunk.hpp"
#include "lockstep/kernels/decode/merge.hpp"
#include "lockstep/kernels/decode/one_grid.hpp"
#include "lockstep/kernels/decode/params.hpp"
#include "lockstep/kernels/decode/scatter.hpp"
