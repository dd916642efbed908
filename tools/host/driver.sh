# Sourced by the tools/host scripts: `root` (the repository), `build` (the build dir given as $1,
# default build/default), `tmp` (removed on exit), and build_driver <name>, which compiles
# tools/host/<name>.cpp against that build's liblockstep into $tmp/<name>.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
build=$(cd "$root" && realpath "${1:-build/default}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build_driver() {
  g++ -std=c++20 -O2 "$root/tools/host/$1.cpp" -I"$root/core/include" -I"$root/attention/include" \
      -I"$root/kernels/include" -L"$build" -llockstep -Wl,-rpath,"$build" -o "$tmp/$1"
}
