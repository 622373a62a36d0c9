"""Headless Chromium for the package's browser tests and its demo: a static
server for js/, chromedriver, and a minimal W3C WebDriver client (Python's
standard library only: nothing to install beyond Chromium itself)."""

import contextlib
import functools
import http.server
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

JS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# WebGPU needs only --enable-unsafe-webgpu (SwiftShader without a GPU); the
# rest keep Chromium off the network and out of the sandbox as root.
CHROMIUM_ARGS = [
    "--headless=new",
    "--enable-unsafe-webgpu",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript",
                      ".mjs": "text/javascript"}

    def log_message(self, *args):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        self.session = None

    def call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"{}").get("value")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"WebDriver {method} {path}: {e.read().decode()[:2000]}") from None

    def s(self, method, path, body=None, timeout=60):
        return self.call(method, f"/session/{self.session}{path}", body, timeout)

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def click(self, css):
        el = self.s("POST", "/element", {"using": "css selector", "value": css})
        self.s("POST", f"/element/{el[ELEMENT]}/click", {})

    def ready(self):
        try:
            return self.call("GET", "/status", timeout=2)["ready"]
        except Exception:
            return False


def wait_for(what, predicate, timeout, interval=0.5):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def browser(window="1200,1000"):
    """Yields (webdriver, base URL of js/) with Chromium started; stops all on exit."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=JS_DIR))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    port = free_port()
    driver_proc = subprocess.Popen([CHROMEDRIVER, f"--port={port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wd = WebDriver(port)
    try:
        wait_for("chromedriver", wd.ready, 30)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM,
                                   "args": CHROMIUM_ARGS + [f"--window-size={window}"]},
        }}}
        wd.session = wd.call("POST", "/session", caps, timeout=120)["sessionId"]
        yield wd, url
    finally:
        if wd.session:
            with contextlib.suppress(Exception):
                wd.s("DELETE", "", timeout=10)
        driver_proc.terminate()
        driver_proc.wait(timeout=10)
        server.shutdown()
