#!/usr/bin/env python3
"""kiln against llama.cpp on the CPU: pp512 and tg128 on the same GGUF files, same threads, one run.

usage: bench/cpu_vs_llamacpp.py [--models KEY|PATH ...] [--reps R] [--threads T] [-p 512] [-n 128]
                                [--depth D] [--kv-type f32|f16|q8_0] [--kiln-args "..."] [--json OUT.json]

Run with the test venv's Python (scripts/setup-venv.sh; llama-cpp-python is in it) after
`scripts/build.sh release kiln read_bandwidth`. The 1.5B row needs `scripts/fetch-models.sh --large`.

What is measured, per model (each engine in its own process, the two interleaved rep by rep, the order
alternating, so both see the same machine state; each figure is the median over the reps):
- kiln: `kiln bench -m M -p P -n N -t T -r 1 -o json` (one untimed warm-up of each test, then one timed run).
- llama.cpp: the way llama-bench measures, through llama-cpp-python's low-level API: one context
  (n_ctx = max(P, N + 1) + 1 as kiln bench sizes its own, n_batch 2048, n_ubatch 512, n_threads =
  n_threads_batch = T, the library's defaults otherwise: f16 KV, flash attention auto), a warm-up, then ppP =
  P random tokens (BOS first) in one llama_decode after clearing the KV cache, and tgN = N single-token
  llama_decode calls after clearing it, starting from BOS.
- --depth D (llama-bench's -d, kiln bench's --depth): tgN after D random tokens (BOS first) already in the cache,
  their prefill not timed; the pp test is then left out. --kv-type T: both engines' K and V caches of that type
  (kiln bench --kv-type; llama.cpp's type_k and type_v, flash attention on, which its quantized V needs).
- Peak RSS: VmHWM of each engine's process, polled while it runs. For llama.cpp the RSS of its Python process just
  before the model loads (the interpreter, numpy, the llama library) is subtracted, so that both numbers are
  the engine's own.
- Read bandwidth: bench/read_bandwidth.cpp, T threads summing a 1 GiB buffer, best of 10 passes, once per run.
  Decode % of it = tg tokens/s x the weight bytes a token reads / bandwidth; the bytes are the GGUF's tensor
  bytes less the token-embedding table (a row lookup), unless the output head is tied to it.

The Q8_0 and F16 rows are SmolLM2-135M-Instruct converted by `kiln convert` from a Hugging Face folder (--hf-dir;
by default the copy of the Q4_1 file's weights that the Python tests save with transformers, made here if
missing) into ~/.cache/kiln/bench/ once.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln"
MODELS = Path(os.environ.get("KILN_MODELS_DIR") or CACHE / "models")
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build/release/tools/kiln/kiln"))
READ_BW = ROOT / "build/release/tests/read_bandwidth"

SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
# key: (label, type, how to get the file)
ROWS = {
    "smollm2-q4_1": ("SmolLM2-135M", "Q4_1", SMOL),
    "gemma3-q4_k_m": ("Gemma-3-270M", "Q4_K_M", MODELS / "gemma-3-270m-q4_k_m.gguf"),
    "smollm2-q8_0": ("SmolLM2-135M", "Q8_0", "q8_0"),
    "smollm2-f16": ("SmolLM2-135M", "F16", "f16"),
    "qwen2.5-1.5b-q4_k_m": ("Qwen2.5-Coder-1.5B", "Q4_K_M", MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
}
MISSING_HINT = {
    "qwen2.5-1.5b-q4_k_m": "scripts/fetch-models.sh --large",
}


# ---- processes ----

def vm_hwm(pid):
    """Peak resident set of a running process, bytes (None once it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_measured(cmd):
    """Runs cmd to completion; returns (stdout, peak RSS in bytes of that process alone). Raises on failure.
    The peak is VmHWM, read every 20 ms while the process runs (the kernel keeps it per address space, so it is
    the exec'd program's own; ru_maxrss would include this Python process's RSS, inherited through fork)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        peak = 0
        while p.poll() is None:
            peak = max(peak, vm_hwm(p.pid) or 0)
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{shlex.join(map(str, cmd))} exited with {p.returncode}:\n"
                               f"{err.read().decode(errors='replace')[-2000:]}")
        return out.read().decode(), peak


def kiln_rep(model, args):
    extra = ["--depth", args.depth] if args.depth else []
    if args.kv_type:
        extra += ["--kv-type", args.kv_type]
    cmd = [KILN, "bench", "-m", model, "-p", 0 if args.depth else args.n_prompt, "-n", args.n_gen, "-t",
           args.threads, "-r", 1, "-o", "json", *extra, *shlex.split(args.kiln_args)]
    out, rss = run_measured([str(c) for c in cmd])
    rows = {r["test"]: r["tokens_per_s"] for r in json.loads(out)}
    tg = next(v for t, v in rows.items() if t.startswith(f"tg{args.n_gen}"))
    return {"pp": rows.get(f"pp{args.n_prompt}", float("nan")), "tg": tg, "rss": rss}


def llama_rep(model, args):
    cmd = [sys.executable, __file__, "--llama-worker", model, str(args.n_prompt), str(args.n_gen),
           str(args.threads), str(args.depth), args.kv_type or "f16"]
    out, rss = run_measured(cmd)
    r = json.loads(out)
    return {"pp": r["pp"], "tg": r["tg"], "rss": rss - r["rss_before_load"]}


def vm_rss():
    """This process's resident set, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}


def llama_worker(model, n_prompt, n_gen, threads, depth=0, kv_type="f16"):
    """One llama.cpp repetition (a separate process, so that its peak RSS is its own): prints JSON."""
    import ctypes
    import random

    import llama_cpp as lc

    quiet = lc.llama_log_callback(lambda level, text, data: None)  # kept alive: the library calls it later
    lc.llama_log_set(quiet, ctypes.c_void_p())
    lc.llama_backend_init()
    rss_before_load = vm_rss()
    mp = lc.llama_model_default_params()
    model_p = lc.llama_model_load_from_file(model.encode(), mp)
    if not model_p:
        sys.exit(f"llama.cpp could not load {model}")
    cp = lc.llama_context_default_params()
    cp.n_ctx = max(n_prompt, depth + n_gen + 1) + 1
    cp.n_batch = 2048
    cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = threads
    if kv_type != "f16":
        cp.type_k = cp.type_v = GGML_TYPES[kv_type]
        cp.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = lc.llama_init_from_model(model_p, cp)
    if not ctx:
        sys.exit(f"llama.cpp could not make a context for {model}")
    vocab = lc.llama_model_get_vocab(model_p)
    n_vocab, bos = lc.llama_vocab_n_tokens(vocab), lc.llama_vocab_bos(vocab)
    rng = random.Random(1234)

    def decode(tokens):
        arr = (lc.llama_token * len(tokens))(*tokens)
        if lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(tokens))) != 0:
            sys.exit("llama_decode failed")

    def prompt(n):  # llama-bench's test_prompt: one batch of n tokens (n <= n_batch)
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        tokens = [bos] + [rng.randrange(n_vocab) for _ in range(n - 1)]
        t0 = time.perf_counter()
        for i in range(0, n, cp.n_batch):
            decode(tokens[i:i + cp.n_batch])
        lc.llama_synchronize(ctx)
        return n / (time.perf_counter() - t0)

    def gen(n):  # llama-bench's test_gen: n single-token steps from BOS, or after `depth` tokens
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        token = bos
        if depth:
            tokens = [bos] + [rng.randrange(n_vocab) for _ in range(depth - 1)]
            for i in range(0, depth, cp.n_batch):
                decode(tokens[i:i + cp.n_batch])
            lc.llama_synchronize(ctx)
            token = rng.randrange(n_vocab)
        t0 = time.perf_counter()
        for _ in range(n):
            decode([token])
            lc.llama_synchronize(ctx)
            token = rng.randrange(n_vocab)
        return n / (time.perf_counter() - t0)

    if not depth:
        prompt(n_prompt)  # warm-up, as llama-bench
    gen(1)
    pp = float("nan") if depth else prompt(n_prompt)
    tg = gen(n_gen)
    lc.llama_free(ctx)
    lc.llama_model_free(model_p)
    print(json.dumps({"pp": pp, "tg": tg, "rss_before_load": rss_before_load}))


# ---- models ----

def bytes_per_token(path):
    """Weight bytes one decode step reads: every tensor, less the token-embedding table unless it is the
    output head too (no output.weight)."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    total = sum(tensors.values())
    if "output.weight" in tensors and "token_embd.weight" in tensors:
        total -= tensors["token_embd.weight"]
    return total


def smollm2_hf_dir(args):
    """A Hugging Face folder of SmolLM2-135M-Instruct for kiln convert: --hf-dir, or the transformers copy of
    the Q4_1 file's weights that tests/python/hf_cache.py keeps (made now if missing, ~1 min)."""
    if args.hf_dir:
        return Path(args.hf_dir)
    if not SMOL.exists():
        return None
    sys.path.insert(0, str(ROOT / "tests/python"))
    import hf_cache

    st = SMOL.stat()

    def cached(what):
        hits = sorted(hf_cache.CACHE.glob(f"{SMOL.name}-{st.st_size}-{int(st.st_mtime)}-transformers-*-{what}"))
        return next((h for h in reversed(hits) if (h / ".complete").exists()), None)

    if cached("model-f32") is None or cached("tokenizer") is None:
        print(f"making the transformers copy of {SMOL.name} (once)", file=sys.stderr)
        hf_cache.hf_model(SMOL)
        hf_cache.hf_tokenizer(SMOL)
    folder = CACHE / "bench" / "SmolLM2-135M-Instruct-hf"
    folder.mkdir(parents=True, exist_ok=True)
    for src in (cached("model-f32"), cached("tokenizer")):
        for f in src.iterdir():
            if not f.name.startswith("."):
                link = folder / f.name  # kiln refuses symbolic links out of a model folder: hard link or copy
                link.unlink(missing_ok=True)
                try:
                    os.link(f, link)
                except OSError:
                    shutil.copyfile(f, link)
    return folder


def converted(kind, args):
    """SmolLM2-135M-Instruct as a `kiln convert --type kind` GGUF (made once); None if no source."""
    out = CACHE / "bench" / f"SmolLM2-135M-Instruct.{kind.upper()}.gguf"
    if out.exists():
        return out
    hf = smollm2_hf_dir(args)
    if hf is None:
        return None
    print(f"kiln convert {hf} -> {out.name}", file=sys.stderr)
    tmp = out.with_name(out.name + ".part")
    subprocess.run([str(KILN), "convert", str(hf), str(tmp), "--type", kind], check=True)
    tmp.rename(out)
    return out


def resolve(key, args):
    """(label, type, path) of a row, or a reason to skip it."""
    if key not in ROWS:  # a path
        path = Path(key)
        return (path.stem, "", path) if path.exists() else f"{key}: no such file"
    label, typ, src = ROWS[key]
    path = src if isinstance(src, Path) else converted(src, args)
    if path is None:
        return f"{key}: no source for kiln convert ({SMOL} is missing and no --hf-dir)"
    if not path.exists():
        return f"{key}: {path} is missing" + (f" ({MISSING_HINT[key]})" if key in MISSING_HINT else "")
    return label, typ, path


# ---- the run ----

def read_bandwidth(threads):
    out = subprocess.run([str(READ_BW), str(threads), "1024", "10"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["read_gb_per_s"] * 1e9


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def mib(b):
    return f"{b / 2**20:.0f} MiB"


def table(results, args, bw):
    p, n = args.n_prompt, args.n_gen
    tg = f"tg{n}" + (f" @ d{args.depth}" if args.depth else "") + (f" {args.kv_type} KV" if args.kv_type else "")
    pp_head = "" if args.depth else f" pp{p} kiln | pp{p} llama.cpp | ratio |"
    lines = [
        f"| model | type |{pp_head} {tg} kiln | {tg} llama.cpp | ratio "
        f"| kiln tg % of read bw | llama.cpp tg % | peak RSS kiln | peak RSS llama.cpp |",
        "| --- | --- |" + ("" if args.depth else " ---: | ---: | ---: |") + " ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for r in results:
        k, l = r["kiln"], r["llama_cpp"]
        pp = "" if args.depth else f" {k['pp']:.1f} | {l['pp']:.1f} | {k['pp'] / l['pp']:.2f} |"
        lines.append(
            f"| {r['model']} | {r['type']} |{pp} {k['tg']:.1f} | {l['tg']:.1f} | {k['tg'] / l['tg']:.2f} "
            f"| {k['tg_bw_pct']:.0f}% | {l['tg_bw_pct']:.0f}% | {mib(k['rss'])} | {mib(l['rss'])} |")
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--llama-worker":
        model, n_prompt, n_gen, threads, depth = sys.argv[2], *map(int, sys.argv[3:7])
        llama_worker(model, n_prompt, n_gen, threads, depth, sys.argv[7])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(ROWS),
                    help=f"row keys ({', '.join(ROWS)}) or GGUF paths (default: every row)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per engine and model (median reported)")
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count(), help="threads for both engines")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, help="tgN after this many tokens in the cache (no pp test)")
    ap.add_argument("--kv-type", choices=list(GGML_TYPES), help="both engines' KV cache type (default: their own)")
    ap.add_argument("--kiln-args", default="", help="more `kiln bench` flags")
    ap.add_argument("--hf-dir", help="Hugging Face folder of SmolLM2-135M-Instruct for the Q8_0 / F16 rows")
    ap.add_argument("--json", help="also write the results, every sample included, to this file")
    args = ap.parse_args()
    if not KILN.exists() or not READ_BW.exists():
        sys.exit(f"missing {KILN} or {READ_BW}: run scripts/build.sh release kiln read_bandwidth")
    if args.n_prompt > 2048:
        sys.exit("-p above 2048 (llama.cpp's n_batch here) is not supported")
    if args.depth < 0:
        sys.exit("--depth must be 0 or more")

    bw = read_bandwidth(args.threads)
    print(f"read bandwidth, {args.threads} threads: {bw / 1e9:.1f} GB/s", file=sys.stderr)
    results = []
    for key in args.models:
        row = resolve(key, args)
        if isinstance(row, str):
            print(f"skipped: {row}", file=sys.stderr)
            continue
        label, typ, path = row
        reps = {"kiln": [], "llama_cpp": []}
        for rep in range(args.reps):
            order = [("kiln", kiln_rep), ("llama_cpp", llama_rep)]
            for name, fn in order if rep % 2 == 0 else order[::-1]:
                r = fn(str(path), args)
                reps[name].append(r)
                print(f"{label} {typ} rep {rep + 1}/{args.reps} {name}: pp{args.n_prompt} {r['pp']:.1f}, "
                      f"tg{args.n_gen} {r['tg']:.1f} tok/s, peak RSS {mib(r['rss'])}", file=sys.stderr)
        bpt = bytes_per_token(path)
        res = {"model": label, "type": typ, "path": str(path), "file_bytes": path.stat().st_size,
               "bytes_per_token": bpt}
        for name, rs in reps.items():
            pp, tg = median([r["pp"] for r in rs]), median([r["tg"] for r in rs])
            res[name] = {"pp": pp, "tg": tg, "rss": max(r["rss"] for r in rs), "tg_bw_pct": 100 * tg * bpt / bw,
                         "samples": rs}
        results.append(res)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.threads} threads, median of {args.reps} interleaved reps; read bandwidth {bw / 1e9:.1f} GB/s "
          f"(bench/read_bandwidth.cpp); load average at the end {load} (llama.cpp's decode collapses when the "
          f"cores are shared: its threads spin at every barrier); tokens/s\n")
    print(table(results, args, bw))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"threads": args.threads, "reps": args.reps, "n_prompt": args.n_prompt, "n_gen": args.n_gen,
             "depth": args.depth, "kv_type": args.kv_type, "kiln_args": args.kiln_args,
             "read_bandwidth_bytes_per_s": bw, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
