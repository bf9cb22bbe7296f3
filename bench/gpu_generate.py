"""Generation speed on the GPU: random-weight models of real shapes, made on the GPU machine by transformers
(bf16 safetensors folders with SmolLM2's tokenizer), run with `kiln run -d cuda`.

Rows: Llama-3-8B shape (BF16 folder, then `kiln convert --type q8_0`), SmolLM2-135M shape (BF16).
Per row: tg128 (decode of 128 tokens after a short prompt: the engine's decode rate) and pp2048 (a 2048-token
prompt, prefilled in the engine's 512-token chunks), as `kiln run` reports them, best of --reps runs; the
bytes read per decoded token (the weights) over the decode time, against the card's copy bandwidth.

Runs on the GPU machine: scripts/gpu-check.sh models. Writes generate.md under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

import torch  # noqa: E402
import transformers  # noqa: E402

from parity_text import PARITY_TEXT  # noqa: E402

# The card's copy bandwidth, as matmul_bench measures it: bytes read + written a second by a 1 GiB
# device-to-device copy, the mean of 10 after a warm-up, through PyTorch in a process of its own (so that its
# CUDA context is gone before the engines run).
_COPY_PROBE = """
import torch
n = 1 << 28
a = torch.empty(n, device="cuda")
b = torch.empty_like(a)
b.copy_(a)
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    b.copy_(a)
stop.record()
torch.cuda.synchronize()
print(2 * 4 * n * 10 / (start.elapsed_time(stop) / 1e3) / 1e9)
"""


def copy_gbs(given: float | None) -> float:
    """`given` when set (--copy-gbs), else the copy bandwidth measured here, GB/s; 0 when it cannot be."""
    if given:
        return given
    r = subprocess.run([sys.executable, "-c", _COPY_PROBE], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        print(f"copy bandwidth: not measured (exit {r.returncode}): {r.stderr.strip()[-300:]}", flush=True)
        return 0.0
    gbs = float(r.stdout.strip().splitlines()[-1])
    print(f"copy bandwidth: {gbs:.1f} GB/s (read + written)", flush=True)
    return gbs


def of_copy(gbs: float, copy: float) -> str:
    """gbs as a share of the copy bandwidth (n/a when that is unknown)."""
    return f"{gbs / copy:.0%}" if copy > 0 else "n/a"


SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=True),
}


def make_folder(name: str, out: Path, tokenizer: Path) -> Path:
    t0 = time.time()
    cfg = transformers.LlamaConfig(**SHAPES[name])
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    torch.cuda.empty_cache()
    for f in tokenizer.iterdir():
        shutil.copy(f, out / f.name)
    print(f"{name}: made in {time.time() - t0:.0f} s", flush=True)
    return out


def kiln_run(kiln: Path, model: Path, prompt: str, n: int, profile: Path | None = None, ctx: int = 4096,
             extra=()) -> dict:
    env = dict(os.environ, KILN_CUDA_PROFILE="1") if profile else None
    r = subprocess.run([str(kiln), "run", "-m", str(model), "-d", "cuda", "-p", prompt, "-n", str(n), "--temp", "0",
                        "--ignore-eos", "-c", str(ctx), *extra], capture_output=True, env=env)
    err = r.stderr.decode(errors="replace")  # a random model's text need not be UTF-8
    if r.returncode != 0:
        raise RuntimeError(f"kiln run {model}: {err[-3000:]}")
    if profile:
        at = err.find(" profile: ")
        with profile.open("a") as f:
            f.write(f"\n## {model.name}, {len(prompt)} prompt characters, {n} generated\n")
            f.write(err[err.rfind("\n", 0, at) + 1:] if at >= 0 else err)
    p = re.search(r"prompt:\s+(\d+) tokens .* ([\d.]+) tokens/s", err)
    d = re.search(r"decode:\s+(\d+) tokens in ([\d.]+) ms, ([\d.]+) tokens/s", err)
    head = re.search(r"^(.* on cuda.*)$", err, re.M)
    return dict(pp=float(p.group(2)), n_prompt=int(p.group(1)), tg=float(d.group(3)),
                line=head.group(1) if head else "")


def weight_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in ([model] if model.is_file() else model.glob("*.safetensors")))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu-deps" / "tokenizer")
    ap.add_argument("--models", type=Path, default=Path("/tmp/kiln-models"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--copy-gbs", type=float, help="the card's copy bandwidth, GB/s (default: measured here)")
    a = ap.parse_args()
    a.copy_gbs = copy_gbs(a.copy_gbs)
    kiln = a.build / "tools" / "kiln" / "kiln"
    a.models.mkdir(parents=True, exist_ok=True)
    short = PARITY_TEXT[:80]
    long = (PARITY_TEXT + " ") * 40
    rows, batched = [], []
    for name in ("smollm2-135m", "llama3-8b"):
        folder = a.models / name
        if not (folder / "config.json").exists():
            make_folder(name, folder, a.tokenizer)
        variants = [("bf16", folder)]
        if name == "llama3-8b":
            q8 = a.models / f"{name}-q8_0.gguf"
            if not q8.exists():
                t0 = time.time()
                subprocess.run([str(kiln), "convert", str(folder), str(q8), "--type", "q8_0"], check=True,
                               capture_output=True)
                print(f"{name}: q8_0 in {time.time() - t0:.0f} s", flush=True)
            variants.append(("q8_0", q8))
        for typ, path in variants:
            best = dict(pp=0.0, tg=0.0, line="", n_prompt=0)
            for _ in range(a.reps):
                tg = kiln_run(kiln, path, short, 128)
                pp = kiln_run(kiln, path, long[:12000], 1)
                best["tg"] = max(best["tg"], tg["tg"])
                best["pp"] = max(best["pp"], pp["pp"])
                best["n_prompt"], best["line"] = pp["n_prompt"], tg["line"]
            # Each op timed alone (KILN_CUDA_PROFILE): where a decode step and a prefill spend their time (one file
            # for both; the output folder comes back only when it holds few files).
            kiln_run(kiln, path, short, 32, a.out / "profiles.txt")
            kiln_run(kiln, path, long[:12000], 1, a.out / "profiles.txt")
            gbs = weight_bytes(path) * best["tg"] / 1e9
            rows.append((name, typ, best["tg"], gbs, of_copy(gbs, a.copy_gbs), best["pp"], best["n_prompt"]))
            print(f"{name} {typ}: tg128 {best['tg']:.1f} tok/s ({gbs:.0f} GB/s), pp{best['n_prompt']} "
                  f"{best['pp']:.0f} tok/s | {best['line']}", flush=True)
    # Batched decode: 16 and 64 requests of 128 greedy tokens at once through the engine (logits_driver
    # generate), the generated tokens after the first of each over the longest request's decode time.
    words = [int(t) for t in range(1000, 1016)]
    for bs in (16, 64):
        prompts = [[w + 37 * i for w in words] for i in range(bs)]
        r = subprocess.run([str(a.build / "tests" / "logits_driver"), "generate", str(a.models / "llama3-8b"), "128",
                            "--device", "cuda", "--quantize-x"], input=json.dumps(prompts), capture_output=True,
                           text=True)
        reply = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"ok": False}
        if not reply.get("ok"):
            raise RuntimeError(f"batched decode bs{bs}: {reply.get('error')} {r.stderr[-2000:]}")
        tps = bs * 127 / (reply["decode_ms"] / 1000)
        batched.append((bs, tps, reply["elapsed_ms"]))
        print(f"llama3-8b bf16 batched decode bs{bs}: {tps:.0f} tok/s ({reply['elapsed_ms']:.0f} ms in all)", flush=True)
    # Memory: the 8B in BF16 with a 32k-token context (f16 K/V) on the card, as the load line reports it.
    big = kiln_run(kiln, a.models / "llama3-8b", short, 8, ctx=32768, extra=("--kv-type", "f16"))
    print(f"32k context: {big['line']}", flush=True)
    # The file's bytes over the decode time: an upper bound on what a token reads (the token embedding table is
    # read one row a step unless it is also the output head).
    lines = ["| model | weights | tg128 tok/s | file GB/s | of copy bandwidth | prompt tokens | prefill tok/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, typ, tg, gbs, frac, pp, n in rows:
        lines.append(f"| {name} | {typ} | {tg:.1f} | {gbs:.0f} | {frac} | {n} | {pp:.0f} |")
    for bs, tps, ms in batched:
        lines.append(f"\nllama3-8b bf16, {bs} requests decoding together: {tps:.0f} tok/s")
    lines.append(f"\n32k-token context: {big['line']}")
    (a.out / "generate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
