#!/usr/bin/env python3
"""Runs the package's browser tests (js/tests/index.html) in headless
Chromium (WebGPU on SwiftShader without a GPU) and prints each result; exits
non-zero if any test fails, the page throws, or no adapter is found.

Usage: js/build.sh && python3 js/tests/run.py [--timeout 600]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from browser import JS_DIR, browser, wait_for  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if not os.path.exists(os.path.join(JS_DIR, "wasm", "gradclip_js_bg.wasm")):
        sys.exit("js/wasm/ is missing: run js/build.sh first")
    t0 = time.monotonic()
    with browser() as (wd, url):
        wd.s("POST", "/url", {"url": url + "tests/index.html"})
        seen = 0

        def progress():
            nonlocal seen
            r = wd.js("return window.testResults || null")
            if r:
                for res in r["results"][seen:]:
                    print(f"{'ok  ' if res['ok'] else 'FAIL'} {res['name']} ({res['ms']} ms)"
                          + (f"\n     {res['error']}" if res["error"] else ""), flush=True)
                seen = len(r["results"])
            errors = wd.js("return window.pageErrors || []")
            if errors:
                raise AssertionError(f"the page threw: {errors}")
            return r and r["done"]

        wait_for("the tests to finish", progress, args.timeout)
        r = wd.js("return window.testResults")
    for line in r["log"]:
        print(f"  {line}")
    failed = [t["name"] for t in r["results"] if not t["ok"]]
    print(f"{len(r['results']) - len(failed)} passed, {len(failed)} failed "
          f"in {time.monotonic() - t0:.1f} s")
    if not r["results"]:
        sys.exit("no test ran")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
