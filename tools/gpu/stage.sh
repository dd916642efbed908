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
# ptxas 13.0 has given cp.async copies an unset descriptor more than once (Note [streamed tiles]):
# an illegal instruction that loses the CUDA context and with it every later step of a GPU call
# (run 120). Check here, before a call is spent on it.
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump /tmp/nvd/nvidia/cu13/bin/cuobjdump 2>/dev/null | head -1 || true)}
if [ -n "$cuobjdump" ]; then
  "$cuobjdump" -sass "$root/.gpu/liblockstep.so.0" > "$root/.gpu/sass.txt"
  python3 "$root/tools/gpu/check_descriptors.py" "$root/.gpu/sass.txt" | tail -3 && rm -f "$root/.gpu/sass.txt" ||
    { echo "stage.sh: unset descriptors (.gpu/sass.txt): do not run this build" >&2; exit 3; }
else
  echo "stage.sh: no cuobjdump (set CUOBJDUMP): descriptors not checked" >&2
fi
du -sh "$root/.gpu"
