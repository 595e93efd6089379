#!/usr/bin/env python3
"""A model with more than 2 GB of weights in external data through every stage that writes graphs.

    external.py --bin BUILD/bin --work DIR [--gib G]

Builds a stack of MatMul+Tanh layers whose weights (G GiB, default 2.1: over protobuf's 2 GB limit)
live in one data file, then checks that
  - tern-optimize -o | tern-schedule -o | tern-run, each in its own folder, give onnxruntime's outputs;
  - tern-show -f onnx -o in another folder writes a pair that onnxruntime runs to the same outputs;
  - tern-optimize big.onnx | tern-run refuses in one line (exit 64) and writes nothing;
  - tern-run's peak resident memory stays below 1.2x the weights' size.
Prints one line per check; exits 1 when one fails. The model is removed afterwards (it is big).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np

D = 4096


def build(path, layers):
    """Writes the weights straight to the data file (onnx's writer keeps them all in memory)."""
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    with open(os.path.join(os.path.dirname(path), "weights.bin"), "wb") as f:
        for i in range(layers):
            w = rng.standard_normal((D, D), dtype=np.float32)
            w *= np.float32(1.0 / np.sqrt(D))
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[D, D],
                            data_location=TensorProto.EXTERNAL)
            for k, v in (("location", "weights.bin"), ("offset", str(f.tell())), ("length", str(w.nbytes))):
                t.external_data.add(key=k, value=v)
            w.tofile(f)
            inits.append(t)
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
            nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
            x = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, D])], inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def ort_run(model, x_path, y_path):
    import onnxruntime as ort
    x = np.load(x_path)
    np.save(y_path, ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0])


def helper_step(*args):
    """Runs a step of this script in a process of its own, so that this one stays small: a child
    forked from a big process starts with the parent's peak resident size, which would then be
    counted as the child's."""
    subprocess.run([sys.executable, os.path.abspath(__file__), "--step"] + [str(a) for a in args], check=True)


def run(cmd, **kw):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    out, err = p.communicate()
    return p.returncode, out, err.decode(errors="replace")


def peak_rss(cmd):
    """Runs cmd and returns (exit status, stderr, peak resident set in bytes)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--bin")
    ap.add_argument("--work")
    ap.add_argument("--gib", type=float, default=2.1)
    a = ap.parse_args()
    if a.step:
        if a.step[0] == "build":
            build(a.step[1], int(a.step[2]))
        else:
            ort_run(*a.step[1:])
        return 0
    if not a.bin or not a.work:
        ap.error("--bin and --work are required")
    tool = lambda name: os.path.join(a.bin, name)
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("src", "opt", "sched", "show", "out"):
        os.makedirs(os.path.join(work, sub))
    layers = max(1, int(round(a.gib * (1 << 30) / (D * D * 4))))
    weights = layers * D * D * 4
    src = os.path.join(work, "src", "big.onnx")
    t0 = time.time()
    helper_step("build", src, layers)
    print(f"# built {layers} layers, {weights / 1e9:.2f} GB of weights in external data ({time.time() - t0:.0f} s)")

    failed = 0

    def check(ok, what):
        nonlocal failed
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok

    x_path = os.path.join(work, "x.npy")
    np.save(x_path, np.random.default_rng(1).standard_normal((1, D), dtype=np.float32))
    helper_step("ort", src, x_path, os.path.join(work, "expect.npy"))
    expect = np.load(os.path.join(work, "expect.npy"))

    opt = os.path.join(work, "opt", "opt.onnx")
    sched = os.path.join(work, "sched", "s.onnx")
    rc1, _, e1 = run([tool("tern-optimize"), src, "-o", opt])
    rc2, _, e2 = run([tool("tern-schedule"), opt, "-o", sched])
    check(rc1 == 0 and rc2 == 0 and os.path.exists(opt + ".data") and os.path.exists(sched + ".data"),
          f"tern-optimize -o and tern-schedule -o write FILE and FILE.data {e1.strip()} {e2.strip()}")
    rc, err, rss = peak_rss([tool("tern-run"), sched, "-i", "x=" + os.path.join(work, "x.npy"),
                             "-O", os.path.join(work, "out")])
    got = np.load(os.path.join(work, "out", "y.npy")) if rc == 0 else None
    diff = float(np.abs(got - expect).max()) if got is not None else float("inf")
    check(rc == 0 and diff < 1e-4, f"tern-optimize -o | tern-schedule -o | tern-run matches onnxruntime "
                                   f"(max |diff| {diff:.2e}) {err.strip()}")
    check(rc == 0 and rss < 1.2 * weights,
          f"tern-run peak memory {rss / 1e9:.2f} GB = {rss / weights:.3f}x the weights (< 1.2x)")

    show = os.path.join(work, "show", "show.onnx")
    rc, _, err = run([tool("tern-show"), "-f", "onnx", src, "-o", show])
    ok = rc == 0 and os.path.getsize(show) < (1 << 20)
    if ok:
        helper_step("ort", show, x_path, os.path.join(work, "show.npy"))
        ok = np.array_equal(np.load(os.path.join(work, "show.npy")), expect)
    check(ok, f"tern-show -f onnx -o in another folder: onnxruntime gives the same outputs {err.strip()}")

    opt_p = subprocess.Popen([tool("tern-optimize"), src], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run_p = subprocess.Popen([tool("tern-run"), "--random"], stdin=opt_p.stdout, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    opt_p.stdout.close()
    _, run_err = run_p.communicate()
    opt_err = opt_p.stderr.read().decode()
    opt_p.wait()
    lines = [l for l in opt_err.splitlines() if l]
    check(opt_p.returncode == 64 and len(lines) == 1 and "-o" in lines[0] and run_p.returncode != 0,
          f"tern-optimize big.onnx | tern-run refuses in one line: {lines}")

    shutil.rmtree(work, ignore_errors=True)
    print(f"{'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
