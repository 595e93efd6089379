#!/usr/bin/env python3
"""Training-step time and memory, tern against PyTorch eager, in one run on the same data.

    bench_train.py [--bin build/bin] [--steps 60] [--threads 1,2] [--pipeline full|autodiff] [NAME...]
    NAME: mlp cnn transformer lstm

For each parity model (tests/models/train_parity.py) at batch 64: PyTorch eager (forward, backward,
Adam step) and tern (tern-autodiff --optimizer adam | tern-optimize | tern-schedule, then tern-run
--train; --pipeline autodiff skips the optimising and scheduling) each take STEPS steps;
the median step time is taken from the second half (tern: from its --log, one line a step). Peak
memory is each process's maximum resident set (a fresh process each: PyTorch's includes the library
itself). Where onnxruntime-training is installed (--ort-python; scripts/setup.sh --bench), its training
API takes the same steps too (a third column). Prints a table and the geometric mean of tern/PyTorch
per thread count.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))


def torch_child(name, threads, steps, work):
    """Runs in a child process: PyTorch's steps; prints JSON {median_ms}."""
    import torch
    import train_parity as tp
    torch.set_num_threads(threads)
    tp.BATCH = 64
    tp.STEPS = steps
    net, x, y = tp.make(name)
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    times = []
    for s in range(steps):
        xb, yb = x[(s * 64) % len(x):][:64], y[(s * 64) % len(y):][:64]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"median_ms": statistics.median(times[steps // 2:])}))


def ort_child(name, threads, steps, work):
    """Runs in a child process of onnxruntime-training's environment: its artifacts (AdamW with
    weight decay 0, which is Adam, and its CrossEntropyLoss block) for the model exported in eval mode
    (onnxruntime-training keeps no training-mode BatchNormalization), then STEPS train steps; prints
    JSON {median_ms}."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    import train_parity as tp
    tp.BATCH = 64
    tp.STEPS = steps
    net, x, y = tp.make(name)
    path = os.path.join(work, "m.onnx")
    net.eval()
    torch.onnx.export(net, x[:64], path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, opset_version=17, do_constant_folding=False)
    m = onnx.load(path)
    params = [t.name for t in m.graph.initializer if t.data_type == 1 and "running" not in t.name]
    artifacts.generate_artifacts(m, requires_grad=params, frozen_params=[], loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=work)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    state = CheckpointState.load_checkpoint(os.path.join(work, "checkpoint"))
    mod = Module(os.path.join(work, "training_model.onnx"), state, os.path.join(work, "eval_model.onnx"),
                 session_options=so)
    opt = Optimizer(os.path.join(work, "optimizer_model.onnx"), mod)
    opt.set_learning_rate(1e-3)
    mod.train()
    xs, ys = x.numpy(), y.numpy().astype(np.int64)
    times = []
    for s in range(steps):
        xb, yb = xs[(s * 64) % len(xs):][:64], ys[(s * 64) % len(ys):][:64]
        t0 = time.perf_counter()
        mod(xb, yb)
        opt.step()
        mod.lazy_reset_grad()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"median_ms": statistics.median(times[steps // 2:])}))


def rss_of(cmd):
    """(returncode, stdout, stderr, peak resident bytes) of a fresh process. It runs under GNU time:
    a child forked straight from this (big) Python process would start with its resident size."""
    with tempfile.NamedTemporaryFile("r") as t:
        p = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%M"] + cmd, capture_output=True, text=True)
        rss = int(t.read().strip().splitlines()[-1]) * 1024
    return p.returncode, p.stdout, p.stderr, rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pipeline", choices=["full", "autodiff"], default="full",
                    help="full: tern-autodiff | tern-optimize | tern-schedule (default); autodiff: its output as it is")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--ort-child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--ort-python", default=os.path.join(HERE, "..", ".venv-ort-training", "bin", "python"),
                    help="a python with onnxruntime-training (scripts/setup.sh --bench makes it); none: not run")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    if a.child:
        torch_child(a.child[0], int(a.child[1]), a.steps, None)
        return 0
    if a.ort_child:
        ort_child(a.ort_child[0], int(a.ort_child[1]), a.steps, a.ort_child[2])
        return 0
    have_ort = os.access(a.ort_python, os.X_OK)
    import numpy as np
    import torch
    import train_parity as tp
    tp.BATCH = 64
    tp.STEPS = a.steps
    names = a.names or ["mlp", "cnn", "lstm", "transformer"]
    ratios = {}
    rows = []
    ort_fail = {}
    with tempfile.TemporaryDirectory() as w:
        for name in names:
            net, x, y = tp.make(name)
            model = os.path.join(w, f"{name}.onnx")
            tp.export(net, x, model)
            np.save(os.path.join(w, "x.npy"), x.numpy())
            np.save(os.path.join(w, "y.npy"), y.numpy().astype(np.int64))
            train = os.path.join(w, f"{name}-train.onnx")
            subprocess.run([os.path.join(a.bin, "tern-autodiff"), "--loss", "cross-entropy", "--optimizer", "adam",
                            "--lr", "1e-3", model, "-o", train], check=True)
            if a.pipeline == "full":
                # as a user runs it: the training step optimised and scheduled
                opt = subprocess.run([os.path.join(a.bin, "tern-optimize"), train], check=True, capture_output=True)
                train = os.path.join(w, f"{name}-train-sched.onnx")
                subprocess.run([os.path.join(a.bin, "tern-schedule"), "-o", train], input=opt.stdout, check=True)
            for th in [int(t) for t in a.threads.split(",")]:
                log = os.path.join(w, "log.jsonl")
                rc, _, err, tern_rss = rss_of([os.path.join(a.bin, "tern-run"), "--train", train, "-i",
                                               "x=" + os.path.join(w, "x.npy"), "-i", "target=" + os.path.join(w, "y.npy"),
                                               "--batch", "64", "--steps", str(a.steps), "--threads", str(th),
                                               "--log", log])
                if rc:
                    print(f"{name}: tern failed: {err.strip()}")
                    continue
                steps = [json.loads(l) for l in open(log) if '"samples_per_s"' in l]
                tern_ms = statistics.median(64 / s["samples_per_s"] * 1e3 for s in steps[len(steps) // 2:])
                rc, out, err, torch_rss = rss_of([sys.executable, os.path.abspath(__file__), "--steps", str(a.steps),
                                                  "--child", name, str(th), "x"])
                if rc:
                    print(f"{name}: torch failed: {err.strip()[-300:]}")
                    continue
                torch_ms = json.loads(out.strip().splitlines()[-1])["median_ms"]
                ort_ms = None
                if have_ort:
                    ow = os.path.join(w, f"ort-{name}-{th}")
                    os.makedirs(ow)
                    p = subprocess.run([a.ort_python, os.path.abspath(__file__), "--steps", str(a.steps), "--ort-child",
                                        name, str(th), ow], capture_output=True, text=True)
                    if p.returncode == 0:
                        ort_ms = json.loads(p.stdout.strip().splitlines()[-1])["median_ms"]
                    else:
                        lines = [l for l in p.stderr.strip().splitlines() if "Error" in l]
                        ort_fail[name] = (lines[-1] if lines else p.stderr.strip()[-200:])[:200]
                r = tern_ms / torch_ms
                ratios.setdefault(th, []).append(r)
                rows.append((name, th, tern_ms, torch_ms, r, tern_rss / 2**20, torch_rss / 2**20, ort_ms))
    print(f"{'model':<12} {'threads':>7} {'tern ms':>9} {'torch ms':>9} {'ratio':>6} {'tern MB':>8} {'torch MB':>9}"
          f" {'ort-training ms':>16} {'tern/ort':>9}")
    for n, th, t, p, r, tm, pm, om in rows:
        ort_cols = f" {om:>16.3f} {t / om:>9.2f}" if om else f" {'-':>16} {'-':>9}"
        print(f"{n:<12} {th:>7} {t:>9.3f} {p:>9.3f} {r:>6.2f} {tm:>8.1f} {pm:>9.1f}" + ort_cols)
    for n, why in ort_fail.items():
        print(f"onnxruntime-training failed on {n}: {why}")
    for th, rs in ratios.items():
        print(f"geometric mean tern/PyTorch at {th} thread{'s' if th > 1 else ''}: "
              f"{math.exp(sum(map(math.log, rs)) / len(rs)):.3f} (worst {max(rs):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
