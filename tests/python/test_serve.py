"""`kiln serve` as its users reach it: the unchanged `openai` client, raw HTTP, and a client that hangs up.

- chat and text completions, streamed or not, give the same greedy text; usage is in every answer (with the
  prefix-cache hit in prompt_tokens_details.cached_tokens) and in the last chunk of a stream that asks for it;
- stop strings, echo (with prompt logprobs), logprobs and n choices work as OpenAI documents them;
- every bad request gets a 4xx in OpenAI's error shape naming the field, and the server stays healthy;
- a client that disconnects mid-stream cancels its request: its KV blocks are freed and it counts as abort;
- a full queue answers 503 with Retry-After; SIGTERM lets the request in flight finish and exits 0.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"
KEY = "test-key-0123456789"
NAME = "SmolLM2-135M-Instruct.Q4_1"
# Time limits are multiplied by this: a sanitizer build computes several times slower (the asan preset sets it).
SLOW = float(os.environ.get("KILN_TEST_SLOW") or 1)


class Server:
    def __init__(self, *extra, model=SMOL):
        assert KILN.exists(), f"build kiln first ({KILN})"
        assert model.exists(), f"missing test model {model}"
        args = [*map(str, extra)]
        if "-c" not in args:
            args += ["-c", "512"]
        self.proc = subprocess.Popen([str(KILN), "serve", "-m", str(model), "--port", "0", "-t", "2", *args],
                                     stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        deadline = time.time() + 60 * SLOW
        while self.port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            assert line, f"kiln serve exited: {''.join(self.lines)}"
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("kiln serve did not become healthy")

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def request(self, method, path, body=None, headers=None, key=KEY):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120 * SLOW)
        h = {"Content-Type": "application/json"} if body is not None else {}
        if key:
            h["Authorization"] = f"Bearer {key}"
        h.update(headers or {})
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        return r.status, payload, dict(r.getheaders())

    def metrics(self) -> dict:
        status, text, _ = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            name = re.sub(r'model_name="[^"]*",?', "", name).replace("{}", "")
            out[name] = float(value)
        return out

    def client(self):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, max_retries=0,
                             timeout=120 * SLOW)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60 * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.drain.join(timeout=10)
        # A sanitizer build reports here (a leak only at exit): any report fails the test that owned the server.
        log = "".join(self.lines)
        assert "Sanitizer" not in log and "runtime error:" not in log, log


@pytest.fixture(scope="module")
def server():
    s = Server("--parallel", 2, "--max-queue", 2, "--api-key", KEY, "--max-body", "64K")
    yield s
    s.stop()


def wait_idle(server, before_abort=None, timeout=30):
    """Until no request runs or waits and no KV block is held; the metrics then."""
    deadline = time.time() + timeout * SLOW
    while True:
        m = server.metrics()
        idle = m["kiln:num_requests_running"] == 0 and m["kiln:num_requests_waiting"] == 0 and \
            m["kiln:kv_cache_usage_perc"] == 0
        if idle and (before_abort is None or m['kiln:request_success_total{finished_reason="abort"}'] > before_abort):
            return m
        assert time.time() < deadline, f"still busy: {m}"
        time.sleep(0.1)


def open_stream(server, max_tokens=400):
    """A raw streaming completion; returns the socket once its first event has arrived."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    body = json.dumps({"prompt": "Count from one to one hundred:", "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True})
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got
    return s


def test_health_models_and_keys(server):
    assert server.request("GET", "/health", key=None)[:2] == (200, {"status": "ok"})
    status, body, _ = server.request("GET", "/v1/models")
    assert status == 200 and body["data"][0]["id"] == NAME and body["data"][0]["max_model_len"] == 512
    for key, why in ((None, "no API key"), ("wrong-key-0123456789", "not valid"), ("x", "not valid")):
        status, body, headers = server.request("GET", "/v1/models", key=key)
        assert status == 401 and why in body["error"]["message"], body
        assert body["error"]["type"] == "authentication_error" and headers.get("WWW-Authenticate") == "Bearer"
    status, page, headers = server.request("GET", "/", key=None)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "<title>kiln</title>" in page and "/v1/chat/completions" in page


def test_chat_stream_and_not_agree(server):
    client = server.client()
    messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant" and text
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens > 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == whole.usage.completion_tokens
    # The same prompt again: its blocks come from the prefix cache.
    assert usage.prompt_tokens_details.cached_tokens > 0
    # Content as a list of text parts is the same message.
    parts = [{"role": "system", "content": [{"type": "text", "text": "You are brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]}]
    again = client.chat.completions.create(model=NAME, messages=parts, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == text


def test_completions_stop_echo_logprobs_n(server):
    client = server.client()
    prompt = "The capital of France is"
    base = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    text = base.choices[0].text
    lp = base.choices[0].logprobs
    assert len(lp.tokens) == base.usage.completion_tokens == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == text
    echo = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert echo.choices[0].text == prompt + text
    words = [w for w in re.findall(r"\w+", text)]
    if words:
        stop = words[-1]
        cut = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0, stop=[stop])
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == text[:text.index(stop)]
    many = client.completions.create(model=NAME, prompt=[prompt, "Two plus two is"], max_tokens=3, n=2,
                                     temperature=0.8, seed=7)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]
    assert many.usage.completion_tokens <= 12
    counts = [server.request("POST", "/tokenize", {"prompt": p})[1]["count"] for p in (prompt, "Two plus two is")]
    assert many.usage.prompt_tokens == sum(counts)  # each prompt once, however many choices it has
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(c.top_logprobs) == 3 for c in content)


def test_echo_with_logprobs_scores_the_prompt(server):
    """echo + logprobs, as OpenAI's legacy completions give it: the prompt's tokens lead the logprobs (the first
    unscored), then the completion's; max_tokens 0 scores the prompt alone (what evaluation harnesses send).
    A prompt that ends with a greedy continuation scores it as generation did."""
    client = server.client()
    prompt = "The capital of France is"
    gen = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    glp = gen.choices[0].logprobs
    both = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                                     echo=True)
    lp = both.choices[0].logprobs
    n_prompt = both.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 4 == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and all(len(t) == 2 for t in lp.top_logprobs[1:])
    assert "".join(lp.tokens) == both.choices[0].text == prompt + gen.choices[0].text
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(len(lp.tokens))]
    assert lp.tokens[n_prompt:] == glp.tokens
    assert lp.token_logprobs[n_prompt:] == pytest.approx(glp.token_logprobs, abs=2e-3)
    # Scoring alone: the prompt plus that continuation as token ids (text would retokenize "\n", "\n" as one
    # token), nothing generated.
    def ids(text, special):
        return server.request("POST", "/tokenize", {"prompt": text, "add_special_tokens": special})[1]["tokens"]
    pieces = [ids(t, False) for t in glp.tokens]
    assert all(len(p) == 1 for p in pieces), pieces
    whole = ids(prompt, True) + [p[0] for p in pieces]
    scored = client.completions.create(model=NAME, prompt=whole, max_tokens=0, temperature=0, logprobs=1,
                                       echo=True)
    slp = scored.choices[0].logprobs
    assert scored.usage.completion_tokens == 0 and scored.choices[0].text == prompt + gen.choices[0].text
    assert scored.choices[0].finish_reason == "length"
    k = len(slp.tokens) - 4
    assert slp.tokens[k:] == glp.tokens
    assert slp.token_logprobs[k:] == pytest.approx(glp.token_logprobs, abs=2e-3)
    # Streamed: the echo chunk carries the scored prompt, then the tokens follow.
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                                            echo=True, stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert tokens == lp.tokens and values[0] is None
    assert values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-6)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == both.choices[0].text
    # A one-token prompt: nothing to score, the token still leads the logprobs and the echoed text.
    for stream in (False, True):
        one = client.completions.create(model=NAME, prompt=[whole[-1]], max_tokens=0, logprobs=1, echo=True,
                                        stream=stream)
        parts = list(one) if stream else [one]
        lps = [p.choices[0].logprobs for p in parts if p.choices and p.choices[0].logprobs]
        assert [t for lp in lps for t in lp.tokens] == [glp.tokens[-1]], lps
        assert [v for lp in lps for v in lp.token_logprobs] == [None]
        assert "".join(p.choices[0].text for p in parts if p.choices) == glp.tokens[-1]
    # max_tokens 0 without echo asks for nothing: a 400 naming the field.
    status, body, _ = server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens", body


def test_stop_token_ids_and_min_tokens(server):
    client = server.client()
    prompt = "One, two, three, four,"
    base = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=0)
    pieces = base.choices[0].logprobs.tokens

    def token_id(piece):
        ids = server.request("POST", "/tokenize", {"prompt": piece, "add_special_tokens": False})[1]["tokens"]
        return ids[0] if len(ids) == 1 else None

    ids = [token_id(p) for p in pieces]
    k = next((i for i in range(1, len(ids)) if ids[i] is not None and ids[i] not in ids[:i]), None)
    assert k is not None, pieces
    cut = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"stop_token_ids": [ids[k]]})
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == "".join(pieces[:k])
    assert cut.usage.completion_tokens == k + 1  # the stop token is generated, not shown
    assert ids[0] is not None
    held = client.completions.create(model=NAME, prompt=prompt, max_tokens=3, temperature=0, logprobs=0,
                                     extra_body={"stop_token_ids": [ids[0]], "min_tokens": 3})
    assert held.choices[0].finish_reason == "length" and held.usage.completion_tokens == 3
    assert ids[0] not in [token_id(p) for p in held.choices[0].logprobs.tokens]


def test_tokenize_detokenize(server):
    status, body, _ = server.request("POST", "/tokenize", {"prompt": "Hello world"})
    assert status == 200 and body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 512
    status, back, _ = server.request("POST", "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and back["prompt"].endswith("Hello world")
    status, err, _ = server.request("POST", "/detokenize", {"tokens": [1, 10 ** 9]})
    assert status == 400 and err["error"]["param"] == "tokens" and "tokens[1]" in err["error"]["message"]


@pytest.mark.parametrize("body,param,needle", [
    (b"{not json", None, "not valid JSON"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature", "must be a number"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature", "out of range"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p", "out of range"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", "out of range"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 99}, "n", "out of range"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop", "must not be empty"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"x": 1}}, "logit_bias", "not a token id"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "system, user, assistant or tool"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "is required"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools", "no tool call syntax"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content",
     "not supported yet"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
     "response_format", "must be text, json_object or json_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
     "stream_options", "only allowed with"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param, needle):
    status, err, _ = server.request("POST", "/v1/chat/completions", body)
    assert status == 400, err
    assert err["error"]["type"] == "invalid_request_error" and needle in err["error"]["message"], err
    assert err["error"]["param"] == param


def test_other_errors_and_the_server_stays_up(server):
    msg = [{"role": "user", "content": "x"}]
    status, err, _ = server.request("POST", "/v1/chat/completions", {"messages": msg, "max_tokens": 100000})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert "512" in err["error"]["message"] and "100000" in err["error"]["message"]
    status, err, _ = server.request("POST", "/v1/completions", {"prompt": "hi " * 600})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    status, err, _ = server.request("POST", "/v1/chat/completions", {"model": "gpt-4", "messages": msg})
    assert status == 404 and err["error"]["code"] == "model_not_found" and "gpt-4" in err["error"]["message"]
    assert server.request("GET", "/v2/nothing")[0] == 404
    status, err, headers = server.request("GET", "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST"
    status, err, _ = server.request("POST", "/v1/chat/completions", "x", headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in err["error"]["message"]
    status, err, _ = server.request("POST", "/v1/chat/completions", {"messages": msg, "pad": "x" * 100000})
    assert status == 413 and "limit" in err["error"]["message"]
    assert server.request("GET", "/health", key=None)[0] == 200
    wait_idle(server)


def test_disconnect_mid_stream_cancels_and_frees_blocks(server):
    before = server.metrics()['kiln:request_success_total{finished_reason="abort"}']
    s = open_stream(server)
    assert server.metrics()["kiln:num_requests_running"] >= 1
    s.close()
    m = wait_idle(server, before_abort=before)
    assert m['kiln:request_success_total{finished_reason="abort"}'] == before + 1


def test_full_queue_is_503_with_retry_after(server):
    socks = [open_stream(server) for _ in range(2)]  # both running (--parallel 2)
    queued = []
    for _ in range(2):  # --max-queue 2: these wait
        s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        body = json.dumps({"prompt": "Hello", "max_tokens": 4})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        queued.append(s)
    deadline = time.time() + 30
    while server.metrics()["kiln:num_requests_waiting"] < 2:
        assert time.time() < deadline
        time.sleep(0.05)
    status, err, headers = server.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
    assert status == 503 and headers.get("Retry-After") == "1" and "--max-queue 2" in err["error"]["message"]
    for s in socks + queued:
        s.close()
    wait_idle(server)


def test_sigterm_finishes_the_request_in_flight_and_exits_0():
    s = Server()
    result = {}

    def ask():
        result["r"] = s.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12,
                                                            "temperature": 0, "ignore_eos": True})

    t = threading.Thread(target=ask)
    t.start()
    deadline = time.time() + 30
    while s.metrics()["kiln:num_requests_running"] < 1:
        assert time.time() < deadline
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=60)
    status, body, _ = result["r"]
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 12
    assert s.proc.wait(timeout=60 * SLOW) == 0, "".join(s.lines)
    assert "stopped" in "".join(s.lines)


def test_bench_serve_measures_the_server(server):
    def bench(*args):
        return subprocess.run([str(KILN), "bench", "serve", "--base-url", f"http://127.0.0.1:{server.port}",
                               "--api-key", KEY, "-o", "json", *map(str, args)], capture_output=True, text=True,
                              timeout=300)

    r = bench("--num-prompts", 3, "--random-input-len", 12, "--random-output-len", 4, "--max-concurrency", 2,
              "--goodput", "ttft:600000")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["completed"] == 3 and j["failed"] == 0 and j["model"] == NAME
    assert j["total_output_tokens"] == 12 and j["total_input_tokens"] >= 36
    assert 0 < j["mean_ttft_ms"] <= j["mean_e2el_ms"] and j["p99_itl_ms"] > 0
    assert j["request_goodput"] == pytest.approx(j["request_throughput"])
    r = bench("--num-prompts", 1, "--random-input-len", 8, "--random-output-len", 3, "--endpoint",
              "/v1/chat/completions")
    assert r.returncode == 0 and json.loads(r.stdout)["completed"] == 1, r.stdout + r.stderr
    r = bench("--goodput", "speed:3")
    assert r.returncode == 3 and "--goodput speed:3" in r.stderr
    wait_idle(server)
