#!/usr/bin/env bash
# Run 132 (twenty-sixth session): Note [split keys] with the defaults that run 131's figures chose
# (Exact: fewer than 12 warps per SM, min(8, key tiles / 4, 1056 / blocks) ranges; TensorCore:
# head_dim 64 under two waves, 2 ranges). The unit tests; the fused benchmarks in three rounds
# alternating the defaults and no split (both knobs 1), one round with both knobs at 3; PyTorch's
# prefill as CUDA graph replays in the same call; racecheck over the split tests on their first
# shape (LOCKSTEP_TEST_SPLIT_SHAPES=1: run 131's Exact racecheck did not finish in 90 s), memcheck
# over them; the split properties (now drawing forced S = 2, 3, 5, 8 or the default) at 1000
# cases; on an H200 only, the decode properties at 2000 cases. Everything under $OUT is packed
# into results.tgz.
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run132.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run132.sh
BUDGET=${BUDGET:-585}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 70 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'Fused.*SplitKeys' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
for round in 1 2 3; do
  for knob in default s1; do
    unset LOCKSTEP_FUSED_TC_SPLITS LOCKSTEP_FUSED_EXACT_SPLITS
    [ $knob = s1 ] && export LOCKSTEP_FUSED_TC_SPLITS=1 LOCKSTEP_FUSED_EXACT_SPLITS=1
    step 45 "round $round $knob" f-$knob-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$knob-$round.json
  done
done
LOCKSTEP_FUSED_TC_SPLITS=3 LOCKSTEP_FUSED_EXACT_SPLITS=3 step 45 "splits 3" f-s3-1.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-s3-1.json
unset LOCKSTEP_FUSED_TC_SPLITS LOCKSTEP_FUSED_EXACT_SPLITS
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    knob = os.path.basename(f)[:-5].split('-')[1]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            rows[(r['name'][16:], r['shape'][:44], knob)].append((round(r['median_ms'], 4), round(r.get('busy_stream_ms', 0), 4)))
for k in sorted(rows): print(*k, '(idle, busy) ms:', rows[k])
P
PYTHONUNBUFFERED=1 step 60 "PyTorch prefill as graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph" $OUT/graph.log | tee -a $sm
LOCKSTEP_TEST_SPLIT_SHAPES=1 step 200 "racecheck split tests, first shape" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*SplitKeys*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED|^\[       OK' $OUT/racecheck.log | tail -4 | tee -a $sm
step 60 "memcheck split tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*SplitKeys*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
RC_PARAMS="max_success=1000" step 150 "split properties 1000" props_split.log $G/lockstep_proptests --gtest_filter='*SplitKeys*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_split.log | tee -a $sm
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  RC_PARAMS="max_success=2000" step 240 "decode properties 2000" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
  grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
fi
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
