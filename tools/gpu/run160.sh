#!/usr/bin/env bash
# Run 160 (thirty-third session): the packing blocks pack 8 kv heads ahead by default (Note
# [packing blocks]; branch pack-ahead's code, measured in run 144, back on main). On an H200 the
# card decides for the issues' verification instead (run142.sh, then run153.sh in a second call).
# Otherwise: the unit tests (the packing test at the default, 1 and 2 ahead, and a shape with 10
# kv heads), memcheck and racecheck over the packing and large-grid tests, the fused properties
# at 1000 cases, three rounds of the fused benchmarks alternating LOCKSTEP_FUSED_TC_PACK_AHEAD=1
# (main before) with the default, and FA2's graph replays in the same call.
# Staging: stage.sh, then cp tools/gpu/run119_common.sh tools/gpu/run142.sh tools/gpu/run143.sh
# tools/gpu/run153.sh tools/gpu/run160.sh tools/gpu/fused_rounds.py tools/gpu/check_descriptors.py .gpu/
# Run (device tool, kind nvidia-h200, carry [".gpu"]): bash .gpu/run160.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) echo "card: $name: the issues' verification (run142.sh)"; BUDGET=${BUDGET:-575} bash .gpu/run142.sh; exit ;;
esac
export BUDGET=${BUDGET:-560}
source "$(pwd)/.gpu/run119_common.sh"
echo "card: $name" | tee -a $sm
check_descriptors_or_stop
step 90 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|Failure' $OUT/tests.log | head -8 | tee -a $sm
grep -E 'FusedWgmmaPacking|FusedBatchRowsOfALargeGrid' $OUT/tests.log | grep -E '^\[ +(OK|FAILED)' | tee -a $sm
step 60 "memcheck packing and large-grid tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmmaPacking*cuda*:*FusedBatchRowsOfALargeGrid*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 90 "racecheck packing test" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmmaPacking*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
RC_PARAMS="max_success=1000" step 150 "fused properties 1000" props.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props.log | tee -a $sm
for round in 1 2 3; do
  for n in 1 8; do
    LOCKSTEP_FUSED_TC_PACK_AHEAD=$n step 30 "round $round ahead $n" f-a$n-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-a$n-$round.json
  done
done
python3 $G/fused_rounds.py $OUT | tee -a $sm
PYTHONUNBUFFERED=1 step 40 "FA2 graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph \| fp16 flash" $OUT/graph.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
