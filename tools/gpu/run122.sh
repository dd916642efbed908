#!/usr/bin/env bash
# Run 122 (planned in the twenty-second session): Note [four wgmma blocks per SM], the head_dim 64
# wgmma kernel's serial schedule at four blocks per SM (LOCKSTEP_FUSED_TC_WGMMA_SERIAL=1), for
# issue 6's 16x16x1024x64 causal (0.95x FA2 in run 119). To run after run121.sh on the same
# machine, or alone (it checks the descriptors itself):
#   its unit test on cuda:0 (the same bytes as the default schedule; the launch record shows the
#   variant ran), the fused benchmarks in two rounds alternating the knob 0 / 1, PyTorch at the
#   same shapes in the same call, the softmax benchmark (Note [softmax exponentials once]), ncu's
#   occupancy limits of both schedules, the fused properties at 1000 cases with the variant forced
#   (one warpgroup, so that every head_dim 64 case runs it), memcheck and racecheck over the
#   variant's unit test.
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run122.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run122.sh
BUDGET=${BUDGET:-560}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
cuobjdump -res-usage $G/liblockstep.so.0 2> /dev/null | grep -A1 -E 'FusedAttentionWgmma.*Li64ELi1E' | grep -oE 'REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' | paste -sd' ' | tee -a $sm
step 40 "the variant's unit tests" tests.log $G/lockstep_tests --gtest_filter='*FusedWgmma*'
grep -E '^\[  (PASSED|FAILED|SKIPPED) |Failure|Skipped' $OUT/tests.log | head -8 | tee -a $sm
for round in 1 2; do
  for serial in 0 1; do
    if [ $(left) -lt 250 ]; then echo "round $round serial $serial skipped: $(left) s left" | tee -a $sm; continue; fi
    LOCKSTEP_FUSED_TC_WGMMA_SERIAL=$serial step 40 "round $round serial $serial" f-$serial-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$serial-$round.json
    grep -E "^\| cuda.*tensor_core" $OUT/f-$serial-$round.log | cut -c1-120 | tee -a $sm
  done
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    serial = os.path.basename(f).split('-')[1]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if 'tensor' in r['name']: rows[(r['shape'][:40], serial)].append(round(r['median_ms'], 4))
for k in sorted(rows): print(*k, rows[k])
P
# Note [softmax exponentials once] (rows of up to 1024 compute each exponential once): the
# softmax benchmark, against the 58% of the copy ceiling at n = 1024 of earlier runs.
step 40 "softmax_rows" softmax.log $G/lockstep-bench --device cuda:0 --filter '^softmax_rows$' --json $OUT/softmax.json
grep -E "ceilings|^\| cuda.*softmax" $OUT/softmax.log | cut -c1-120 | tee -a $sm
PYTHONUNBUFFERED=1 step 120 "PyTorch at the same shapes" torch.log python3 $G/torch_peers.py --prefill --json $OUT/peers.json
tail -24 $OUT/torch.log | tee -a $sm
ncu_wgmma_occupancy
LOCKSTEP_FUSED_TC_WGMMA_SERIAL=1 LOCKSTEP_FUSED_TC_WGMMA_WG=1 RC_PARAMS="max_success=1000" step 150 "fused properties 1000, the serial schedule forced" props.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props.log | tee -a $sm
step 60 "memcheck the variant's test" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmmaSerial*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 60 "racecheck the variant's test" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmmaSerial*cuda*'
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
