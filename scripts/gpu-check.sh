#!/usr/bin/env bash
# Runs on the GPU machine (with .gpu-deps copied there beside the tree: scripts/gpu-deps.sh fetches it):
# unpacks the build dependencies into a prefix, builds the `cuda-dev` preset (sm_90a; or unpacks kiln and
# cuda_tests built from this same tree by scripts/gpu-deps.sh --kiln-binaries), then runs the steps named
# (default: test), writing logs under $OUT.
#   usage (on the GPU machine, in the tree): scripts/gpu-check.sh [STEP]...
#   BASE_TREE=DIR also builds an earlier tree (kiln, matmul_bench; BASE_TARGETS others) in /tmp/kiln-base for A/B
#             runs: see below.
#   test      the C++ tests that need no model file (core, ops: the op harness on CUDA, cuda)
#   cudatests cuda_tests alone (CUDA_TESTS_FILTER: a gtest filter), with no other test binary to build
#   sanitize  the CUDA op harness under compute-sanitizer memcheck and racecheck (SANITIZE_FILTER: a gtest filter
#             instead of every OpHarness test; SANITIZE_TESTS=cuda_tests: that test binary instead of ops_tests)
#   bench     bench/matmul_bench --device cuda (GEMV / GEMM kernels against the card's copy bandwidth; BENCH_ARGS its
#             arguments, BENCH_BASE=PATH another build's matmul_bench beside it, BENCH_REPS rounds)
#   mmq       the K-quant matmuls of 2 to 64 tokens (MMQ_M; the 8B's shapes) by the integer GEMV / cuBLAS
#             (KILN_CUDA_MMQ=0), by the integer tensor-core kernel from 5 tokens (the default), and from 2
#             (matmul_bench --mmq-min 2)
#   attn      tests/attention_bench (the 8B shape's attention op: prefill of 512 to 4096 tokens, decode), again
#             with KILN_CUDA_WGMMA=0 (mma.sync where Hopper takes wgmma), beside PyTorch's flash and cuDNN attention
#             on the same prefill shapes (bench/attention_peer.py), then ncu's view of the prefill kernel at 2048
#             tokens
#   attndecode the decode attention kernel alone (tests/attention_bench --decode DECODE_CASES, default 1x32768,
#             1x8192,16x4096) for each KV type of KV_TYPES (default f16 q8_0 q8_64), this build's beside a packed
#             base build's (build/cuda-dev/base/attention_bench), then ncu's view of the staged kernel at 1x32768
#             for f16 and q8_64 (NCU_DECODE=0: not)
#   ncu       ncu sections (speed of light, occupancy, warp states, memory) of one kernel in matmul_bench:
#             NCU_KERNEL (default mmq_kernel) on NCU_CASES (type:KxN:m ...)
#   ltprobe   bench/cublaslt_probe.cu: cuBLAS's bf16 GEMMs on the 8B's shapes at 9 to 64 tokens, its default and every
#             algorithm cuBLASLt's heuristic offers (LTPROBE_SHAPES: KxN ... instead)
#   tune      the m = 1 GEMV at each forced rows-a-block (matmul_bench --gemv-rows), for the launch heuristic
#             (types: TUNE_TYPES)
#   parity    bench/gpu_parity.py: random-weight models of every architecture, CPU exact vs CUDA
#   models    bench/gpu_generate.py: Llama-3-8B- and 135M-shaped models, decode and prefill, batched decode
#   prep      start making the peer step's GGUF files in the background (a later call's peer step waits for them);
#             PREP_ONLY=smollm2-135m-bf16,llama3-8b-q8_0 makes those alone (files `kiln convert` writes need no
#             llama.cpp build; the q4_ ones are quantized from the model's bf16 file, which PREP_ONLY must name);
#             on a machine kept from an earlier call, it runs again unless one is running (its files are kept);
#             llama3-8b-q4_k_r and llama3-8b-q4_0_r (smollm2-135m-... too; named alone) are
#             bench/random_kquant_gguf.py's files, Q4_K_M's or Q4_0's types and bytes from the bf16 file, with no
#             llama.cpp build
#   ab        kiln alone on the peer step's files (made by prep; waits for all of them, so that no quantizing
#             shares the machine): decode and prefill under each of the environment settings AB_ENVS (default:
#             KILN_CUDA_PDL=0 KILN_CUDA_PDL=1; A=1+B=2 sets two; KILN_BIN=PATH runs another kiln binary), interleaved,
#             on AB_FILES (default: the 135M and 8B BF16 and the 8B Q8_0; or a folder such as fp8's llama3-8b-fp8), AB_REPS rounds (default 2), with the
#             bench arguments AB_ARGS (default: -p 512 -n 128; batched decode: -p 0 -n 128 --batch 16,64)
#   profile   each kernel's time in decode steps by ncu (bench/gpu_peer.py's kernel_profile) on PROFILE_FILES
#             (default: the 8B Q4_0; waits for prep's files)
#   trace     each kernel's time within the decode steps as they run (graphs, programmatic launch): CUPTI's
#             records (bench/cuda_trace.cpp) summed by bench/cuda_trace.py, on TRACE_FILES (default: the 8B Q4_0
#             and the 135M BF16, or a folder such as fp8's llama3-8b-fp8; waits for prep's files), TRACE_ARGS
#             the bench's arguments, TRACE_LATEST=1 the steps of the last graph replayed (the batched decode of
#             -n N --batch B), TRACE_KEEP=1 the records as $OUT/trace-FILE.csv.gz, TRACE_BASE=PATH another kiln
#             traced first
#   prefill   each kernel's time in a pp2048 (ncu), kiln's and llama.cpp's, and kiln's per-op table
#             (KILN_CUDA_PROFILE) on PREFILL_FILES (default: the 8B BF16; waits for that file and the peer's build)
#   offload   partial offload beside llama.cpp (bench/gpu_peer.py --offload): OFFLOAD_LAYERS (default 16) layers on
#             the GPU, the rest on the CPU, pp512 and tg128 on OFFLOAD_FILES (default: the 8B Q4_0; waits for prep's
#             files and the peer's build), and one `kiln run --gpu-layers` generation
#   fit       bench/gpu_fit.py: a model whose weights do not fit the GPU's free memory (the rest held by another
#             process) loads with the layers that fit, unasked (the 8B Q4_K_M when prep has made it)
#   serve     kiln serve on CUDA under load, beside kiln bench --batch 64 --pg 256,128 of the same model (the engine's
#             ceilings: decode alone, and the same requests with their prefill):
#             kiln bench serve at 1, 16 and 64 concurrent requests (256-token random prompts, 128 tokens out),
#             greedy and sampled (temperature 0.8, top_p 0.95, repetition_penalty 1.1, no top_k), on SERVE_FILES
#             (default: the default model, when .gpu-model's parts have made it, and the 8B BF16 of prep); then
#             bench/deterministic_check.py against a server with and without --deterministic; SERVE_CONCURRENCY
#             the concurrency levels (default "1 16 64")
#   serveab   the serve step's 64-request rounds (greedy and sampled, after a warm-up round, each server twice) by the
#             BASE_TREE build's kiln and this tree's, interleaved, beside kiln bench --pg 256,128 --batch 64, on
#             SERVEAB_FILE (default: the default model)
#   quant     kiln quantize and kiln imatrix beside llama-quantize and llama-imatrix on the 8B BF16 of prep (waits
#             for it and for the peer's build): BF16 -> Q4_K_M on every core (wall time, and whether the files are
#             byte-identical), then an importance matrix from QUANT_CHUNKS (default 196: about 100k tokens) chunks
#             of 512 tokens of this tree's text on the GPU
#   gptq      GPTQ on the 8B BF16 of prep: kiln imatrix --full on the GPU (GPTQ_CHUNKS chunks of 512 tokens of this
#             tree's text, default 64), then kiln quantize --method gptq to Q4_K_M on every core, each timed, and the
#             file's decode on the GPU; first the default model's Gram matrices on the GPU against the CPU's
#             (bench/gram_check.py). It runs in a process session of its own (a call's 10 minutes may not hold
#             it): a later call's gptq step waits for the same run (GPTQ_WAIT seconds at most, default 540)
#   spec      speculative decoding on CUDA, the default model: kiln run --spec none / ngram on the editing prompt
#             (bench/prompts/edit-rename.txt, chat template, 256 tokens, greedy; SPEC_REPS rounds, interleaved), the
#             decode tokens/s and drafts kept, texts compared, with and without --deterministic; the texts of
#             every prompt of bench/prompts under --deterministic; the chi-square test of sampled speculation
#             on CUDA (runtime_tests in BUILD_TARGETS); then kiln serve --parallel 64 without and with --spec
#             ngram under kiln bench serve at 64 concurrent requests
#   build     nothing but the build (BUILD_TARGETS)
#   tp        tensor parallelism over the GPUs this machine has (TP_WORLDS, default: 1, and 3 where there are 3
#             GPUs: the default model's heads divide by those): the collectives' tests (cuda_tests, ops_tests), then per world the default model's
#             logits of a 64-token prompt against one GPU's (tests/logits_driver --tp; max abs and top-1) and
#             the engine's greedy 32 tokens against one GPU's (logits_driver, cuda_tests, ops_tests in
#             BUILD_TARGETS)
#   kv        the 8-bit KV caches (q8_0, q8_64) on CUDA: the op harness's attention and KV-write cases (ops_tests
#             in BUILD_TARGETS); KL divergence against f16 KV and (--exact) f32 KV on the default model; the tokens
#             1 GiB of each type holds; decode at KV_DEPTH (default 32768) positions, pp2048 and tg128@bs64, f16
#             beside each (KV_TYPES, default "f16 q8_0 q8_64"), on the default model and the 8B BF16 of prep
#   fp8       FP8 weights on CUDA: the op harness's weight cases (f8_e4m3 among them; ops_tests in BUILD_TARGETS)
#             and cuda_tests' row-form and stacked cases, then the Llama-3-8B shape's random BF16 folder written
#             as FP8 by kiln quantize (compressed-tensors, per channel) and, unless prep made it, as a BF16 GGUF by
#             kiln convert; kiln bench of the two side by side (pp2048, tg128, and --batch 64; FP8's batch also on
#             cuBLASLt's GEMM, KILN_CUDA_WGMMA=0), with each one's
#             step profile and a 2,048-token prompt's ops timed alone (KILN_CUDA_PROFILE)
#             (FP8_PROFILE=0: the two benches alone; FP8_BENCH=0: the folders made, nothing run; FP8_STATIC=1:
#             a third folder with static activation scales, from kiln imatrix's ranges, benched beside them;
#             FP8_KV=1: decode at 32,768 positions (--depth) of the FP8 folder with f16 and q8_64 KV, two rounds)
#   fp8quality bench/fp8_quality.py on CUDA at the fast precision: the default model's BF16 source (dequantized
#             from .gpu-model's parts by transformers) against FP8 with dynamic and static activations, FP8 by
#             GPTQ, and Q8_0: mean KLD, same top, perplexity
#   quanttypes bench/gpu_quant_types.py: every type kiln quantize writes, made here from the default model (dequantized
#             to F16) and from a random model of Qwen2.5-1.5B's shape, each file's tg128 on the GPU
#   burst     kiln serve on CUDA (the default model, --parallel 64) under bursts of 10x and 50x the slots (BURST_SPECS: REQUESTS:PROMPT_TOKENS ...)
#             (kiln bench serve with every request sent at once): requests answered, TTFT p50/p99, duration
#   serveprof where a served step's time goes (KILN_STEP_PROFILE=1: plan, batch, launch, wait, emit), at 64 concurrent
#             requests of the default model (256-token prompts, 128 out), greedy, sampled and sampled under a JSON
#             schema, each on a server of its own, beside kiln bench --batch 64's steps
#   gather    only gathers the model parts the call carries (.gpu-model: see below); nothing is built
#   structured kiln serve on CUDA (--parallel 64) of the default model, or of STRUCTURED_MODEL=NAME (.gpu-model/NAME):
#             bench/structured_check.py's schema suite (the outputs in $OUT/structured-NAME.json, for --validate
#             where jsonschema is), then kiln bench serve at 64 concurrent requests, unconstrained and under a JSON
#             schema, greedy and sampled (TPOT side by side)
#   peer      bench/gpu_peer.py: kiln beside llama.cpp's CUDA build (.gpu-deps/llama.cpp.tar.xz, built here into
#             /tmp/llama.cpp, alongside kiln's build) on the same GGUF files
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kiln-gpu-out}"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(test)
deps=/tmp/kiln-deps
mkdir -p "$deps"
# A later call on the same machine may come without .gpu-deps: what an earlier one unpacked is kept.
# A machine with nlohmann/json of its own keeps it: two versions' headers on the include paths (ours beside PCRE2's,
# the system's elsewhere) give the libraries different inline namespaces, and the link fails.
for f in .gpu-deps/*.deb; do
  if [[ $f == *nlohmann-json* ]] && [ -e /usr/include/nlohmann/json.hpp ]; then continue; fi
  if [ -e "$f" ]; then dpkg -x "$f" "$deps"; fi
done
lib="$deps/usr/lib/x86_64-linux-gnu"
export PATH="$deps/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$deps/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$deps"  # the .pc files say prefix=/usr
export CMAKE_PREFIX_PATH="$deps/usr"
export OPENSSL_ROOT_DIR="$deps/usr"
# gguf-py (scripts/gpu-deps.sh carries its wheel): bench/random_kquant_gguf.py, and gpu_peer.py's byte counts.
for w in .gpu-deps/gguf-*.whl; do
  if [ -e "$w" ]; then export PYTHONPATH="$PWD/$w${PYTHONPATH:+:$PYTHONPATH}"; fi
done
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  cmake --version | head -1
} | tee "$out/build.log"
# A real model travels in parts (a call's tree is too small for it), gathered in /tmp over back-to-back calls and
# joined once all are there: .gpu-model/part-* (the default model) or .gpu-model/NAME/part-* (any other, by
# scripts/gpu-deps.sh --split-model FILE NAME), each with its sha256 beside the parts, become
# /tmp/kiln-models/default.gguf or NAME.gguf. The `gather` step alone does only this: no build.
gather_model() {  # gather_model PARTS_DIR NAME
  local dest=/tmp/kiln-models/$2.gguf stage=/tmp/kiln-model-parts/$2
  compgen -G "$1/part-*" >/dev/null && [ -f "$1/sha256" ] && [ ! -e "$dest" ] || return 0
  mkdir -p "$stage" /tmp/kiln-models
  cp "$1"/part-* "$stage/"
  if [ "$(cat "$stage"/part-* | sha256sum | cut -d' ' -f1)" = "$(cat "$1/sha256")" ]; then
    cat "$stage"/part-* >"$dest.part" && mv "$dest.part" "$dest" && rm -rf "$stage"
    echo "$2: joined" | tee -a "$out/build.log"
  else
    echo "$2: $(ls "$stage" | wc -l) parts here, not all yet" | tee -a "$out/build.log"
  fi
}
gather_model .gpu-model default
for d in .gpu-model/*/; do
  if [ -d "$d" ]; then gather_model "${d%/}" "$(basename "$d")"; fi
done
if [ "${steps[*]}" = gather ]; then exit 0; fi
# The peer (llama-bench, llama-batched-bench, llama-quantize, llama-imatrix, llama-perplexity) builds beside kiln (the machine has 16 cores), in a
# process session of its own, so that it outlives this call: a later call on the same machine finds it done.
# PEER_BUILD=1 starts it whatever the steps (a later invocation's peer step in the same call waits for it).
# /tmp/llama.cpp.status holds "ok" or "failed" once it has ended.
peer_dir=/tmp/llama.cpp
peer_status=/tmp/llama.cpp.status
if { [[ " ${steps[*]} " =~ " peer " ]] || [[ " ${steps[*]} " =~ " offload " ]] || [ -n "${PEER_BUILD:-}" ] ||
  { [[ " ${steps[*]} " =~ " prep " ]] && [[ -z "${PREP_ONLY:-}" || "${PREP_ONLY}" =~ q4_(0|k_m) ]]; }; } &&
  [ ! -e "$peer_dir.started" ]; then
  touch "$peer_dir.started"
  # .gpu-peer/llama.cpp-cuda.tar.xz (scripts/gpu-deps.sh --peer-binaries: the same tools built on the
  # development machine, at this same path) is used when its llama-bench starts here; else the source builds.
  setsid bash -c '
    if [ -f .gpu-peer/llama.cpp-cuda.tar.xz ] && rm -rf "$1" && mkdir -p "$(dirname "$1")" &&
      tar xJf .gpu-peer/llama.cpp-cuda.tar.xz -C "$(dirname "$1")" && "$1/build/bin/llama-bench" --help >/dev/null
    then echo ok >"$2"; exit 0; fi
    if rm -rf "$1" && mkdir -p "$(dirname "$1")" && tar xJf .gpu-deps/llama.cpp.tar.xz -C "$(dirname "$1")" &&
      cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF &&
      cmake --build "$1/build" -j "$(nproc)" --target llama-bench llama-batched-bench llama-quantize \
        llama-imatrix llama-perplexity
    then echo ok >"$2"; else echo failed >"$2"; fi
  ' _ "$peer_dir" "$peer_status" >/tmp/llama.cpp.build.log 2>&1 </dev/null &
fi
# The output folder comes back only while it holds few files: one log a step.
# BASE_TREE=DIR: a second source tree (an earlier commit: `git archive` into an ignored folder of the tree, carried)
# copied to /tmp/kiln-base and built there beside this one, into /tmp/kiln-base/build/cuda-dev (kiln and
# matmul_bench, or the targets BASE_TARGETS names), for BENCH_BASE and the ab step's KILN_BIN. Outside the tree:
# a later call on the same machine, whose copy of the tree replaces DIR, still finds that build.
base_dir=/tmp/kiln-base
if [ -n "${BASE_TREE:-}" ]; then
  rm -rf "$base_dir" && cp -r "$BASE_TREE" "$base_dir"
  (cd "$base_dir" &&
    cmake --preset cuda-dev -DKILN_PYTHON= -DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER= &&
    cmake --build build/cuda-dev -j "$(nproc)" $(printf -- '--target %s ' ${BASE_TARGETS:-kiln matmul_bench})) \
    >"$out/build-base.log" 2>&1 &
  base_pid=$!
fi
# .gpu-kiln/kiln-cuda.tar.xz (scripts/gpu-deps.sh --kiln-binaries: kiln and cuda_tests of this preset built on
# the development machine): unpacked into the build folder instead of building, where the hash of the sources
# they were built from (.gpu-kiln/tree.sha256) is this tree's; then only what BUILD_TARGETS names, or the other
# binaries the steps run, build.
# Their RUNPATH names the other machine's CUDA folder: this machine's CUDA libraries go on the loader's path,
# and binaries that do not start here are built after all.
prebuilt=0
if [ -f .gpu-kiln/kiln-cuda.tar.xz ] && [ "$(cat .gpu-kiln/tree.sha256 2>/dev/null)" = "$(scripts/tree-hash.sh)" ] &&
  mkdir -p build/cuda-dev && tar xJf .gpu-kiln/kiln-cuda.tar.xz -C build/cuda-dev; then
  cuda_lib="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)/lib64"
  [ -d "$cuda_lib" ] && export LD_LIBRARY_PATH="$cuda_lib:$LD_LIBRARY_PATH"
  if build/cuda-dev/tools/kiln/kiln --version >/dev/null 2>&1 &&
    { [ ! -e build/cuda-dev/tests/cuda_tests ] ||
      build/cuda-dev/tests/cuda_tests --gtest_list_tests >/dev/null 2>&1; }; then
    prebuilt=1
    scripts/tree-hash.sh >build/cuda-dev/.kiln-prebuilt
    echo "$(cat .gpu-kiln/binaries 2>/dev/null || echo kiln cuda_tests): built from this tree elsewhere (.gpu-kiln)" |
      tee -a "$out/build.log"
  else
    echo "the binaries of .gpu-kiln do not start here: building them" | tee -a "$out/build.log"
    rm -f build/cuda-dev/tools/kiln/kiln build/cuda-dev/tests/cuda_tests
  fi
fi
# A later call on the same machine, without .gpu-kiln, finds the binaries an earlier one unpacked (the build folder
# is kept) and uses them while the tree's hash is still theirs.
if [ "$prebuilt" = 0 ] && [ "$(cat build/cuda-dev/.kiln-prebuilt 2>/dev/null)" = "$(scripts/tree-hash.sh)" ]; then
  cuda_lib="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)/lib64"
  [ -d "$cuda_lib" ] && export LD_LIBRARY_PATH="$cuda_lib:$LD_LIBRARY_PATH"
  prebuilt=1
  echo "kiln and cuda_tests: unpacked by an earlier call from this tree" | tee -a "$out/build.log"
fi
# BUILD_TARGETS="kiln matmul_bench ...": only those targets (a shorter call for the bench or ncu steps).
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
# With the binaries of .gpu-kiln, the steps that run others build those the pack does not hold.
if [ "$prebuilt" = 1 ] && [ ${#targets[@]} -eq 0 ]; then
  need() { [ -e "build/cuda-dev/tests/$2" ] || targets+=(--target "$1"); }
  for step in "${steps[@]}"; do
    case "$step" in
      test) need core_tests core_tests; need ops_tests ops_tests; need cuda_tests cuda_tests ;;
      cudatests) need cuda_tests cuda_tests ;;
      sanitize) need "${SANITIZE_TESTS:-ops_tests}" "${SANITIZE_TESTS:-ops_tests}" ;;
      bench | mmq | ncu | tune) need matmul_bench matmul_bench ;;
      attn | attndecode) need attention_bench attention_bench ;;
      trace) need kiln_cuda_trace libkiln_cuda_trace.so ;;
    esac
  done
fi
if [ "$prebuilt" = 0 ] || [ ${#targets[@]} -gt 0 ]; then
  cmake --preset cuda-dev -DKILN_PYTHON= -DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER= \
    >>"$out/build.log" 2>&1
  cmake --build build/cuda-dev -j "$(nproc)" "${targets[@]}" -- -k 0 >>"$out/build.log" 2>&1 || true
fi
if [ -n "${BASE_TREE:-}" ]; then
  wait "$base_pid" || echo "the base tree did not build: $(tail -3 "$out/build-base.log")"
  echo "base build: $base_dir/build/cuda-dev"
fi
grep -E "error|warning: " "$out/build.log" | head -40 || true
# BUILD_TARGETS may leave kiln out; the steps that need no kiln still run.
if [ -x build/cuda-dev/tools/kiln/kiln ]; then build/cuda-dev/tools/kiln/kiln --version | tee -a "$out/build.log"; fi
bin=build/cuda-dev
status=0
# The prep step's background process runs: started, not ended (no status yet), and alive. One that was killed
# before writing its status is not waited for.
# Until the server on localhost:PORT answers /health (two minutes at most).
wait_healthy() {
  for _ in $(seq 120); do
    python3 -c "import urllib.request as u; u.urlopen('http://localhost:$1/health', timeout=1)" 2>/dev/null && return 0
    sleep 1
  done
}
# One kiln bench serve run against the server on localhost:PORT (256-token random prompts, 128 tokens out), as
# "T tok/s, TPOT M ms, failed F": served KILN PORT PROMPTS CONCURRENCY EXTRA_BODY.
served() {
  "$1" bench serve --base-url "http://localhost:$2" --num-prompts "$3" --max-concurrency "$4" \
    --random-input-len 256 --random-output-len 128 --extra-body "$5" -o json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f tok/s, TPOT %.2f ms, failed %d" % (d["output_throughput"], d["mean_tpot_ms"], d["failed"]))'
}
prep_running() {
  [ -e /tmp/kiln-prep.started ] && [ ! -e /tmp/kiln-prep.status ] && [ -e /tmp/kiln-prep.pid ] &&
    kill -0 "$(cat /tmp/kiln-prep.pid)" 2>/dev/null
}
for step in "${steps[@]}"; do
  case "$step" in
    test)
      for t in core_tests ops_tests cuda_tests; do
        "$bin/tests/$t" --gtest_brief=1 >"$out/$t.log" 2>&1 || status=1
        grep -vE "^\[ *(RUN|OK) " "$out/$t.log" | head -80 || true
        cat "$out/$t.log" >>"$out/tests.log" && rm "$out/$t.log"
      done
      ;;
    cudatests)
      "$bin/tests/cuda_tests" --gtest_brief=1 --gtest_filter="${CUDA_TESTS_FILTER:-*}" >"$out/cuda_tests.log" 2>&1 ||
        status=1
      tail -5 "$out/cuda_tests.log"
      ;;
    sanitize)
      # SANITIZE_EACH=SECONDS: each test the filter names in a run of its own, cut at that many seconds (a slow
      # test then costs its own verdict, not the others').
      tb="$bin/tests/${SANITIZE_TESTS:-ops_tests}"
      filter="${SANITIZE_FILTER:-OpHarness.*:-OpHarness.Perf}"
      runs=("$filter")
      if [ -n "${SANITIZE_EACH:-}" ]; then
        mapfile -t runs < <("$tb" --gtest_list_tests --gtest_filter="$filter" |
          awk '/^[^ ]/{s=$1} /^  /{print s $1}')
      fi
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
        for f in "${runs[@]}"; do
          echo "## $tool $f" >>"$out/sanitize.log"
          timeout "${SANITIZE_EACH:-100000}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$tb" \
            --gtest_brief=1 --gtest_filter="$f" >>"$out/sanitize.log" 2>&1 || { echo "rc $? for $tool $f" | tee -a "$out/sanitize.log"; status=1; }
          tail -3 "$out/sanitize.log"
        done
      done
      ;;
    bench)
      # BENCH_ARGS: matmul_bench's arguments after --device cuda; BENCH_BASE=PATH: another matmul_bench (an
      # earlier build) run before this one, BENCH_REPS times each, interleaved.
      for rep in $(seq "${BENCH_REPS:-1}"); do
        for b in ${BENCH_BASE:-} "$bin/tests/matmul_bench"; do
          echo "## $b, round $rep"
          "$b" --device cuda ${BENCH_ARGS:-} || status=1
        done
      done 2>&1 | tee "$out/matmul_bench.md"
      ;;
    mmq)
      for setting in "KILN_CUDA_MMQ=0" "KILN_CUDA_MMQ=1" "KILN_CUDA_MMQ=1 --mmq-min 2"; do
        echo "$setting"
        read -r e extra <<<"$setting"
        env "$e" "$bin/tests/matmul_bench" --device cuda --types q4_k,q5_k,q6_k --m ${MMQ_M:-2,4,8,9,16,32,64} \
          --shapes 4096x4096,4096x14336,14336x4096 $extra || status=1
      done 2>&1 | tee "$out/mmq.md"
      ;;
    ncu)
      # ncu's view of one kernel in matmul_bench (NCU_KERNEL, default mmq_kernel) on each of NCU_CASES
      # (type:KxN:m, default: the 8B's Q4_K gate at 16 and 64 tokens, its Q6_K down at 64).
      for case in ${NCU_CASES:-q4_k:4096x14336:16 q4_k:4096x14336:64 q6_k:14336x4096:64}; do
        IFS=: read -r type shape m <<<"$case"
        echo "## $case"
        ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-mmq_kernel}" --launch-skip 4 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          --section MemoryWorkloadAnalysis "$bin/tests/matmul_bench" --device cuda --types "$type" --m "$m" \
          --shapes "$shape" 2>&1 | grep -vE "^==PROF==|^ *$|^ *-+[ -]*$|^\|" | head -120 || status=1
      done 2>&1 | tee "$out/ncu.md"
      ;;
    attn)
      {
        "$bin/tests/attention_bench" --device cuda ${ATTN_ARGS:---prefill 512,2048,4096}
        echo "KILN_CUDA_WGMMA=0 (mma.sync in place of the warpgroup kernel on Hopper):"
        KILN_CUDA_WGMMA=0 "$bin/tests/attention_bench" --device cuda ${ATTN_ARGS:---prefill 512,2048,4096}
        python3 bench/attention_peer.py || true
        ncu --clock-control none --kernel-name regex:attention_mma --launch-skip 1 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
          "$bin/tests/attention_bench" --device cuda --prefill 2048 --decode '' 2>&1 |
          grep -vE "^==PROF==|^ *$|^ *-+[ -]*$" | head -150
      } 2>&1 | tee "$out/attn.md" || status=1
      ;;
    attndecode)
      {
        for kv in ${KV_TYPES:-f16 q8_0 q8_64}; do
          for b in "$bin/tests/attention_bench" "$bin/base/attention_bench"; do
            [ -x "$b" ] || continue
            echo "## --kv-type $kv: $b"
            "$b" --device cuda --kv-type "$kv" --prefill '' --decode "${DECODE_CASES:-1x32768,1x8192,16x4096}"
          done
        done
        if [ "${NCU_DECODE:-1}" = 1 ]; then
          for kv in f16 q8_64; do
            echo "## ncu: attention_staged_kernel, --kv-type $kv, 1x32768"
            ncu --clock-control none --kernel-name regex:attention_staged --launch-skip 2 --launch-count 1 \
              --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
              --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
              "$bin/tests/attention_bench" --device cuda --kv-type "$kv" --prefill '' --decode 1x32768 2>&1 |
              grep -vE "^==PROF==|^ *$|^ *-+[ -]*$" | head -120
          done
        fi
      } 2>&1 | tee "$out/attndecode.md" || status=1
      ;;
    ltprobe)
      { nvcc -O2 -arch=sm_90a -std=c++20 bench/cublaslt_probe.cu -lcublasLt -lcublas -o /tmp/cublaslt_probe &&
        /tmp/cublaslt_probe ${LTPROBE_SHAPES:-}; } 2>&1 | tee "$out/cublaslt_probe.md" || status=1
      ;;
    tune)
      for rows in 1 2 4 8; do
        echo "--gemv-rows $rows"
        "$bin/tests/matmul_bench" --device cuda --types ${TUNE_TYPES:-bf16,q8_0,q4_0,q4_k,q6_k} --m 1 \
          --gemv-rows "$rows" || status=1
      done 2>&1 | tee "$out/tune.md"
      ;;
    parity) python3 bench/gpu_parity.py --build "$bin" --out "$out" 2>&1 | tee "$out/parity.log" || status=1 ;;
    fit)
      # The 8B Q4_K_M of prep when it has been made: 4.6 GiB, so that the split does not hang on the guess of
      # kiln's CUDA context size.
      fit_model=/tmp/kiln-models/llama3-8b-q4_k_m.gguf
      python3 bench/gpu_fit.py --build "$bin" ${FIT_ARGS:-$([ -e "$fit_model" ] && echo --model "$fit_model")} 2>&1 |
        tee "$out/fit.log" || status=1
      ;;
    models) python3 bench/gpu_generate.py --build "$bin" --out "$out" 2>&1 | tee "$out/generate.log" || status=1 ;;
    prep | fp8)
      # The random models (prep's, and fp8's folder) take their tokenizer from .gpu-deps: without it nothing
      # is made, and the steps after wait on nothing.
      [ -f .gpu-deps/tokenizer/tokenizer.json ] || {
        echo "$step: .gpu-deps/tokenizer is not here (scripts/gpu-deps.sh writes it)" | tee -a "$out/build.log"
        status=1
        continue
      }
      ;;&
    prep)
      # The GGUF files of the peer step, made in the background (they outlive this call): 8B folder by
      # transformers, kiln convert, then llama-quantize once the peer is built. /tmp/kiln-prep.status at the end.
      # Started again by a later call on the same machine unless one is running (files already made are kept,
      # so a later PREP_ONLY adds its own, and a failed prep is retried).
      if ! prep_running; then
        rm -f /tmp/kiln-prep.status
        touch /tmp/kiln-prep.started
        setsid bash -c '
          if python3 bench/gpu_peer.py --prepare-only --build "$1" --peer "$2/build" --out /tmp --peer-ready "$3" \
            ${4:+--only "$4"}
          then echo ok >/tmp/kiln-prep.status; else echo failed >/tmp/kiln-prep.status; fi
        ' _ "$bin" "$peer_dir" "$peer_status" "${PREP_ONLY:-}" >>/tmp/kiln-prep.log 2>&1 </dev/null &
        echo $! >/tmp/kiln-prep.pid
      fi
      ;;
    serve)
      while prep_running; do sleep 5; done
      k="$bin/tools/kiln/kiln"
      sampled='"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1, "top_k": -1'
      for f in ${SERVE_FILES:-default llama3-8b-bf16}; do
        path=/tmp/kiln-models/$f.gguf
        [ -e "$path" ] || { echo "$f: not here"; status=1; continue; }
        echo "## $f"
        "$k" bench -m "$path" -d cuda -p 256 -n 128 --batch 64 --pg 256,128 -r 2 2>&1 | grep -E "^\|" || status=1
        echo "--deterministic:"
        "$k" bench -m "$path" -d cuda -p 256 -n 128 --batch 64 -r 2 --deterministic 2>&1 | grep -E "^\| [^-]" || status=1
        "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --max-queue 0 --port 8090 >"/tmp/serve-$f.log" 2>&1 &
        spid=$!
        wait_healthy 8090
        for c in ${SERVE_CONCURRENCY:-1 16 64}; do
          for s in '"temperature": 0' "$sampled"; do
            n=$((c * 4 > 256 ? 256 : (c * 4 < 16 ? 16 : c * 4)))
            r=$(served "$k" 8090 "$n" "$c" "{\"ignore_eos\": true, $s}")
            echo "| $f | $c | ${s%%,*} | $r |"
          done
        done
        python3 bench/deterministic_check.py --base-url http://localhost:8090 || status=1
        kill "$spid"; wait "$spid" || true
        "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --max-queue 0 --port 8090 --deterministic >>"/tmp/serve-$f.log" 2>&1 &
        spid=$!
        wait_healthy 8090
        echo "--deterministic:"
        python3 bench/deterministic_check.py --base-url http://localhost:8090 --expect-identical || status=1
        for s in '"temperature": 0' "$sampled"; do
          r=$(served "$k" 8090 256 64 "{\"ignore_eos\": true, $s}")
          echo "| $f --deterministic | 64 | ${s%%,*} | $r |"
        done
        kill "$spid"; wait "$spid" || true
        grep -iE "assert|error|fatal" "/tmp/serve-$f.log" | head -5 || true
      done 2>&1 | tee "$out/serve.md"
      ;;
    quant)
      while prep_running; do sleep 5; done
      [ -e "$peer_dir.started" ] && while [ ! -e "$peer_status" ]; do sleep 5; done
      k="$bin/tools/kiln/kiln"
      pb="$peer_dir/build/bin"
      src=/tmp/kiln-models/llama3-8b-bf16.gguf
      {
        [ -e "$src" ] || { echo "$src: not here (run prep with PREP_ONLY=llama3-8b-bf16 first)"; exit 1; }
        [ -x "$pb/llama-quantize" ] || { echo "the peer did not build: $(tail -3 /tmp/llama.cpp.build.log)"; exit 1; }
        cat "$src" >/dev/null  # into the page cache, for both
        TIMEFORMAT="%R s"
        echo "## BF16 -> Q4_K_M, $(nproc) threads"
        for round in 1 2; do
          echo -n "kiln quantize ($round): "; { time "$k" quantize "$src" /tmp/q-kiln.gguf Q4_K_M -t "$(nproc)" --force >/tmp/q-kiln.log 2>&1; } 2>&1
          rm -f /tmp/q-peer.gguf
          echo -n "llama-quantize ($round): "; { time "$pb/llama-quantize" "$src" /tmp/q-peer.gguf Q4_K_M "$(nproc)" >/tmp/q-peer.log 2>&1; } 2>&1
        done
        cmp -s /tmp/q-kiln.gguf /tmp/q-peer.gguf && echo "the two files: byte-identical" || echo "the two files DIFFER"
        ls -l /tmp/q-kiln.gguf /tmp/q-peer.gguf
        # Calibration text: this tree's docs and sources, repeated until long enough.
        for _ in 1 2 3 4; do cat docs/*.md src/*/*.cpp src/*/*.h; done >/tmp/calib.txt
        n="${QUANT_CHUNKS:-196}"
        echo "## imatrix, $n x 512 tokens, the 8B BF16 on the GPU"
        echo -n "kiln imatrix: "; { time "$k" imatrix -m "$src" -f /tmp/calib.txt -o /tmp/im-kiln.gguf -c 512 --chunks "$n" -d cuda >/tmp/im-kiln.log 2>&1; } 2>&1
        echo -n "llama-imatrix: "; { time "$pb/llama-imatrix" -m "$src" -f /tmp/calib.txt -o /tmp/im-peer.gguf -c 512 -b 512 --chunks "$n" -ngl 99 >/tmp/im-peer.log 2>&1; } 2>&1
        tail -3 /tmp/im-kiln.log; grep -E "Final estimate|tokens|chunks" /tmp/im-peer.log | tail -3
        echo -n "kiln quantize with kiln's imatrix: "; { time "$k" quantize --imatrix /tmp/im-kiln.gguf "$src" /tmp/q-kiln-im.gguf Q4_K_M -t "$(nproc)" --force >/tmp/q-kiln-im.log 2>&1; } 2>&1
        echo -n "llama-quantize with kiln's imatrix: "; rm -f /tmp/q-peer-im.gguf; { time "$pb/llama-quantize" --imatrix /tmp/im-kiln.gguf "$src" /tmp/q-peer-im.gguf Q4_K_M "$(nproc)" >/tmp/q-peer-im.log 2>&1; } 2>&1
        cmp -s /tmp/q-kiln-im.gguf /tmp/q-peer-im.gguf && echo "with the imatrix: byte-identical" || echo "with the imatrix: the files DIFFER"
      } 2>&1 | tee "$out/quant.md" || status=1
      ;;
    gptq)
      # Started once a machine (it outlives the call); each gptq step waits for it, GPTQ_WAIT seconds at most.
      if [ ! -e /tmp/kiln-gptq.started ]; then
        while prep_running; do sleep 5; done
        touch /tmp/kiln-gptq.started
        for _ in 1 2 3 4; do cat docs/*.md src/*/*.cpp src/*/*.h; done >/tmp/calib.txt
        setsid bash -c '
          k="$1/tools/kiln/kiln"; src=/tmp/kiln-models/llama3-8b-bf16.gguf; def=/tmp/kiln-models/default.gguf
          TIMEFORMAT="%R s"
          if [ -e "$def" ]; then
            echo "## the default model: Gram matrices on the GPU against the CPU (2 x 256 tokens)"
            python3 bench/gram_check.py --kiln "$k" --model "$def" --text /tmp/calib.txt
            echo "## the default model: GPTQ Q4_0 with its factors and updates on the CPU and on the GPU"
            "$k" imatrix -m "$def" -f /tmp/calib.txt -o /tmp/def-full.gguf -c 256 --chunks 4 --full -d cuda \
              >/tmp/def-full.log 2>&1 || tail -3 /tmp/def-full.log
            for d in cpu cuda; do
              rm -f "/tmp/def-gptq-$d.gguf"
              echo "-d $d: $( { time "$k" quantize --method gptq --imatrix /tmp/def-full.gguf "$def" \
                "/tmp/def-gptq-$d.gguf" Q4_0 --allow-requantize -d "$d" >"/tmp/def-gptq-$d.log" 2>&1; } 2>&1)"
              tail -1 "/tmp/def-gptq-$d.log"
            done
            echo "bytes that differ between the two files: $(cmp -l /tmp/def-gptq-cpu.gguf /tmp/def-gptq-cuda.gguf | wc -l) of $(stat -c %s /tmp/def-gptq-cpu.gguf)"
          fi
          [ -e "$src" ] || { echo "$src: not here (run prep with PREP_ONLY=llama3-8b-bf16 first)"; echo failed >/tmp/kiln-gptq.status; exit; }
          echo "## the 8B BF16: kiln imatrix --full, $2 x 512 tokens on the GPU"
          { time "$k" imatrix -m "$src" -f /tmp/calib.txt -o /tmp/im-full.gguf -c 512 --chunks "$2" -d cuda --full \
            >/tmp/im-full.log 2>&1; } 2>&1
          tail -2 /tmp/im-full.log; ls -l /tmp/im-full.gguf
          echo "## kiln quantize --method gptq Q4_K_M, factors and updates on the GPU, $(nproc) threads"
          rm -f /tmp/q-gptq.gguf
          { time "$k" quantize --method gptq --imatrix /tmp/im-full.gguf "$src" /tmp/q-gptq.gguf Q4_K_M \
            -t "$(nproc)" -d cuda >/tmp/q-gptq.log 2>&1; } 2>&1
          tail -3 /tmp/q-gptq.log; ls -l /tmp/q-gptq.gguf
          rm -f /tmp/im-full.gguf
          "$k" bench -m /tmp/q-gptq.gguf -d cuda -p 512 -n 128 -r 2 2>&1 | grep -E "^\|"
          echo ok >/tmp/kiln-gptq.status
        ' _ "$bin" "${GPTQ_CHUNKS:-64}" >/tmp/kiln-gptq.log 2>&1 </dev/null &
      fi
      for _ in $(seq "${GPTQ_WAIT:-540}"); do [ -e /tmp/kiln-gptq.status ] && break; sleep 1; done
      cp /tmp/kiln-gptq.log "$out/gptq.md"
      cat "$out/gptq.md"
      [ -e /tmp/kiln-gptq.status ] || echo "(still running)"
      ;;
    spec)
      k="$bin/tools/kiln/kiln"
      path=/tmp/kiln-models/default.gguf
      {
        [ -e "$path" ] || { echo "$path: not here"; exit 1; }
        prompt="$(cat bench/prompts/edit-rename.txt)"
        for det in "" --deterministic; do
          echo "## kiln run --chat -n 256 --temp 0 ${det}"
          for rep in $(seq "${SPEC_REPS:-3}"); do
            for s in none ngram; do
              "$k" run -m "$path" -d cuda -p "$prompt" --chat -n 256 --temp 0 --spec "$s" $det \
                >"/tmp/spec-$s$det.txt" 2>"/tmp/spec-$s$det.log" || { tail -3 "/tmp/spec-$s$det.log"; exit 1; }
              echo "round $rep, --spec $s: $(grep -E '^decode:' "/tmp/spec-$s$det.log") $(grep -E '^drafts:' "/tmp/spec-$s$det.log")"
            done
            cmp -s "/tmp/spec-none$det.txt" "/tmp/spec-ngram$det.txt" && echo "round $rep: the same text" ||
              echo "round $rep: the texts DIFFER"
          done
          # How the verifying steps ran: graphs replayed, captured, or op by op (the backend's profile line).
          for s in none ngram; do
            KILN_STEP_PROFILE=1 "$k" run -m "$path" -d cuda -p "$prompt" --chat -n 256 --temp 0 --spec "$s" $det \
              2>&1 >/dev/null | grep -E "programs replayed|^engine " | sed "s/^/--spec $s: /"
          done
        done
        # Greedy text under --deterministic is the text without drafts on every prompt of bench/prompts.
        echo "## --deterministic, each prompt of bench/prompts, 192 tokens, --spec none against ngram"
        for f in bench/prompts/*.txt; do
          for s in none ngram; do
            "$k" run -m "$path" -d cuda -p "$(cat "$f")" --chat -n 192 --temp 0 --spec "$s" --deterministic \
              >"/tmp/suite-$s.txt" 2>"/tmp/suite-$s.log" || { tail -3 "/tmp/suite-$s.log"; exit 1; }
          done
          same=DIFFERENT
          cmp -s /tmp/suite-none.txt /tmp/suite-ngram.txt && same="the same"
          echo "$(basename "$f"): $same text; $(grep -E '^decode:' /tmp/suite-none.log) against $(grep -E '^decode:' /tmp/suite-ngram.log) $(grep -E '^drafts:' /tmp/suite-ngram.log)"
        done
        # Sampled speculation keeps the target's distribution on the GPU (runtime_tests in BUILD_TARGETS).
        if [ -x "$bin/tests/runtime_tests" ]; then
          mkdir -p /tmp/kiln-test-models
          ln -sf "$path" /tmp/kiln-test-models/SmolLM2-135M-Instruct.Q4_1.gguf
          KILN_TEST_BACKEND=cuda KILN_MODELS_DIR=/tmp/kiln-test-models "$bin/tests/runtime_tests" \
            --gtest_filter='EngineSpeculative.SampledTokensFollowTheTargetDistribution' 2>&1 |
            grep -E "chi-square|OK|FAILED|Failure" | head -8
        fi
        echo "## kiln serve --parallel 64 under 64 concurrent requests (256 in, 128 out, greedy)"
        for round in 1 2; do
          for s in none ngram; do
            KILN_STEP_PROFILE=1 "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --port 8095 --spec "$s" \
              >/tmp/serve-spec.log 2>&1 &
            spid=$!
            wait_healthy 8095
            echo "round $round, --spec $s: $(served "$k" 8095 256 64 '{"ignore_eos": true, "temperature": 0}')"
            kill "$spid"; wait "$spid" || true
            # The server's steps when it stops: decode and prompt steps, launch against wait, graphs replayed.
            grep -E "engine (decode|prefill) steps|programs replayed" /tmp/serve-spec.log | sed "s/^/  /"
          done
        done
      } 2>&1 | tee "$out/spec.md" || status=1
      ;;
    tp)
      path=/tmp/kiln-models/default.gguf
      {
        "$bin/tests/cuda_tests" --gtest_brief=1 --gtest_filter='CudaCollective*' 2>&1 | tail -4
        "$bin/tests/ops_tests" --gtest_brief=1 --gtest_filter='*Collectives*:HostGroup.*' 2>&1 | tail -3
        n_gpu=$(nvidia-smi -L | grep -c '^GPU')
        # The default model's 9 heads and 3 KV heads split over 1 or 3 ranks.
        worlds="${TP_WORLDS:-1 $([ "$n_gpu" -ge 3 ] && echo 3)}"
        echo "## $n_gpu GPUs; worlds: $worlds"
        [ -e "$path" ] || { echo "$path: not here"; exit 1; }
        ids=$(python3 -c 'print([(i * 7919) % 49000 + 17 for i in range(64)])')
        d="$bin/tests/logits_driver"
        echo "[$ids]" | "$d" logits "$path" /tmp/tp-ref.f32 --device cuda --chunk 24 | tail -1
        echo "[$ids]" | "$d" generate "$path" 32 --device cuda >/tmp/tp-ref.json
        for w in $worlds; do
          echo "[$ids]" | "$d" logits "$path" "/tmp/tp-$w.f32" --device cuda --chunk 24 --tp "$w" | tail -1
          python3 - "$w" <<'PY'
import array, sys
w = sys.argv[1]
def rows(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    n = len(a) // 64
    return [a[i * n:(i + 1) * n] for i in range(64)]
ref, got = rows("/tmp/tp-ref.f32"), rows(f"/tmp/tp-{w}.f32")
diff = max(max(abs(x - y) for x, y in zip(r, g)) for r, g in zip(ref, got))
scale = max(max(abs(x) for x in r) for r in ref)
top = sum(max(range(len(r)), key=r.__getitem__) == max(range(len(g)), key=g.__getitem__) for r, g in zip(ref, got))
print(f"world {w}: logits max abs {diff:.3e} (scale {scale:.1f}), top-1 the same on {top} of 64 positions")
PY
          echo "[$ids]" | "$d" generate "$path" 32 --device cuda --tp "$w" >"/tmp/tp-$w.json"
          python3 -c 'import json,sys; a=json.load(open("/tmp/tp-ref.json"))["tokens"]; b=json.load(open(sys.argv[1]))["tokens"]; print("greedy 32 tokens:", "the same" if a == b else f"DIFFER {a} {b}")' "/tmp/tp-$w.json"
        done
      } 2>&1 | tee "$out/tp.md" || status=1
      ;;
    build) ;;  # the build alone (BUILD_TARGETS), e.g. while a model's parts are still on their way
    kv)
      k="$bin/tools/kiln/kiln"
      path=/tmp/kiln-models/default.gguf
      kld() {  # kld BASE_FILE ARGS...: mean KLD and same top token against BASE_FILE
        "$k" perplexity -m "$path" -d cuda --kl-divergence-base "$1" --kl-divergence -o json "${@:2}" |
          python3 -c 'import json,sys; d=json.load(sys.stdin); print("mean KLD %.2e, same top %.2f%%" % (d["kld"]["value"], 100 * d["same_top"]["value"]))'
      }
      {
        [ -x "$bin/tests/ops_tests" ] && "$bin/tests/ops_tests" --gtest_brief=1 \
          --gtest_filter='OpHarness.*Attention*:OpHarness.KvWrite*:OpHarness.BatchInvariant*' 2>&1 | tail -5
        # Without the default model (its parts not carried), only the 8B's speeds below.
        if [ -e "$path" ]; then
          for _ in 1 2 3 4; do cat docs/*.md src/*/*.cpp; done >/tmp/kv-text.txt
          echo "## KV types against f16 KV (the default path) and f32 KV (--exact): default model, 8 chunks of 512 tokens"
          "$k" perplexity -m "$path" -d cuda -f /tmp/kv-text.txt -c 512 --chunks 8 --kv-type f16 \
            --kl-divergence-base /tmp/kv-f16.kld >/dev/null 2>&1
          for t in q8_0 q8_64; do echo "$t against f16: $(kld /tmp/kv-f16.kld --kv-type "$t")"; done
          "$k" perplexity -m "$path" -d cuda -f /tmp/kv-text.txt -c 512 --chunks 8 --kv-type f32 --exact \
            --kl-divergence-base /tmp/kv-f32.kld >/dev/null 2>&1
          for t in f16 q8_0 q8_64; do echo "--exact, $t against f32: $(kld /tmp/kv-f32.kld --kv-type "$t" --exact)"; done
          echo "## kiln serve --kv-memory 1G: the tokens each type holds"
          for t in f16 q8_0 q8_64; do
            "$k" serve -m "$path" -d cuda --kv-memory 1G --kv-type "$t" --port 8096 >/tmp/serve-kv.log 2>&1 &
            spid=$!
            wait_healthy 8096
            grep -oE "KV cache .*tokens\)" /tmp/serve-kv.log
            kill "$spid"; wait "$spid" || true
          done
        else
          echo "$path: not here (the default model's KL divergence and memory skipped)"
        fi
        while prep_running; do sleep 5; done
        # Decode at a long context (32k positions read a token), batched decode, and prefill, f16 beside q8_0, on
        # the default model and the 8B BF16 of prep (when there).
        for m in "$path" /tmp/kiln-models/llama3-8b-bf16.gguf; do
          [ -e "$m" ] || continue
          for t in ${KV_TYPES:-f16 q8_0 q8_64}; do
            echo "## $(basename "$m") --kv-type $t"
            "$k" bench -m "$m" -d cuda --kv-type "$t" -p 0 -n 128 --depth "${KV_DEPTH:-32768}" -r 3 2>&1 | grep -E "^\|" | grep -vE "^\| (model|---) "
            "$k" bench -m "$m" -d cuda --kv-type "$t" -p 2048 -n 128 --batch 64 -r 2 2>&1 | grep -E "^\|" | grep -vE "^\| (model|---) "
          done
        done
      } 2>&1 | tee "$out/kv.md" || status=1
      ;;
    fp8)
      k="$bin/tools/kiln/kiln"
      {
        "$bin/tests/ops_tests" --gtest_brief=1 \
          --gtest_filter='OpHarness.Matmul*:OpHarness.GetRows*:OpHarness.MoeMatmul*:OpHarness.BatchInvariant*' 2>&1 |
          tail -5
        # The row form of one-scale-a-row weights against the file's form, and the e4m3 GEMM against the exact
        # products of its codes (cuda_tests in BUILD_TARGETS).
        [ -x "$bin/tests/cuda_tests" ] && "$bin/tests/cuda_tests" --gtest_brief=1 \
          --gtest_filter='CudaGemv.Fp8*:CudaStack.*:CudaFp8Gemm.*' 2>&1 | tail -5
        while prep_running; do sleep 5; done
        bf16=/tmp/kiln-models/llama3-8b-bf16.gguf folder=/tmp/kiln-models/llama3-8b-folder
        fp8=/tmp/kiln-models/llama3-8b-fp8 static=/tmp/kiln-models/llama3-8b-fp8-static
        models=("$bf16" "$fp8")
        if [ "${FP8_STATIC:-0}" = 1 ]; then models+=("$static"); fi
        if [ ! -e "$fp8/config.json" ] || { [ "${FP8_STATIC:-0}" = 1 ] && [ ! -e "$static/config.json" ]; }; then
          [ -e "$folder/config.json" ] || python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'bench')
from gpu_generate import make_folder; make_folder('llama3-8b', Path('$folder'), Path('.gpu-deps/tokenizer'))"
          if [ ! -e "$fp8/config.json" ]; then
            echo "## kiln quantize FOLDER OUT FP8, $(nproc) threads"
            TIMEFORMAT="%R s"
            { time "$k" quantize "$folder" "$fp8" FP8 -t "$(nproc)"; } 2>&1 | tail -2
          fi
          # Static activation scales (FP8_STATIC=1): the input ranges of 4 x 512 tokens of this tree's text.
          if [ "${FP8_STATIC:-0}" = 1 ] && [ ! -e "$static/config.json" ]; then
            cat docs/*.md src/*/*.cpp >/tmp/fp8-calib.txt
            "$k" imatrix -m "$folder" -f /tmp/fp8-calib.txt -o /tmp/kiln-models/llama3-8b.imatrix.gguf -c 512 \
              --chunks 4 --no-ppl -d cuda 2>&1 | tail -1
            "$k" quantize "$folder" "$static" FP8 --imatrix /tmp/kiln-models/llama3-8b.imatrix.gguf \
              -t "$(nproc)" 2>&1 | tail -1
          fi
          # The BF16 side from the same folder when prep has not made it, so that one call compares the two.
          [ -e "$bf16" ] || "$k" convert "$folder" "$bf16" --type bf16 2>&1 | tail -1
          rm -rf "$folder"
        fi
        for m in "${models[@]}"; do
          [ "${FP8_BENCH:-1}" = 1 ] || break
          [ -e "$m" ] || { echo "$m: not here (prep with PREP_ONLY=llama3-8b-bf16)"; continue; }
          echo "## $m"
          "$k" bench -m "$m" -d cuda -p 2048 -n 128 --batch 64 -r 2 2>&1 | grep -E "^\||^kiln: cuda"
          # The FP8 decode batch on cuBLASLt's e4m3 GEMM instead of the warpgroup kernel (Hopper), beside it.
          if [ "$m" = "$fp8" ]; then
            echo "KILN_CUDA_WGMMA=0:"
            KILN_CUDA_WGMMA=0 "$k" bench -m "$m" -d cuda -p 0 -n 128 --batch 64 -r 2 2>&1 | grep -E "bs64"
          fi
          # The 8-bit KV cache against f16 at a long context, on the FP8 weights (FP8_KV=1).
          if [ "$m" = "$fp8" ] && [ "${FP8_KV:-0}" = 1 ]; then
            for rep in 1 2; do
              for t in f16 q8_64; do
                echo "--kv-type $t, round $rep: $("$k" bench -m "$m" -d cuda --kv-type "$t" -p 0 -n 128 --depth 32768 \
                  -r 2 2>&1 | grep -E "^\| .*tg128" | awk -F'|' '{print $8}')"
              done
            done
          fi
          [ "${FP8_PROFILE:-1}" = 1 ] || continue
          # Where a step's time goes (host launch against the GPU's wait), and whether steps replay as graphs.
          KILN_STEP_PROFILE=1 "$k" bench -m "$m" -d cuda -p 2048 -n 128 --batch 64 -r 1 2>&1 |
            grep -E "steps:|programs replayed" | sed "s/^/  /"
          # Where a 2,048-token prompt's time goes, op by op (each op timed alone).
          KILN_CUDA_PROFILE=1 "$k" bench -m "$m" -d cuda -p 2048 -n 0 -r 3 2>&1 | grep -A22 "profile:" | sed "s/^/  /"
        done
      } 2>&1 | tee "$out/fp8.md" || status=1
      ;;
    fp8quality)
      # What FP8 costs the default model on CUDA at the fast precision (the e4m3 tensor cores; activations
      # rounded per token, or by static scales): bench/fp8_quality.py, its BF16 source dequantized here from the
      # GGUF file of .gpu-model's parts.
      {
        m=/tmp/kiln-models/default.gguf
        [ -e "$m" ] || { echo "$m: not here (.gpu-model's parts, gathered first)"; exit 1; }
        text=/usr/share/common-licenses/GPL-3 calib=/usr/share/common-licenses/GPL-2
        if [ ! -e "$text" ] || [ ! -e "$calib" ]; then  # this tree's docs scored, its sources calibrate
          cat docs/*.md >/tmp/fp8-text.txt && cat src/*/*.cpp >/tmp/fp8-calib.txt
          text=/tmp/fp8-text.txt calib=/tmp/fp8-calib.txt
        fi
        PYTHONUNBUFFERED=1 python3 bench/fp8_quality.py --model "$m" --kiln "$bin/tools/kiln/kiln" --device cuda \
          --fast --text "$text" --calib "$calib"
      } 2>&1 | tee "$out/fp8quality.md" || status=1
      ;;
    quanttypes)
      python3 bench/gpu_quant_types.py --build "$bin" --model /tmp/kiln-models/default.gguf --qwen-shape \
        ${QUANT_TYPES:+--types "$QUANT_TYPES"} 2>&1 | tee "$out/quanttypes.md" || status=1
      ;;
    burst)
      k="$bin/tools/kiln/kiln"
      path=/tmp/kiln-models/default.gguf
      {
        [ -e "$path" ] || { echo "$path: not here"; exit 1; }
        "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --port 8091 >/tmp/serve-burst.log 2>&1 &
        spid=$!
        wait_healthy 8091
        echo "| burst | prompt tokens | answered | TTFT p50 | TTFT p99 | duration |"
        ulimit -n 65536 2>/dev/null || true
        for spec in ${BURST_SPECS:-640:32 3200:32 640:1024 3200:1024}; do
          n=${spec%%:*}; len=${spec##*:}
          "$k" bench serve --base-url http://localhost:8091 --num-prompts "$n" --max-concurrency "$n" \
            --random-input-len "$len" --random-output-len 16 -o json |
            python3 -c 'import json,sys; d=json.load(sys.stdin); n=sys.argv[1]; print("| %s | %s | %d of %s | %.2f s | %.2f s | %.1f s |" % (n, sys.argv[2], d["completed"], n, d["median_ttft_ms"]/1e3, d["p99_ttft_ms"]/1e3, d["duration"]))' "$n" "$len"
        done
        kill "$spid"; wait "$spid" || true
        grep -iE "assert|error|fatal" /tmp/serve-burst.log | head -5 || true
      } 2>&1 | tee "$out/burst.md" || status=1
      ;;
    serveprof)
      k="$bin/tools/kiln/kiln"
      path=/tmp/kiln-models/default.gguf
      {
        [ -e "$path" ] || { echo "$path: not here"; exit 1; }
        echo "## kiln bench --batch 64"
        KILN_STEP_PROFILE=1 "$k" bench -m "$path" -d cuda -p 256 -n 128 --batch 64 --pg 256,128 -r 1 2>&1 |
          grep -E "^\| [^-]|^engine"
        echo "## each op alone: kernels and their enqueueing (KILN_CUDA_PROFILE=1), pp256"
        KILN_CUDA_PROFILE=1 "$k" bench -m "$path" -d cuda -p 256 -n 0 -r 1 2>&1 | grep -A40 "profile:" | head -45
        schema='{"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 30, "maxItems": 30}}, "required": ["items"], "additionalProperties": false}'
        for s in greedy sampled schema; do
          extra='{"ignore_eos": true, "temperature": 0}'
          [ "$s" != greedy ] && extra='{"ignore_eos": true, "temperature": 0.8, "top_p": 0.95'
          [ "$s" = sampled ] && extra="$extra}"
          [ "$s" = schema ] && extra="$extra, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"l\", \"schema\": $schema}}}"
          KILN_STEP_PROFILE=1 "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --port 8093 >/tmp/serve-prof.log 2>&1 &
          spid=$!
          wait_healthy 8093
          for round in 1 2; do
            echo "## served, $s, round $round: $("$k" bench serve --base-url http://localhost:8093 --num-prompts 256 \
              --max-concurrency 64 --random-input-len 256 --random-output-len 128 --extra-body "$extra" -o json |
              python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f tok/s, TPOT %.2f ms, TTFT %.1f ms, failed %d" % (d["output_throughput"], d["mean_tpot_ms"], d["mean_ttft_ms"], d["failed"]))')"
          done
          kill "$spid"; wait "$spid" || true
          grep -E "^engine|assert|error" /tmp/serve-prof.log
        done
      } 2>&1 | tee "$out/serveprof.md" || status=1
      ;;
    serveab)
      while prep_running; do sleep 5; done
      path=/tmp/kiln-models/${SERVEAB_FILE:-default}.gguf
      {
        [ -e "$path" ] || { echo "$path: not here"; exit 1; }
        [ -x "$base_dir/build/cuda-dev/tools/kiln/kiln" ] || { echo "no base build (BASE_TREE)"; exit 1; }
        "$bin/tools/kiln/kiln" bench -m "$path" -d cuda -p 256 -n 128 --batch 64 --pg 256,128 -r 2 2>&1 | grep -E "^\|"
        sampled='"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1, "top_k": -1'
        for round in 1 2; do
          for which in base new; do
            k="$bin/tools/kiln/kiln"
            [ "$which" = base ] && k="$base_dir/build/cuda-dev/tools/kiln/kiln"
            "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --max-queue 0 --port 8094 >/tmp/serve-ab.log 2>&1 &
            spid=$!
            wait_healthy 8094
            for s in warm-up '"temperature": 0' "$sampled"; do
              extra="{\"ignore_eos\": true, ${s/warm-up/\"temperature\": 0}}"
              r=$(served "$k" 8094 256 64 "$extra")
              [ "$s" = warm-up ] || echo "| $which | round $round | ${s%%,*} | $r |"
            done
            kill "$spid"; wait "$spid" || true
          done
        done
      } 2>&1 | tee "$out/serveab.md" || status=1
      ;;
    structured)
      k="$bin/tools/kiln/kiln"
      path=/tmp/kiln-models/${STRUCTURED_MODEL:-default}.gguf
      {
        [ -e "$path" ] || { echo "$path: not here"; exit 1; }
        "$k" serve -m "$path" -d cuda --parallel 64 -c 2048 --port 8092 >/tmp/serve-structured.log 2>&1 &
        spid=$!
        wait_healthy 8092
        python3 bench/structured_check.py --base-url http://localhost:8092 --out "$out/structured-${STRUCTURED_MODEL:-default}.json" --concurrency 32
        schema='{"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 30, "maxItems": 30}}, "required": ["items"], "additionalProperties": false}'
        rf="\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"list\", \"schema\": $schema}}"
        echo "| requests | sampling | constraint | output tok/s | TPOT mean | TPOT median | failed |"
        for s in '"temperature": 0' '"temperature": 0.8, "top_p": 0.95'; do
          for c in none schema; do
            extra="{\"ignore_eos\": true, $s}"
            [ "$c" = schema ] && extra="{\"ignore_eos\": true, $s, $rf}"
            "$k" bench serve --base-url http://localhost:8092 --num-prompts 256 --max-concurrency 64 \
              --random-input-len 256 --random-output-len 128 --extra-body "$extra" -o json |
              python3 -c 'import json,sys; d=json.load(sys.stdin); print("| 64 | %s | %s | %.1f | %.2f ms | %.2f ms | %d |" % (sys.argv[1], sys.argv[2], d["output_throughput"], d["mean_tpot_ms"], d["median_tpot_ms"], d["failed"]))' "${s%%,*}" "$c"
          done
        done
        kill "$spid"; wait "$spid" || true
        grep -iE "assert|error|fatal" /tmp/serve-structured.log | head -5 || true
        # Where a constrained step's time goes: each op kind timed alone (the sampling kernel with masks and
        # without), greedy and sampled, 64 requests (constrained_bench; BUILD_TARGETS must name it).
        if [ -x "$bin/tests/constrained_bench" ]; then
          for t in 0 0.8; do
            for only in plain schema; do
              echo "## constrained_bench --temp $t --only $only, KILN_CUDA_PROFILE=1"
              KILN_CUDA_PROFILE=1 KILN_STEP_PROFILE=1 "$bin/tests/constrained_bench" --model "$path" --device cuda \
                --batch 64 --n 128 --reps 1 --temp "$t" --only "$only" 2>&1 | tail -25
            done
          done
        fi
      } 2>&1 | tee "$out/structured-${STRUCTURED_MODEL:-default}.md" || status=1
      ;;
    ab)
      while prep_running; do sleep 5; done
      for f in ${AB_FILES:-smollm2-135m-bf16 llama3-8b-bf16 llama3-8b-q8_0}; do
        path=/tmp/kiln-models/$f.gguf
        [ -e "$path" ] || path=/tmp/kiln-models/$f  # a folder (fp8's llama3-8b-fp8)
        if [ ! -e "$path" ]; then
          echo "$f: not made"
          status=1
          continue
        fi
        for rep in $(seq "${AB_REPS:-2}"); do
          for e in ${AB_ENVS:-KILN_CUDA_PDL=0 KILN_CUDA_PDL=1}; do
            k="$bin/tools/kiln/kiln"
            [[ $e == KILN_BIN=* ]] && k=${e#KILN_BIN=}
            r=$(env ${e//+/ } "$k" bench -m "$path" -d cuda ${AB_ARGS:--p 512 -n 128} -r 2 2>&1 |
              awk -F'|' '/ (pp[0-9]+|tg[0-9]+(@bs[0-9]+)?) /{printf "%s %s  ", $7, $8}')
            echo "| $f | $e | $rep | $r |"
          done
        done
      done 2>&1 | tee "$out/ab.md"
      ;;
    profile)
      while prep_running; do sleep 5; done
      for f in ${PROFILE_FILES:-llama3-8b-q4_0}; do
        echo "## $f"
        python3 -c "import sys; sys.path.insert(0, 'bench'); import gpu_peer as g; from pathlib import Path as P
print(g.kernel_profile(P('$bin/tools/kiln/kiln'), P('/tmp/kiln-models/$f.gguf'),
                       'The quick brown fox jumps over the lazy dog. ' * 4))" || status=1
      done 2>&1 | tee "$out/profile.md"
      ;;
    trace)
      # Where a decode step's GPU time goes, kernel by kernel, under CUDA graphs and programmatic launch as it
      # runs (ncu, above, times each kernel alone): kiln bench with bench/cuda_trace.cpp's CUPTI records, then
      # bench/cuda_trace.py, on TRACE_FILES (default: the 8B Q4_0 and the 135M BF16; waits for prep's files).
      # The same bench without the records first, for what recording costs.
      while prep_running; do sleep 5; done
      lib=$PWD/$bin/tests/libkiln_cuda_trace.so
      if [ ! -e "$lib" ]; then
        echo "no $lib: the kiln_cuda_trace target (built where CMake finds CUPTI) was not built" | tee "$out/trace.md"
        status=1
        continue
      fi
      for f in ${TRACE_FILES:-llama3-8b-q4_0 smollm2-135m-bf16}; do
        m="/tmp/kiln-models/$f.gguf"
        [ -e "$m" ] || m="/tmp/kiln-models/$f"  # a folder (fp8's llama3-8b-fp8)
        args=(bench -m "$m" -d cuda ${TRACE_ARGS:--p 0 -n 128 -r 1})
        # TRACE_BASE=PATH: another kiln (an earlier build: build/cuda-dev/base/kiln from a pack with KILN_BASE)
        # traced first, on the same file.
        for k in ${TRACE_BASE:-} "$bin/tools/kiln/kiln"; do
          [ -n "${TRACE_BASE:-}" ] && echo "## $k"
          echo "$f without the records: $("$k" "${args[@]}" 2>/dev/null | grep -E "^\| .*tg")"
          echo "$f with them: $(KILN_CUDA_TRACE_OUT="/tmp/trace-$f.csv" CUDA_INJECTION64_PATH="$lib" \
            "$k" "${args[@]}" 2>"/tmp/trace-$f.log" | grep -E "^\| .*tg")"
          tail -1 "/tmp/trace-$f.log"
          # KILN_CUDA_TRACE_API=1: the host's time in each CUDA runtime and driver function, too.
          grep -A30 "host time in CUDA calls" "/tmp/trace-$f.log" || true
          python3 bench/cuda_trace.py "/tmp/trace-$f.csv" --label "$f" ${TRACE_LATEST:+--latest} || status=1
          # TRACE_KEEP=1: the records too, compressed, for bench/cuda_trace.py here (two files more under $OUT).
          if [ "${TRACE_KEEP:-0}" = 1 ]; then gzip -c "/tmp/trace-$f.csv" >"$out/trace-$f.csv.gz"; fi
        done
      done 2>&1 | tee "$out/trace.md"
      ;;
    prefill)
      while [ ! -e "$peer_status" ]; do sleep 5; done
      for f in ${PREFILL_FILES:-llama3-8b-bf16}; do
        while prep_running && [ ! -e /tmp/kiln-models/$f.gguf ]; do
          sleep 5
        done
        echo "## $f"
        python3 -c "import sys; sys.path.insert(0, 'bench'); import gpu_peer as g; from pathlib import Path as P
print(g.prefill_profile(P('$bin/tools/kiln/kiln'), P('$peer_dir/build/bin/llama-bench'), P('/tmp/kiln-models/$f.gguf')))" ||
          status=1
      done 2>&1 | tee "$out/prefill.md"
      ;;
    offload)
      files=${OFFLOAD_FILES:-llama3-8b-q4_0}
      layers=${OFFLOAD_LAYERS:-16}
      first=/tmp/kiln-models/${files%%,*}.gguf
      while [ ! -e "$first" ] && prep_running; do sleep 5; done
      "$bin/tools/kiln/kiln" run -m "$first" --gpu-layers "${layers%%,*}" -p "The quick brown fox" -n 32 --temp 0 \
        >"$out/offload-run.log" 2>&1 || status=1
      tail -4 "$out/offload-run.log"
      # Where a prompt's time goes with the CPU layers' prompt matmuls on the GPU, their weights through
      # page-locked staging.
      echo "offload: $(KILN_STEP_PROFILE=1 "$bin/tools/kiln/kiln" bench -m "$first" --gpu-layers "${layers%%,*}" \
        -p 512 -n 0 -r 2 2>&1 | grep -E "pp512|prefill steps|offloaded steps")" | tee -a "$out/offload-run.log"
      while [ ! -e "$peer_status" ]; do sleep 5; done
      while prep_running; do sleep 5; done
      python3 bench/gpu_peer.py --build "$bin" --peer "$peer_dir/build" --out "$out" --only "$files" \
        --offload "$layers" --reps 2 2>&1 | tee "$out/offload.log" || status=1
      ;;
    peer)
      while [ ! -e "$peer_status" ]; do sleep 5; done
      if [ "$(cat "$peer_status")" != ok ]; then
        tail -30 /tmp/llama.cpp.build.log
        status=1
        continue
      fi
      if [ -e /tmp/kiln-prep.started ]; then
        while prep_running; do sleep 5; done
        cat /tmp/kiln-prep.log
      fi
      python3 bench/gpu_peer.py --build "$bin" --peer "$peer_dir/build" --out "$out" ${PEER_ARGS:-} 2>&1 |
        tee "$out/peer.log" || status=1
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
exit $status
