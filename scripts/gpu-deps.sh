#!/usr/bin/env bash
# Fetches, here, the Debian 12 packages that kiln's build needs and the GPU machine lacks (it has CUDA, CMake and
# ninja, and no package registry): fmt, nlohmann-json, CLI11, PCRE2, OpenSSL's headers, GoogleTest, pkg-config.
# They land in .gpu-deps/ (ignored by git), which a `device` call carries; scripts/gpu-check.sh unpacks them into a
# prefix there. Idempotent: a package already fetched is not fetched again. About 5 MB.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
pkgs=(nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
      libpcre2-posix3 libssl-dev libssl3 libgtest-dev libgmock-dev pkgconf pkgconf-bin libpkgconf3)
dir="$KILN_ROOT/.gpu-deps"
mkdir -p "$dir"
cd "$dir"
missing=()
for p in "${pkgs[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "fetching ${missing[*]} into .gpu-deps/"
  apt-get download "${missing[@]}" 2>/dev/null
fi
# The default model's tokenizer as a Hugging Face folder (~3.5 MB): bench/gpu_parity.py and gpu_generate.py save
# it into the models they make there. Made from the GGUF by the test venv's transformers.
if [ ! -f "$dir/tokenizer/tokenizer.json" ]; then
  [ -x "$KILN_VENV/bin/python" ] || die "the test venv is missing: run scripts/setup-venv.sh and scripts/fetch-models.sh"
  say "writing the default model's tokenizer into .gpu-deps/tokenizer/"
  (cd "$KILN_ROOT/tests/python" && "$KILN_VENV/bin/python" -c "
import parity_lib as lp
from hf_cache import hf_tokenizer
hf_tokenizer(lp.MODELS / 'SmolLM2-135M-Instruct.Q4_1.gguf').save_pretrained('$dir/tokenizer')")
fi
