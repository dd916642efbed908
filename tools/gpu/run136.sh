#!/usr/bin/env bash
# Run 136 (twenty-seventh session): HEAD (split keys opt-in, AttentionOptions::batch_invariant) on
# whatever card comes: the unit tests (the split tests check that the default's bytes are no
# split's), every fused property at 1000 cases (the split ones force S = 2..16), parity, memcheck
# over the fused, Flash-Decoding and cache tests, racecheck over the split tests (first shape) and
# the wgmma tests, the fused and decode benchmarks twice with PyTorch's decode and prefill (eager
# and as graph replays) in the same call. On an H200, a second call runs run136b.sh (the decode
# properties at 2000 cases). Everything under $OUT is packed into results.tgz.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run136*.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run136.sh
BUDGET=${BUDGET:-580}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 70 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'Fused.*SplitKeys' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
for round in 1 2; do
  step 40 "fused round $round" f-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$round.json
  step 30 "decode round $round" v-$round.log $G/lockstep-bench --device cuda:0 --filter '^decode$|^flash_decoding$' --json $OUT/v-$round.json
done
python3 - <<'P' | tee -a $sm
import json, glob, os
out = os.environ['OUT']
for f in sorted(glob.glob(out + '/[fv]-*.json')):
    for d in json.load(open(f))['devices']:
        for r in d['results']:
            ex = {k: round(r[k], 4) for k in ('busy_stream_ms', 'busy_ms', 'idle_stream_ms', 'host_us_per_call', 'frac_read_ceiling', 'GFLOPs', 'GBps') if isinstance(r.get(k), (int, float))}
            print(os.path.basename(f)[:-5], r['name'], r['shape'][:60], 'median', round(r['median_ms'], 4), ex)
        if f.endswith('v-1.json'): print('ceilings', d['ceilings'])
P
PYTHONUNBUFFERED=1 step 60 "PyTorch decode and prefill" torch.log python3 $G/torch_peers.py --prefill --json $OUT/peers.json
grep -E "^\| " $OUT/torch.log | tee -a $sm
PYTHONUNBUFFERED=1 step 45 "PyTorch prefill as graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph" $OUT/graph.log | tee -a $sm
RC_PARAMS="max_success=1000" step 150 "fused properties 1000" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_fused.log | tee -a $sm
step 15 "parity" parity.log $G/lockstep parity --cases 3
tail -1 $OUT/parity.log | tee -a $sm
step 70 "memcheck fused, decode, cache tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*:*Flash*cuda*:*Cache*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -3 | tee -a $sm
LOCKSTEP_TEST_SPLIT_SHAPES=1 step 60 "racecheck split tests, first shape" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*SplitKeys*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -3 | tee -a $sm
step 30 "racecheck wgmma tests" racecheck2.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmma*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck2.log | tail -3 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
