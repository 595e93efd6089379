#!/usr/bin/env python3
"""Recursive models, inference: tern-run's recursive TreeLSTM (scripts/make_recursive_models.py, one
call a tree node, children's calls side by side on --threads) against PyTorch eager recursion of the
same network on the same weights, over the dev trees of scripts/make_treebank.py, in one run.

    .venv/bin/python scripts/bench_recursive.py [--hidden 64] [--threads 1,2] [--rounds 3] [--keep DIR]

A tree's time is its forward pass to the root's scores (tern-run --json's per-example latency; for
PyTorch, time.perf_counter around the call under torch.no_grad), throughput the trees over the sum of
their times, the median over rounds. Training throughput, the iterative and unrolled baselines and
batching of ready calls are not measured yet.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def tern_trees_per_s(args, work, threads):
    split = os.path.join(work, "tb", "dev")
    cmd = [os.path.join(args.bin, "tern-run"), "--threads", str(threads), "--json",
           *[f"-i{k}={os.path.join(split, k + '.pb')}" for k in ("left", "right", "word", "root")],
           os.path.join(work, "m", "treelstm.txt")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"bench_recursive: tern-run failed: {p.stderr[-2000:]}")
    j = json.loads(p.stdout)
    return 1000.0 / j["latency_ms"]["mean"], j["iters"]


def torch_trees_per_s(work, threads):
    import onnx
    import torch
    from onnx import numpy_helper as nh
    sys.path.insert(0, HERE)
    from make_recursive_models import load_weights
    torch.set_num_threads(threads)
    p = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in load_weights(os.path.join(work, "m")).items()}
    d = p["emb"].shape[1]

    def node(k, left, right, word):
        if left[k] < 0:
            g = p["emb"][word[k]] @ p["wleaf"] + p["bleaf"]
            c = torch.sigmoid(g[:d]) * torch.tanh(g[2 * d:])
            return torch.sigmoid(g[d:2 * d]) * torch.tanh(c), c
        ha, ca = node(left[k], left, right, word)
        hb, cb = node(right[k], left, right, word)
        gi, gfa, gfb, go, gu = (torch.cat([ha, hb]) @ p["winner"] + p["binner"]).chunk(5)
        c = torch.sigmoid(gi) * torch.tanh(gu) + torch.sigmoid(gfa) * ca + torch.sigmoid(gfb) * cb
        return torch.sigmoid(go) * torch.tanh(c), c

    def seq(name):
        q = onnx.SequenceProto()
        with open(os.path.join(work, "tb", "dev", name + ".pb"), "rb") as f:
            q.ParseFromString(f.read())
        return [nh.to_array(t).tolist() for t in q.tensor_values]

    left, right, word, root = (seq(k) for k in ("left", "right", "word", "root"))
    total = 0.0
    with torch.no_grad():
        for e in range(len(left)):
            t0 = time.perf_counter()
            h, _ = node(root[e], left[e], right[e], word[e])
            (h @ p["wout"] + p["bout"]).sum().item()
            total += time.perf_counter() - t0
    return len(left) / total, len(left)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="bench_recursive.")
    py = sys.executable
    subprocess.run([py, os.path.join(HERE, "make_treebank.py"), os.path.join(work, "tb")], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([py, os.path.join(HERE, "make_recursive_models.py"), "--hidden", str(args.hidden),
                    os.path.join(work, "m")], check=True)
    sys.setrecursionlimit(10000)
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        tern = [tern_trees_per_s(args, work, threads)[0] for _ in range(args.rounds)]
        torch_ = [torch_trees_per_s(work, threads)[0] for _ in range(args.rounds)]
        rows.append((threads, statistics.median(tern), statistics.median(torch_)))
    print(f"\nTreeLSTM inference, hidden {args.hidden}, the 1101 generated dev trees (mean 19 words), medians of "
          f"{args.rounds} rounds")
    print("| threads | tern recursive trees/s | PyTorch eager recursion trees/s | tern / PyTorch |")
    print("|---:|---:|---:|---:|")
    for threads, a, b in rows:
        print(f"| {threads} | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
