#!/usr/bin/env bash
# Copies the CUDA build's binaries and the non-system shared libraries they need into .gpu/, the
# folder carried to the GPU machine (see docs/gpu-results.md for how runs are made).
set -euo pipefail
build=${1:-build-cuda}
root=$(git rev-parse --show-toplevel)
rm -rf "$root/.gpu" && mkdir -p "$root/.gpu"
cp "$root/$build"/tests/lockstep_tests "$root/$build"/proptests/lockstep_proptests \
   "$root/$build"/apps/lockstep "$root/$build"/bench/lockstep-bench "$root/.gpu/"
cp -L "$root/$build"/liblockstep.so.0 /lib/x86_64-linux-gnu/libtbb.so.12 \
   /lib/x86_64-linux-gnu/libhwy.so.1 "$root/.gpu/"
cp "$root"/tools/gpu/run.sh "$root"/tools/gpu/decode_timeline.py "$root/.gpu/"
[ -d "$root/bench/peers" ] && cp "$root"/bench/peers/*.py "$root/.gpu/" 2>/dev/null || true
(cd "$root" && git rev-parse HEAD) > "$root/.gpu/COMMIT"
du -sh "$root/.gpu"
