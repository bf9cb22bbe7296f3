"""The chat page of `kiln serve`, driven in headless Chromium (Debian's package) over the DevTools protocol: a
message typed and sent shows the streamed reply in the page (the same text the API gives), the Stop button
cancels a reply on the server, and a screenshot is kept (build/test-artifacts/chat_page.png).
"""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import websocket

from test_serve import KILN, NAME, Server, wait_idle

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="kiln-chromium-")
        self.proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                                      "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                                      "--window-size=1000,700", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.time() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.time() < deadline, "chromium did not start"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def close(self):
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def page():
    if CHROMIUM is None:
        pytest.fail("chromium is missing: scripts/install-deps.sh installs it")
    server = Server("--parallel", 2, "-c", 2048)
    browser = Browser()
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"http://127.0.0.1:{server.port}/")
    deadline = time.time() + 30
    while browser.eval("document.readyState") != "complete" or not browser.eval(
            "document.getElementById('model').textContent"):
        assert time.time() < deadline
        time.sleep(0.1)
    yield server, browser
    browser.close()
    server.stop()


def send(browser, text, max_tokens):
    browser.eval(f"document.getElementById('temperature').value = '0';"
                 f"document.getElementById('max_tokens').value = '{max_tokens}';"
                 f"document.getElementById('input').value = {json.dumps(text)};"
                 f"document.getElementById('form').requestSubmit(); true")


def test_a_message_streams_its_reply_into_the_page(page):
    server, browser = page
    assert browser.eval("document.getElementById('model').textContent") == NAME
    send(browser, "Name three fruits.", 48)  # long enough to be seen growing, polled every 10 ms
    lengths = []
    deadline = time.time() + 300
    while True:  # the reply grows in the page while the Stop button is enabled
        reply = browser.eval("(document.querySelector('.msg.assistant') || {}).textContent || ''")
        lengths.append(len(reply))
        if browser.eval("document.getElementById('stop').disabled") and reply:
            break
        assert time.time() < deadline
        time.sleep(0.01)
    status, api, _ = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Name three fruits."}], "max_tokens": 48, "temperature": 0})
    assert status == 200 and reply == api["choices"][0]["message"]["content"]
    assert len(set(lengths)) > 2, f"the reply did not grow in steps: {lengths}"  # it streamed
    shot = browser.call("Page.captureScreenshot", format="png")["data"]
    out = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "test-artifacts"
    out.mkdir(parents=True, exist_ok=True)
    (out / "chat_page.png").write_bytes(base64.b64decode(shot))
    assert (out / "chat_page.png").stat().st_size > 10000


def test_stop_cancels_the_reply_on_the_server(page):
    server, browser = page
    before = server.metrics()['kiln:request_success_total{finished_reason="abort"}']
    browser.eval("document.getElementById('new').click(); true")
    send(browser, "Tell me a very long story.", 500)
    deadline = time.time() + 120
    while not browser.eval("(document.querySelector('.msg.assistant') || {}).textContent || ''"):
        assert time.time() < deadline
        time.sleep(0.05)
    browser.eval("document.getElementById('stop').click(); true")
    wait_idle(server, before_abort=before, timeout=120)
    assert browser.eval("document.getElementById('stop').disabled")
