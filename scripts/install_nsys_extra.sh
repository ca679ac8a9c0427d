#!/usr/bin/env bash
# Unpack the Debian builds of Nsight Systems 2023.4 (sid) and 2024.2 (experimental) side by side,
# without installing them, so the test suite can re-export a 2022.4 report with their exporters
# and so check the loader against the SQLite schemas they write (3.7.x and 3.11.x).
#
# usage: install_nsys_extra.sh [DEST]      (DEST default: /opt/nsys-extra)
# Result: DEST/<release>/nsys (a link to that release's CLI), e.g. /opt/nsys-extra/2024.2/nsys.
# Idempotent; no root needed if DEST is writable; touches neither the system's apt setup nor dpkg's
# database (a private APT_CONFIG keeps lists and downloads under DEST/.apt). About 20 s, 390 MB
# download, 1.4 GB on disk. Only `nsys export` is expected to work from these trees: profiling with
# them would need more libraries and links (research/nsys_local.md §7).
set -euo pipefail

DEST=${1:-/opt/nsys-extra}
# release prefix -> Debian suite that carries it; the newest build of that release is taken,
# so a binNMU (+b2) or a new upload of the same release does not break the script.
RELEASES=("2023.4:sid" "2024.2:experimental")
TARGET_REL=usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64

missing=()
for item in "${RELEASES[@]}"; do
  [ -x "$DEST/${item%%:*}/nsys" ] || missing+=("$item")
done
if [ ${#missing[@]} -eq 0 ]; then
  for item in "${RELEASES[@]}"; do "$DEST/${item%%:*}/nsys" --version; done
  exit 0
fi

apt_dir=$DEST/.apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
touch "$apt_dir/status"
cat > "$apt_dir/sources.list" <<'SRC'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid non-free
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian experimental non-free
SRC
cat > "$apt_dir/apt.conf" <<CONF
Dir::Etc::sourcelist "$apt_dir/sources.list";
Dir::Etc::sourceparts "/nonexistent";
Dir::State::lists "$apt_dir/lists";
Dir::State::status "$apt_dir/status";
Dir::Cache "$apt_dir";
Dir::Cache::archives "$apt_dir/archives";
APT::Architecture "amd64";
APT::Sandbox::User "root";
CONF
export APT_CONFIG=$apt_dir/apt.conf
apt-get update -qq

for item in "${missing[@]}"; do
  release=${item%%:*}
  suite=${item#*:}
  # `apt-cache madison` lists "pkg | version | url suite/non-free amd64 Packages".
  version=$(apt-cache madison nsight-systems \
            | awk -v r="$release." -v s=" $suite/" 'index($3, r) == 1 && index($0, s) { print $3 }' \
            | sort -V | tail -n 1)
  if [ -z "$version" ]; then
    echo "install_nsys_extra: Debian $suite no longer carries nsight-systems $release.*" >&2
    exit 1
  fi
  (cd "$apt_dir/debs" && apt-get download -qq "nsight-systems=$version" "nsight-systems-target=$version")
  tree=$DEST/$release/tree
  rm -rf "$tree" && mkdir -p "$tree"
  for deb in "$apt_dir/debs"/nsight-systems{,-target}_"${version/:/%3a}"_amd64.deb; do
    dpkg-deb -x "$deb" "$tree"
  done
  rm -f "$apt_dir/debs"/*.deb
  ln -sfn "tree/$TARGET_REL/nsys" "$DEST/$release/nsys"
  "$DEST/$release/nsys" --version
done
