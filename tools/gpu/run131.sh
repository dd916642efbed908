#!/usr/bin/env bash
# Run 131 (twenty-sixth session): Note [split keys]. The unit tests (Fused*SplitKeys on cuda:0
# among them); memcheck and racecheck over the split tests; the fused properties at 1000 cases
# (Fused*SplitKeys: the split schedules, CUDA against the CPU device and float64); the fused
# benchmarks in rounds alternating the default (split where the grid is small) and
# LOCKSTEP_FUSED_TC_SPLITS=1 LOCKSTEP_FUSED_EXACT_SPLITS=1 (no split), then S = 2, 4, 6 once;
# PyTorch's prefill as CUDA graph replays (device time) at the same shapes, whisper-tiny causal
# and a 512-query chunk over 8192 keys included. Everything under $OUT is packed into results.tgz (the tool returns at most 8 files).
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run131.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run131.sh
BUDGET=${BUDGET:-585}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 70 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'Fused.*SplitKeys' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
for round in 1 2; do
  for knob in default s1; do
    unset LOCKSTEP_FUSED_TC_SPLITS LOCKSTEP_FUSED_EXACT_SPLITS
    [ $knob = s1 ] && export LOCKSTEP_FUSED_TC_SPLITS=1 LOCKSTEP_FUSED_EXACT_SPLITS=1
    step 45 "round $round $knob" f-$knob-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$knob-$round.json
  done
done
for n in 2 4 6; do
  LOCKSTEP_FUSED_TC_SPLITS=$n LOCKSTEP_FUSED_EXACT_SPLITS=$n step 45 "splits $n" f-s$n-1.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-s$n-1.json
done
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
step 90 "memcheck split tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*SplitKeys*cuda*:*FusedWgmmaDeferred*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 90 "racecheck split tests" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*SplitKeys*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
RC_PARAMS="max_success=1000" step 150 "fused properties 1000" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_fused.log | tee -a $sm
step 30 "parity" parity.log $G/lockstep parity --cases 10
tail -5 $OUT/parity.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
