#!/usr/bin/env bash
# Run 152 (thirty-first session): the card decides. On an H200: run142.sh's verification of main
# (unit tests, fused properties at 1000, decode properties at 2000, parity, memcheck, racecheck),
# then, on the same warm machine, a second call: BUDGET=360 bash .gpu/run143.sh (the figures with
# PyTorch). On any other card: only the DeviceMath tests on CUDA (a few seconds), which check the
# new half_bits_rn (0x7fff for every NaN) against __float2half_rn and __floats2half2_rn over all
# 2^32 floats, NaNs included, and the rest of the device math against the host's bits (run 152
# did; H100_MATH=0: nothing).
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run142.sh tools/gpu/run143.sh tools/gpu/run152.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, kind nvidia-h200, carry [".gpu"]): bash .gpu/run152.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) BUDGET=${BUDGET:-575} bash .gpu/run142.sh ;;
  *) [ "${H100_MATH:-1}" = 0 ] && { echo "not an H200: nothing run (H100_MATH=0)"; exit 0; }
     export BUDGET=60; source "$(pwd)/.gpu/run119_common.sh"  # (BUDGET=60 source ...: unset after)
     echo "card: $name" >> $sm
     step 50 "DeviceMath tests on CUDA" math.log $G/lockstep_tests --gtest_filter='*DeviceMath*cuda*'
     grep -E '^\[ +(OK|FAILED|PASSED|SKIPPED) |mismatches|first at|Failure' $OUT/math.log | tee -a $sm ;;
esac
