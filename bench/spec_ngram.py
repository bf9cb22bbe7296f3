#!/usr/bin/env python3
"""What speculative decoding (`--spec ngram`) buys one request: `kiln run` greedy on a prompt without and with
it, interleaved rep by rep, the decode tokens/s of each (median), their ratio, the share of draft tokens kept,
and whether the texts are byte for byte the same (they must be).

    python3 bench/spec_ngram.py --model ~/.cache/kiln/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

The default prompt (`bench/prompts/edit-rename.txt`) is an editing task: a short Python file to rewrite with
one function renamed, whose answer repeats most of the prompt. `--prompt FILE` takes another (sent as a chat
message unless `--raw`).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(kiln, model, prompt, args, spec):
    cmd = [str(kiln), "run", "-m", str(model), "-p", prompt, "-n", str(args.n), "--temp", "0", "-t",
           str(args.threads), "-d", args.device, "--spec", spec, "--draft-max", str(args.draft_max)]
    if not args.raw:
        cmd.append("--chat")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"kiln run failed: {r.stderr[-2000:]}")
    tps = float(re.search(r"^decode: .* ([\d.]+) tokens/s", r.stderr, re.M)[1])
    n = int(re.search(r"^decode:\s+(\d+) tokens", r.stderr, re.M)[1])
    kept = re.search(r"^drafts:\s+(\d+) of (\d+)", r.stderr, re.M)
    return r.stdout, tps, n, (int(kept[1]), int(kept[2])) if kept else (0, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--kiln", type=Path, default=ROOT / "build/release/tools/kiln/kiln")
    ap.add_argument("--prompt", type=Path, default=ROOT / "bench/prompts/edit-rename.txt")
    ap.add_argument("--raw", action="store_true", help="the prompt as text, not a chat message")
    ap.add_argument("-n", type=int, default=400, help="tokens to generate at most")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("-d", "--device", default="cpu")
    a = ap.parse_args()
    prompt = a.prompt.read_text()
    speeds = {"none": [], "ngram": []}
    texts = {}
    kept = (0, 0)
    n = 0
    for _ in range(a.reps):
        for spec in ("none", "ngram"):
            text, tps, n, k = run(a.kiln, a.model, prompt, a, spec)
            speeds[spec].append(tps)
            texts.setdefault(spec, text)
            if spec == "ngram":
                kept = k
    plain, spec = statistics.median(speeds["none"]), statistics.median(speeds["ngram"])
    print(f"{a.model.name}, {a.prompt.name}, {n} tokens, {a.threads} threads on {a.device}, median of {a.reps}")
    print("| decoding | tokens/s | ratio | draft tokens kept | same text |")
    print("|---|---:|---:|---:|---|")
    print(f"| plain | {plain:.1f} | 1.00 | | |")
    same = "yes" if texts["ngram"] == texts["none"] else "NO"
    share = f"{kept[0]} of {kept[1]} ({100 * kept[0] / max(1, kept[1]):.0f}%)"
    print(f"| --spec ngram | {spec:.1f} | {spec / plain:.2f} | {share} | {same} |")
    if same != "yes":
        sys.exit("the texts differ")


if __name__ == "__main__":
    main()
