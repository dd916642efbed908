#pragma once
// The whole public API.
#include "lockstep/buffer.hpp"
#include "lockstep/device.hpp"
#include "lockstep/device_id.hpp"
#include "lockstep/error.hpp"
#include "lockstep/interop.hpp"
#include "lockstep/shapes.hpp"
