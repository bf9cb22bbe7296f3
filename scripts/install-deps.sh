#!/usr/bin/env bash
# Installs the Debian 12 packages kiln builds with. Idempotent: does nothing when all are present.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

pkgs=(build-essential cmake ninja-build ccache pkg-config git unzip
      nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libssl-dev libboost-dev
      libgtest-dev libgmock-dev libbenchmark-dev python3 python3-venv python3-pip
      chromium)  # headless, for the chat page test (tests/python/test_serve_page.py)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
say "installing Debian packages: ${missing[*]}"
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
