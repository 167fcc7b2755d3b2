#!/usr/bin/env bash
# Makes sure the Debian bookworm packages tether builds with are installed.
# As root: installs what is missing (apt-get update once, then install).
# Otherwise: names what is missing and exits non-zero.
# `deps.sh fuzz` also wants clang and libFuzzer (the fuzz harnesses only).
set -euo pipefail
pkgs=(g++ cmake ninja-build libboost1.81-dev libboost-json1.81-dev libsqlitecpp-dev
      libsqlite3-dev catch2 bubblewrap libssl-dev libhowardhinnant-date-dev)
[ "${1:-}" = fuzz ] && pkgs+=(clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "tether needs these Debian packages, which are not installed:" >&2
  echo "  ${missing[*]}" >&2
  echo "install them as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
