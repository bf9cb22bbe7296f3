#!/usr/bin/env bash
# Fetches, here, the Debian 12 packages that kiln's build needs and the GPU machine lacks (it has CUDA, CMake and
# ninja, and no package registry): fmt, nlohmann-json, CLI11, PCRE2, OpenSSL's headers, GoogleTest, pkg-config.
# They land in .gpu-deps/ (ignored by git), copied with the tree to the GPU machine; scripts/gpu-check.sh
# unpacks them into a prefix there. Idempotent: a package already fetched is not fetched again. About 5 MB.
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
# The peer: llama.cpp as the llama-cpp-python source package vendors it (the version the test venv pins),
# trimmed to what llama-bench, llama-batched-bench and llama-quantize need with the CPU and CUDA backends
# (~6 MB). scripts/gpu-check.sh peer builds it there.
peer="$dir/llama.cpp.tar.xz"
if [ ! -f "$peer" ]; then
  version=$(grep -E '^llama-cpp-python==' "$KILN_ROOT/scripts/requirements-test.txt" | cut -d= -f3)
  [ -n "$version" ] || die "scripts/requirements-test.txt does not pin llama-cpp-python"
  cache="$KILN_CACHE/peer"
  mkdir -p "$cache"
  sdist="$cache/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    say "downloading the llama-cpp-python $version source package"
    "$KILN_VENV/bin/pip" download --quiet --no-deps --no-binary :all: -d "$cache" "llama-cpp-python==$version"
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar xzf "$sdist" -C "$work"
  src="$work/llama_cpp_python-$version/vendor/llama.cpp"
  rm -rf "$src"/{models,docs,tests,examples,pocs,benches,media,gguf-py,conversion,scripts,skills,ci,app,grammars}
  for d in "$src"/tools/*/; do
    case "$(basename "$d")" in llama-bench | batched-bench | quantize) ;; *) rm -rf "$d" ;; esac
  done
  for d in "$src"/ggml/src/ggml-*/; do
    case "$(basename "$d")" in ggml-cpu | ggml-cuda) ;; *) rm -rf "$d" ;; esac
  done
  printf 'llama_add_compile_flags()\nadd_subdirectory(batched-bench)\nadd_subdirectory(llama-bench)\nadd_subdirectory(quantize)\n' \
    >"$src/tools/CMakeLists.txt"
  say "packing llama.cpp $version for the GPU machine into .gpu-deps/llama.cpp.tar.xz"
  tar cJf "$peer" -C "$(dirname "$src")" llama.cpp
fi
