#!/usr/bin/env python3
"""Whether a request's text depends on the requests beside it: 8 chat prompts sent alone, one at a time, then
again inside a burst of concurrent requests of mixed lengths (greedy, and sampled with a fixed seed); counts
the prompts whose text came back byte-identical. Talks to any OpenAI-compatible server (standard library only).

  python3 bench/deterministic_check.py --base-url http://127.0.0.1:8080 [--burst 256] [--expect-identical]
"""
import argparse
import concurrent.futures as cf
import json
import random
import sys
import urllib.request

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 100.",
    "What is the capital of France? Answer in one word, then explain why it matters.",
    "Describe a cat to someone who has never seen one.",
    "Give me a recipe for a simple tomato sauce.",
    "Why is the sky blue?",
    "Translate 'good morning, how are you?' into Spanish and German.",
]

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue").split()


def chat(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return out["choices"][0]["message"]["content"]


def body(prompt, max_tokens, sampling):
    b = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    b.update(sampling)
    return b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--burst", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--expect-identical", action="store_true", help="exit 1 unless every prompt matches")
    a = ap.parse_args()
    rng = random.Random(1)
    kinds = {"greedy": lambda i: {"temperature": 0},
             "seeded": lambda i: {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1, "seed": 1000 + i}}
    ok_all = True
    for kind, sampling in kinds.items():
        alone = [chat(a.base_url, body(p, a.max_tokens, sampling(i))) for i, p in enumerate(PROMPTS)]
        # The burst: the 8 prompts spread among others of mixed lengths and sampling, all sent at once.
        jobs = []
        for j in range(a.burst - len(PROMPTS)):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 400)))
            other = {"temperature": rng.choice([0, 0.7, 1.0]), "seed": j}
            jobs.append(body(words, rng.randint(8, 160), other))
        slots = sorted(rng.sample(range(len(jobs) + len(PROMPTS)), len(PROMPTS)))
        for i, s in enumerate(slots):
            jobs.insert(s, body(PROMPTS[i], a.max_tokens, sampling(i)))
        with cf.ThreadPoolExecutor(max_workers=len(jobs)) as ex:
            texts = list(ex.map(lambda b: chat(a.base_url, b), jobs))
        same = sum(texts[s] == alone[i] for i, s in enumerate(slots))
        print(f"{kind}: {same} of {len(PROMPTS)} prompts byte-identical alone and inside a burst of {len(jobs)}")
        ok_all = ok_all and same == len(PROMPTS)
    return 0 if ok_all or not a.expect_identical else 1


if __name__ == "__main__":
    sys.exit(main())
