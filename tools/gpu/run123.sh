#!/usr/bin/env bash
# Run 123 (twenty-third session): run121.sh and run122.sh cut to one call, for a session whose
# device time holds only one: the unit tests on cuda:0; the decode benchmarks in two rounds
# alternating LOCKSTEP_DECODE_TAIL_PREFETCH = 0 / 1 / every block (Note [tail prefetch]); the fused
# benchmarks in two rounds alternating LOCKSTEP_FUSED_TC_WGMMA_SERIAL = 0 / 1 (Note [four wgmma
# blocks per SM]); the softmax benchmark; PyTorch's prefill at the same shapes; ncu's occupancy
# limits of both wgmma schedules; the decode properties at 2000 cases; the fused properties at
# 1000 with the serial schedule forced; memcheck and racecheck over both variants' tests.
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run123.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run123.sh
BUDGET=${BUDGET:-585}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
cuobjdump -res-usage $G/liblockstep.so.0 2> /dev/null | grep -A1 -E 'FusedAttentionWgmma.*Li64ELi1E' | grep -oE 'REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' | paste -sd' ' | tee -a $sm
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
for round in 1 2; do
  for tail in 0 1 1000000; do
    LOCKSTEP_DECODE_TAIL_PREFETCH=$tail step 30 "round $round tail $tail" v-$tail-$round.log $G/lockstep-bench --device cuda:0 --filter '^decode$|^flash_decoding$' --json $OUT/v-$tail-$round.json
  done
  for serial in 0 1; do
    LOCKSTEP_FUSED_TC_WGMMA_SERIAL=$serial step 40 "round $round serial $serial" f-$serial-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$serial-$round.json
  done
done
# Per benchmark and shape, per knob value: (median ms, % of the read ceiling, host us per call) per round.
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/[vf]-*.json')):
    kind, knob = os.path.basename(f).split('-')[:2]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if kind == 'f' and 'tensor' not in r['name']: continue
            rows[(r['name'], r['shape'][:44], ('tail ' if kind == 'v' else 'serial ') + knob)].append(
                (round(r['median_ms'], 4), round(100 * r.get('frac_read_ceiling', 0), 1), round(r.get('host_us_per_call', 0), 1)))
for k in sorted(rows): print(*k, rows[k])
P
step 40 "softmax_rows" softmax.log $G/lockstep-bench --device cuda:0 --filter '^softmax_rows$' --json $OUT/softmax.json
grep -E "ceilings|^\| cuda.*softmax" $OUT/softmax.log | cut -c1-120 | tee -a $sm
PYTHONUNBUFFERED=1 step 120 "PyTorch prefill at the same shapes" torch.log python3 $G/torch_peers.py --prefill --json $OUT/peers.json
tail -12 $OUT/torch.log | tee -a $sm
ncu_wgmma_occupancy
RC_PARAMS="max_success=2000" step 150 "decode properties 2000" props.log $G/lockstep_proptests --gtest_filter='Decode.*:*IncrementalDecode*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props.log | tee -a $sm
LOCKSTEP_FUSED_TC_WGMMA_SERIAL=1 LOCKSTEP_FUSED_TC_WGMMA_WG=1 RC_PARAMS="max_success=1000" step 150 "fused properties 1000, the serial schedule forced" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_fused.log | tee -a $sm
LOCKSTEP_DECODE_TAIL_PREFETCH=1000000 step 40 "memcheck decode/flash/kv cache tests (every block prefetching) and the serial schedule's test" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Decod*cuda*:*Flash*cuda*:*KvCache*cuda*:*Increm*cuda*:*FusedWgmmaSerial*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 60 "racecheck the two variants' tests" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*DecodeL2Policies*cuda*:*FusedWgmmaSerial*cuda*'
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
