#!/usr/bin/env bash
# Run 147 (twenty-ninth session): with the session's last device time (under 10 minutes) the
# properties that issues 5 and 6 ask of an H200, only on an H200: the decode properties at 2000
# cases (CUDA == CPU, batch invariance, incremental) and every fused property at 1000; on any
# other card it stops at once. Staging: as run142.sh, plus this script.
# Run (device tool, carry [".gpu"]): BUDGET=<seconds> bash .gpu/run147.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
RC_PARAMS="max_success=2000" step 200 "decode properties 2000" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
RC_PARAMS="max_success=1000" step 170 "fused properties 1000" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_fused.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
