#!/usr/bin/env bash
# Run 146 (twenty-ninth session): the H200 verification of issues 5 and 6, only on an H200 (the
# device tool lends an H100 or an H200 without a choice; main's code already ran on H100s, runs
# 142 and 145). On an H200: run142.sh (unit tests, fused properties at 1000, decode properties at
# 2000, parity, memcheck, racecheck) on main's staged build; on anything else it stops at once.
# Then, on the same warm machine: BUDGET=360 bash .gpu/run143.sh (the figures with PyTorch).
# Staging: as run142.sh, plus this script. Run (device tool, carry [".gpu"]): bash .gpu/run146.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) BUDGET=${BUDGET:-560} bash .gpu/run142.sh ;;
  *) echo "not an H200: nothing run" ;;
esac
