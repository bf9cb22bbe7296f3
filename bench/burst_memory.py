#!/usr/bin/env python3
"""What a burst costs `kiln serve` in memory, with the bound on queued tokens and without it, and what a queued
request holds beside what the bound charges it.

1. Bursts. For each run (--max-queued-tokens given, then 0: no bound): start `kiln serve` on the CPU, warm it
   up with two rounds of --parallel requests of distinct full-length prompts (every KV block and scratch buffer
   touched), reset the server's peak RSS (/proc/PID/clear_refs), then send one burst of --burst raw HTTP
   completions at once, each a prompt of --prompt-tokens tokens at most (one text, a distinct tail each) and
   --max-tokens tokens out. The server's VmRSS is sampled every 5 ms meanwhile and VmHWM read at the end. Every
   answer is checked: a 200 must carry its --max-tokens tokens, a refusal must be 503 with Retry-After and code
   server_busy; afterwards /metrics must show nothing running or waiting, and num_requests_rejected_total must
   equal the refusals.
2. Held per queued request (--held-only runs this part alone, --no-held skips it). With one slot
   (`--parallel 1`) held by a long decode, --held-count requests of one shape are queued, then as many again:
   the RSS between the two points over the count is what one holds (the first batch absorbs the allocator's
   one-time growth). Shapes: a one-word prompt, a --prompt-tokens prompt, the same with echo and logprobs
   (every prompt token scored), a logit_bias over the whole vocabulary. Beside it, the server's charge
   (server/api.h, queued_charge) in bytes.

    bench/burst_memory.py [--kiln build/release/tools/kiln/kiln] [--burst 600] [--max-queued-tokens 16384]

The standard library alone (and the kiln binary: --kiln or KILN_BIN). Prints two markdown tables; exit status
1 when a check fails.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build/release/tools/kiln/kiln"))
TOKEN_BYTES, CHOICE_TOKENS = 64, 256  # server/api.h: kQueuedTokenBytes, kQueuedChoiceTokens
WORDS = ("river stone market window garden letter silver morning basket candle harbor meadow lantern "
         "thunder pocket ribbon saddle tunnel violin wagon anchor bridge cellar feather ginger island kettle "
         "ladder marble needle orchard pepper quarry rocket shadow timber velvet walnut yellow zebra").split()


def status_kib(pid, field):
    """A /proc/PID/status field in KiB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


class Server:
    def __init__(self, a, max_queued_tokens, parallel):
        cmd = [str(a.kiln), "serve", "-m", str(a.model), "-d", "cpu", "--port", "0", "-t", str(a.threads),
               "--parallel", str(parallel), "-c", str(a.ctx), "--max-queued-tokens", str(max_queued_tokens)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.port, self.log = None, []
        deadline = time.time() + 120
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line or time.time() > deadline:
                raise RuntimeError("kiln serve did not start: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            self.port = int(m.group(1)) if m else None
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("kiln serve did not become healthy")

    def request(self, method, path, body=None):
        """(status, parsed JSON or text, headers) of one request on its own connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        data = None if body is None else json.dumps(body)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        return r.status, payload, {k.lower(): v for k, v in r.getheaders()}

    def metrics(self):
        out = {}
        for line in self.request("GET", "/metrics")[1].splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[re.sub(r'\{model_name="[^"]*"\}', "", name)] = float(value)
        return out

    def wait_for(self, name, value, timeout=300):
        deadline = time.time() + timeout
        while self.metrics()[name] < value:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{name} did not reach {value}")
            time.sleep(0.05)

    def stop(self, kill=False):
        if kill:
            self.proc.kill()
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def make_prompt(server, n_tokens, tail, offset=0):
    """A text of at most n_tokens tokens (as the server counts them) ending with `tail`, and its count; texts
    of different offsets differ from their first word on (no KV block in common)."""
    words = [WORDS[(i * 7 + i // len(WORDS) + offset) % len(WORDS)] for i in range(n_tokens)]
    while words:
        text = " ".join(words) + " " + tail
        count = server.request("POST", "/tokenize", {"prompt": text})[1]["count"]
        if count <= n_tokens:
            return text, count
        del words[-max(1, count - n_tokens):]
    raise ValueError(f"the tail '{tail}' alone is over {n_tokens} tokens")


def send_all(server, bodies, wait=True):
    """Sends every body at once (one thread and connection each); their (status, payload, headers)."""
    results = [None] * len(bodies)
    gate = threading.Barrier(len(bodies))

    def one(i):
        gate.wait()
        try:
            results[i] = server.request("POST", "/v1/completions", bodies[i])
        except OSError as e:
            results[i] = (0, str(e), {})

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads if wait else []:
        t.join()
    return results


def burst(a, bound):
    """One burst against a fresh server with --max-queued-tokens `bound`; a row of the table."""
    s = Server(a, bound, a.parallel)
    try:
        for round in range(2):  # the second round takes the blocks the first left free
            warm = [make_prompt(s, a.prompt_tokens, "Warm-up.", offset=1 + i + round * a.parallel)[0]
                    for i in range(a.parallel)]
            for r in send_all(s, [{"prompt": w, "max_tokens": a.max_tokens} for w in warm]):
                assert r[0] == 200, r
        # One text with a distinct tail each: prefills are short, the queue holds whole prompts.
        text, n_prompt = make_prompt(s, a.prompt_tokens, "Request 0000.")
        bodies = [{"prompt": text.replace("Request 0000.", f"Request {i:04d}."), "max_tokens": a.max_tokens,
                   "ignore_eos": True} for i in range(a.burst)]
        time.sleep(0.5)
        pid = s.proc.pid
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        idle = status_kib(pid, "VmRSS")
        peak, done = [idle], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], status_kib(pid, "VmRSS"))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.time()
        results = send_all(s, bodies)
        seconds = time.time() - t0
        done.set()
        sampler.join()
        peak_kib = max(peak[0], status_kib(pid, "VmHWM"))
        problems = []
        for r in results:
            if r[0] == 200:
                u = r[1]["usage"]
                if u["completion_tokens"] != a.max_tokens or u["prompt_tokens"] != n_prompt:
                    problems.append(f"an answer with usage {u}")
            elif r[0] == 503:
                err = r[1].get("error", {}) if isinstance(r[1], dict) else {}
                if err.get("code") != "server_busy" or int(r[2].get("retry-after", "0")) < 1:
                    problems.append(f"a 503 without Retry-After or code server_busy: {r[2]} {r[1]}")
            else:
                problems.append(f"status {r[0]}: {r[1]}")
        answered = sum(r[0] == 200 for r in results)
        refused = sum(r[0] == 503 for r in results)
        deadline = time.time() + 60
        while True:
            m = s.metrics()
            if m["kiln:num_requests_running"] == 0 and m["kiln:num_requests_waiting"] == 0:
                break
            if time.time() > deadline:
                problems.append(f"still busy after the burst: {m}")
                break
            time.sleep(0.1)
        if m["kiln:num_requests_rejected_total"] != refused:
            problems.append(f"num_requests_rejected_total {m['kiln:num_requests_rejected_total']:.0f}, "
                            f"{refused} refusals seen")
        charge = n_prompt + CHOICE_TOKENS
        if bound and answered < bound // charge:
            problems.append(f"{answered} answered: the bound alone admits {bound // charge}")
        return {"bound": bound, "prompt_tokens": n_prompt, "answered": answered, "refused": refused,
                "idle_mib": idle / 1024, "peak_mib": peak_kib / 1024, "seconds": seconds,
                "problems": problems}
    finally:
        s.stop()


def held(a, name, body, n_tokens, count):
    """Bytes one queued request of this shape holds (the RSS slope over `count` more), and its charge."""
    s = Server(a, 0, 1)
    try:
        holder = {"prompt": "Once upon a time", "max_tokens": a.ctx - 16, "ignore_eos": True}
        send_all(s, [holder], wait=False)
        s.wait_for("kiln:num_requests_running", 1)
        pid, rss = s.proc.pid, []
        for k in (1, 2):
            send_all(s, [dict(body, prompt=f"{i} {body['prompt']}") for i in range(count)], wait=False)
            s.wait_for("kiln:num_requests_waiting", k * count)
            time.sleep(0.5)
            rss.append(status_kib(pid, "VmRSS"))
        if s.metrics()["kiln:num_requests_running"] != 1:
            raise RuntimeError("the holder finished before the measurement: raise -c")
        extra = len(body.get("logit_bias", {})) * 8 + sum(map(len, body.get("stop", [])))
        charge = (n_tokens + CHOICE_TOKENS + -(-3 * extra // TOKEN_BYTES)) * TOKEN_BYTES
        return {"shape": name, "held": (rss[1] - rss[0]) * 1024 / count, "charge": charge}
    finally:
        s.stop(kill=True)  # the queued requests need not finish


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", type=Path, default=KILN)
    ap.add_argument("--model", type=Path, default=MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--burst", type=int, default=600)
    ap.add_argument("--max-queued-tokens", type=int, default=16384)
    ap.add_argument("--held-count", type=int, default=200, help="queued requests a measurement adds (x5 for "
                    "the one-word prompt, /4 for the whole-vocabulary logit_bias)")
    ap.add_argument("--held-only", action="store_true")
    ap.add_argument("--no-held", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if not a.kiln.exists():
        sys.exit(f"missing {a.kiln}: build the kiln target, or give --kiln / KILN_BIN")
    rows, shapes, problems = [], [], []
    if not a.held_only:
        rows = [burst(a, bound) for bound in (a.max_queued_tokens, 0)]
        problems += [p for r in rows for p in r["problems"]]
        n = rows[0]["prompt_tokens"]
        print(f"\n{a.model.name} on the CPU, {a.threads} threads, --parallel {a.parallel} -c {a.ctx}; one burst "
              f"of {a.burst} completions of {n} prompt tokens ({a.burst * n:,} in all) and {a.max_tokens} out\n")
        print("| --max-queued-tokens | bound | answered | refused (503) | idle RSS | peak RSS | peak above idle "
              "| duration |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            flag = f"{r['bound']:,}" if r["bound"] else "0 (none)"
            bound = f"{r['bound'] * TOKEN_BYTES / 2**20:.1f} MiB" if r["bound"] else "none"
            print(f"| {flag} | {bound} | {r['answered']} | {r['refused']} | {r['idle_mib']:.0f} MiB | "
                  f"{r['peak_mib']:.0f} MiB | {r['peak_mib'] - r['idle_mib']:.1f} MiB | {r['seconds']:.0f} s |")
    if not a.no_held:
        s = Server(a, 0, 1)
        try:
            text, n = make_prompt(s, a.prompt_tokens - 8, "Go on.")
            one = s.request("POST", "/tokenize", {"prompt": "0 hi"})[1]["count"]
            # The vocabulary's size, from the message that refuses a token id outside it.
            err = s.request("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {str(2**30): 1}})[1]
            n_vocab = int(re.search(r"\[0, (\d+)\)", err["error"]["message"]).group(1))
        finally:
            s.stop()
        c = a.held_count
        shapes = [held(a, "one-word prompt", {"prompt": "hi", "max_tokens": 1}, one, 5 * c),
                  held(a, f"{n}-token prompt", {"prompt": text, "max_tokens": 1}, n + 1, c),
                  held(a, f"{n}-token prompt, echo and logprobs", {"prompt": text, "max_tokens": 1, "echo": True,
                                                                  "logprobs": 1}, n + 1, c),
                  held(a, f"logit_bias over all {n_vocab:,} tokens",
                       {"prompt": "hi", "max_tokens": 1, "logit_bias": {str(i): 1 for i in range(n_vocab)}}, one,
                       max(1, c // 4))]
        print(f"\nHeld by one queued request (RSS slope over {c} more queued, --parallel 1) and its charge "
              f"against --max-queued-tokens\n")
        print("| queued request | held | charged | held / charged |")
        print("|---|---:|---:|---:|")
        for r in shapes:
            print(f"| {r['shape']} | {r['held'] / 1024:.1f} KiB | {r['charge'] / 1024:.1f} KiB | "
                  f"{r['held'] / r['charge']:.2f} |")
            if r["held"] > r["charge"]:
                problems.append(f"{r['shape']}: holds {r['held']:.0f} bytes, charged {r['charge']}")
    for p in problems:
        print("FAIL:", p)
    if a.json:
        a.json.write_text(json.dumps({"bursts": rows, "held": shapes}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
