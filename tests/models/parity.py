#!/usr/bin/env python3
"""Model parity: runs each exported model in onnxruntime and in tern-run on the same seeded inputs and
requires max|tern - ort| <= 1e-4 * max|ort| + 1e-5 for every output.

Usage: .venv/bin/python tests/models/parity.py [--models DIR] [--tern-run PATH] [--threads N]
                                              [--schedule TERN_SCHEDULE] [--optimize LEVEL] [NAME...]
Defaults: DIR is $TERN_BUILD/tests/models/cache (exported on first use), PATH $TERN_BUILD/bin/tern-run.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import export_models  # noqa: E402

RTOL = 1e-4
ATOL = 1e-5
SEED = 1


def make_inputs(inputs):
    rng = np.random.default_rng(SEED)
    feeds = {}
    for i in inputs:
        if i.dtype == "int64":
            feeds[i.name] = rng.integers(0, i.high, size=i.shape, dtype=np.int64)
        else:
            feeds[i.name] = rng.standard_normal(i.shape, dtype=np.float32)
    return feeds


def run_ort(path, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def run_tern(tern_run, path, feeds, work, extra=()):
    """Runs tern-run with .npy inputs; returns ({output name: array}, error message or None)."""
    out_dir = os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)
    cmd = [tern_run, *extra]
    for name, value in feeds.items():
        f = os.path.join(work, name + ".npy")
        np.save(f, value)
        cmd += ["-i", f"{name}={f}"]
    cmd += ["-O", out_dir, path]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines()
        return None, f"tern-run exit {p.returncode}: {lines[-1] if lines else '(no message)'}"
    return {f[: -len(".npy")]: np.load(os.path.join(out_dir, f)) for f in os.listdir(out_dir)}, None


def compare(want, got):
    """Returns (max abs error, bound, problem or None) for the output furthest from its bound."""
    worst = (0.0, ATOL)
    for name, w in want.items():
        if name not in got:
            return *worst, f"output '{name}' missing"
        g = got[name]
        if g.shape != w.shape or g.dtype != w.dtype:
            return *worst, f"output '{name}' is {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}"
        if not w.size:
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        diff = np.abs(g64 - w64)
        e = float(np.max(np.where(np.isnan(diff), np.inf, diff)))
        b = RTOL * float(np.max(np.abs(w64))) + ATOL
        if e / b > worst[0] / worst[1]:
            worst = (e, b)
    return *worst, None


def main():
    build = os.environ.get("TERN_BUILD", "build")
    ap = argparse.ArgumentParser(description="Compare tern-run with onnxruntime on exported models.")
    ap.add_argument("--models", default=os.path.join(build, "tests", "models", "cache"))
    ap.add_argument("--tern-run", default=os.path.join(build, "bin", "tern-run"))
    ap.add_argument("--schedule", metavar="TERN_SCHEDULE",
                    help="run the models as this tern-schedule schedules them, on --threads workers")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--optimize", metavar="LEVEL", help="tern-run's --optimize (default: tern-run's own)")
    ap.add_argument("names", nargs="*", metavar="NAME")
    opt = ap.parse_args()
    names = opt.names or list(export_models.MODELS)
    for n in names:
        if n not in export_models.MODELS:
            sys.exit(f"parity: unknown model {n!r} (known: {', '.join(export_models.MODELS)})")

    print(f"{'model':<22} {'max abs err':>12} {'bound':>12} {'tern s':>8}  result")
    failed = 0
    for name in names:
        path = export_models.export(opt.models, name)
        feeds = make_inputs(export_models.MODELS[name][1])
        want = run_ort(path, feeds)
        with tempfile.TemporaryDirectory() as work:
            if opt.schedule:
                scheduled = os.path.join(work, "scheduled.onnx")
                subprocess.run([opt.schedule, "-o", scheduled, path], check=True)
                path = scheduled
            t0 = time.monotonic()
            extra = ["--threads", str(opt.threads)] + (["--optimize", opt.optimize] if opt.optimize else [])
            got, problem = run_tern(opt.tern_run, path, feeds, work, extra)
            secs = time.monotonic() - t0
        err, bound = float("nan"), float("nan")
        if got is not None:
            err, bound, problem = compare(want, got)
            if problem is None and not err <= bound:
                problem = "error above bound"
        failed += problem is not None
        print(f"{name:<22} {err:>12.3e} {bound:>12.3e} {secs:>8.2f}  {'FAIL: ' + problem if problem else 'PASS'}")
        sys.stdout.flush()
    print(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
