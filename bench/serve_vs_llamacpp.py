"""kiln serve beside llama.cpp's server (llama-cpp-python's `python -m llama_cpp.server`, from the test venv) on the
same GGUF file, the same threads and context, loaded by `kiln bench serve` with the same prompts, in one run.

For each engine in turn: start its server, send --num-prompts random-word prompts (--input-len words,
--output-len tokens each; the end-of-generation tokens are banned with logit_bias so that both generate the same
counts) at each --rates, at most --max-concurrency at once, and stop it. kiln runs --parallel requests together;
llama-cpp-python's server answers one request at a time (it has no parallel slots), with its prompt cache on and
--interrupt_requests off (by default a request arriving cuts off the one being streamed).

    ~/.cache/kiln/venv/bin/python bench/serve_vs_llamacpp.py [--build build/release] [--num-prompts 200]

Prints a markdown table (and writes --json): per engine and rate, request and output-token throughput, TTFT and
ITL p50/p99.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
END_TOKENS = {"<|endoftext|>", "<|im_end|>", "</s>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<eos>"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_token_ids(model: Path) -> list[int]:
    import gguf
    r = gguf.GGUFReader(str(model))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    return [i for i, t in enumerate(tokens) if t in END_TOKENS]


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not come up")


def start(engine: str, a, port: int) -> subprocess.Popen:
    if engine == "kiln":
        cmd = [str(a.build / "tools" / "kiln" / "kiln"), "serve", "-m", str(a.model), "--port", str(port), "-t",
               str(a.threads), "--parallel", str(a.parallel), "-c", str(a.ctx), "--max-queue", "100000"]
    else:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(a.model), "--host", "127.0.0.1", "--port",
               str(port), "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads), "--n_ctx", str(a.ctx),
               "--n_batch", "512", "--cache", "True",
               # By default a new request interrupts the one being streamed: it would cut every answer short.
               "--interrupt_requests", "False"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bench(a, port: int, rate: str, banned: list[int]) -> dict:
    cmd = [str(a.build / "tools" / "kiln" / "kiln"), "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
           "--num-prompts", str(a.num_prompts), "--request-rate", rate, "--max-concurrency", str(a.max_concurrency),
           "--random-words", "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--seed", "1", "--extra-body", json.dumps({"logit_bias": {str(i): -100 for i in banned}}), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kiln bench serve: {r.stderr}")
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "release")
    ap.add_argument("--model", type=Path, default=MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--rates", default="1,4,inf")
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    banned = end_token_ids(a.model)
    results = []
    for engine in ("kiln", "llama.cpp"):
        port = free_port()
        proc = start(engine, a, port)
        try:
            wait_ready(port, proc)
            for rate in a.rates.split(","):
                r = bench(a, port, rate, banned)
                r["engine"], r["rate"] = engine, rate
                results.append(r)
                print(f"{engine} rate {rate}: {r['completed']} ok, {r['failed']} failed, "
                      f"{r['output_throughput']:.1f} tok/s, TTFT p99 {r['p99_ttft_ms']:.0f} ms", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"\n{a.model.name}, {a.threads} threads, {a.num_prompts} prompts of {a.input_len} words and "
          f"{a.output_len} tokens, at most {a.max_concurrency} at once; kiln --parallel {a.parallel}\n")
    print("| rate (req/s) | engine | req/s | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | failed |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rate']} | {r['engine']} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
              f"{r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | {r['median_itl_ms']:.0f} / {r['p99_itl_ms']:.0f} | "
              f"{r['failed']} |")
    by = {(r["engine"], r["rate"]): r for r in results}
    for rate in a.rates.split(","):
        k, ll = by[("kiln", rate)], by[("llama.cpp", rate)]
        print(f"rate {rate}: kiln / llama.cpp output throughput {k['output_throughput'] / ll['output_throughput']:.2f}x, "
              f"TTFT p99 {k['p99_ttft_ms'] / max(ll['p99_ttft_ms'], 1e-9):.2f}x")
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
