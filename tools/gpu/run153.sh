#!/usr/bin/env bash
# Run 153 (thirty-first session): the CPU device's row-major softmax (Note [row-major softmax])
# against CUDA: the property Kernels.SoftmaxRows at 500 cases (CUDA == the CPU's native variant,
# now the row-major code, == its generic variant, the lane code; both within the oracle's bound)
# and the softmax unit tests on both devices. Then, on an H200 only, run143.sh with the rest of
# the budget (the figures with PyTorch): on an H200 this is the second call, after run152.sh.
# Staging: as run152.sh, plus tools/gpu/run153.sh. Run: bash .gpu/run153.sh
export BUDGET=${BUDGET:-590}
source "$(pwd)/.gpu/run119_common.sh"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name" | tee -a $sm
RC_PARAMS="max_success=500" step 150 "softmax property 500" props_softmax.log $G/lockstep_proptests --gtest_filter='Kernels.SoftmaxRows'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED|OK, passed" $OUT/props_softmax.log | tee -a $sm
step 40 "softmax unit tests" softmax_units.log $G/lockstep_tests --gtest_filter='*Softmax*'
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure" $OUT/softmax_units.log | head -6 | tee -a $sm
case "$name" in
  *H200*) BUDGET=$(( $(left) - 5 )) bash .gpu/run143.sh ;;
  *) echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm ;;
esac
