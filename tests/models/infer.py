#!/usr/bin/env python3
"""tern-show --infer-shapes against onnx.shape_inference on the exported models.

    infer.py --models DIR --bin BUILD/bin [NAME...]

For every model: each value that onnx's inference gives a shape must get the same type from tern
(element type, rank, every dimension: the same number, or the same symbol); after tern-optimize -O2,
tern must type more values than onnx does on the same graph (onnx does not know tern's operators),
or all of them;
every edge that tern-show -f dot draws from a value must carry a type label. Prints one line per
model and exits 1 on any disagreement.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

import onnx
from onnx import shape_inference


def types_of(graph, skip):
    """name -> (elem_type, dims) for every value_info / output with a tensor type and a shape."""
    out = {}
    for vi in list(graph.value_info) + list(graph.output):
        if vi.name in skip or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = []
        for d in tt.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None))
        out[vi.name] = (tt.elem_type, dims)
    return out


def agrees(theirs, ours):
    if ours is None or theirs[0] != ours[0] or len(theirs[1]) != len(ours[1]):
        return False
    # onnx's own invented symbols (unk__N) name dimensions it could not compute: any answer agrees
    return all(t is None or (isinstance(t, str) and t.startswith("unk__")) or t == o
               for t, o in zip(theirs[1], ours[1]))


def tern_show(bin_dir, args, stdin=None):
    p = subprocess.run([os.path.join(bin_dir, "tern-show")] + args, input=stdin, capture_output=True)
    if p.returncode:
        raise RuntimeError(p.stderr.decode().strip())
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(a.models, "*.onnx")))
    if a.names:
        paths = [p for p in paths if os.path.basename(p)[:-5] in a.names]
    if not paths:
        print(f"no models in {a.models}")
        return 1
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            name = os.path.basename(path)[:-5]
            model = onnx.load(path)
            given = {vi.name for vi in model.graph.input} | {t.name for t in model.graph.initializer}
            theirs = types_of(shape_inference.infer_shapes(model).graph, given)
            out = os.path.join(tmp, name + ".onnx")
            tern_show(a.bin, ["-f", "onnx", "--infer-shapes", path, "-o", out])
            ours = types_of(onnx.load(out, load_external_data=False).graph, given)
            bad = [(k, v, ours.get(k)) for k, v in theirs.items() if not agrees(v, ours.get(k))]

            opt = subprocess.run([os.path.join(a.bin, "tern-optimize"), path], capture_output=True, check=True).stdout
            opt_model = onnx.load_from_string(opt)
            given_opt = {vi.name for vi in opt_model.graph.input} | {t.name for t in opt_model.graph.initializer}
            n_values = len({o for n in opt_model.graph.node for o in n.output if o} - given_opt)
            theirs_opt = len(types_of(shape_inference.infer_shapes(opt_model).graph, given_opt))
            ours_opt = len(types_of(onnx.load_from_string(tern_show(a.bin, ["-f", "onnx", "--infer-shapes", "-"], opt)).graph,
                                    given_opt))

            dot = tern_show(a.bin, ["-f", "dot", path]).decode()
            edges = re.findall(r"->\s*\S+\s*(\[[^\]]*\])?", dot)
            unlabelled = sum(1 for e in edges if not re.search(r'label="[a-z0-9]+\[', e or ""))

            ok = not bad and (ours_opt > theirs_opt or ours_opt == n_values) and unlabelled == 0
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(theirs) - len(bad)}/{len(theirs)} of onnx's shapes agree; "
                  f"after -O2 tern types {ours_opt}/{n_values} values, onnx {theirs_opt}; "
                  f"{len(edges) - unlabelled}/{len(edges)} DOT edges labelled")
            for k, t, o in bad[:5]:
                print(f"     {k}: onnx {t}, tern {o}")
    print(f"{len(paths) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
