#!/usr/bin/env bash
# Run 126 (twenty-fifth session): Note [deferred P.V wait] on the GPU, and the H200 figures that
# run 125 was to take. In one call: the unit tests (the deferred schedule's bytes against the
# serial one's on cuda:0 among them); PyTorch's prefill and decode; the fused benchmarks in four
# rounds alternating the default (serial), LOCKSTEP_FUSED_TC_WGMMA_DEFER=1 and
# LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0; the decode benchmarks twice; PyTorch's prefill again (FA2's
# figure moves between calls); the fused properties at 1000 cases with the deferred schedule
# forced; memcheck and racecheck over the wgmma tests. A summary of (median ms, TFLOP/s or % of
# the read ceiling, host us per call) per knob set and round; everything under $OUT is packed
# into results.tgz (the tool returns at most 8 files).
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run126.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run126.sh
BUDGET=${BUDGET:-540}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'FusedWgmma(Deferred|Serial)GivesTheSameBytes' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
PYTHONUNBUFFERED=1 step 60 "PyTorch 1" torch-1.log python3 $G/torch_peers.py --prefill --json $OUT/peers-1.json
for round in 1 2 3 4; do
  for knob in default defer overlap; do
    unset LOCKSTEP_FUSED_TC_WGMMA_DEFER LOCKSTEP_FUSED_TC_WGMMA_SERIAL
    [ $knob = defer ] && export LOCKSTEP_FUSED_TC_WGMMA_DEFER=1
    [ $knob = overlap ] && export LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0
    step 40 "round $round $knob" f-$knob-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$knob-$round.json
  done
done
unset LOCKSTEP_FUSED_TC_WGMMA_DEFER LOCKSTEP_FUSED_TC_WGMMA_SERIAL
for round in 1 2; do
  step 30 "decode round $round" v-$round.log $G/lockstep-bench --device cuda:0 --filter '^decode$|^flash_decoding$' --json $OUT/v-$round.json
done
PYTHONUNBUFFERED=1 step 60 "PyTorch 2" torch-2.log python3 $G/torch_peers.py --prefill --json $OUT/peers-2.json
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/[vf]-*.json')):
    parts = os.path.basename(f)[:-5].split('-')
    knob = parts[1] if parts[0] == 'f' else 'decode'
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            rows[(r['name'], r['shape'][:44], knob)].append(
                (round(r['median_ms'], 4), round(r.get('GFLOPs', 0) / 1000, 1), round(100 * r.get('frac_read_ceiling', 0), 1),
                 round(r.get('host_us_per_call', 0), 1)))
for k in sorted(rows): print(*k, rows[k])
for f in sorted(glob.glob(out + '/peers-*.json')):
    for r in json.load(open(f))['rows']:
        if r['op'] == 'prefill' or r['shape'].startswith(('B=1 H=32', 'B=32', 'B=128')):
            print(os.path.basename(f), r['op'], r['dtype'], r['backend'], r['shape'], round(r.get('median_ms', 0), 4),
                  round(r.get('TFLOPs', 0) or r.get('GBps', 0) or 0, 1))
P
LOCKSTEP_FUSED_TC_WGMMA_DEFER=1 RC_PARAMS="max_success=1000" step 120 "fused properties 1000, deferred forced" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_fused.log | tee -a $sm
LOCKSTEP_FUSED_TC_WGMMA_DEFER=1 step 60 "memcheck fused tests, deferred forced" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 60 "racecheck wgmma tests" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmma*cuda*'
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -3 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
