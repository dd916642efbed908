#!/usr/bin/env bash
# Quick start, command 1: installs the Debian packages lockstep needs, builds the library and the
# `lockstep` tool, and runs the demo on the auto device (CUDA when a usable GPU exists, else the
# CPU device), checked against the CPU device. tools/test.sh builds and runs everything else.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake --preset default > /dev/null
cmake --build --preset default --target lockstep_tool lockstep_example_decode_step
./build/default/apps/lockstep devices
./build/default/apps/lockstep demo --device auto
