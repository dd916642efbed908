#!/usr/bin/env bash
# Run 124b (twenty-fourth session): checks 6ae436f, where the serial head_dim 64 wgmma schedule is
# the default (Note [four wgmma blocks per SM]) and the host path is shorter (9b90ce9, 043a85d):
# the unit tests on cuda:0; the fused benchmarks alternating the default and
# LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0, three rounds; the decode benchmarks twice (host time per
# call); the fused properties at 1000 cases with the defaults; memcheck over the fused and decode
# tests. Everything under $OUT is packed into results.tgz (the tool returns at most 8 files).
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run124.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run124.sh
BUDGET=${BUDGET:-400}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
for round in 1 2 3; do
  for serial in default 0; do
    if [ $serial = default ]; then unset LOCKSTEP_FUSED_TC_WGMMA_SERIAL; else export LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0; fi
    step 40 "round $round serial $serial" f-$serial-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$serial-$round.json
  done
done
unset LOCKSTEP_FUSED_TC_WGMMA_SERIAL
for round in 1 2; do
  step 30 "decode round $round" v-$round.log $G/lockstep-bench --device cuda:0 --filter '^decode$|^flash_decoding$' --json $OUT/v-$round.json
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/[vf]-*.json')):
    parts = os.path.basename(f)[:-5].split('-')
    knob = ('serial ' + parts[1]) if parts[0] == 'f' else 'decode'
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if parts[0] == 'f' and 'tensor' not in r['name']: continue
            rows[(r['name'], r['shape'][:44], knob)].append(
                (round(r['median_ms'], 4), round(100 * r.get('frac_read_ceiling', 0), 1), round(r.get('host_us_per_call', 0), 1)))
for k in sorted(rows): print(*k, rows[k])
P
RC_PARAMS="max_success=1000" step 120 "fused properties 1000, defaults" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_fused.log | tee -a $sm
step 60 "memcheck fused and decode tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*:*Flash*cuda*:*KvCache*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
