#!/usr/bin/env bash
# Run 119, second call (see run119a.sh): the properties on cuda:0 (decode at 2000 cases with the
# one grid; every property at 300 cases with the defaults), lockstep parity, and
# compute-sanitizer memcheck and racecheck over the decode, flash, KV-cache and interop unit
# tests with the one grid. Each step runs only if the call's time budget still holds it.
BUDGET=${BUDGET:-545}
source "$(pwd)/.gpu/run119_common.sh"
export LOCKSTEP_DECODE_ONE_GRID=1
RC_PARAMS="max_success=2000" step 140 "decode properties 2000 (one grid)" props_one.log $G/lockstep_proptests --gtest_filter='Decode.*:*IncrementalDecode*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_one.log | tee -a $sm
unset LOCKSTEP_DECODE_ONE_GRID
RC_PARAMS="max_success=300" step 150 "all properties 300" props_all.log $G/lockstep_proptests
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED|Falsifiable" $OUT/props_all.log | head -10 | tee -a $sm
step 90 "parity 60 cases" parity.log $G/lockstep parity --device cuda:0 --cases 60
tail -3 $OUT/parity.log | tee -a $sm
export LOCKSTEP_DECODE_ONE_GRID=1
for tool in memcheck racecheck; do
  step 100 "$tool decode/flash/kv cache/interop tests (one grid)" $tool.log compute-sanitizer --tool $tool --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Decod*cuda*:*Flash*cuda*:*KvCache*cuda*:*Increm*cuda*:CudaInterop*:-CudaInterop.OutOfMemory*'
  grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/$tool.log | tail -2 | tee -a $sm
done
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
