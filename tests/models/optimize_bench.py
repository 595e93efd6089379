#!/usr/bin/env python3
"""Latency of the exported models in tern-run before and after tern-optimize -O2: a ratio table and the
geometric mean over the sequence models (transformer and recurrent). A benchmark, not a test: the rounds
alternate between the two graphs (in turn first) so that a busy machine slows both alike, and each figure
is the median over the rounds of each round's median wall-clock latency. On a shared machine the CPU
time per run is steadier: it is measured too, as the CPU time of a process that runs the graph iters + 1
times less that of one that runs it once, divided by iters.

Usage: .venv/bin/python tests/models/optimize_bench.py [--models DIR] [--build DIR] [--rounds R]
       [--iters N] [--threads T] [NAME...]
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import export_models  # noqa: E402

SEQUENCE_MODELS = ("transformer_encoder", "lstm_lm", "gru_classifier")


def run(build, path, iters, threads):
    """Runs tern-run; returns (median wall-clock ms per run, CPU seconds of the whole process)."""
    cmd = [os.path.join(build, "bin", "tern-run"), "--random", "--json", "--iters", str(iters), "--threads",
           str(threads), path]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(p.stdout)["latency_ms"]["median"], cpu


def latency(build, path, iters, threads):
    """(median wall-clock ms, CPU ms) per run."""
    wall, cpu = run(build, path, iters + 1, threads)
    _, once = run(build, path, 1, threads)
    return wall, (cpu - once) * 1000 / iters


def main():
    build = os.environ.get("TERN_BUILD", "build")
    ap = argparse.ArgumentParser(description="Time models before and after tern-optimize -O2.")
    ap.add_argument("--models", default=os.path.join(build, "tests", "models", "cache"))
    ap.add_argument("--build", default=build)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("names", nargs="*", metavar="NAME")
    opt = ap.parse_args()
    names = opt.names or list(export_models.MODELS)
    print(f"{'model':<22} {'orig ms':>9} {'-O2 ms':>9} {'ratio':>6} {'orig cpu':>9} {'-O2 cpu':>9} {'ratio':>6}")
    ratios, cpu_ratios = {}, {}
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            path = export_models.export(opt.models, name)
            fast = os.path.join(work, name + ".O2.onnx")
            subprocess.run([os.path.join(opt.build, "bin", "tern-optimize"), "-O2", "-o", fast, path], check=True)
            runs = {path: [], fast: []}
            for r in range(opt.rounds):
                for p in (path, fast) if r % 2 == 0 else (fast, path):
                    runs[p].append(latency(opt.build, p, opt.iters, opt.threads))
            med = {p: statistics.median(r[0] for r in runs[p]) for p in runs}
            cpu = {p: statistics.median(r[1] for r in runs[p]) for p in runs}
            ratios[name] = med[fast] / med[path]
            cpu_ratios[name] = cpu[fast] / cpu[path] if cpu[path] > 0 else float("nan")
            print(f"{name:<22} {med[path]:>9.3f} {med[fast]:>9.3f} {ratios[name]:>6.3f} {cpu[path]:>9.3f} "
                  f"{cpu[fast]:>9.3f} {cpu_ratios[name]:>6.3f}")
            sys.stdout.flush()
    seq = [n for n in names if n in SEQUENCE_MODELS]
    if seq:
        def geomean(r):
            return math.exp(sum(math.log(r[n]) for n in seq) / len(seq))
        print(f"geometric mean of the ratios on {', '.join(seq)}: wall {geomean(ratios):.3f}, "
              f"cpu {geomean(cpu_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
