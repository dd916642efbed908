#!/usr/bin/env bash
# Run 136b (twenty-seventh session): the decode properties at 2000 cases (issue 5's "done when":
# CUDA == CPU bytes, batch invariance, incremental decode, rollback), for a card that run136.sh
# found to be an H200 (they ran at 2000 cases on an H100 in run 124 with the same decode kernels).
BUDGET=${BUDGET:-580}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $sm
RC_PARAMS="max_success=2000" step 300 "decode properties 2000 (1)" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
RC_PARAMS="max_success=2000" step 240 "decode properties 2000 (2)" props_decode2.log $G/lockstep_proptests --gtest_filter='*IncrementalAttentionGivesFlashDecodingBytes*:*RollbackThenReappend*:*CacheOperationsAndDevicePositions*:*CpuRowMajorGivesTheLaneBytes*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode2.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
