#!/usr/bin/env python3
"""Recursive models in tern's text syntax, their weights beside them (external data), for the
treebank of scripts/make_treebank.py: a tree's inputs are left, right, word (int64 [nodes]) and root
(int64), its output the root's 5 class scores.

    make_recursive_models.py [--vocab 108] [--hidden 64] [--seed 0] DIR
        DIR/treelstm-train.txt: the same, also reading every node's label (int64 [nodes]) and giving
        the mean cross-entropy over the tree's nodes as output loss (tern-autodiff --loss-output loss)
        DIR/treelstm.txt and DIR/treelstm.bin: a binary TreeLSTM (Tai et al.'s N-ary form). The
        function Node(node, ...) -> (h, c) invokes itself on the node's children under an If (a leaf
        reads its word's embedding), so each call of a tree's node runs without inlining and a node's
        two subtrees are independent calls.
        DIR/treernn.txt, DIR/rntn.txt (and -train.txt, .bin): TreeRNN (h = tanh([ha; hb] W + b), a leaf
        tanh of its word's vector) and RNTN (the same plus the bilinear term [ha; hb]^T V [ha; hb])
    make_recursive_models.py --accuracy SPLIT OUT
        the share of SPLIT's roots whose sign the logits in OUT/logits/ get right (the binary task)
    make_recursive_models.py --compare [--kind treernn|rntn] DIR SPLIT OUT
        the roots' scores that tern-run wrote to OUT/logits/ (one .npy a tree, from
        tern-run -i left=SPLIT/left.pb ... DIR/treelstm.txt -O OUT) against numpy's recursion on the
        same weights: prints the largest difference relative to the scores' scale, exits 1 above 1e-4
"""
import argparse
import os
import sys

import numpy as np

WEIGHTS = ("emb", "wleaf", "bleaf", "winner", "binner", "wout", "bout")


def shapes(v, d):
    return {"emb": (v, d), "wleaf": (d, 3 * d), "bleaf": (3 * d,), "winner": (2 * d, 5 * d), "binner": (5 * d,),
            "wout": (d, 5), "bout": (5,)}


def write(folder, v, d, seed):
    r = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    decl, offset, blobs = [], 0, []
    for name, shape in shapes(v, d).items():
        scale = 1.0 if name == "emb" else 1.0 / np.sqrt(shape[0])
        a = (r.standard_normal(shape) * scale).astype("<f4") if len(shape) > 1 else np.zeros(shape, "<f4")
        blobs.append(a.tobytes())
        dims = ",".join(str(x) for x in shape)
        decl.append(f'float[{dims}] {name} = ["location": "treelstm.bin", "offset": "{offset}", '
                    f'"length": "{a.nbytes}"]')
        offset += a.nbytes
    tmp = os.path.join(folder, "treelstm.bin.tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(blobs))
    os.replace(tmp, os.path.join(folder, "treelstm.bin"))
    args = "node, left, right, word, " + ", ".join(WEIGHTS[:5])
    text = f"""<ir_version: 8, opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
treelstm (int64[N] left, int64[N] right, int64[N] word, int64 root) => (float[5] logits)
   <{(',' + chr(10) + '    ').join(decl)}>
{{
  h, c = tern.Invoke <function = "Node", function_domain = "tree"> (root, left, right, word, {", ".join(WEIGHTS[:5])})
  s = MatMul (h, wout)
  logits = Add (s, bout)
}}
<domain: "tree", opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
Node ({args}) => (h, c) {{
  l = Gather <axis = 0> (left, node)
  zero = Constant <value = int64 {{0}}> ()
  leaf = Less (l, zero)
  h, c = If (leaf) <then_branch = leaf_case () => (float[{d}] hl, float[{d}] cl) {{
    w = Gather <axis = 0> (word, node)
    x = Gather <axis = 0> (emb, w)
    xw = MatMul (x, wleaf)
    g = Add (xw, bleaf)
    gi, go, gu = Split <axis = 0> (g)
    si = Sigmoid (gi)
    tu = Tanh (gu)
    cl = Mul (si, tu)
    so = Sigmoid (go)
    tc = Tanh (cl)
    hl = Mul (so, tc)
  }}, else_branch = inner_case () => (float[{d}] hi, float[{d}] ci) {{
    r = Gather <axis = 0> (right, node)
    ha, ca = tern.Invoke <function = "Node", function_domain = "tree"> (l, left, right, word, {", ".join(WEIGHTS[:5])})
    hb, cb = tern.Invoke <function = "Node", function_domain = "tree"> (r, left, right, word, {", ".join(WEIGHTS[:5])})
    x = Concat <axis = 0> (ha, hb)
    xw = MatMul (x, winner)
    g = Add (xw, binner)
    gi, gfa, gfb, go, gu = Split <axis = 0> (g)
    si = Sigmoid (gi)
    tu = Tanh (gu)
    new = Mul (si, tu)
    sfa = Sigmoid (gfa)
    keepa = Mul (sfa, ca)
    sfb = Sigmoid (gfb)
    keepb = Mul (sfb, cb)
    kept = Add (keepa, keepb)
    ci = Add (new, kept)
    so = Sigmoid (go)
    tc = Tanh (ci)
    hi = Mul (so, tc)
  }}>
}}
"""
    with open(os.path.join(folder, "treelstm.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, "treelstm-train.txt"), "w") as f:
        f.write(train_text(decl, d))
    for kind in SIMPLE:
        write_simple(folder, kind, v, d, seed)


def train_text(decl, d):
    """The TreeLSTM for training: Node also reads the labels and returns the summed cross-entropy of
    its subtree's nodes; the model's loss is its mean over the tree's nodes (tern-autodiff
    --loss-output loss)."""
    w = ", ".join(WEIGHTS)
    args = "node, left, right, word, label, " + w
    return f"""<ir_version: 8, opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
treelstm (int64[N] left, int64[N] right, int64[N] word, int64 root, int64[N] label) => (float[5] logits, float loss)
   <{(',' + chr(10) + '    ').join(decl)}>
{{
  h, c, total = tern.Invoke <function = "Node", function_domain = "tree"> (root, left, right, word, label, {w})
  s = MatMul (h, wout)
  logits = Add (s, bout)
  n = Size (left)
  nf = Cast <to = 1> (n)
  loss = Div (total, nf)
}}
<domain: "tree", opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
Node ({args}) => (h, c, loss) {{
  l = Gather <axis = 0> (left, node)
  zero = Constant <value = int64 {{0}}> ()
  leaf = Less (l, zero)
  h, c, below = If (leaf) <then_branch = leaf_case () => (float[{d}] hl, float[{d}] cl, float bl) {{
    w = Gather <axis = 0> (word, node)
    x = Gather <axis = 0> (emb, w)
    xw = MatMul (x, wleaf)
    g = Add (xw, bleaf)
    gi, go, gu = Split <axis = 0> (g)
    si = Sigmoid (gi)
    tu = Tanh (gu)
    cl = Mul (si, tu)
    so = Sigmoid (go)
    tc = Tanh (cl)
    hl = Mul (so, tc)
    bl = Constant <value = float {{0}}> ()
  }}, else_branch = inner_case () => (float[{d}] hi, float[{d}] ci, float bi) {{
    r = Gather <axis = 0> (right, node)
    ha, ca, la = tern.Invoke <function = "Node", function_domain = "tree"> (l, left, right, word, label, {w})
    hb, cb, lb = tern.Invoke <function = "Node", function_domain = "tree"> (r, left, right, word, label, {w})
    x = Concat <axis = 0> (ha, hb)
    xw = MatMul (x, winner)
    g = Add (xw, binner)
    gi, gfa, gfb, go, gu = Split <axis = 0> (g)
    si = Sigmoid (gi)
    tu = Tanh (gu)
    new = Mul (si, tu)
    sfa = Sigmoid (gfa)
    keepa = Mul (sfa, ca)
    sfb = Sigmoid (gfb)
    keepb = Mul (sfb, cb)
    kept = Add (keepa, keepb)
    ci = Add (new, kept)
    so = Sigmoid (go)
    tc = Tanh (ci)
    hi = Mul (so, tc)
    bi = Add (la, lb)
  }}>
  s = MatMul (h, wout)
  z = Add (s, bout)
  lz = LogSoftmax <axis = 0> (z)
  y = Gather <axis = 0> (label, node)
  ly = Gather <axis = 0> (lz, y)
  own = Neg (ly)
  loss = Add (own, below)
}}
"""


def load_weights(folder, kind="treelstm"):
    """The weights of DIR/KIND.txt, from the external data file beside it."""
    raw = np.fromfile(os.path.join(folder, kind + ".bin"), "<f4")
    text = open(os.path.join(folder, kind + ".txt")).read()
    out = {}
    for name in WEIGHTS if kind == "treelstm" else SIMPLE[kind]:
        head = text.index(f"] {name} = [")
        dims = [int(x) for x in text[text.rindex("float[", 0, head) + 6:head].split(",")]
        at = text.index('"offset": "', head) + 11
        off = int(text[at:text.index('"', at)]) // 4
        out[name] = raw[off:off + int(np.prod(dims))].reshape(dims)
    return out


# TreeRNN (Socher et al. 2011's recursive network: h = tanh([ha; hb] W + b), a leaf its word's vector
# through tanh) and RNTN (Socher et al. 2013: the same plus the bilinear term [ha; hb]^T V [ha; hb],
# V of d slices of 2d x 2d, stored as [2d, 2d d]).
SIMPLE = {"treernn": ("emb", "winner", "binner", "wout", "bout"),
          "rntn": ("emb", "winner", "binner", "tensor", "wout", "bout")}

SIMPLE_TEXT = """<ir_version: 8, opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
KIND (int64[N] left, int64[N] right, int64[N] word, int64 rootLABELIN) => (float[5] logitsLOSSOUT)
   <DECL>
{
  MAINOUTS = tern.Invoke <function = "Node", function_domain = "tree"> (root, left, right, word, LABELARGW)
  s = MatMul (h, wout)
  logits = Add (s, bout)MEANLOSS
}
<domain: "tree", opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
Node (node, left, right, word, LABELARGW) => (NODEOUTS) {
  l = Gather <axis = 0> (left, node)
  zero = Constant <value = int64 {0}> ()
  leaf = Less (l, zero)
  IFOUTS = If (leaf) <then_branch = leaf_case () => LEAFOUTS {
    wd = Gather <axis = 0> (word, node)
    x = Gather <axis = 0> (emb, wd)
    hl = Tanh (x)LEAFLOSS
  }, else_branch = inner_case () => INNEROUTS {
    r = Gather <axis = 0> (right, node)
    HA = tern.Invoke <function = "Node", function_domain = "tree"> (l, left, right, word, LABELARGW)
    HB = tern.Invoke <function = "Node", function_domain = "tree"> (r, left, right, word, LABELARGW)
    x = Concat <axis = 0> (ha, hb)
    xw = MatMul (x, winner)BILINEAR
    hi = Tanh (g)INNERLOSS
  }>NODELOSS
}
"""

TRAIN_PARTS = {
    "MEANLOSS": "\n  n = Size (left)\n  nf = Cast <to = 1> (n)\n  loss = Div (total, nf)",
    "LEAFLOSS": "\n    bl = Constant <value = float {0}> ()",
    "INNERLOSS": "\n    bi = Add (la, lb)",
    "NODELOSS": ("\n  s = MatMul (h, wout)\n  z = Add (s, bout)\n  lz = LogSoftmax <axis = 0> (z)\n"
                 "  y = Gather <axis = 0> (label, node)\n  ly = Gather <axis = 0> (lz, y)\n  own = Neg (ly)\n"
                 "  loss = Add (own, below)"),
}


def simple_shapes(kind, v, d):
    s = {"emb": (v, d), "winner": (2 * d, d), "binner": (d,), "wout": (d, 5), "bout": (5,)}
    if kind == "rntn":
        s["tensor"] = (2 * d, 2 * d * d)
    return {k: s[k] for k in SIMPLE[kind]}


def write_simple(folder, kind, v, d, seed):
    r = np.random.default_rng(seed)
    decl, offset, blobs = [], 0, []
    for name, shape in simple_shapes(kind, v, d).items():
        scale = 1.0 if name == "emb" else 1.0 / np.sqrt(shape[0]) / (np.sqrt(2 * d) if name == "tensor" else 1)
        a = (r.standard_normal(shape) * scale).astype("<f4") if len(shape) > 1 else np.zeros(shape, "<f4")
        blobs.append(a.tobytes())
        dims = ",".join(str(x) for x in shape)
        decl.append(f'float[{dims}] {name} = ["location": "{kind}.bin", "offset": "{offset}", '
                    f'"length": "{a.nbytes}"]')
        offset += a.nbytes
    tmp = os.path.join(folder, kind + ".bin.tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(blobs))
    os.replace(tmp, os.path.join(folder, kind + ".bin"))
    bilinear = (f"\n    t = MatMul (x, tensor)\n    shape = Constant <value = int64[2] {{{d}, {2 * d}}}> ()\n"
                "    tm = Reshape (t, shape)\n    q = MatMul (tm, x)\n    lin = Add (xw, q)\n    g = Add (lin, binner)"
                if kind == "rntn" else "\n    g = Add (xw, binner)")
    for train in (False, True):
        sub = {
            "KIND": kind, "DECL": (",\n    ").join(decl), "BILINEAR": bilinear,
            "LABELIN": ", int64[N] label" if train else "", "LOSSOUT": ", float loss" if train else "",
            "LABELARGW": ("label, " if train else "") + ", ".join(SIMPLE[kind]),
            "MAINOUTS": "h, total" if train else "h", "NODEOUTS": "h, loss" if train else "h",
            "IFOUTS": "h, below" if train else "h",
            "LEAFOUTS": f"(float[{d}] hl, float bl)" if train else f"(float[{d}] hl)",
            "INNEROUTS": f"(float[{d}] hi, float bi)" if train else f"(float[{d}] hi)",
            "HA": "ha, la" if train else "ha", "HB": "hb, lb" if train else "hb",
        }
        for k in TRAIN_PARTS:
            sub[k] = TRAIN_PARTS[k] if train else ""
        text = SIMPLE_TEXT
        for k in sorted(sub, key=len, reverse=True):
            text = text.replace(k, sub[k])
        with open(os.path.join(folder, kind + ("-train" if train else "") + ".txt"), "w") as f:
            f.write(text)


def simple_reference(p, kind, left, right, word, root):
    d = p["emb"].shape[1]

    def node(k):
        if left[k] < 0:
            return np.tanh(p["emb"][word[k]])
        x = np.concatenate([node(left[k]), node(right[k])])
        g = x @ p["winner"] + p["binner"]
        if kind == "rntn":
            g = g + (x @ p["tensor"]).reshape(d, 2 * d) @ x
        return np.tanh(g)

    return node(int(root)) @ p["wout"] + p["bout"]


def reference(p, left, right, word, root):
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    d = p["emb"].shape[1]

    def node(k):
        if left[k] < 0:
            g = p["emb"][word[k]] @ p["wleaf"] + p["bleaf"]
            c = sig(g[:d]) * np.tanh(g[2 * d:])
            return sig(g[d:2 * d]) * np.tanh(c), c
        ha, ca = node(left[k])
        hb, cb = node(right[k])
        g = np.concatenate([ha, hb]) @ p["winner"] + p["binner"]
        gi, gfa, gfb, go, gu = np.split(g, 5)
        c = sig(gi) * np.tanh(gu) + sig(gfa) * ca + sig(gfb) * cb
        return sig(go) * np.tanh(c), c

    h, _ = node(int(root))
    return h @ p["wout"] + p["bout"]


def compare(folder, split, out, kind="treelstm"):
    import onnx
    from onnx import numpy_helper as nh
    sys.setrecursionlimit(10000)
    p = {k: v.astype(np.float64) for k, v in load_weights(folder, kind).items()}

    def seq(name):
        q = onnx.SequenceProto()
        with open(os.path.join(split, name + ".pb"), "rb") as f:
            q.ParseFromString(f.read())
        return [nh.to_array(t) for t in q.tensor_values]

    left, right, word, root = (seq(k) for k in ("left", "right", "word", "root"))
    worst = 0.0
    for e in range(len(left)):
        want = (reference(p, left[e], right[e], word[e], root[e]) if kind == "treelstm"
                else simple_reference(p, kind, left[e], right[e], word[e], root[e]))
        got = np.load(os.path.join(out, "logits", f"{e}.npy"))
        worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-6)))
    print(f"{len(left)} trees: largest difference {worst:.2e} of the scores' scale")
    return 0 if worst <= 1e-4 else 1


def accuracy(split, out):
    """The roots' sign from tern-run's logits (P(3) + P(4) > P(0) + P(1), as make_treebank.py
    --check-tree scores its TreeLSTM) against the treebank's sign of each root."""
    import onnx
    from onnx import numpy_helper as nh
    q = onnx.SequenceProto()
    with open(os.path.join(split, "sign.pb"), "rb") as f:
        q.ParseFromString(f.read())
    signs = [int(nh.to_array(t)) for t in q.tensor_values]
    right = 0
    for e, s in enumerate(signs):
        z = np.load(os.path.join(out, "logits", f"{e}.npy")).astype(np.float64)
        p = np.exp(z - z.max())
        right += int(p[3] + p[4] > p[0] + p[1]) == s
    return right / len(signs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--vocab", type=int, default=108)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--kind", default="treelstm", choices=("treelstm", "treernn", "rntn"),
                    help="the model --compare reads (DIR/KIND.txt)")
    a = ap.parse_args()
    if a.accuracy:
        if len(a.rest) != 1:
            sys.exit("usage: make_recursive_models.py --accuracy SPLIT OUT")
        print(f"root sign accuracy {accuracy(a.dir, a.rest[0]):.4f}")
        return 0
    if a.compare:
        if len(a.rest) != 2:
            sys.exit("usage: make_recursive_models.py --compare DIR SPLIT OUT")
        return compare(a.dir, *a.rest, kind=a.kind)
    write(a.dir, a.vocab, a.hidden, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
