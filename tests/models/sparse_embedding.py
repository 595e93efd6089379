#!/usr/bin/env python3
"""Sparse gradients of an embedding table: a bag-of-words classifier over a 1,000,000 x 64 table
(256 MB of float32, in an external data file) trained from the shell, once with the gradient as the
rows read (tern-autodiff's default) and once with --dense-gradients, in the same run.

    sparse_embedding.py --bin BUILD/bin --work DIR [--rows 1000000] [--steps 10]

Checks, for SGD (only the rows read are updated) and for Adam (every row's moments decay):
  - both runs end with the same parameters (bit for bit: the same arithmetic on the same sums);
  - the sparse run's arena (tern-run -v) is under a tenth of the table, the dense one's over it;
  - the sparse run's peak resident memory is below the dense run's by at least 3/4 of the table.
Prints the figures: peak memory, arena, milliseconds a step.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np


def rss_of(cmd):
    """(stderr, peak resident bytes, seconds) of a fresh process, under GNU time."""
    with tempfile.NamedTemporaryFile("r") as t:
        p = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%M %e"] + cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"FAIL {' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
        kb, secs = t.read().strip().splitlines()[-1].split()
    return p.stderr, int(kb) * 1024, float(secs)


def make_model(path, rows, dim, classes, seq):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((rows, dim), dtype=np.float32) * 0.1).astype(np.float32)
    w = (rng.standard_normal((dim, classes), dtype=np.float32) * 0.1).astype(np.float32)
    b = np.zeros(classes, np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "tokens"], ["emb"]),
         helper.make_node("ReduceMean", ["emb"], ["bag"], axes=[1], keepdims=0),
         helper.make_node("Gemm", ["bag", "w", "b"], ["logits"])],
        "bag_of_words",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")  # onnx.save appends to a data file that is there
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=os.path.basename(path) + ".data", size_threshold=1024)


def trained_table(path):
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.name in ("table", "w", "b")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    dim, classes, seq, batch = 64, 10, 16, 64
    table_bytes = a.rows * dim * 4
    w = lambda *p: os.path.join(a.work, *p)
    make_model(w("bow.onnx"), a.rows, dim, classes, seq)
    rng = np.random.default_rng(1)
    n = batch * a.steps
    np.save(w("tokens.npy"), rng.integers(0, a.rows, (n, seq), dtype=np.int64))
    np.save(w("label.npy"), rng.integers(0, classes, n, dtype=np.int64))
    failed = 0
    for opt, lr in (("sgd", "0.5"), ("adam", "1e-2")):
        res, params = {}, {}
        for kind in ("rows", "dense"):
            train = w(f"{opt}-{kind}-train.onnx")
            cmd = [os.path.join(a.bin, "tern-autodiff"), "--loss", "cross-entropy", "--target", "label", "--optimizer",
                   opt, "--lr", lr, w("bow.onnx"), "-o", train]
            if kind == "dense":
                cmd.append("--dense-gradients")
            subprocess.run(cmd, check=True, capture_output=True)
            err, rss, secs = rss_of([os.path.join(a.bin, "tern-run"), "--train", train, "-i", "tokens=" + w("tokens.npy"),
                                     "-i", "label=" + w("label.npy"), "--batch", str(batch), "--steps", str(a.steps),
                                     "-v", "-o", w(f"{opt}-{kind}-trained.onnx")])
            arena = int(re.search(r"arena (\d+) bytes", err).group(1))
            inplace = re.search(r"(\d+) of (\d+) parameters and state tensors updated in place", err).groups()
            res[kind] = (rss, arena, secs, inplace)
            params[kind] = trained_table(w(f"{opt}-{kind}-trained.onnx"))
            for f in (train, w(f"{opt}-{kind}-trained.onnx")):  # hundreds of MB each
                for p in (f, f + ".data"):
                    if os.path.exists(p):
                        os.remove(p)
            print(f"     {opt:4} {kind:5}: peak {rss / 2**20:7.1f} MB, arena {arena / 2**20:7.2f} MB, "
                  f"{inplace[0]} of {inplace[1]} updated in place, {secs:.2f} s for {a.steps} steps "
                  f"(table {table_bytes / 2**20:.0f} MB)")
        ps, pd = params["rows"], params["dense"]
        same = all(np.array_equal(ps[k], pd[k]) for k in ps)
        moved = not np.array_equal(ps["table"], trained_table(w("bow.onnx"))["table"])
        checks = [
            (same and moved, "the rows and the dense run end with the same parameters (and the table trained)"),
            (res["rows"][1] < table_bytes / 10, f"the rows run's arena is under a tenth of the table"),
            (res["dense"][1] >= table_bytes, "the dense run's arena holds a gradient of the table's size"),
            (res["dense"][0] - res["rows"][0] >= 0.75 * table_bytes,
             "the rows run peaks at least 3/4 of the table below the dense run"),
        ]
        for ok, what in checks:
            print(f"{'ok  ' if ok else 'FAIL'} {opt}: {what}")
            failed += not ok
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
