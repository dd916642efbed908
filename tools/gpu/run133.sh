#!/usr/bin/env bash
# Run 133 (twenty-sixth session): Note [overlapped prefill launch] -- the wgmma attention kernel
# launched with programmatic stream serialization after the packing launch. The unit tests (the
# wgmma and split tests on cuda:0 among them); the fused benchmarks in three rounds alternating
# the default and LOCKSTEP_PDL=0 (plain launches); PyTorch's prefill as graph replays in the same
# call; memcheck over the wgmma and split tests; the fused properties at 300 cases.
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run133.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run133.sh
BUDGET=${BUDGET:-400}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 70 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
for round in 1 2 3; do
  for knob in default nopdl; do
    unset LOCKSTEP_PDL
    [ $knob = nopdl ] && export LOCKSTEP_PDL=0
    step 45 "round $round $knob" f-$knob-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$knob-$round.json
  done
done
unset LOCKSTEP_PDL
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    knob = os.path.basename(f)[:-5].split('-')[1]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if r['name'] != 'attention_fused_tensor_core': continue
            rows[(r['shape'][:44], knob)].append((round(r['median_ms'], 4), round(r.get('busy_stream_ms', 0), 4)))
for k in sorted(rows): print(*k, '(idle, busy) ms:', rows[k])
P
PYTHONUNBUFFERED=1 step 60 "PyTorch prefill as graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph" $OUT/graph.log | grep -E "fp16 flash" | tee -a $sm
step 60 "memcheck wgmma and split tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmma*cuda*:*Fused*SplitKeys*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
RC_PARAMS="max_success=300" step 90 "fused properties 300" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_fused.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
