#!/usr/bin/env python3
"""Eager tern against PyTorch eager, in one run: the cost of one operation from Python, and each of
tests/programs' programs' step time against its PyTorch twin.

    bench_eager.py [--build BUILD] [--ops 1000] [--repeats 7] [--no-programs] [NAME...]

Per-operator overhead: 1000 tiny operations (Add, Mul, Relu and Sigmoid in turn, on 16 floats, the
result of each the input of the next) timed as one block, the median of --repeats blocks, with and
without a tape (one input requiring a gradient), tern and PyTorch (one thread each) in this
process. Programs: each of tests/programs' programs runs on both backends in this process (tern
first); the step time is the median of its main-loop steps, as the program measures it. Prints tables and the geometric mean of tern/PyTorch.
"""
import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def chain(lib, x, n, ops):
    for i in range(n):
        x = ops[i % len(ops)](x)
    return x


def per_op(lib_name, n, repeats, grad):
    import numpy as np
    if lib_name == "torch":
        import torch
        torch.set_num_threads(1)
        x = torch.tensor(np.linspace(-1, 1, 16, dtype=np.float32), requires_grad=grad)
        c = torch.tensor(np.full(16, 0.5, np.float32))
        ops = [lambda t: t + c, lambda t: t * c, torch.relu, torch.sigmoid]
        ctx = torch.enable_grad if grad else torch.no_grad
    else:
        import tern
        x = tern.Parameter(np.linspace(-1, 1, 16, dtype=np.float32)) if grad else \
            tern.tensor(np.linspace(-1, 1, 16, dtype=np.float32))
        c = tern.tensor(np.full(16, 0.5, np.float32))
        ops = [lambda t: t + c, lambda t: t * c, lambda t: t.relu(), lambda t: t.sigmoid()]

        class ctx:  # noqa: N801 - a context manager like torch's
            def __enter__(self):
                self.g = None if grad else tern.no_grad()
                if self.g:
                    self.g.__enter__()

            def __exit__(self, *a):
                if self.g:
                    self.g.__exit__(*a)
    times = []
    for r in range(repeats + 1):
        with ctx():
            t0 = time.perf_counter()
            y = chain(None, x, n, ops)
            t1 = time.perf_counter()
        del y
        if r:  # the first block warms caches up
            times.append((t1 - t0) / n * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-programs", action="store_true")
    ap.add_argument("names", nargs="*", help="programs to time (default: all)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build, "python"))
    rows = []
    for grad in (False, True):
        t = per_op("tern", a.ops, a.repeats, grad)
        p = per_op("torch", a.ops, a.repeats, grad)
        rows.append(("tape" if grad else "no tape", t, p))
    print(f"{'one operation on 16 floats':<28} {'tern us':>8} {'torch us':>9} {'ratio':>6}")
    for what, t, p in rows:
        print(f"{what:<28} {t:>8.2f} {p:>9.2f} {t / p:>6.2f}")
    if a.no_programs:
        return 0
    sys.path.insert(0, os.path.join(ROOT, "tests", "programs"))
    import importlib
    import run_all
    ratios = []
    print(f"\n{'program':<20} {'tern ms':>8} {'torch ms':>9} {'ratio':>6}")
    for name in a.names or run_all.discover():
        mod = importlib.import_module(name)
        tern_ms = mod.run("tern", 0)["step_ms"]
        torch_ms = mod.run("torch", 0)["step_ms"]
        r = tern_ms / torch_ms
        ratios.append(r)
        print(f"{name:<20} {tern_ms:>8.3f} {torch_ms:>9.3f} {r:>6.2f}")
    if ratios:
        print(f"geometric mean tern/PyTorch: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} "
              f"(worst {max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
