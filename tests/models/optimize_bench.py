#!/usr/bin/env python3
"""Latency of the exported models in tern-run before and after tern-optimize -O2: a ratio table and the
geometric mean over the sequence models (transformer and recurrent). A benchmark, not a test: the rounds
alternate between the two graphs (in turn first) so that a busy machine slows both alike, and each figure
is the median over the rounds of each round's median (and of its minimum).

Usage: .venv/bin/python tests/models/optimize_bench.py [--models DIR] [--build DIR] [--rounds R]
       [--iters N] [--threads T] [NAME...]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import export_models  # noqa: E402

SEQUENCE_MODELS = ("transformer_encoder", "lstm_lm", "gru_classifier")


def latency(build, path, iters, threads):
    cmd = [os.path.join(build, "bin", "tern-run"), "--random", "--json", "--iters", str(iters), "--warmup",
           str(max(2, iters // 10)), "--threads", str(threads), path]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    ms = json.loads(p.stdout)["latency_ms"]
    return ms["median"], ms["min"]


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
    print(f"{'model':<22} {'orig ms':>9} {'-O2 ms':>9} {'ratio':>6} {'orig min':>9} {'-O2 min':>9} {'ratio':>6}")
    ratios = {}
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
            low = {p: statistics.median(r[1] for r in runs[p]) for p in runs}
            ratios[name] = med[fast] / med[path]
            print(f"{name:<22} {med[path]:>9.3f} {med[fast]:>9.3f} {ratios[name]:>6.3f} {low[path]:>9.3f} "
                  f"{low[fast]:>9.3f} {low[fast] / low[path]:>6.3f}")
            sys.stdout.flush()
    seq = [ratios[n] for n in names if n in SEQUENCE_MODELS]
    if seq:
        print(f"geometric mean of the ratios on {', '.join(n for n in names if n in SEQUENCE_MODELS)}: "
              f"{math.exp(sum(map(math.log, seq)) / len(seq)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
