#!/usr/bin/env bash
# Run 148 (thirtieth session): the card decides. On an H200: run142.sh's verification of main
# (unit tests, among them the new DeviceMath.HalfRoundingIsTheCpusOverEveryFloat; fused
# properties at 1000, decode properties at 2000, parity, memcheck, racecheck), then, on the same
# warm machine, a second call: BUDGET=360 bash .gpu/run143.sh (the figures with PyTorch). On any
# other card: the unit tests only (UNIT_ONLY=1), which run the new test of CUDA's fp16 rounding
# against math::half_bits_rn over all 2^32 floats on a GPU for the first time (H100_UNITS=0: nothing,
# once runs 148-149 had run them).
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run142.sh tools/gpu/run143.sh tools/gpu/run148.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, kind nvidia-h200, carry [".gpu"]): bash .gpu/run148.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) BUDGET=${BUDGET:-575} bash .gpu/run142.sh ;;
  *) if [ "${H100_UNITS:-1}" = 1 ]; then UNIT_ONLY=1 BUDGET=${BUDGET:-150} bash .gpu/run142.sh; else echo "not an H200: nothing run"; fi ;;
esac
