#!/usr/bin/env python3
"""Browser test of the training demo page (examples/train/web/).

Serves the built page on localhost, drives Debian's headless Chromium through
chromedriver (W3C WebDriver, Python standard library only), clicks Start with
gradient clipping on, and checks that:
  - the page found a WebGPU adapter and reports it,
  - the loss falls: the mean of the last 20 steps is below 0.6 x the first 20,
    and every loss and gradient norm is finite,
  - both charts have drawn (line segments counted by the page, and pixels of
    the line colour read back from each canvas),
  - the page stays responsive while training (event-loop stalls and WebDriver
    round trips stay short),
  - a screenshot is produced (a PNG of the window's size).

Usage: examples/train/web/build.sh && python3 examples/train/web/e2e_test.py
       [--steps 150] [--screenshot docs/train-web.png] [--timeout 300]
"""

import argparse
import base64
import functools
import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# WebGPU needs only --enable-unsafe-webgpu (it runs on SwiftShader without a
# GPU); the rest keep Chromium off the network and out of the sandbox as root.
CHROMIUM_ARGS = [
    "--headless=new",
    "--enable-unsafe-webgpu",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1100,1000",
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript"}

    def log_message(self, *args):
        pass


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

    def start(self):
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": CHROMIUM_ARGS},
        }}}
        self.session = self.call("POST", "/session", caps, timeout=120)["sessionId"]

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def click(self, css):
        el = self.s("POST", "/element", {"using": "css selector", "value": css})
        self.s("POST", f"/element/{el[ELEMENT]}/click", {})


def wait_for(what, predicate, timeout, interval=0.5):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "screenshot is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# Counts pixels of the clipping-on line colour in a canvas.
COUNT_LINE_PIXELS = """
const c = document.getElementById(arguments[0]);
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 0; i < d.length; i += 4) {
  if (Math.abs(d[i] - 31) < 40 && Math.abs(d[i + 1] - 119) < 40 && Math.abs(d[i + 2] - 180) < 40) n++;
}
return n;
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--compare", type=int, default=0, metavar="STEPS",
                    help="first train this many steps with clipping off, then Reset "
                         "(the charts keep that run, faded)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--screenshot", default=os.path.join(HERE, "..", "..", "..", "target", "train-web.png"))
    args = ap.parse_args()
    if not os.path.exists(os.path.join(HERE, "pkg", "train_web.js")):
        sys.exit("examples/train/web/pkg/ is missing: run examples/train/web/build.sh first")

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=HERE))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    port = free_port()
    driver_proc = subprocess.Popen([CHROMEDRIVER, f"--port={port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wd = WebDriver(port)
    try:
        wait_for("chromedriver", lambda: _ready(wd), 30)
        wd.start()
        wd.s("POST", "/url", {"url": url})
        wait_for("the page to load the model (or fail)",
                 lambda: wd.js("return window.demoState && (window.demoState.ready || window.demoState.error)"), 120)
        st = wd.js("return window.demoState")
        assert not st["error"], f"page error: {st['error']}"
        adapter = st["adapter"]
        print(f"adapter: {adapter}")
        assert adapter.strip(), "no adapter shown"
        assert wd.js("return document.getElementById('clip').checked"), "clipping should start on"
        max_norm = wd.js("return parseFloat(document.getElementById('maxnorm-value').textContent)")

        worst_round_trip = 0.0

        def train(steps):
            """Clicks Start, waits for `steps` steps of the current run, clicks Stop."""
            nonlocal worst_round_trip

            def progress():
                nonlocal worst_round_trip
                t = time.monotonic()
                s = wd.js("return {n: window.demoState.current.steps.length, error: window.demoState.error}")
                worst_round_trip = max(worst_round_trip, time.monotonic() - t)
                assert not s["error"], f"page error: {s['error']}"
                return s["n"] >= steps

            t0 = time.monotonic()
            wd.click("#start")
            wait_for(f"{steps} steps", progress, args.timeout)
            wd.click("#start")  # Stop
            wait_for("the loop to stop", lambda: not wd.js("return window.demoState.running"), 30)
            return time.monotonic() - t0

        if args.compare:
            wd.click("#clip")
            train(args.compare)
            off = wd.js("return window.demoState.current")
            finite = [x for x in off["losses"] if isinstance(x, (int, float))]
            print(f"clipping off: {len(off['losses'])} steps, {len(finite)} with a finite loss, "
                  f"max grad norm {max((g for g in off['norms'] if isinstance(g, (int, float))), default=0):.3g}")
            wd.click("#reset")
            wait_for("the reset", lambda: wd.js("return window.demoState.current.steps.length === 0"), 30)
            wd.click("#clip")
            assert wd.js("return document.getElementById('clip').checked")

        elapsed = train(args.steps)
        time.sleep(0.3)  # let the last frame draw
        st = wd.js("return window.demoState")
        run = st["current"]
        losses, norms, n = run["losses"], run["norms"], len(run["losses"])
        print(f"steps: {n} in {elapsed:.1f} s ({n / elapsed:.1f} steps/s), max norm {max_norm}")
        assert all(isinstance(x, (int, float)) for x in losses + norms), "non-finite loss or norm"
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        print(f"loss: first 20 steps {first:.4f}, last 20 steps {last:.4f}; "
              f"grad norm: max {max(norms):.3f}, clipped steps {sum(1 for g in norms if g > max_norm)}")
        assert run["steps"] == list(range(1, n + 1)), "steps are not 1..n"
        assert last < 0.6 * first, f"the loss did not fall: {first:.4f} -> {last:.4f}"
        drawn = st["drawn"]
        pixels = {c: wd.js(COUNT_LINE_PIXELS, c) for c in ("loss-chart", "norm-chart")}
        print(f"drawn segments {drawn}, line pixels {pixels}")
        assert drawn["loss"] >= n - 2 and drawn["norm"] >= n - 2, f"charts drew {drawn} of {n - 1} segments"
        assert min(pixels.values()) > 500, f"too few line pixels in the charts: {pixels}"
        print(f"responsiveness: longest event-loop stall {st['maxLagMs']:.0f} ms, "
              f"slowest WebDriver round trip {worst_round_trip * 1e3:.0f} ms")
        assert st["maxLagMs"] < 1000, f"the page stalled for {st['maxLagMs']:.0f} ms"
        assert worst_round_trip < 5, f"a WebDriver call took {worst_round_trip:.1f} s"

        png = base64.b64decode(wd.s("GET", "/screenshot"))
        width, height = png_size(png)
        assert width >= 800 and height >= 600 and len(png) > 20_000, (width, height, len(png))
        os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
        with open(args.screenshot, "wb") as f:
            f.write(png)
        print(f"screenshot: {args.screenshot} ({width}x{height}, {len(png)} bytes)")
        print("demo browser test passed")
    finally:
        if wd.session:
            try:
                wd.s("DELETE", "", timeout=10)
            except Exception:
                pass
        driver_proc.terminate()
        driver_proc.wait(timeout=10)
        server.shutdown()


def _ready(wd):
    try:
        return wd.call("GET", "/status", timeout=2)["ready"]
    except Exception:
        return False


if __name__ == "__main__":
    main()
