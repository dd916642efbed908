#!/usr/bin/env bash
# Quick start, command 1: installs the Debian packages lockstep needs, builds it, and runs the
# main job (`lockstep demo` on the auto device: CUDA when a usable GPU exists, else the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake --preset default > /dev/null
cmake --build --preset default
./build/default/apps/lockstep devices
./build/default/apps/lockstep demo --device auto
