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
# gguf-py's wheel (pure Python, the version the test venv pins): bench/random_kquant_gguf.py and gpu_peer.py read
# and write GGUF files there with it (scripts/gpu-check.sh puts it on PYTHONPATH).
if ! compgen -G "$dir/gguf-*.whl" >/dev/null; then
  gguf_version=$(grep -E '^gguf==' "$KILN_ROOT/scripts/requirements-test.txt" | cut -d= -f3)
  [ -n "$gguf_version" ] || die "scripts/requirements-test.txt does not pin gguf"
  [ -x "$KILN_VENV/bin/pip" ] || die "the test venv is missing: run scripts/setup-venv.sh"
  say "downloading the gguf $gguf_version wheel into .gpu-deps/"
  "$KILN_VENV/bin/pip" download --quiet --no-deps --only-binary :all: -d "$dir" "gguf==$gguf_version"
fi
# The peer: llama.cpp as the llama-cpp-python source package vendors it (the version the test venv pins),
# trimmed to what llama-bench, llama-batched-bench, llama-quantize, llama-imatrix and llama-perplexity need
# with the CPU and CUDA backends (~6 MB). scripts/gpu-check.sh peer builds it there.
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
    case "$(basename "$d")" in llama-bench | batched-bench | quantize | imatrix | perplexity) ;; *) rm -rf "$d" ;; esac
  done
  for d in "$src"/ggml/src/ggml-*/; do
    case "$(basename "$d")" in ggml-cpu | ggml-cuda) ;; *) rm -rf "$d" ;; esac
  done
  { echo 'llama_add_compile_flags()'; printf 'add_subdirectory(%s)\n' batched-bench llama-bench quantize imatrix perplexity; } \
    >"$src/tools/CMakeLists.txt"
  say "packing llama.cpp $version for the GPU machine into .gpu-deps/llama.cpp.tar.xz"
  tar cJf "$peer" -C "$(dirname "$src")" llama.cpp
fi
# --peer-binaries: also the peer's CUDA tools built here (nvcc compiles for sm_90a without a GPU; about 40
# minutes on 2 cores), packed as .gpu-peer/llama.cpp-cuda.tar.xz (~42 MB, ignored; a folder of its own, to be
# carried to the GPU machine only by the calls that run the peer): llama.cpp/build/bin with the three
# tools and their shared libraries, which find one another through $ORIGIN. The driver's libcuda.so.1, absent
# here, is left for the GPU machine to resolve; NCCL, which only several GPUs use, is left out.
# scripts/gpu-check.sh unpacks them instead of building the source when they start there, which spares a call
# about four minutes of the GPU machine's time.
# PEER_BUILD_DIR: where the source is unpacked and built (default: the cache; an existing build is reused).
if [ "${1:-}" = "--peer-binaries" ] && [ ! -f "$KILN_ROOT/.gpu-peer/llama.cpp-cuda.tar.xz" ]; then
  command -v nvcc >/dev/null || die "--peer-binaries needs nvcc (the CUDA toolkit) on the PATH"
  build_root="${PEER_BUILD_DIR:-$KILN_CACHE/peer-cuda/llama.cpp}"
  if [ ! -f "$build_root/CMakeLists.txt" ]; then
    mkdir -p "$(dirname "$build_root")"
    tar xJf "$peer" -C "$(dirname "$build_root")"
    [ "$(basename "$build_root")" = llama.cpp ] || mv "$(dirname "$build_root")/llama.cpp" "$build_root"
  fi
  say "building llama.cpp's CUDA tools in $build_root/build"
  cmake -S "$build_root" -B "$build_root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CUDA_NCCL=OFF \
    '-DCMAKE_BUILD_RPATH=$ORIGIN' -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined >/dev/null
  cmake --build "$build_root/build" -j "$(nproc)" --target llama-bench llama-batched-bench llama-quantize
  bin="$build_root/build/bin"
  stage=$(mktemp -d)
  mkdir -p "$stage/llama.cpp/build/bin"
  cp -a "$bin"/llama-bench "$bin"/llama-batched-bench "$bin"/llama-quantize "$bin"/*.so* "$stage/llama.cpp/build/bin/"
  strip --strip-unneeded "$stage"/llama.cpp/build/bin/* 2>/dev/null || true
  say "packing llama.cpp's CUDA tools into .gpu-peer/llama.cpp-cuda.tar.xz"
  mkdir -p "$KILN_ROOT/.gpu-peer"
  tar cJf "$KILN_ROOT/.gpu-peer/llama.cpp-cuda.tar.xz" -C "$stage" llama.cpp
  rm -rf "$stage"
fi
# --kiln-binaries: kiln, cuda_tests, attention_bench, matmul_bench and the CUPTI trace library of the
# `cuda-dev` preset (sm_90a) built here from this tree, stripped and packed as .gpu-kiln/kiln-cuda.tar.xz
# (~30 MB: one xz stream whose 192 MiB window holds the device code the binaries share; git-ignored; with
# .gpu-deps and the tree, under what a call carries, but not beside .gpu-peer) with the hash of the sources
# they were built from (scripts/tree-hash.sh) in .gpu-kiln/tree.sha256. scripts/gpu-check.sh unpacks them
# instead of building where its tree gives the same hash, which spares a call the build (1.5 to 3.5 minutes
# of the GPU machine's time). Made again whenever the tree's hash or the set of binaries has changed.
# KILN_BINARIES="cuda_tests": those targets beside kiln instead. KILN_BASE=DIR: binaries built from an earlier
# tree (DIR/kiln, DIR/matmul_bench, stripped) packed beside them as base/ (unpacked as build/cuda-dev/base/: the
# ab step's KILN_BIN, the bench step's BENCH_BASE, the trace step's TRACE_BASE, the attndecode step's
# base/attention_bench), for A/B runs in one call; each follows its twin in the stream, and a base kiln adds
# about 15 MB.
if [ "${1:-}" = "--kiln-binaries" ]; then
  command -v nvcc >/dev/null || die "--kiln-binaries needs nvcc (the CUDA toolkit) on the PATH"
  pack_dir="$KILN_ROOT/.gpu-kiln"
  want="kiln ${KILN_BINARIES:-cuda_tests attention_bench matmul_bench kiln_cuda_trace}"
  want=$(printf '%s\n' $want | sort -u | tr '\n' ' ')
  base_hash=
  if [ -n "${KILN_BASE:-}" ]; then
    [ -d "$KILN_BASE" ] || die "KILN_BASE=$KILN_BASE: not a folder"
    base_hash="base:$(cat "$KILN_BASE"/* | sha256sum | cut -c1-16)"
  fi
  want="$want$base_hash"
  stamp="$("$KILN_ROOT/scripts/tree-hash.sh") $want"
  packed="$(cat "$pack_dir/tree.sha256" 2>/dev/null || true) $(cat "$pack_dir/binaries" 2>/dev/null || true)"
  if [ ! -f "$pack_dir/kiln-cuda.tar.xz" ] || [ "$packed" != "$stamp" ]; then
    say "building $want(cuda-dev) for the GPU machine"
    targets=()
    for t in ${want%base:*}; do targets+=(--target "$t"); done
    (cd "$KILN_ROOT" && cmake --preset cuda-dev >/dev/null && cmake --build build/cuda-dev "${targets[@]}")
    [ "$("$KILN_ROOT/scripts/tree-hash.sh") $want" = "$stamp" ] || die "the tree changed during the build: run it again"
    stage=$(mktemp -d)
    mkdir -p "$stage/tools/kiln" "$stage/tests"
    if [ -n "$base_hash" ]; then mkdir -p "$stage/base" && cp "$KILN_BASE"/* "$stage/base/"; fi
    for t in ${want%base:*}; do
      case "$t" in
        kiln) strip -o "$stage/tools/kiln/kiln" "$KILN_ROOT/build/cuda-dev/tools/kiln/kiln" ;;
        kiln_cuda_trace)
          strip -o "$stage/tests/libkiln_cuda_trace.so" "$KILN_ROOT/build/cuda-dev/tests/libkiln_cuda_trace.so"
          ;;
        *) strip -o "$stage/tests/$t" "$KILN_ROOT/build/cuda-dev/tests/$t" ;;
      esac
    done
    say "packing them into .gpu-kiln/kiln-cuda.tar.xz"
    mkdir -p "$pack_dir"
    rm -f "$pack_dir/tree.sha256" "$pack_dir/binaries"
    # Each base binary right after its twin, inside the window that finds what they share.
    files=$(cd "$stage" && find tools tests -type f | sort)
    if [ -n "$base_hash" ]; then
      files=$(for f in $files; do
        echo "$f"
        if [ -e "$stage/base/$(basename "$f")" ]; then echo "base/$(basename "$f")"; fi
      done)
    fi
    tar cf - -C "$stage" $files | xz -T1 --lzma2=preset=9,dict=192MiB >"$pack_dir/kiln-cuda.tar.xz"
    echo "${stamp%% *}" >"$pack_dir/tree.sha256"
    echo "$want" >"$pack_dir/binaries"
    rm -rf "$stage"
  fi
fi
# --split-model FILE NAME: a model for the GPU machine in parts of 58 MB, each small enough for one call beside the
# tree, as .gpu-model/NAME/part-NN with the file's sha256 (ignored by git); scripts/gpu-check.sh joins them there
# into /tmp/kiln-models/NAME.gguf once every part has come (a call each, the `gather` step, the machine kept warm).
if [ "${1:-}" = "--split-model" ]; then
  [ $# -eq 3 ] && [ -f "$2" ] || die "usage: scripts/gpu-deps.sh --split-model FILE NAME"
  dir="$KILN_ROOT/.gpu-model/$3"
  rm -rf "$dir" && mkdir -p "$dir"
  split -b 58000000 -d -a 2 "$2" "$dir/part-"
  sha256sum "$2" | cut -d' ' -f1 >"$dir/sha256"
  say "$2: $(ls "$dir" | grep -c part-) parts in .gpu-model/$3/"
fi
