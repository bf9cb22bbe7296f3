#!/usr/bin/env python3
"""What a grammar costs decoding, kiln beside llama.cpp (llama-cpp-python of the test venv) on the same GGUF
file, threads and GBNF grammar: greedy decode tokens/s without and with the grammar, interleaved rep by rep,
median of --reps. Each engine's own decode timer (kiln run's summary; llama.cpp's perf counters), so that load
and prompt time stay out. A grammar's output may end before -n tokens: the rate is over the tokens decoded.

    ~/.cache/kiln/venv/bin/python bench/grammar_vs_llamacpp.py --kiln build/release/tools/kiln/kiln \\
        --grammar bench/grammars/json.gbnf
"""
import argparse
import re
import statistics
import subprocess
from pathlib import Path

MODELS = Path.home() / ".cache" / "kiln" / "models"
PROMPT = "Write a JSON object describing a small library with its books and their authors:"


def kiln_rate(args, grammar):
    cmd = [args.kiln, "run", "-m", args.model, "-p", PROMPT, "-n", str(args.n), "--temp", "0", "-t",
           str(args.threads)]
    if grammar:
        cmd += ["--grammar", args.grammar]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"decode:\s+(\d+) tokens in (\d+) ms", err)
    return int(m.group(1)), int(m.group(1)) / (int(m.group(2)) / 1e3)


def llama_rate(llm, llama_cpp, grammar):
    llm.reset()
    llama_cpp.llama_perf_context_reset(llm.ctx)
    out = llm.create_completion(PROMPT, max_tokens=args_global.n, temperature=0, grammar=grammar)
    perf = llama_cpp.llama_perf_context(llm.ctx)
    n = out["usage"]["completion_tokens"]
    # n_eval counts the decode steps after the prompt (the first token comes with the prompt's step).
    return n, perf.n_eval / (perf.t_eval_ms / 1e3)


def main():
    global args_global
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/release/tools/kiln/kiln")
    ap.add_argument("--model", default=str(MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--grammar", default=str(Path(__file__).parent / "grammars" / "json.gbnf"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args_global = args = ap.parse_args()

    import llama_cpp
    llm = llama_cpp.Llama(args.model, n_threads=args.threads, n_ctx=1024, verbose=False)
    g = llama_cpp.LlamaGrammar.from_string(Path(args.grammar).read_text(), verbose=False)
    rates = {k: [] for k in ("kiln", "kiln+grammar", "llama.cpp", "llama.cpp+grammar")}
    tokens = {}
    for _ in range(args.reps):
        for name, fn in (("kiln", lambda: kiln_rate(args, False)), ("kiln+grammar", lambda: kiln_rate(args, True)),
                         ("llama.cpp", lambda: llama_rate(llm, llama_cpp, None)),
                         ("llama.cpp+grammar", lambda: llama_rate(llm, llama_cpp, g))):
            n, r = fn()
            tokens[name] = n
            rates[name].append(r)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"model {Path(args.model).name}, grammar {Path(args.grammar).name}, {args.threads} threads, "
          f"median of {args.reps}; decode tokens/s (tokens decoded)")
    print("| engine | no grammar | grammar | grammar / none |")
    print("|---|---:|---:|---:|")
    for e in ("kiln", "llama.cpp"):
        print(f"| {e} | {med[e]:.1f} ({tokens[e]}) | {med[e + '+grammar']:.1f} ({tokens[e + '+grammar']}) | "
              f"{med[e + '+grammar'] / med[e]:.2f} |")
    print(f"kiln / llama.cpp under the grammar: {med['kiln+grammar'] / med['llama.cpp+grammar']:.2f}x")


if __name__ == "__main__":
    main()
