#!/usr/bin/env bash
# Run 141 (twenty-seventh session): the last of the session's device time, in priority order within
# BUDGET seconds: the unit tests; the fused and decode benchmarks with PyTorch's decode and prefill
# (graph replays) in the same call; every fused property at 1000 cases; the decode
# properties at 2000 cases (CUDA == CPU, batch invariance); memcheck and racecheck over the fused
# and decode tests. Everything under $OUT is packed into results.tgz.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run141.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): BUDGET=300 bash .gpu/run141.sh
BUDGET=${BUDGET:-300}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 40 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
step 30 "fused" f.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f.json
step 20 "decode" v.log $G/lockstep-bench --device cuda:0 --filter '^decode$|^flash_decoding$' --json $OUT/v.json
python3 - <<'P' | tee -a $sm
import json, glob, os
out = os.environ['OUT']
for f in sorted(glob.glob(out + '/[fv].json')):
    for d in json.load(open(f))['devices']:
        if f.endswith('v.json'): print('ceilings', {k: v for k, v in d['ceilings'].items() if 'GBps' in k or 'GFLOPs' in k})
        for r in d['results']:
            print(r['name'][-16:], r['shape'][:50], 'busy', round(r.get('busy_stream_ms', r['median_ms']), 4),
                  'read', round(r.get('frac_read_ceiling', 0), 4), 'host_us', round(r.get('host_us_per_call', 0), 2))
P
PYTHONUNBUFFERED=1 step 30 "PyTorch prefill graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph \| (fp16 flash|fp32 efficient)" $OUT/graph.log | tee -a $sm
PYTHONUNBUFFERED=1 step 30 "PyTorch decode" torch.log python3 $G/torch_peers.py --json $OUT/peers.json
grep -E "^\| decode" $OUT/torch.log | tee -a $sm
RC_PARAMS="max_success=1000" step 100 "fused properties 1000" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_fused.log | tee -a $sm
RC_PARAMS="max_success=2000" step 120 "decode properties 2000" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
step 30 "memcheck fused, decode, cache tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*:*Flash*cuda*:*Cache*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
LOCKSTEP_TEST_SPLIT_SHAPES=1 step 40 "racecheck wgmma, split, decode tests" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmma*cuda*:*SplitKeys*cuda*:*FlashDecoding*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
