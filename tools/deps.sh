#!/usr/bin/env bash
# Installs the Debian packages lockstep builds with, when any is missing (idempotent).
set -euo pipefail
pkgs="cmake ninja-build g++ libtbb-dev libhwy-dev librapidcheck-dev googletest libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" > /dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing:$missing"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing > /dev/null
