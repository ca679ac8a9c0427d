#!/usr/bin/env bash
# Install Nsight Systems 2022.4 (Debian bookworm non-free, package nsight-systems) and make
# `nsys profile` work on a CPU-only Debian 12 machine. Idempotent; needs root; reaches only
# deb.debian.org. About 30-60 s from scratch, 0.02 s when everything is present.
#
# Why each step (research/nsys_local.md §4-§5):
# - bookworm carries nsight-systems only in non-free;
# - --no-install-recommends skips 8 driver/CUPTI packages that nsys does not need on CPU;
# - the CLI looks for QdstrmImporter next to target-linux-x64, but Debian installs it under
#   /usr/lib/nsight-systems/host-linux-x64; without the link `nsys profile` exits 0 and writes
#   only a .qdstrm (no .nsys-rep).
set -euo pipefail

NSYS_HOST=/usr/lib/nsight-systems/host-linux-x64
NSYS_LINK=/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
SOURCES=/etc/apt/sources.list.d/perfdoctor-nonfree.sources

if ! command -v nsys >/dev/null 2>&1 || [ ! -x "$NSYS_HOST/QdstrmImporter" ]; then
  cat > "$SOURCES" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nsight-systems >/dev/null
fi
if [ ! -e "$NSYS_LINK" ]; then ln -sfn "$NSYS_HOST" "$NSYS_LINK"; fi
nsys --version
