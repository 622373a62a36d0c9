#!/usr/bin/env python3
"""Browser test of the demo page (js/demo/): drives it in headless Chromium
(WebGPU on SwiftShader without a GPU), clicks Start, trains both runs for
--steps steps, and checks that:
  - the page found a WebGPU adapter and reports it, and threw nothing,
  - the clipped run learns: its mean loss over the last 10 steps is below
    --fall times that of the first 10, and every loss and norm is finite,
  - both charts have drawn (segments counted by the page, and pixels of the
    clipped run's colour read back from each canvas),
  - the generated text updates (at least two samples of the clipped run,
    the last different from the first),
  - the page stays responsive (event-loop stalls and WebDriver round trips),
  - Reset starts again from the same first step (same loss and norm),
and saves a screenshot.

Usage: js/build.sh && python3 js/demo/e2e_test.py [--steps 120]
       [--query hidden=64&batch=16] [--screenshot target/js-demo.png]
"""

import argparse
import base64
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from browser import JS_DIR, browser, wait_for  # noqa: E402

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
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--query", default="", help="URL parameters of the page (hidden, batch, seq, lr, maxNorm)")
    ap.add_argument("--fall", type=float, default=0.85,
                    help="the clipped run's last-10 mean loss must be below this times its first-10 mean")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--screenshot", default=os.path.join(JS_DIR, "..", "target", "js-demo.png"))
    args = ap.parse_args()
    if not os.path.exists(os.path.join(JS_DIR, "wasm", "gradclip_js_bg.wasm")):
        sys.exit("js/wasm/ is missing: run js/build.sh first")
    with browser(window="1200,1000") as (wd, url):
        wd.s("POST", "/url", {"url": f"{url}demo/index.html?{args.query}"})
        wait_for("the page to set up (or fail)",
                 lambda: wd.js("return window.demoState && (window.demoState.ready || window.demoState.error)"), 180)
        st = wd.js("return window.demoState")
        assert not st["error"], f"page error: {st['error']}"
        print(f"adapter: {st['adapter']}")
        assert st["adapter"].strip(), "no adapter shown"
        worst_round_trip = 0.0

        def progress():
            nonlocal worst_round_trip
            t = time.monotonic()
            s = wd.js("return {n: window.demoState.runs.clipped.losses.length, error: window.demoState.error}")
            worst_round_trip = max(worst_round_trip, time.monotonic() - t)
            assert not s["error"], f"page error: {s['error']}"
            return s["n"] >= args.steps

        t0 = time.monotonic()
        wd.click("#start")
        wait_for(f"{args.steps} steps", progress, args.timeout)
        wd.click("#start")  # Pause
        wait_for("the loop to stop", lambda: not wd.js("return window.demoState.running"), 60)
        elapsed = time.monotonic() - t0
        time.sleep(0.5)
        st = wd.js("return window.demoState")
        assert not st["error"], f"page error: {st['error']}"
        clipped, unclipped = st["runs"]["clipped"], st["runs"]["unclipped"]
        losses, norms = clipped["losses"], clipped["norms"]
        n = len(losses)
        print(f"{n} steps of both runs in {elapsed:.1f} s ({st['stepsPerSecond']:.1f} steps/s)")
        assert all(isinstance(x, (int, float)) for x in losses + norms), "a non-finite loss or norm in the clipped run"
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        bad = [x for x in unclipped["losses"] if not isinstance(x, (int, float)) or x > 20]
        print(f"clipped: loss {first:.3f} -> {last:.3f}, gradient norm max {max(norms):.3g}; "
              f"unclipped: loss {unclipped['losses'][0]:.3f} -> {unclipped['losses'][-1]}, "
              f"{len(bad)} steps diverged (loss > 20 or not finite)")
        assert last < args.fall * first, f"the clipped run's loss did not fall enough: {first:.3f} -> {last:.3f}"
        samples = clipped["samples"]
        print(f"samples: {len(samples)}; the last (step {samples[-1]['step'] if samples else '-'}):")
        for line in (samples[-1]["text"] if samples else "").splitlines()[:6]:
            print(f"  | {line}")
        assert len(samples) >= 2 and samples[-1]["text"] != samples[0]["text"], "the generated text did not update"
        drawn = st["drawn"]
        pixels = {c: wd.js(COUNT_LINE_PIXELS, c) for c in ("loss-chart", "norm-chart")}
        print(f"drawn segments {drawn}, clipped-colour pixels {pixels}")
        assert drawn["loss"] >= n - 2 and drawn["norm"] >= n - 2, f"charts drew {drawn} for {n} steps"
        assert min(pixels.values()) > 300, f"too few line pixels in the charts: {pixels}"
        print(f"responsiveness: longest event-loop stall {st['maxLagMs']:.0f} ms, "
              f"slowest WebDriver round trip {worst_round_trip * 1e3:.0f} ms")
        assert st["maxLagMs"] < 1000, f"the page stalled for {st['maxLagMs']:.0f} ms"
        assert worst_round_trip < 5, f"a WebDriver call took {worst_round_trip:.1f} s"
        png = base64.b64decode(wd.s("GET", "/screenshot"))
        assert png[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
        width, height = struct.unpack(">II", png[16:24])
        assert width >= 800 and height >= 600 and len(png) > 20_000, (width, height, len(png))
        os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
        with open(args.screenshot, "wb") as f:
            f.write(png)
        print(f"screenshot: {args.screenshot} ({width}x{height}, {len(png)} bytes)")

        # Reset starts both runs again from the same start: step numbers,
        # losses and norms count from 1 again.
        wd.click("#reset")
        st = wd.js("return window.demoState")
        assert st["step"] == 0 and not st["runs"]["clipped"]["losses"], "Reset kept the old run"
        wd.click("#start")
        wait_for("5 steps after the reset", lambda: len(wd.js("return window.demoState.runs.clipped.norms")) >= 5, 120)
        wd.click("#start")
        wait_for("the loop to stop", lambda: not wd.js("return window.demoState.running"), 60)
        again = wd.js("return window.demoState.runs.clipped")
        assert abs(again["losses"][0] - losses[0]) < 1e-6 * max(1, losses[0]), \
            f"the first loss after the reset is {again['losses'][0]}, before it was {losses[0]}"
        assert abs(again["norms"][0] - norms[0]) < 1e-5 * norms[0], \
            f"the first norm after the reset is {again['norms'][0]}, before it was {norms[0]}"
        print("demo browser test passed")


if __name__ == "__main__":
    main()
