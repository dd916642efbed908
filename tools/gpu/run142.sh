#!/usr/bin/env bash
# Run 142 (twenty-eighth session): main's code after the session's review fixes, verified on
# whatever card comes (the issues ask for an H200), LOCKSTEP_TEST_REQUIRE_CUDA=1 (run119_common.sh):
# the unit tests (FusedBatchRowsOfALargeGridAreTheBatchAlone compares a 384-block grid's batch
# with that batch alone: the grid-dependent kernel variants), every fused property at 1000 cases
# (FusedRowsDoNotDependOnTheBatchHeadsOrQueryRows among them), the decode properties at 2000
# (CUDA == CPU, batch invariance, incremental; layers other than 0 and scores past exp's range),
# parity, memcheck over the fused, Flash-Decoding and cache tests, racecheck over the wgmma,
# split and Flash-Decoding tests. Everything under $OUT is packed into results.tgz.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run142.sh tools/gpu/check_descriptors.py .gpu/
# DECODE_S=<seconds> sets the decode properties' step (200 by default; run161.sh gives 240).
# Run (device tool, carry [".gpu"]): bash .gpu/run142.sh
BUDGET=${BUDGET:-575}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 90 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'FusedBatchRowsOfALargeGrid|DoneSlotsDoNotLengthen|HalfRoundingIsTheCpus|BeyondTheHalfRange' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
grep -E 'on cuda.*gives 0x|mismatches|first at' $OUT/tests.log | tee -a $sm
# UNIT_ONLY=1 (run148.sh on a card that is not an H200): the unit tests only.
if [ "${UNIT_ONLY:-0}" = 1 ]; then
  echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
  (cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
  exit 0
fi
RC_PARAMS="max_success=1000" step 170 "fused properties 1000" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_fused.log | tee -a $sm
RC_PARAMS="max_success=2000" step ${DECODE_S:-200} "decode properties 2000" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
step 20 "parity" parity.log $G/lockstep parity --cases 3
tail -1 $OUT/parity.log | tee -a $sm
step 40 "memcheck fused, decode, cache tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*:*Flash*cuda*:*Cache*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
LOCKSTEP_TEST_SPLIT_SHAPES=1 step 60 "racecheck wgmma, split, decode tests" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmma*cuda*:*SplitKeys*cuda*:*FlashDecoding*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
