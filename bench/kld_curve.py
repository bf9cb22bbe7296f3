#!/usr/bin/env python3
"""Mean KL divergence against bits per weight, one line per way of quantizing, as a PNG and a markdown table.

    python3 bench/kld_curve.py --model ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf --gptq \\
        --png docs/images/kld-smollm2.png

The inputs are bench/quant_quality.py's (and its work folder is shared: files made by one are scored once): the
model file dequantized to F16 as the source, kiln's imatrix over three license texts, every file scored by
`kiln perplexity --kl-divergence` against the F16 model over four other texts. The lines:

- plain: `kiln quantize F16 OUT TYPE`, each preset of --types;
- imatrix: the same with `--imatrix`; llama-quantize writes the same bytes from the same importance matrix
  (tests/python/test_quantize.py), so this line is llama.cpp's imatrix presets too;
- GPTQ (--gptq): `--imatrix FULL --method gptq`, FULL the imatrix with the Gram matrices over the same chunks;
- budget: `kiln quantize F16 OUT Q4_K_M --imatrix --target-bpw B` for each B of --bpw (each tensor's type
  chosen for the least rounding error within B bits per weight);
- budget + GPTQ (--gptq and --budget-gptq): the same with `--method gptq`.

Bits per weight: the file's bytes times 8 over the model's parameter count (as llama.cpp prints BPW).

`--target-kld X,...` also runs `kiln quantize F16 OUT Q4_K_M --imatrix --target-kld X --kld-base base.kld` for
each X (with --budget-gptq: rounded by GPTQ) and prints, per target, the KLD measured on the file it kept,
whether it meets the target, and its size beside the smallest imatrix preset whose KLD meets the same target.
The search measures on the evaluation text itself, so this checks that it keeps its promise, not how the
target carries over to other text.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_quality import ROOT, kld_of, prepare  # noqa: E402

LINES = {  # line -> (colour, marker)
    "plain": ("#999999", "o"),
    "imatrix (llama.cpp's files)": ("#1f77b4", "s"),
    "GPTQ": ("#d62728", "D"),
    "budget": ("#2ca02c", "^"),
    "budget + GPTQ": ("#9467bd", "v"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--kiln", type=Path, default=ROOT / "build/release/tools/kiln/kiln")
    ap.add_argument("--types", default="Q6_K,Q5_K_M,Q4_K_M,IQ4_XS,Q3_K_M,Q2_K")
    ap.add_argument("--bpw", default="3.0,3.5,4.0,4.5,5.0,5.5,6.0", help="budgets (bits per weight)")
    ap.add_argument("--gptq", action="store_true", help="the GPTQ line (kiln imatrix --full first)")
    ap.add_argument("--gptq-types", help="the presets of the GPTQ line (default: --types)")
    ap.add_argument("--budget-gptq", action="store_true", help="with --gptq: the budgets rounded by GPTQ too")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-quant-quality"))
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8, help="evaluation chunks")
    ap.add_argument("--calib-chunks", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--target-kld", default="", help="KLD targets to check (comma-separated)")
    ap.add_argument("--png", type=Path, help="the figure (matplotlib)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    k, w, t = a.kiln, a.work, str(a.threads)
    f16, base, imx = prepare(a, full=a.gptq)
    n_params = sum(int(x.n_elements) for x in gguf.GGUFReader(str(f16)).tensors)

    jobs = []  # (line, label, file, kiln quantize arguments after IN OUT)
    for ty in a.types.split(","):
        jobs.append(("plain", ty, w / f"{ty}-kiln.gguf", [ty]))
        jobs.append(("imatrix (llama.cpp's files)", ty, w / f"{ty}-kiln-imx.gguf", [ty, "--imatrix", imx["kiln"]]))
        if a.gptq and ty in (a.gptq_types or a.types).split(","):
            jobs.append(("GPTQ", ty, w / f"{ty}-kiln-gptq-imx.gguf",
                         [ty, "--imatrix", imx["full"], "--method", "gptq"]))
    for b in filter(None, a.bpw.split(",")):
        jobs.append(("budget", f"{b} bpw", w / f"budget-{b}-kiln-imx.gguf",
                     ["Q4_K_M", "--imatrix", imx["kiln"], "--target-bpw", b]))
        if a.gptq and a.budget_gptq:
            jobs.append(("budget + GPTQ", f"{b} bpw", w / f"budget-{b}-kiln-gptq-imx.gguf",
                         ["Q4_K_M", "--imatrix", imx["full"], "--method", "gptq", "--target-bpw", b]))

    gptq_budget = a.gptq and a.budget_gptq
    for x in filter(None, a.target_kld.split(",")):
        imatrix = ["--imatrix", imx["full"], "--method", "gptq"] if gptq_budget else ["--imatrix", imx["kiln"]]
        jobs.append(("target", x, w / f"target-{x}-kiln{'-gptq' if gptq_budget else ''}-imx.gguf",
                     ["Q4_K_M", *imatrix, "--target-kld", x, "--kld-base", base]))

    points = []
    for line, label, out, args in jobs:
        if not out.exists():
            cmd = [str(c) for c in (k, "quantize", f16, out, *args, "-t", t)]
            t0 = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:  # a target the search cannot meet is a result too
                if line != "target":
                    sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
                points.append({"line": line, "label": label, "error": r.stderr.strip().splitlines()[-1][-200:]})
                print(json.dumps(points[-1]), file=sys.stderr, flush=True)
                continue
            print(f"{out.name}: {time.time() - t0:.1f} s", file=sys.stderr)
        s = kld_of(k, out, base, t)
        size = out.stat().st_size
        points.append({"line": line, "label": label, "file": out.name, "mib": size / 2**20,
                       "bpw": 8 * size / n_params, "kld": s["kld"]["value"], "kld_err": s["kld"]["error"],
                       "same_top": s["same_top"]["value"]})
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)

    print(f"source: {a.model.name} dequantized to F16, {n_params / 1e6:.1f}M parameters; "
          f"eval {a.chunks} x {a.ctx} tokens")
    curve = [p for p in points if p["line"] in LINES]
    print("| line | type | bpw | MiB | mean KLD | same top |")
    print("|---|---|---:|---:|---:|---:|")
    for p in sorted(curve, key=lambda p: (list(LINES).index(p["line"]), -p["bpw"])):
        print(f"| {p['line']} | {p['label']} | {p['bpw']:.2f} | {p['mib']:.1f} | {p['kld']:.4f} ± {p['kld_err']:.4f} "
              f"| {100 * p['same_top']:.1f}% |")
    targets = [p for p in points if p["line"] == "target"]
    if targets:
        presets = [p for p in points if p["line"].startswith("imatrix")]
        print("\n| target KLD | measured | met | MiB | bpw | smallest imatrix preset meeting it | its MiB | size ratio |")
        print("|---:|---:|---|---:|---:|---|---:|---:|")
        met = 0
        for p in targets:
            x = float(p["label"])
            if "error" in p:
                print(f"| {x} | refused: {p['error']} |")
                continue
            ok = p["kld"] <= x
            met += ok
            best = min((q for q in presets if q["kld"] <= x), key=lambda q: q["mib"], default=None)
            peer = f"{best['label']} ({best['kld']:.4f}) | {best['mib']:.1f} | {p['mib'] / best['mib']:.3f}" \
                if best else "none of --types | |"
            print(f"| {x} | {p['kld']:.4f} | {'yes' if ok else 'no'} | {p['mib']:.1f} | {p['bpw']:.2f} | {peer} |")
        print(f"\ntargets met: {met} of {len(targets)}")
    if a.json:
        a.json.write_text(json.dumps(points, indent=1))
    if a.png:
        plot(curve, a.png, a.title or f"{a.model.name}: mean KLD against F16")


def plot(points, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for line, (colour, marker) in LINES.items():
        pts = sorted((p for p in points if p["line"] == line), key=lambda p: p["bpw"])
        if not pts:
            continue
        ax.plot([p["bpw"] for p in pts], [p["kld"] for p in pts], color=colour, marker=marker, label=line,
                linewidth=1.5, markersize=5)
        if line.startswith("imatrix"):
            for p in pts:
                ax.annotate(p["label"], (p["bpw"], p["kld"]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=colour)
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight (file bytes x 8 / parameters)")
    ax.set_ylabel("mean KL divergence from F16 (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    print(f"wrote {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
