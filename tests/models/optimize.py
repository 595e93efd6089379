#!/usr/bin/env python3
"""tern-optimize on the exported models: outputs after -O1, -O2 and -O3 match the original's in tern-run
(max|opt - orig| <= 1e-4 * max|orig| + 1e-5); the -O1 graph passes onnx.checker and runs in onnxruntime
with matching outputs; optimising an optimised graph changes nothing (text comparison); and -O2 leaves
no more nodes than onnxruntime's own optimised model (ORT_ENABLE_EXTENDED), layout conversions
(tern.ToBlocks, tern.FromBlocks) not counted since that level leaves out onnxruntime's layout pass.

Usage: .venv/bin/python tests/models/optimize.py [--models DIR] [--build DIR] [NAME...]
Defaults: DIR is $TERN_BUILD/tests/models/cache (exported on first use), the build $TERN_BUILD or build.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402
from parity import export_models  # noqa: E402

LEVELS = (1, 2, 3)


def tool(build, name):
    return os.path.join(build, "bin", name)


def optimize(build, src, dst, level):
    p = subprocess.run([tool(build, "tern-optimize"), f"-O{level}", "-o", dst, src], capture_output=True, text=True)
    return None if p.returncode == 0 else f"tern-optimize -O{level} exit {p.returncode}: {p.stderr.strip()}"


def text(build, path):
    p = subprocess.run([tool(build, "tern-show"), "-f", "text", path], capture_output=True, text=True, check=True)
    return p.stdout


def idempotent(build, path, level):
    """tern-optimize of an optimised graph prints as the same text."""
    p = subprocess.run(f"'{tool(build, 'tern-optimize')}' -O{level} '{path}' | '{tool(build, 'tern-show')}' -f text",
                       shell=True, capture_output=True, text=True)
    return p.returncode == 0 and p.stdout == text(build, path)


def ort_node_count(path, work):
    out = os.path.join(work, "ort.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = out
    so.intra_op_num_threads = 1
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return len(onnx.load(out, load_external_data=False).graph.node)


def within(want, got):
    err, bound, problem = parity.compare(want, got)
    if problem is None and not err <= bound:
        problem = f"max error {err:.3e} above {bound:.3e}"
    return problem


def check_model(build, path, name, work):
    """Returns (list of problems, -O2 node count, onnxruntime's node count)."""
    problems = []
    feeds = parity.make_inputs(export_models.MODELS[name][1])
    run_tern = tool(build, "tern-run")
    base, problem = parity.run_tern(run_tern, path, feeds, os.path.join(work, "base"))
    if problem:
        return [f"original: {problem}"], None, None
    nodes = None
    for level in LEVELS:
        opt = os.path.join(work, f"O{level}.onnx")
        problem = optimize(build, path, opt, level)
        if problem:
            problems.append(problem)
            continue
        got, problem = parity.run_tern(run_tern, opt, feeds, os.path.join(work, f"run{level}"))
        problem = problem or within(base, got)
        if problem:
            problems.append(f"-O{level}: {problem}")
        if not idempotent(build, opt, level):
            problems.append(f"-O{level}: optimising the optimised graph changes it")
        if level == 1:
            try:
                onnx.checker.check_model(onnx.load(opt), full_check=True)
                problem = within(parity.run_ort(path, feeds), parity.run_ort(opt, feeds))
                if problem:
                    problems.append(f"-O1 in onnxruntime: {problem}")
            except Exception as e:  # the checker and onnxruntime raise their own kinds
                problems.append(f"-O1: {type(e).__name__}: {str(e).splitlines()[0]}")
        if level == 2:
            # layout conversions are not counted: ORT_ENABLE_EXTENDED leaves out onnxruntime's own
            # (its blocked layout, with its reorder nodes, comes at ORT_ENABLE_ALL)
            nodes = sum(1 for n in onnx.load(opt, load_external_data=False).graph.node
                        if not (n.domain == "tern" and n.op_type in ("ToBlocks", "FromBlocks")))
    theirs = ort_node_count(path, work)
    if nodes is not None and nodes > theirs:
        problems.append(f"-O2 leaves {nodes} nodes, onnxruntime {theirs}")
    return problems, nodes, theirs


def main():
    build = os.environ.get("TERN_BUILD", "build")
    ap = argparse.ArgumentParser(description="Check tern-optimize on exported models.")
    ap.add_argument("--models", default=os.path.join(build, "tests", "models", "cache"))
    ap.add_argument("--build", default=build)
    ap.add_argument("names", nargs="*", metavar="NAME")
    opt = ap.parse_args()
    names = opt.names or list(export_models.MODELS)
    for n in names:
        if n not in export_models.MODELS:
            sys.exit(f"optimize: unknown model {n!r} (known: {', '.join(export_models.MODELS)})")
    print(f"{'model':<22} {'nodes':>6} {'-O2':>6} {'ort':>6}  result")
    failed = 0
    for name in names:
        path = export_models.export(opt.models, name)
        before = len(onnx.load(path, load_external_data=False).graph.node)
        with tempfile.TemporaryDirectory() as work:
            problems, nodes, theirs = check_model(opt.build, path, name, work)
        failed += bool(problems)
        result = "FAIL: " + "; ".join(problems) if problems else "PASS"
        print(f"{name:<22} {before:>6} {nodes if nodes is not None else '-':>6} {theirs or '-':>6}  {result}")
        sys.stdout.flush()
    print(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
