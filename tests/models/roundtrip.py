#!/usr/bin/env python3
"""Graph-file round trips on real models: the exported torchvision/torch.nn models and every model of
the ONNX backend node tests. For each model M:
  - `tern-show -f onnx M` passes onnx.checker and gives outputs identical to M's in onnxruntime
    (for models onnxruntime can run);
  - `tern-show -f text M | tern-show -f onnx | tern-show -f text` equals `tern-show -f text M`;
  - `tern-show -f dot M | dot -Tsvg` succeeds.
Usage: .venv/bin/python tests/models/roundtrip.py [--models DIR] [--node-tests DIR] [--bin DIR] [--limit N]
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import export_models  # noqa: E402


def sh(cmd, data=None):
    return subprocess.run(cmd, input=data, capture_output=True)


def ort_outputs(model_bytes, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def feeds_for(model):
    """Seeded random feeds from the declared inputs (symbolic dimensions become 1); None if unknown."""
    rng = np.random.default_rng(0)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            return None
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[vi.name] = rng.integers(0, 3, shape).astype(dtype)
        else:
            return None
    return feeds


def check(path, bindir, work):
    """Returns a list of problems (empty when every check holds)."""
    show = os.path.join(bindir, "tern-show")
    problems = []
    binary = sh([show, "-f", "onnx", path])
    if binary.returncode != 0:
        return [f"tern-show -f onnx: {binary.stderr.decode().strip()}"], False
    try:
        onnx.checker.check_model(onnx.load_from_string(binary.stdout))
    except Exception as e:  # the checker's own exception types vary by version
        problems.append(f"onnx.checker rejects tern's file: {str(e).splitlines()[0]}")
    with open(path, "rb") as f:
        original_bytes = f.read()
    identical = binary.stdout == original_bytes
    original = onnx.load_from_string(original_bytes)
    # A byte-identical file runs identically: onnxruntime is only consulted when the bytes differ.
    feeds = None if identical else feeds_for(original)
    if feeds is not None:
        try:
            want = ort_outputs(original.SerializeToString(), feeds)
        except Exception:
            want = None  # onnxruntime cannot run the original: nothing to compare
        if want is not None:
            try:
                got = ort_outputs(binary.stdout, feeds)
                for w, g in zip(want, got):
                    w, g = np.asarray(w), np.asarray(g)
                    floats = np.issubdtype(w.dtype, np.floating) and np.issubdtype(g.dtype, np.floating)
                    if not np.array_equal(w, g, equal_nan=floats):
                        problems.append("onnxruntime gives different outputs for tern's file")
                        break
            except Exception as e:
                problems.append(f"onnxruntime cannot run tern's file: {str(e).splitlines()[0]}")
    text = sh([show, "-f", "text", "--weights", path])
    if text.returncode != 0:
        problems.append(f"tern-show -f text: {text.stderr.decode().strip()}")
    else:
        again = sh([show, "-f", "onnx"], text.stdout)
        third = sh([show, "-f", "text", "--weights"], again.stdout) if again.returncode == 0 else again
        if third.returncode != 0 or third.stdout != text.stdout:
            problems.append("text -> onnx -> text is not stable")
    dot = sh([show, "-f", "dot", path])
    svg = sh(["dot", "-Tsvg", "-o", os.devnull], dot.stdout) if dot.returncode == 0 else dot
    if svg.returncode != 0:
        problems.append(f"dot: {svg.stderr.decode().strip()[:200]}")
    return problems, identical


def main():
    ap = argparse.ArgumentParser()
    build = os.environ.get("TERN_BUILD", "build")
    ap.add_argument("--models", default=os.path.join(build, "tests", "models", "cache"))
    ap.add_argument("--node-tests", default=os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node"))
    ap.add_argument("--bin", default=os.path.join(build, "bin"))
    ap.add_argument("--limit", type=int, default=0, help="check only the first N node-test models")
    args = ap.parse_args()
    paths = [export_models.export(args.models, name) for name in export_models.MODELS]
    node = sorted(glob.glob(os.path.join(args.node_tests, "*", "model.onnx")))
    if args.limit:
        node = node[: args.limit]
    failed = same = 0
    with tempfile.TemporaryDirectory() as work:
        for p in paths + node:
            problems, identical = check(p, args.bin, work)
            same += identical
            name = os.path.relpath(p, args.node_tests) if p in node else os.path.basename(p)
            if problems:
                failed += 1
                print(f"FAIL {name}: " + "; ".join(problems))
    print(f"round trips: {len(paths)} exported models, {len(node)} node-test models "
          f"({same} written back byte for byte), {failed} failed")
    return 1 if failed or not paths else 0


if __name__ == "__main__":
    sys.exit(main())
