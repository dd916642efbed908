#!/usr/bin/env bash
# Run 144 (twenty-ninth session): the card decides. The issues' "done when" names an H200, and the
# device tool lends an H100 or an H200 without a choice. On an H200: run142.sh's verification of
# main (unit tests, fused properties at 1000, decode properties at 2000, parity, memcheck,
# racecheck) at main's HEAD. On anything else: the pack-ahead rounds (branch pack-ahead,
# run140.sh, staged from a build of 19d3e93 in .gpu-pa), never measured so far.
# Staging: main as run142.sh (.gpu, plus this script); pack-ahead's stage.sh output moved to .gpu-pa
# with its run119_common.sh, run140.sh and check_descriptors.py.
# Run (device tool, carry [".gpu", ".gpu-pa"]): bash .gpu/run144.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) BUDGET=${BUDGET:-575} bash .gpu/run142.sh ;;
  *) rm -rf .gpu && mv .gpu-pa .gpu && BUDGET=${BUDGET:-420} bash .gpu/run140.sh ;;
esac
