#!/usr/bin/env bash
# Quick start, command 2 (what CI runs): builds and runs the whole test suite — unit tests on every
# backend (CUDA instances skip with the reason when there is no GPU), the property tests (200
# cases each), the `lockstep` tool's runs (the demo, its checks' fault self-tests, parity, the
# device list's JSON), the consumer example against a fresh install, and the benchmark smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
tools/deps.sh
cmake --preset default > /dev/null
cmake --build --preset default
ctest --preset default
echo "test suite: $(( $(date +%s) - start )) s"
