#!/usr/bin/env python3
"""PyTorch peer of gradclip's benchmark (examples/bench).

Times torch.nn.utils.clip_grad_norm_(foreach=True) on the same sizes, tensor
counts, norms and clip / no-clip steps as `cargo run --release --example
bench`, on whatever device torch sees (CUDA if available, else CPU), and
writes the bench's result rows without its roofline fields (schema
"gradclip-bench/1"; the bench's own is "gradclip-bench/2") so that
bench/compare.py can print ours / torch per case.

    python3 bench/torch_peer.py --json torch.json            # sizes 1e5..1e7
    python3 bench/torch_peer.py --max-n 1e8 --json torch.json
    python3 bench/torch_peer.py --backend numpy --quick --json numpy.json

Timing: on CUDA, CUDA events around the clip call give the GPU time
("gpu" basis), and torch.cuda.synchronize() closes the wall time; on the CPU
the wall time is the basis. The copy bandwidth is dst.copy_(src) of the same
N, timed the same way, in the same run. Every repetition starts from the
same pristine gradients (an untimed copy_), like the Rust bench.

`--backend numpy` is a stand-in used to test this script without torch: the
same foreach semantics (per-tensor norms, norm of norms, one multiply) in
numpy on the CPU, reported as implementation "numpy". It is not a PyTorch
figure.
"""

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time

SCHEMA = "gradclip-bench/1"
CLIP_FLOOR_BYTES = 12  # norm read + scale read and write
NOCLIP_FLOOR_BYTES = 4  # norm read only
MIN_N = 100_000


def parse_count(s):
    v = float(s)
    if not (v >= 1 and v == int(v)):
        raise argparse.ArgumentTypeError(f"not a positive element count: {s}")
    return int(v)


def sizes_of(args):
    if args.sizes:
        return sorted(set(parse_count(s) for s in args.sizes.split(",")))
    top = 1_000_000 if args.quick else parse_count(args.max_n)
    out, n = [], MIN_N
    while n <= top:
        out.append(n)
        n *= 10
    if not out or out[-1] != top:
        out.append(top)
    return out


def norm_p(norm):
    """The p of a norm named as the bench names it: l2, inf, or pX (p3, p1.5)."""
    if norm == "l2":
        return 2.0
    if norm == "inf":
        return math.inf
    if norm.startswith("p"):
        try:
            p = float(norm[1:])
        except ValueError:
            p = 0.0
        if p > 0 and math.isfinite(p):
            return p
    raise SystemExit(f"not a norm: {norm!r} (l2, inf, or p followed by a positive number)")


def even_sizes(n, t):
    q, r = divmod(n, t)
    return [q + (1 if i < r else 0) for i in range(t)]


def median(v):
    return statistics.median(v) if v else float("nan")


class TorchBackend:
    """clip_grad_norm_(foreach=True) on torch's device."""

    implementation = "torch"

    def __init__(self, device):
        import torch

        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dev = torch.device(device)
        self.cuda = self.dev.type == "cuda"
        self.basis = "gpu" if self.cuda else "wall"
        self.foreach = True
        gen = torch.Generator().manual_seed(0x9E3779B9)
        self._gen = gen

    def adapter(self):
        torch = self.torch
        if self.cuda:
            props = torch.cuda.get_device_properties(self.dev)
            name, kind = props.name, "DiscreteGpu"
            info = f"CUDA {torch.version.cuda}, {props.total_memory // 2**20} MiB"
        else:
            name, kind = platform.processor() or platform.machine(), "Cpu"
            info = f"{torch.get_num_threads()} threads"
        return {
            "name": name,
            "backend": "CUDA" if self.cuda else "CPU",
            "device_type": kind,
            "driver": f"torch {torch.__version__}",
            "driver_info": info,
        }

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def pristine(self, n):
        # Uniform in [-0.01, 0.01), like the Rust bench (same distribution,
        # not the same bits): the time does not depend on the values.
        host = (self.torch.rand(n, generator=self._gen, dtype=self.torch.float32) - 0.5) * 0.02
        return host.to(self.dev)

    def reference(self, pristine, norm):
        x = pristine.double()
        return float(x.abs().max() if norm == "inf" else x.norm(p=norm_p(norm)))

    def bind(self, pristine, sizes):
        torch = self.torch
        grads = torch.empty_like(pristine)
        params = [torch.nn.Parameter(torch.empty(s, device=self.dev)) for s in sizes]
        for p, g in zip(params, torch.split(grads, sizes)):
            p.grad = g
        return {"grads": grads, "params": params}

    def restore(self, bound, pristine):
        bound["grads"].copy_(pristine)

    def clip(self, bound, max_norm, norm):
        norm_type = norm_p(norm)
        clip = self.torch.nn.utils.clip_grad_norm_
        if self.foreach:
            try:
                return clip(bound["params"], max_norm, norm_type=norm_type, foreach=True)
            except RuntimeError as e:
                # Older torch on the CPU: no foreach kernels.
                print(f"foreach=True refused ({e}); using foreach=None", file=sys.stderr)
                self.foreach = False
        return clip(bound["params"], max_norm, norm_type=norm_type, foreach=None)

    def timed(self, reps, warmup, copy, prepare, work):
        """Per repetition: copy() timed (the limit), prepare() untimed, work()
        timed; warmup + reps times. Returns (copy basis seconds, basis
        seconds, wall seconds, host call seconds, last result)."""
        torch = self.torch
        if self.cuda:
            events = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(reps)]
        copies, wall, call, out = [], [], [], None
        for r in range(warmup + reps):
            k = r - warmup
            ev = events[k] if self.cuda and k >= 0 else None
            self.sync()
            t0 = time.perf_counter()
            if ev:
                ev[0].record()
            copy()
            if ev:
                ev[1].record()
            self.sync()
            t1 = time.perf_counter()
            prepare()
            self.sync()
            t2 = time.perf_counter()
            if ev:
                ev[2].record()
            out = work()
            t3 = time.perf_counter()
            if ev:
                ev[3].record()
            self.sync()
            t4 = time.perf_counter()
            if k >= 0:
                copies.append(t1 - t0)
                call.append(t3 - t2)
                wall.append(t4 - t2)
        if self.cuda:
            copies = [e[0].elapsed_time(e[1]) * 1e-3 for e in events]
            basis = [e[2].elapsed_time(e[3]) * 1e-3 for e in events]
        else:
            basis = list(wall)
        return copies, basis, wall, call, out

    def copy_target(self, pristine):
        return self.torch.empty_like(pristine)

    def copy(self, dst, src):
        dst.copy_(src)

    def total(self, out):
        return float(out)


class NumpyBackend:
    """Stand-in with the same harness, for testing this script without torch."""

    implementation = "numpy"
    basis = "wall"
    cuda = False

    def __init__(self, device):
        import numpy as np

        self.np = np
        self.rng = np.random.default_rng(0x9E3779B9)

    def adapter(self):
        return {
            "name": platform.processor() or platform.machine(),
            "backend": "CPU",
            "device_type": "Cpu",
            "driver": f"numpy {self.np.__version__} (stand-in, not PyTorch)",
            "driver_info": "",
        }

    def sync(self):
        pass

    def pristine(self, n):
        return ((self.rng.random(n, dtype=self.np.float32) - 0.5) * 0.02).astype(self.np.float32)

    def reference(self, pristine, norm):
        x = self.np.abs(pristine.astype(self.np.float64))
        p = norm_p(norm)
        return float(x.max() if p == math.inf else (x**p).sum() ** (1 / p))

    def bind(self, pristine, sizes):
        grads = self.np.empty_like(pristine)
        cuts = self.np.cumsum(sizes)[:-1]
        return {"grads": grads, "views": self.np.split(grads, cuts)}

    def restore(self, bound, pristine):
        self.np.copyto(bound["grads"], pristine)

    def clip(self, bound, max_norm, norm):
        np = self.np
        p = norm_p(norm)
        if p == math.inf:
            per = [np.abs(v).max() for v in bound["views"]]
            total = np.float32(max(per))
        else:
            per = np.array([(np.abs(v) ** p).sum() ** (1 / p) for v in bound["views"]])
            total = np.float32((per**p).sum() ** (1 / p))
        coef = np.float32(min(max_norm / (float(total) + 1e-6), 1.0))
        for v in bound["views"]:  # torch multiplies even when coef == 1
            v *= coef
        return total

    def timed(self, reps, warmup, copy, prepare, work):
        copies, wall, out = [], [], None
        for r in range(warmup + reps):
            t0 = time.perf_counter()
            copy()
            t1 = time.perf_counter()
            prepare()
            t2 = time.perf_counter()
            out = work()
            t3 = time.perf_counter()
            if r >= warmup:
                copies.append(t1 - t0)
                wall.append(t3 - t2)
        return copies, list(wall), wall, wall, out

    def copy_target(self, pristine):
        return self.np.empty_like(pristine)

    def copy(self, dst, src):
        self.np.copyto(dst, src)

    def total(self, out):
        return float(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-n", default="1e7", help="largest N; sizes are the decades from 1e5 up to it, plus it")
    p.add_argument("--sizes", help="explicit sizes, e.g. 1e5,3e6")
    p.add_argument("--tensors", default="1,100,10000")
    p.add_argument("--norms", default="l2,inf", help="l2, inf, or pX as the bench names them (p3, p1.5)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="sizes up to 1e6, one warm-up")
    p.add_argument("--device", default="auto", help="torch device: auto (cuda if available), cuda, cpu")
    p.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.warmup = min(args.warmup, 1)
    if args.reps < 20:
        print(f"warning: --reps {args.reps} is below the 20 repetitions results should use", file=sys.stderr)

    be = TorchBackend(args.device) if args.backend == "torch" else NumpyBackend(args.device)
    sizes = sizes_of(args)
    tensor_counts = [int(t) for t in args.tensors.split(",")]
    norms = [n.strip().lower() for n in args.norms.split(",")]
    for norm in norms:
        norm_p(norm)
    adapter = be.adapter()
    print(f"adapter: {adapter['name']} ({adapter['backend']}, {adapter['driver']}); basis {be.basis}; "
          f"sizes {sizes}, tensors {tensor_counts}, norms {norms}, {args.reps} reps after {args.warmup} warm-up",
          file=sys.stderr)

    copies, results = [], []
    started = time.perf_counter()
    for n in sizes:
        pristine = be.pristine(n)
        dst = be.copy_target(pristine)
        copy_medians = []
        refs = {norm: be.reference(pristine, norm) for norm in norms}
        for t in tensor_counts:
            if t < 1 or t > n:
                continue
            bound = be.bind(pristine, even_sizes(n, t))
            for norm in norms:
                ref = refs[norm]
                for step, factor, floor in (("clip", 0.5, CLIP_FLOOR_BYTES), ("noclip", 2.0, NOCLIP_FLOOR_BYTES)):
                    max_norm = factor * ref
                    # Like the Rust bench: a copy of the whole buffer in every
                    # repetition, next to the clip, is this case's limit.
                    copy_s, basis, wall, call, out = be.timed(
                        args.reps, args.warmup,
                        lambda: be.copy(dst, pristine),
                        lambda: be.restore(bound, pristine),
                        lambda: be.clip(bound, max_norm, norm))
                    copy_s = median(copy_s)
                    copy_medians.append(copy_s)
                    limit_gbps = 8 * n / copy_s * 1e-9
                    total = be.total(out)
                    coef = min(max_norm / (total + 1e-6), 1.0)
                    err = abs(total - ref) / ref
                    if (coef < 1.0) != (step == "clip") or not err <= 1e-3:
                        sys.exit(f"N={n} tensors={t} {norm} {step}: norm {total} vs reference {ref}, coefficient {coef}")
                    seconds = median(basis)
                    gbps = floor * n / seconds * 1e-9
                    results.append({
                        "implementation": be.implementation,
                        "n": n, "tensors": t, "norm": norm, "step": step,
                        "floor_bytes": floor * n,
                        "seconds": seconds, "basis": be.basis, "min_seconds": min(basis),
                        "wall_seconds": median(wall),
                        "record_seconds": median(call) if be.cuda else None,
                        "passes": {},
                        "gbps": gbps, "copy_fraction": gbps / limit_gbps, "limit": "device copy",
                        "limit_gbps": limit_gbps,
                        "total_norm": total, "coefficient": coef,
                        "foreach": getattr(be, "foreach", None),
                    })
                    print(".", end="", file=sys.stderr, flush=True)
            del bound
        copy_s = median(copy_medians)
        copies.append({"n": n, "bytes": 8 * n, "seconds": copy_s, "gbps": 8 * n / copy_s * 1e-9,
                       "host_seconds": None, "host_gbps": None})
        print(f" N = {n}: copy {copies[-1]['gbps']:.1f} GB/s", file=sys.stderr)
    print(f"done in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    run = {
        "schema": SCHEMA,
        "tool": be.implementation,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([sys.executable.rsplit("/", 1)[-1]] + sys.argv),
        "adapter": adapter,
        "basis": be.basis,
        "reps": args.reps,
        "warmup": args.warmup,
        "copy": copies,
        "results": results,
    }
    print(f"| N | tensors | norm | step | {be.implementation} µs | GB/s | % copy |")
    print("|---:|---:|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['n']} | {r['tensors']} | {r['norm']} | {r['step']} | {r['seconds'] * 1e6:.1f} | "
              f"{r['gbps']:.3g} | {100 * r['copy_fraction']:.3g}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(run, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
