// Device, Stream and Event have no out-of-line members of their own; this file anchors the
// shared pieces of the core library.
#include "lockstep/device.hpp"
