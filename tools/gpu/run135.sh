#!/usr/bin/env bash
# Run 135 (twenty-sixth session): HEAD after split keys became opt-in (AttentionOptions::
# batch_invariant = false). The unit tests (the split tests check that the default's bytes are
# those of no split), the split properties at 300 cases (S forced to 2..16), parity, and the fused
# benchmarks once (whisper-tiny rows with and without the option).
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run135.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run135.sh
BUDGET=${BUDGET:-150}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $sm
step 40 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -6 | tee -a $sm
grep -E 'Fused.*SplitKeys' $OUT/tests.log | grep -E 'OK|FAILED' | tee -a $sm
RC_PARAMS="max_success=300" step 50 "split properties 300" props.log $G/lockstep_proptests --gtest_filter='*SplitKeys*'
grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props.log | tee -a $sm
step 15 "parity" parity.log $G/lockstep parity --cases 3
tail -1 $OUT/parity.log | tee -a $sm
step 20 "bench" f.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f.json
python3 -c "
import json
for d in json.load(open('$OUT/f.json'))['devices']:
    for r in d['results']:
        if 'L=1500' in r['shape']: print(r['name'][16:], r['shape'], 'busy', round(r.get('busy_stream_ms', 0), 4))" | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
