#!/usr/bin/env bash
# Run 152 (thirty-first session): the card decides. On an H200: run142.sh's verification of main
# (unit tests, fused properties at 1000, decode properties at 2000, parity, memcheck, racecheck),
# then, on the same warm machine, a second call: bash .gpu/run153.sh (the softmax checks, then
# run143.sh: the figures with PyTorch). On any other card: run153.sh's checks of the CPU's row-major softmax against CUDA
# (H100_CHECKS=0: nothing). (Run 152's own call ran the DeviceMath tests on CUDA instead: the new
# half_bits_rn against __float2half_rn and __floats2half2_rn over all 2^32 floats.)
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run142.sh tools/gpu/run143.sh tools/gpu/run152.sh tools/gpu/run153.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, kind nvidia-h200, carry [".gpu"]): bash .gpu/run152.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) BUDGET=${BUDGET:-575} bash .gpu/run142.sh ;;
  *) [ "${H100_CHECKS:-1}" = 0 ] && { echo "not an H200: nothing run (H100_CHECKS=0)"; exit 0; }
     bash .gpu/run153.sh ;;  # the row-major softmax against CUDA (run 152 ran the DeviceMath tests)
esac
