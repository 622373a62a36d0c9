#!/usr/bin/env python3
"""Browser test of the training demo page (examples/train/web/).

Serves the built page on localhost, drives Debian's headless Chromium through
chromedriver (W3C WebDriver, Python standard library only), clicks Start with
the fixed clipping mode, and checks that:
  - the page found a WebGPU adapter and reports it,
  - the loss falls: the mean of the last 20 steps is below 0.6 x the first 20,
    and every loss and gradient norm is finite; every step reports the max
    norm as its threshold,
  - both charts have drawn (line segments counted by the page, and pixels of
    the line colour read back from each canvas),
  - the page stays responsive while training (event-loop stalls and WebDriver
    round trips stay short).
Then, after Reset, a run with AutoClip and one with ZClip (the adaptive
thresholds gradclip computes on the GPU), each checked for:
  - a finite, positive threshold reported every step (ZClip: after its
    warm-up, none during it),
  - the threshold applied: a step was clipped exactly when its norm was above
    the threshold, and then to the threshold,
  - the run's largest norm after the first steps (its worst spike) clipped,
  - the threshold line and the clipped steps drawn in the norm chart.
Last, a screenshot (a PNG of the window's size).

Usage: examples/train/web/build.sh && python3 examples/train/web/e2e_test.py
       [--compare 100] [--steps 150] [--autoclip-steps 60] [--zclip-steps 100]
       [--screenshot docs/train-web.png] [--timeout 300]
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


# Counts the pixels of a line colour [r, g, b] in a canvas.
COUNT_LINE_PIXELS = """
const c = document.getElementById(arguments[0]), [r, g, b] = arguments[1];
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 0; i < d.length; i += 4) {
  if (Math.abs(d[i] - r) < 40 && Math.abs(d[i + 1] - g) < 40 && Math.abs(d[i + 2] - b) < 40) n++;
}
return n;
"""
# The page's line colour of each mode (COLORS in app.js).
MODE_RGB = {"none": [214, 39, 40], "fixed": [31, 119, 180], "zclip": [44, 160, 44],
            "autoclip": [148, 103, 189]}
# A clipped step's norm times its coefficient is its threshold (PyTorch's
# max_norm / (norm + 1e-6) moves it by 1e-6 of the norm at most).
CLIP_TOLERANCE = 1e-4


def is_number(x):
    # WebDriver turns NaN and Infinity into null.
    return isinstance(x, (int, float))


def check_adaptive(name, run, warmup):
    """Checks a run of an adaptive mode: thresholds reported and applied, the
    worst spike clipped. `warmup`: steps that have no threshold."""
    norms, coefs, thresholds, bounds = (run[k] for k in ("norms", "coefficients", "thresholds", "boundaries"))
    n = len(norms)
    assert all(is_number(x) for x in run["losses"] + norms), f"{name}: a non-finite loss or norm"
    assert all(m == name for m in run["modes"]), f"{name}: steps in another mode: {set(run['modes'])}"
    for i in range(n):
        b = bounds[i]
        if i < warmup:
            assert b is None, f"{name}: step {i + 1} is in the warm-up but has the threshold {b}"
            continue
        assert is_number(b) and b > 0, f"{name}: step {i + 1} reports no finite threshold ({b})"
        t, g, c = thresholds[i], norms[i], coefs[i]
        # ZClip clips a spike below its boundary; the others clip to it.
        assert t is None or t <= b * (1 + 1e-6), f"{name}: step {i + 1}: threshold {t} above its boundary {b}"
        if c < 1:
            # A norm equal to the threshold (AutoClip's first step: the
            # percentile of its own norm) gets max_norm / (norm + 1e-6) < 1.
            assert is_number(t) and g >= t, f"{name}: step {i + 1} clipped ({c}) but its norm {g} < threshold {t}"
            assert abs(g * c - t) <= CLIP_TOLERANCE * t, \
                f"{name}: step {i + 1}: norm {g} x coefficient {c} = {g * c}, not its threshold {t}"
        else:
            assert c == 1, f"{name}: step {i + 1}: coefficient {c} above 1"
            assert t is None or g <= t, f"{name}: step {i + 1}: norm {g} above threshold {t} and not clipped"
    clipped = [i for i in range(n) if coefs[i] < 1]
    after = list(range(warmup, n))
    worst = max(after, key=lambda i: norms[i])
    print(f"{name}: {n} steps, {len(clipped)} clipped; threshold from step {warmup + 1}: "
          f"{min(bounds[i] for i in after):.3f} to {max(bounds[i] for i in after):.3f}; worst spike: "
          f"step {worst + 1}, norm {norms[worst]:.3f} clipped to {thresholds[worst]} (x{coefs[worst]:.3f})")
    assert worst in clipped, \
        f"{name}: the largest norm after step {warmup} (step {worst + 1}, {norms[worst]}) was not clipped"
    return len(clipped)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--compare", type=int, default=0, metavar="STEPS",
                    help="first train this many steps with clipping off, then Reset "
                         "(the charts keep that run, faded)")
    ap.add_argument("--autoclip-steps", type=int, default=60, metavar="STEPS",
                    help="then Reset and train this many steps with AutoClip (0: skip)")
    ap.add_argument("--zclip-steps", type=int, default=100, metavar="STEPS",
                    help="then Reset and train this many steps with ZClip (0: skip)")
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
        assert wd.js("return document.getElementById('mode').value") == "fixed", "clipping should start fixed"
        max_norm = wd.js("return parseFloat(document.getElementById('maxnorm-value').textContent)")
        slider = wd.js("return Math.pow(10, parseFloat(document.getElementById('maxnorm').value))")

        def select_mode(mode):
            wd.click(f"#mode option[value={mode}]")
            assert wd.js("return document.getElementById('mode').value") == mode, f"could not select {mode}"

        def reset():
            wd.click("#reset")
            wait_for("the reset", lambda: wd.js("return window.demoState.current.steps.length === 0"), 30)

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
            select_mode("none")
            train(args.compare)
            off = wd.js("return window.demoState.current")
            finite = [x for x in off["losses"] if isinstance(x, (int, float))]
            print(f"clipping off: {len(off['losses'])} steps, {len(finite)} with a finite loss, "
                  f"max grad norm {max((g for g in off['norms'] if isinstance(g, (int, float))), default=0):.3g}")
            reset()
            select_mode("fixed")

        elapsed = train(args.steps)
        time.sleep(0.3)  # let the last frame draw
        st = wd.js("return window.demoState")
        run = st["current"]
        losses, norms, n = run["losses"], run["norms"], len(run["losses"])
        print(f"steps: {n} in {elapsed:.1f} s ({n / elapsed:.1f} steps/s), max norm {max_norm}")
        assert all(isinstance(x, (int, float)) for x in losses + norms), "non-finite loss or norm"
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        print(f"loss: first 20 steps {first:.4f}, last 20 steps {last:.4f}; "
              f"grad norm: max {max(norms):.3f}, clipped steps {sum(1 for c in run['coefficients'] if c < 1)}")
        assert run["steps"] == list(range(1, n + 1)), "steps are not 1..n"
        assert all(abs(b - slider) <= 1e-6 * slider and t == b for b, t in zip(run["boundaries"], run["thresholds"])) and \
            all(m == "fixed" for m in run["modes"]), "the fixed run's threshold is not its max norm"
        assert last < 0.6 * first, f"the loss did not fall: {first:.4f} -> {last:.4f}"
        drawn = st["drawn"]
        pixels = {c: wd.js(COUNT_LINE_PIXELS, c, MODE_RGB["fixed"]) for c in ("loss-chart", "norm-chart")}
        print(f"drawn segments {drawn}, line pixels {pixels}")
        assert drawn["loss"] >= n - 2 and drawn["norm"] >= n - 2, f"charts drew {drawn} of {n - 1} segments"
        assert min(pixels.values()) > 500, f"too few line pixels in the charts: {pixels}"
        print(f"responsiveness: longest event-loop stall {st['maxLagMs']:.0f} ms, "
              f"slowest WebDriver round trip {worst_round_trip * 1e3:.0f} ms")
        assert st["maxLagMs"] < 1000, f"the page stalled for {st['maxLagMs']:.0f} ms"
        assert worst_round_trip < 5, f"a WebDriver call took {worst_round_trip:.1f} s"

        # ZClip last: the screenshot shows its spike boundary over the norm.
        for mode, steps in (("autoclip", args.autoclip_steps), ("zclip", args.zclip_steps)):
            if not steps:
                continue
            reset()
            select_mode(mode)
            elapsed = train(steps)
            time.sleep(0.3)  # let the last frame draw
            st = wd.js("return window.demoState")
            warmup = st["zclipWarmup"] if mode == "zclip" else 0
            assert mode != "zclip" or 0 < warmup < steps, f"ZClip's warm-up {warmup} vs {steps} steps"
            print(f"{mode}: {steps} steps in {elapsed:.1f} s")
            clipped = check_adaptive(mode, st["current"], warmup)
            drawn = st["drawn"]
            line = wd.js(COUNT_LINE_PIXELS, "norm-chart", MODE_RGB[mode])
            print(f"{mode}: drawn {drawn}, line pixels {line}")
            assert drawn["norm"] >= steps - 2 and line > 500, f"{mode}: the norm line was not drawn"
            assert drawn["threshold"] >= steps - warmup - 2, f"{mode}: the threshold line was not drawn"
            assert drawn["clipped"] == clipped, f"{mode}: {drawn['clipped']} clipped steps marked, not {clipped}"
        st = wd.js("return window.demoState")
        assert not st["error"], f"page error: {st['error']}"
        assert st["maxLagMs"] < 1000, f"the page stalled for {st['maxLagMs']:.0f} ms"

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
