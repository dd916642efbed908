#!/usr/bin/env bash
# Run 161 (thirty-third session): run142.sh's checks (unit tests, fused properties at 1000 cases,
# decode properties at 2000, parity, memcheck, racecheck) with 240 s for the decode properties
# (run 154 ran out at 200 during BatchInvariance) and a 590 s budget: the issues' checks at the
# session's last commit, on whatever card comes.
# Staging: as run142.sh, plus tools/gpu/run161.sh. Run: bash .gpu/run161.sh
DECODE_S=${DECODE_S:-240} BUDGET=${BUDGET:-590} exec bash "$(pwd)/.gpu/run142.sh"
