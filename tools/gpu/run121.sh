#!/usr/bin/env bash
# Run 121 (planned in the twenty-first session; run 120's plan, whose one call was lost): the unit
# tests on cuda:0; the decode benchmarks in three rounds alternating LOCKSTEP_DECODE_TAIL_PREFETCH
# = 0 (HEAD's default kernel, run 119's code), 1 (the prefetching variant with one block
# prefetching: what its rolled first copies cost alone), 132, 264, 528 and every block; then the
# rest of the verification of HEAD's library (the decode properties at 2000 cases, again at 500
# with every chunk block prefetching (Note [tail prefetch]), all properties at 300, parity,
# memcheck over the decode tests and racecheck over the prefetching variant's test).
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run121.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run121.sh
BUDGET=${BUDGET:-560}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
F='^decode$|^flash_decoding$'
for round in 1 2 3; do
  for tail in 0 1 132 264 528 1000000; do
    if [ $(left) -lt 300 ]; then echo "round $round tail $tail skipped: $(left) s left" | tee -a $sm; continue; fi
    LOCKSTEP_DECODE_TAIL_PREFETCH=$tail step 30 "round $round tail $tail" v-$tail-$round.log $G/lockstep-bench --device cuda:0 --filter "$F" --json $OUT/v-$tail-$round.json
    grep -E "^\| cuda.*flash_decoding \|" $OUT/v-$tail-$round.log | cut -c1-110 | tee -a $sm
  done
done
# Per benchmark and N: (median ms, % of the read ceiling, the ceiling in GB/s, host us per call) per round.
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/v-*.json')):
    tail = os.path.basename(f).split('-')[1]
    d = json.load(open(f))
    for dev in d['devices']:
        c = dev.get('ceilings', {})
        for r in dev['results']:
            rows[(r['name'], r['shape'][:44], tail)].append((round(r['median_ms'], 4), round(100 * r.get('frac_read_ceiling', 0), 1), round(c.get('read_GBps', 0)), round(r.get('host_us_per_call', 0), 1)))
for k in sorted(rows, key=lambda k: (k[0], k[1], int(k[2]))): print(*k, rows[k])
P
RC_PARAMS="max_success=2000" step 150 "decode properties 2000" props.log $G/lockstep_proptests --gtest_filter='Decode.*:*IncrementalDecode*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props.log | tee -a $sm
LOCKSTEP_DECODE_TAIL_PREFETCH=1000000 RC_PARAMS="max_success=500" step 60 "decode properties 500, every block prefetching" props_pf.log $G/lockstep_proptests --gtest_filter='Decode.*:*IncrementalDecode*'
grep -E "^\[  (PASSED|FAILED) |Falsifiable" $OUT/props_pf.log | tee -a $sm
RC_PARAMS="max_success=300" step 60 "all properties 300" props_all.log $G/lockstep_proptests
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED|Falsifiable" $OUT/props_all.log | head -10 | tee -a $sm
step 40 "parity 60 cases" parity.log $G/lockstep parity --device cuda:0 --cases 60
tail -2 $OUT/parity.log | tee -a $sm
LOCKSTEP_DECODE_TAIL_PREFETCH=1000000 step 40 "memcheck decode/flash/kv cache/interop tests, every block prefetching" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Decod*cuda*:*Flash*cuda*:*KvCache*cuda*:*Increm*cuda*:CudaInterop*:-CudaInterop.OutOfMemory*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 40 "racecheck the prefetching variant's test" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*DecodeL2Policies*cuda*'
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
