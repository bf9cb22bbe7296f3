"""Where the steps of a CUDA program spend their time on the GPU, from the kernel records bench/cuda_trace.cpp
writes (CUDA_INJECTION64_PATH=libkiln_cuda_trace.so; scripts/gpu-check.sh trace).

A step is the kernels that one CUDA graph launch replayed (one correlation id). The steps of the most common
kernel sequence are compared (a decode's, once its graph is captured), the last --steps of them. Over a step's
span (its first kernel's start to its last kernel's end) every instant is one kernel's when that kernel ran
alone, shared when several ran at once (programmatic launches overlap a kernel's start with the end of the one
before), or idle when none ran. A kernel also advances the step's end by the time from the end of every kernel
before it to its own end (nothing when it ends earlier): these add up to the span, and under programmatic
launches, where a kernel starts while the one before still runs and waits for it, they are what the step waits
on each kernel. Printed, as Markdown: per kernel (its short name), launches a step, mean duration, time alone
and advance a step, and the advance's share of the span; then the step's first --first kernels in order (a
layer), each with its duration, its start against the end of the kernel before (negative: they overlapped) and
its advance; then the step's repeating unit (a decoder layer), each kernel's duration and advance averaged over
the layers and the steps.

Usage: python3 bench/cuda_trace.py TRACE.csv[.gz] [--steps 20] [--first 12] [--label NAME]
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
import statistics
import sys
from pathlib import Path

# kiln's DType values (src/core/dtype.h) as the demangled template arguments spell them: (kiln::DType)12.
DTYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 12: "q4_k", 13: "q5_k",
          14: "q6_k", 30: "bf16"}


def short_name(name: str) -> str:
    """A demangled kernel signature without its return type, namespaces and parameter list, with kiln's dtype
    template arguments by name: 'gemv_staged_kernel<q4_0, 1, 8>'."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):  # drop the trailing balanced parameter list
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    s = re.sub(r"\(kiln::DType\)(\d+)", lambda m: DTYPES.get(int(m.group(1)), m.group(0)), s)
    for ns in ("(anonymous namespace)::", "kiln::cuda::", "kiln::ops::", "kiln::"):
        s = s.replace(ns, "")
    return s


def load(path: Path) -> list[dict]:
    """The kernel records of a trace file, plain or gzip-compressed (a name ending in .gz)."""
    rows = []
    opened = gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")
    with opened as f:
        for r in csv.DictReader(f):
            rows.append({"start": int(r["start_ns"]), "end": int(r["end_ns"]), "corr": int(r["correlation"]),
                         "graph": int(r["graph_id"]), "node": int(r["graph_node"]), "name": short_name(r["name"])})
    return rows


def replays(rows: list[dict]) -> list[list[dict]]:
    """The kernels of each graph launch, sorted by start: those that share the launch's correlation id, or,
    should every kernel of a graph carry an id of its own, runs of one graph's kernels in start order, a new
    run where a node comes again."""
    graph = sorted((r for r in rows if r["graph"] != 0), key=lambda r: (r["start"], r["end"]))
    by_launch = collections.defaultdict(list)
    for r in graph:
        by_launch[(r["graph"], r["corr"])].append(r)
    if any(len(g) > 1 for g in by_launch.values()):
        return list(by_launch.values())
    runs, current = [], {}
    for r in graph:
        run = current.get(r["graph"])
        if run is None or r["node"] in run["nodes"]:
            run = current[r["graph"]] = {"nodes": set(), "kernels": []}
            runs.append(run["kernels"])
        run["nodes"].add(r["node"])
        run["kernels"].append(r)
    return runs


def steps(rows: list[dict], last: int, latest: bool = False) -> list[list[dict]]:
    """The graph replays of the most common kernel sequence (with `latest`, the last replay's), the last `last`
    of them, each sorted by start."""
    replays_ = replays(rows)
    if not replays_:
        return []
    if latest:
        shape = tuple(r["name"] for r in max(replays_, key=lambda g: g[0]["start"]))
    else:
        shape = collections.Counter(tuple(r["name"] for r in g) for g in replays_).most_common(1)[0][0]
    same = sorted((g for g in replays_ if tuple(r["name"] for r in g) == shape), key=lambda g: g[0]["start"])
    return same[-last:]


def split(step: list[dict]) -> tuple[list[int], int, int]:
    """Each kernel's time alone, the time shared by several and the idle time of a step's span, in ns."""
    events = []
    for i, r in enumerate(step):
        events.append((r["start"], 1, i))
        events.append((r["end"], 0, i))
    events.sort()  # at one instant, ends before starts
    alone = [0] * len(step)
    shared = idle = 0
    active: set[int] = set()
    prev = events[0][0]
    for t, kind, i in events:
        dt = t - prev
        if dt > 0:
            if len(active) == 1:
                alone[next(iter(active))] += dt
            elif active:
                shared += dt
            else:
                idle += dt
        prev = t
        if kind == 1:
            active.add(i)
        else:
            active.discard(i)
    return alone, shared, idle


def advances(step: list[dict]) -> list[int]:
    """How far each kernel of a step (sorted by start) moved the latest end so far, in ns: the first kernel its
    duration, every other max(0, its end - the latest end before it). They add up to the step's span."""
    out, latest = [], step[0]["start"]
    for r in step:
        out.append(max(0, r["end"] - latest))
        latest = max(latest, r["end"])
    return out


def layer_period(names: list[str]) -> tuple[int, int, int]:
    """The repeating unit of a step's kernel names (a decoder layer): (period, first index, repeats) of the run
    of at least three repeats in a row that covers the most kernels (the shortest period on a tie, then the
    latest start); (0, 0, 0) when there is none."""
    best, covered = (0, 0, 0), 0
    n = len(names)
    for p in range(2, n // 3 + 1):
        for start in range(p):
            run_start, reps = start, 0
            for i in range(start, n - p + 1, p):
                if names[i:i + p] == names[run_start:run_start + p]:
                    reps += 1
                    # The same cover by a later rotation of the same unit: a layer whose first kernel the
                    # step's first layer lacks (a residual add) begins later.
                    later = reps * p == covered and p == best[0] and run_start > best[1]
                    if reps >= 3 and (reps * p > covered or later):
                        best, covered = (p, run_start, reps), reps * p
                else:
                    run_start, reps = i, 1
    return best


def report(rows: list[dict], last: int, first: int, label: str, latest: bool = False) -> str:
    chosen = steps(rows, last, latest)
    if not chosen:
        return f"## {label}\n\nno kernel replayed from a CUDA graph in the trace\n"
    n = len(chosen)
    spans = [max(r["end"] for r in g) - g[0]["start"] for g in chosen]
    per_kernel = collections.defaultdict(lambda: {"count": 0, "dur": 0, "alone": 0, "advance": 0})
    shared_total = idle_total = 0
    for g in chosen:
        alone, shared, idle = split(g)
        shared_total += shared
        idle_total += idle
        for r, a, adv in zip(g, alone, advances(g)):
            k = per_kernel[r["name"]]
            k["count"] += 1
            k["dur"] += r["end"] - r["start"]
            k["alone"] += a
            k["advance"] += adv
    span = statistics.mean(spans)
    lines = [f"## {label}", "",
             f"{n} steps of {len(chosen[0])} kernels: span {span / 1e3:.1f} us (min {min(spans) / 1e3:.1f}, "
             f"max {max(spans) / 1e3:.1f}); a step: {shared_total / n / 1e3:.1f} us with several kernels running, "
             f"{idle_total / n / 1e3:.1f} us with none", "",
             "| kernel | a step | mean us | alone, us a step | advance, us a step | of the span |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, k in sorted(per_kernel.items(), key=lambda kv: -kv[1]["advance"]):
        lines.append(f"| `{name}` | {k['count'] // n} | {k['dur'] / k['count'] / 1e3:.2f} | "
                     f"{k['alone'] / n / 1e3:.1f} | {k['advance'] / n / 1e3:.1f} | {k['advance'] / n / span:.1%} |")
    step_adv = [advances(g) for g in chosen]
    lines += ["", f"The step's first {min(first, len(chosen[0]))} kernels (mean over the steps):", "",
              "| # | kernel | us | start - end of the one before, us | advance, us |", "|---:|---|---:|---:|---:|"]
    for i in range(min(first, len(chosen[0]))):
        dur = statistics.mean(g[i]["end"] - g[i]["start"] for g in chosen)
        gap = "" if i == 0 else f"{statistics.mean(g[i]['start'] - g[i - 1]['end'] for g in chosen) / 1e3:.2f}"
        adv = statistics.mean(a[i] for a in step_adv)
        lines.append(f"| {i} | `{chosen[0][i]['name']}` | {dur / 1e3:.2f} | {gap} | {adv / 1e3:.2f} |")
    period, first_i, reps = layer_period([r["name"] for r in chosen[0]])
    if period:
        lines += ["", f"A layer: {period} kernels from kernel {first_i}, {reps} times a step (mean over the layers and "
                      f"the steps; their advance sums to {reps} x the table's):", "",
                  "| # | kernel | us | advance, us |", "|---:|---|---:|---:|"]
        for j in range(period):
            idx = [first_i + period * k + j for k in range(reps)]
            dur = statistics.mean(g[i]["end"] - g[i]["start"] for g in chosen for i in idx)
            adv = statistics.mean(a[i] for a in step_adv for i in idx)
            lines.append(f"| {j} | `{chosen[0][first_i + j]['name']}` | {dur / 1e3:.2f} | {adv / 1e3:.2f} |")
        total = statistics.mean(sum(a[first_i + period * k + j] for j in range(period)) for a in step_adv
                                for k in range(reps))
        lines.append(f"| | a layer | | {total / 1e3:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=20, help="the last N steps of the common shape")
    ap.add_argument("--first", type=int, default=12, help="the step's first N kernels, in order")
    ap.add_argument("--label", default="")
    ap.add_argument("--latest", action="store_true",
                    help="the steps of the last replay's sequence (the batched decode of `bench -n N --batch B`)")
    a = ap.parse_args()
    print(report(load(a.trace), a.steps, a.first, a.label or a.trace.name, a.latest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
