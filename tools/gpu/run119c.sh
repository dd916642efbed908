#!/usr/bin/env bash
# Run 119, third call: the properties with the default schedule (two decode launches) at the
# issues' case counts (every property at 1000 cases; decode's at 2000), compute-sanitizer
# memcheck over every unit test on cuda:0, and racecheck over the fused-attention unit tests
# (their kernels use shared memory). Each step runs only if the call's time budget holds it.
BUDGET=${BUDGET:-550}
source "$(pwd)/.gpu/run119_common.sh"
RC_PARAMS="max_success=2000" step 150 "decode properties 2000 (two launches)" props_dec2000.log $G/lockstep_proptests --gtest_filter='Decode.*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_dec2000.log | tee -a $sm
RC_PARAMS="max_success=1000" step 170 "all other properties 1000" props_1000.log $G/lockstep_proptests --gtest_filter='-Decode.*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_1000.log | tee -a $sm
step 120 "memcheck, every unit test" memcheck_all.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*cuda*:Cuda*:-CudaInterop.OutOfMemory*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck_all.log | tail -2 | tee -a $sm
step 100 "racecheck, fused attention and kernels tests" racecheck_fused.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*:*Kernels*cuda*:*Multihead*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck_fused.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
