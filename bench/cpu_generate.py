#!/usr/bin/env python3
"""Prefill and decode speed of `kiln run` beside llama.cpp (llama-cpp-python), same GGUF, same threads, one run.

usage: bench/cpu_generate.py [--model PATH] [--threads T] [--prompt-tokens P] [--gen N] [--reps R] [--baseline KILN]
Run it with the test venv's Python (scripts/setup-venv.sh makes it; llama-cpp-python is in it) after
`scripts/build.sh release`. Prints one table: tokens/s for llama.cpp and for kiln in both matmul modes (exact f32 activations, the default,
and --quantize-activations), each as a ratio to llama.cpp, and the decode speed
the machine's memory bandwidth allows (weights bytes read once per token; bandwidth measured here with numpy).
--baseline KILN adds another kiln binary (e.g. a build of the previous commit) to the same interleaved runs, in
both modes, with its ratio to this build: a change is shown not to slow kiln down in one run, on one machine state.
"""
import argparse
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build/release/tools/kiln/kiln"))
TEXT = ("The lighthouse keeper wrote down the weather every morning: wind, cloud, the colour of the sea. "
        "Over thirty years the notebooks filled a shelf, then a cupboard, then the small room under the stairs. ")


def kiln_run(model, prompt, threads, n, extra, binary=KILN):
    res = subprocess.run([str(binary), "run", "-m", str(model), "-p", prompt, "-n", str(n), "--temp", "0", "--ignore-eos",
                          "-t", str(threads), "-c", "2048", *extra], capture_output=True, text=True, check=True)
    pre = re.search(r"prompt:\s+(\d+) tokens \(\d+ cached\) in (\d+) ms, ([\d.]+) tokens/s", res.stderr)
    dec = re.search(r"decode:\s+(\d+) tokens in (\d+) ms, ([\d.]+) tokens/s", res.stderr)
    return int(pre.group(1)), float(pre.group(3)), float(dec.group(3))


def llama_cpp_run(llm, tokens, n):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    t1 = time.perf_counter()
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t2 = time.perf_counter()
    for _ in range(n - 1):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t3 = time.perf_counter()
    return len(tokens) / (t1 - t0), (n - 1) / (t3 - t2)


def memory_bandwidth_gbs():
    a = np.ones(64 << 20, dtype=np.float32)  # 256 MiB
    b = np.empty_like(a)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = max(best, 2 * a.nbytes / (time.perf_counter() - t0))  # read + write
    return best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--baseline", help="another kiln binary to measure beside this one")
    args = ap.parse_args()
    from llama_cpp import Llama

    llm = Llama(model_path=args.model, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                n_batch=512, logits_all=False, verbose=False)
    tokens = llm.tokenize((TEXT * 40).encode(), add_bos=False)[: args.prompt_tokens]
    prompt = llm.detokenize(tokens).decode()
    modes = {"kiln": (KILN, []), "kiln -qa": (KILN, ["--quantize-activations"])}
    if args.baseline:
        modes |= {"base": (Path(args.baseline), []), "base -qa": (Path(args.baseline), ["--quantize-activations"])}
    k_pre, k_dec = {m: [] for m in modes}, {m: [] for m in modes}
    l_pre, l_dec = [], []
    for _ in range(args.reps):  # interleaved so every engine sees the same machine state
        for mode, (binary, extra) in modes.items():
            n_prompt, p, d = kiln_run(args.model, prompt, args.threads, args.gen, extra, binary)
            k_pre[mode].append(p)
            k_dec[mode].append(d)
        p, d = llama_cpp_run(llm, llm.tokenize(prompt.encode(), add_bos=False), args.gen)
        l_pre.append(p)
        l_dec.append(d)
    weight_bytes = Path(args.model).stat().st_size
    bw = memory_bandwidth_gbs()
    print(f"model {Path(args.model).name}, {args.threads} threads, prompt {n_prompt} tokens, {args.gen} generated, "
          f"best of {args.reps}")
    print(f"{'':10} {'engine':10} {'tok/s':>8} {'vs llama.cpp':>13} {'vs base':>8}")
    limit = bw * 1e9 / weight_bytes
    for name, k, l in (("prefill", k_pre, max(l_pre)), ("decode", k_dec, max(l_dec))):
        print(f"{name:10} {'llama.cpp':10} {l:8.1f} {1.0:13.2f}")
        for mode in modes:
            base = "base -qa" if mode.endswith("-qa") else "base"
            vs = f"{max(k[mode]) / max(k[base]):8.3f}" if args.baseline and not mode.startswith("base") else ""
            print(f"{name:10} {mode:10} {max(k[mode]):8.1f} {max(k[mode]) / l:13.2f} {vs}")
    print(f"memory bandwidth {bw:.1f} GB/s (numpy copy): decode limit ~{limit:.0f} tok/s for {weight_bytes / 1e6:.0f} MB "
          f"of weights; best kiln decode {max(max(k_dec[m]) for m in modes if not m.startswith('base')) / limit:.1%} of "
          f"it, llama.cpp "
          f"{max(l_dec) / limit:.1%}")


if __name__ == "__main__":
    main()
