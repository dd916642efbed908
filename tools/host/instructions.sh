#!/usr/bin/env bash
# Instructions per eager decode call on the host, counted by callgrind (deterministic: no GPU, no
# timer). Builds tools/host/host_calls.cpp against a build's liblockstep and counts, inside
# flash_decoding and incremental_attention on the calling thread, 101 calls minus 1 call (the
# first call's one-time scratch allocation drops out), divided by 100.
# Usage: tools/host/instructions.sh [build dir, default build/default]
source "$(dirname "$0")/driver.sh"
build_driver host_calls
count() {  # count <calls> <mode> <function>
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" --toggle-collect="lockstep::$3(*" \
      "$tmp/host_calls" "$1" "$2" 2>&1 | sed -n 's/.*Collected : \([0-9,]*\).*/\1/p' | tr -d ,
}
for mode in flash_decoding incremental_attention; do
  arg=$([ $mode = incremental_attention ] && echo incremental || echo flash)
  one=$(count 1 $arg $mode)
  many=$(count 101 $arg $mode)
  echo "$mode: $(( (many - one) / 100 )) instructions per call on the host (callgrind; 101 calls $many, 1 call $one)"
done
