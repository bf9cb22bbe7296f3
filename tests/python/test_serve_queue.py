"""`kiln serve`'s queue: a burst larger than the slots is queued and answered, not shed; the bound on queued
prompt tokens sheds only the excess, with 503 and Retry-After, counted in /metrics; `--queue-timeout` ends a
request that waited too long with a 503 of its own; a client that hangs up while queued leaves the queue.
"""
import concurrent.futures as cf
import json
import socket
import threading
import time

from test_serve import NAME, SLOW, Server, wait_idle


def long_request(server, max_tokens):
    """A request that holds the server's one slot for a while; returns its thread."""
    t = threading.Thread(target=server.request, args=("POST", "/v1/completions", {
        "model": NAME, "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True}))
    t.start()
    deadline = time.time() + 30 * SLOW
    while server.metrics()["kiln:num_requests_running"] < 1:
        assert time.time() < deadline
        time.sleep(0.02)
    return t


def test_a_burst_of_ten_times_the_slots_is_answered():
    s = Server("--parallel", 2)  # the default limits
    try:
        client = s.client()  # the unchanged openai client, retries off: a 503 would fail the test

        def one(i):
            r = client.completions.create(model=NAME, prompt=f"Item {i}: the", max_tokens=4)
            return r.choices[0].finish_reason

        with cf.ThreadPoolExecutor(max_workers=20) as ex:
            reasons = list(ex.map(one, range(20)))
        assert len(reasons) == 20 and all(r in ("stop", "length") for r in reasons)
        assert wait_idle(s)["kiln:num_requests_rejected_total"] == 0
    finally:
        s.stop()


def test_the_token_bound_sheds_only_the_excess_and_disconnects_leave_the_queue():
    # A queued request is charged its prompt tokens and 256 more (what it holds besides them, server/api.h):
    # two 200-token prompts (456 each) and a one-token one (257) fit 1,250; a third long one does not.
    s = Server("--parallel", 1, "--max-queued-tokens", 1250, "-c", 4096)
    try:
        # The slot's holder asks for 4,000 tokens, far more than the checks below take on a loaded machine (a
        # shorter one ended first there and drained the queue), and hangs up (which ends it) once they are done.
        holder = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        body = json.dumps({"model": NAME, "prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                           "stream": True})
        holder.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        deadline = time.time() + 30 * SLOW
        while s.metrics()["kiln:num_requests_running"] < 1:
            assert time.time() < deadline
            time.sleep(0.02)
        prompt = " ".join(["word"] * 200)  # 200 tokens
        statuses = [None] * 3

        def send(i):
            statuses[i] = s.request("POST", "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 2})

        threads = []
        for i in range(2):
            threads.append(threading.Thread(target=send, args=(i,)))
            threads[-1].start()
        deadline = time.time() + 30 * SLOW
        while s.metrics()["kiln:num_requests_waiting"] < 2:
            assert time.time() < deadline
            time.sleep(0.02)
        status, body, headers = s.request("POST", "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 2})
        assert status == 503 and body["error"]["code"] == "server_busy", body
        assert "max-queued-tokens" in body["error"]["message"] and int(headers["Retry-After"]) >= 1
        assert s.metrics()["kiln:num_requests_rejected_total"] == 1
        # A queued client that hangs up leaves the queue while the slot is still held.
        data = json.dumps({"model": NAME, "prompt": "hello", "max_tokens": 2})
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n{data}").encode())
        deadline = time.time() + 30 * SLOW  # each wait its own: on a loaded machine the phases add up
        while s.metrics()["kiln:num_requests_waiting"] < 3:
            assert time.time() < deadline
            time.sleep(0.02)
        # Another one-token request does not fit: by its prompt tokens alone it would.
        status, body, _ = s.request("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2})
        assert status == 503 and body["error"]["code"] == "server_busy", body
        assert s.metrics()["kiln:num_requests_rejected_total"] == 2
        sock.close()
        deadline = time.time() + 30 * SLOW
        while s.metrics()["kiln:num_requests_waiting"] > 2:
            assert time.time() < deadline, "the hung-up request stayed queued"
            time.sleep(0.02)
        assert s.metrics()["kiln:num_requests_running"] == 1
        holder.close()
        for t in threads:
            t.join()
        assert [st[0] for st in statuses[:2]] == [200, 200]
        wait_idle(s)
    finally:
        s.stop()


def test_queue_timeout_ends_a_request_that_waited_too_long():
    s = Server("--parallel", 1, "--queue-timeout", 0.5)
    try:
        holder = long_request(s, 400)
        t0 = time.time()
        status, body, headers = s.request("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2})
        waited = time.time() - t0
        assert status == 503 and body["error"]["code"] == "queue_timeout", body
        assert "for admission" in body["error"]["message"] and "Retry-After" in headers
        assert 0.4 < waited < 30 * SLOW
        holder.join()
        m = wait_idle(s)
        assert m["kiln:num_requests_queue_timeout_total"] == 1
    finally:
        s.stop()


def test_priority_admits_lower_values_first_and_preempts_what_it_outranks():
    s = Server("--parallel", 1)
    try:
        done = {}

        def send(name, priority, max_tokens):
            body = {"model": NAME, "prompt": f"{name}: once upon a time", "max_tokens": max_tokens,
                    "ignore_eos": True, "priority": priority}
            status, reply, _ = s.request("POST", "/v1/completions", body)
            assert status == 200, reply
            done[name] = time.monotonic()

        threads = [threading.Thread(target=send, args=("held", 0, 300))]
        threads[0].start()
        deadline = time.time() + 30 * SLOW
        while s.metrics()["kiln:num_requests_running"] < 1:
            assert time.time() < deadline
            time.sleep(0.02)
        for i, (name, priority) in enumerate([("late", 3), ("equal", 0)]):
            threads.append(threading.Thread(target=send, args=(name, priority, 8)))
            threads[-1].start()
            while s.metrics()["kiln:num_requests_waiting"] < i + 1:
                assert time.time() < deadline
                time.sleep(0.02)
        # Outranks the running request: it is preempted (and later resumed), not waited for.
        threads.append(threading.Thread(target=send, args=("urgent", -1, 8)))
        threads[-1].start()
        for t in threads:
            t.join()
        assert sorted(done, key=done.get) == ["urgent", "held", "equal", "late"]
        status, body, _ = s.request("POST", "/v1/completions", {"model": NAME, "prompt": "x", "priority": "high"})
        assert status == 400 and body["error"]["param"] == "priority", body
    finally:
        s.stop()
