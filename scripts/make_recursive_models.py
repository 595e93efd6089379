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
        DIR/KIND-iter.txt (and -iter-train.txt): the same model as one Loop over the tree's nodes in
        their order, each trip one node (the iterative baseline)
        DIR/KIND-levels.txt (and -levels-train.txt): one Loop over the tree's heights, each trip all
        nodes of one height at once (level-by-level batching); also reads level_order and
        level_starts (make_treebank.py)
    make_recursive_models.py --unroll [--kind treelstm|treernn|rntn] [--train] [--first N] DIR SPLIT OUT
        OUT/E.txt for each tree E of SPLIT: one static graph of the tree (the unrolled baseline), each
        node of the tree its own operators, the words (with --train the labels too, and the loss
        as an output) its inputs, in OUT/E-word.npy (and OUT/E-label.npy); OUT/KIND.bin a copy of
        DIR's weights
    make_recursive_models.py --accuracy SPLIT OUT
        the share of SPLIT's roots whose sign the logits in OUT/logits/ get right (the binary task)
    make_recursive_models.py --compare [--kind treernn|rntn] DIR SPLIT OUT
        the roots' scores that tern-run wrote to OUT/logits/ (one .npy a tree, from
        tern-run -i left=SPLIT/left.pb ... DIR/treelstm.txt -O OUT) against numpy's recursion on the
        same weights: prints the largest difference relative to the scores' scale, exits 1 above 1e-4
"""
import argparse
import os
import re
import shutil
import sys

import numpy as np

# The models: each one's weights, in the order they are stored and passed to Node, and the state a node
# returns beyond h (a TreeLSTM's memory cell c).
KINDS = {
    # Tai et al.'s binary (N-ary) TreeLSTM
    "treelstm": ("emb", "wleaf", "bleaf", "winner", "binner", "wout", "bout"),
    # Socher et al. 2011's recursive network: h = tanh([ha; hb] W + b), a leaf tanh of its word's vector
    "treernn": ("emb", "winner", "binner", "wout", "bout"),
    # Socher et al. 2013: the same plus the bilinear term [ha; hb]^T V [ha; hb], V of d slices of
    # 2d x 2d, stored as [2d, 2d d]
    "rntn": ("emb", "winner", "binner", "tensor", "wout", "bout"),
}
WEIGHTS = KINDS["treelstm"]


def kind_shapes(kind, v, d):
    s = {"emb": (v, d), "wleaf": (d, 3 * d), "bleaf": (3 * d,), "winner": (2 * d, 5 * d if kind == "treelstm" else d),
         "binner": (5 * d if kind == "treelstm" else d,), "tensor": (2 * d, 2 * d * d), "wout": (d, 5), "bout": (5,)}
    return {k: s[k] for k in KINDS[kind]}


LEAF = {
    "treelstm": """
    x = Gather <axis = 0> (emb, wd)
    xw = MatMul (x, wleaf)
    g = Add (xw, bleaf)
    gi, go, gu = Split <axis = 0> (g)
    si = Sigmoid (gi)
    tu = Tanh (gu)
    cl = Mul (si, tu)
    so = Sigmoid (go)
    tc = Tanh (cl)
    hl = Mul (so, tc)""",
    "simple": """
    x = Gather <axis = 0> (emb, wd)
    hl = Tanh (x)""",
}

INNER = {
    "treelstm": """
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
    hi = Mul (so, tc)""",
    "treernn": """
    xw = MatMul (x, winner)
    g = Add (xw, binner)
    hi = Tanh (g)""",
    "rntn": """
    xw = MatMul (x, winner)
    t = MatMul (x, tensor)
    shape = Constant <value = int64[2] {D, D2}> ()
    tm = Reshape (t, shape)
    q = MatMul (tm, x)
    lin = Add (xw, q)
    g = Add (lin, binner)
    hi = Tanh (g)""",
}

# A node's loss in the training model: its own cross-entropy plus its subtree's (below).
NODE_LOSS = """
  s = MatMul (h, wout)
  z = Add (s, bout)
  lz = LogSoftmax <axis = 0> (z)
  y = Gather <axis = 0> (label, node)
  ly = Gather <axis = 0> (lz, y)
  own = Neg (ly)
  loss = Add (own, below)"""


def model_text(kind, decl, d, train):
    """KIND.txt, or with train KIND-train.txt: Node(node, left, right, word[, label], weights...)
    invokes itself on the node's children under an If (a leaf reads its word's embedding); with train
    it also returns the summed cross-entropy of its subtree's nodes, the model's loss its mean over
    the tree."""
    state = ["h", "c"] if kind == "treelstm" else ["h"]
    args = ("label, " if train else "") + ", ".join(KINDS[kind])
    loss = ["loss"] if train else []

    def named(suffix, extra):
        return ", ".join([s + suffix for s in state] + extra)

    def typed(suffix, extra):
        return ", ".join([f"float[{d}] {s}{suffix}" for s in state] + [f"float {x}" for x in extra])

    call = 'tern.Invoke <function = "Node", function_domain = "tree">'
    inner = INNER[kind].replace("D2", str(2 * d)).replace("D,", f"{d},")
    return f"""<ir_version: 8, opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
{kind} (int64[N] left, int64[N] right, int64[N] word, int64 root{", int64[N] label" if train else ""}) => (float[5] logits{", float loss" if train else ""})
   <{(',' + chr(10) + '    ').join(decl)}>
{{
  {named("", ["total"] if train else [])} = {call} (root, left, right, word, {args})
  s = MatMul (h, wout)
  logits = Add (s, bout){'''
  n = Size (left)
  nf = Cast <to = 1> (n)
  loss = Div (total, nf)''' if train else ""}
}}
<domain: "tree", opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
Node (node, left, right, word, {args}) => ({named("", loss)}) {{
  l = Gather <axis = 0> (left, node)
  zero = Constant <value = int64 {{0}}> ()
  leaf = Less (l, zero)
  {named("", ["below"] if train else [])} = If (leaf) <then_branch = leaf_case () => ({typed("l", ["bl"] if train else [])}) {{
    wd = Gather <axis = 0> (word, node){LEAF["treelstm" if kind == "treelstm" else "simple"]}{'''
    bl = Constant <value = float {0}> ()''' if train else ""}
  }}, else_branch = inner_case () => ({typed("i", ["bi"] if train else [])}) {{
    r = Gather <axis = 0> (right, node)
    {named("a", ["la"] if train else [])} = {call} (l, left, right, word, {args})
    {named("b", ["lb"] if train else [])} = {call} (r, left, right, word, {args})
    x = Concat <axis = 0> (ha, hb){inner}{'''
    bi = Add (la, lb)''' if train else ""}
  }}>{NODE_LOSS if train else ""}
}}
"""


def iter_text(kind, decl, d, train, levels=False):
    """KIND-iter.txt, or with train KIND-iter-train.txt: the iterative form of KIND.txt, one Loop over
    the tree's nodes in their order (children come before their parent), each step computing one
    node's state from its children's rows of the states so far and writing its own row (ScatterND).
    With levels, KIND-levels.txt (-train): level-by-level batching, one Loop over the tree's heights
    (make_treebank.py's level_order and level_starts), each step computing all nodes of one height at
    once (the leaves, then batches of inner nodes whose children are done). With train, the loss is
    the mean cross-entropy over the nodes, as KIND-train.txt's."""
    state = ["h", "c"] if kind == "treelstm" else ["h"]
    big = {s: s.upper() for s in state}
    args = ", ".join(f"float[N,{d}] {big[s]}" for s in state)
    outs = ", ".join(f"float[N,{d}] {big[s]}o" for s in state)
    inner = INNER[kind].replace("D2", str(2 * d)).replace("D,", f"{d},")
    leaf = LEAF["treelstm" if kind == "treelstm" else "simple"]
    at, dims = ("idx", f"[M,{d}]") if levels else ("k", f"[{d}]")  # a trip's node(s), and their state's shape
    if levels:
        # a batch of rows: split and concatenate along axis 1; RNTN's bilinear term row by row
        leaf, inner = (t.replace("Split <axis = 0>", "Split <axis = 1>") for t in (leaf, inner))
        inner = inner.replace(f"shape = Constant <value = int64[2] {{{d}, {2 * d}}}> ()",
                              f"shape = Constant <value = int64[3] {{-1, {d}, {2 * d}}}> ()").replace(
            "q = MatMul (tm, x)", "two = Constant <value = int64[1] {2}> ()\n    xs = Unsqueeze (x, two)\n"
                                   "    q3 = MatMul (tm, xs)\n    q = Squeeze (q3, two)")
    gathers = "".join(f"""
      {s}a = Gather <axis = 0> ({big[s]}, l{"i" if levels else ""})
      {s}b = Gather <axis = 0> ({big[s]}, r)""" for s in state)
    if levels:
        writes = "".join(f"""
    {big[s]}o = ScatterND ({big[s]}, kk, {s})""" for s in state)
    else:
        writes = "".join(f"""
    {s}u = Unsqueeze ({s}, zeros)
    {big[s]}o = ScatterND ({big[s]}, kk, {s}u)""" for s in state)
    starts = "".join(f"""
  {big[s]}0 = ConstantOfShape (shp)""" for s in state)
    typed = lambda suffix: ", ".join(f"float{dims} {s}{suffix}" for s in state)  # noqa: E731
    named = lambda suffix, up=False: ", ".join((big[s] if up else s) + suffix for s in state)  # noqa: E731
    label = ", int64[N] label" if train else ""
    tail = """
  zs = MatMul (Hn, wout)
  z = Add (zs, bout)
  lz = LogSoftmax <axis = 1> (z)
  lab = Unsqueeze (label, ones)
  picked = GatherElements <axis = 1> (lz, lab)
  mean = ReduceMean <keepdims = 0> (picked)
  loss = Neg (mean)""" if train else ""
    if levels:
        trips = """
  nh = Size (level_starts)
  one = Constant <value = int64 {1}> ()
  trips = Sub (nh, one)"""
        which = """
    l1 = Add (k, one)
    ku = Unsqueeze (k, zeros)
    l1u = Unsqueeze (l1, zeros)
    b = Gather <axis = 0> (level_starts, ku)
    e = Gather <axis = 0> (level_starts, l1u)
    idx = Slice (level_order, b, e)
    zero = Constant <value = int64 {0}> ()
    leaf = Equal (k, zero)"""
        before_inner = "li = Gather <axis = 0> (left, idx)\n      r = Gather <axis = 0> (right, idx)"
        index = "kk = Unsqueeze (idx, ones)"
        extra_in = ", int64[N] level_order, int64[H] level_starts"
    else:
        trips, which = "", """
    l = Gather <axis = 0> (left, k)
    zero = Constant <value = int64 {0}> ()
    leaf = Less (l, zero)"""
        before_inner = "r = Gather <axis = 0> (right, k)"
        index = "kk = Reshape (k, shape11)"
        extra_in = ""
    return f"""<ir_version: 8, opset_import: ["" : 17]>
{kind} (int64[N] left, int64[N] right, int64[N] word, int64 root{label}{extra_in}) => (float[5] logits{", float loss" if train else ""})
   <{(',' + chr(10) + '    ').join(decl)}>
{{
  n = Size (left)
  zeros = Constant <value = int64[1] {{0}}> ()
  ones = Constant <value = int64[1] {{1}}> ()
  n1 = Unsqueeze (n, zeros)
  dd = Constant <value = int64[1] {{{d}}}> ()
  shp = Concat <axis = 0> (n1, dd){starts}{trips}
  shape11 = Constant <value = int64[2] {{1, 1}}> ()
  always = Constant <value = bool {{1}}> ()
  {named("n", True)} = Loop ({"trips" if levels else "n"}, always, {named("0", True)}) <body = step (int64 k, bool cin, {args}) => (bool cout, {outs}) {{
    cout = Identity (cin){which}
    {named("")} = If (leaf) <then_branch = leaf_case () => ({typed("l")}) {{
      wd = Gather <axis = 0> (word, {at}){leaf.replace(chr(10) + "    ", chr(10) + "      ")}
    }}, else_branch = inner_case () => ({typed("i")}) {{
      {before_inner}{gathers}
      x = Concat <axis = {1 if levels else 0}> (ha, hb){inner.replace(chr(10) + "    ", chr(10) + "      ")}
    }}>
    {index}{writes}
  }}>
  hr = Gather <axis = 0> (Hn, root)
  s = MatMul (hr, wout)
  logits = Add (s, bout){tail}
}}
"""


def unrolled_text(kind, decl, d, left, right, word, root, label=None):
    """One tree's static graph (the unrolled baseline): every node of the tree its own operators, in
    children-first order; the tree's shape is the graph's, its words (and with label, its labels)
    the graph's inputs, as in the recursive model; output the root's logits, or with label also the
    loss of KIND-train.txt."""
    leaf_src = LEAF["treelstm" if kind == "treelstm" else "simple"]
    inner_src = INNER[kind].replace("D2", str(2 * d)).replace("D,", f"{d},")
    body = []

    def emit(src, k, given, outs):
        """src's lines for node k: names it defines get the suffix _k, `given` maps its free names
        (children's states, the word id, x) to values, `outs` its results to node k's state."""
        lines = [ln.strip() for ln in src.strip().splitlines()]
        defined = {n.strip() for ln in lines for n in ln.split("=", 1)[0].split(",")}
        names = {n: f"{n}_{k}" for n in defined}
        names.update(given)
        names.update(outs)
        pat = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
        for ln in lines:
            lhs, rhs = ln.split("=", 1)
            op, _, args = rhs.partition("(")
            body.append(pat.sub(lambda m: names[m.group(1)], lhs) + "=" + op + "(" +
                        pat.sub(lambda m: names[m.group(1)], args))

    order, stack = [], [(int(root), False)]
    while stack:  # children first (post-order), without Python's recursion limit
        k, done = stack.pop()
        if done or left[k] < 0:
            order.append(k)
        else:
            stack += [(k, True), (int(right[k]), False), (int(left[k]), False)]
    for k in order:
        outs = {"hl" if left[k] < 0 else "hi": f"h_{k}"}
        if kind == "treelstm":
            outs["cl" if left[k] < 0 else "ci"] = f"c_{k}"
        if left[k] < 0:
            body.append(f"i_{k} = Constant <value = int64 {{{k}}}> ()")
            body.append(f"wd_{k} = Gather <axis = 0> (word, i_{k})")
            emit(leaf_src, k, {"wd": f"wd_{k}"}, outs)
        else:
            a, b = int(left[k]), int(right[k])
            body.append(f"x_{k} = Concat <axis = 0> (h_{a}, h_{b})")
            given = {"x": f"x_{k}", "ca": f"c_{a}", "cb": f"c_{b}"}
            emit(inner_src, k, given, outs)
        if label is not None:
            body += [f"s_{k} = MatMul (h_{k}, wout)", f"z_{k} = Add (s_{k}, bout)",
                     f"lz_{k} = LogSoftmax <axis = 0> (z_{k})",
                     f"j_{k} = Constant <value = int64 {{{k}}}> ()",
                     f"y_{k} = Gather <axis = 0> (label, j_{k})",
                     f"ly_{k} = Gather <axis = 0> (lz_{k}, y_{k})"]
    r = int(root)
    body += [f"s = MatMul (h_{r}, wout)", "logits = Add (s, bout)"]
    outputs = "float[5] logits"
    if label is not None:
        body.append("nll = Sum (" + ", ".join(f"ly_{k}" for k in order) + ")")
        body += [f"n = Constant <value = float {{{float(len(order))}}}> ()", "mean = Div (nll, n)",
                 "loss = Neg (mean)"]
        outputs += ", float loss"
    n = len(left)
    inputs = f"int64[{n}] word" + (f", int64[{n}] label" if label is not None else "")
    return (f'<ir_version: 8, opset_import: ["" : 17]>\n{kind}_unrolled ({inputs}) => ({outputs})\n'
            f"   <{(',' + chr(10) + '    ').join(decl)}>\n{{\n  " + "\n  ".join(body) + "\n}\n")


def unroll(folder, split, out, kind="treelstm", train=False, first=None):
    """OUT/E.txt for each tree E of SPLIT (the first `first`), its inputs OUT/E-word.npy (and with
    train OUT/E-label.npy); KIND's weights in OUT/KIND.bin (a copy of DIR's)."""
    text = open(os.path.join(folder, kind + ".txt")).read()
    decl = re.findall(r'float\[[0-9,]+\] \w+ = \["location": [^\]]*\]', text)
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(folder, kind + ".bin"), os.path.join(out, kind + ".bin"))
    d = load_weights(folder, kind)["emb"].shape[1]
    trees = [read_seq(os.path.join(split, k + ".pb")) for k in ("left", "right", "word", "root")]
    labels = read_seq(os.path.join(split, "label.pb")) if train else None
    n = len(trees[0]) if first is None else min(first, len(trees[0]))
    for e in range(n):
        left, right, word, root = (t[e] for t in trees)
        with open(os.path.join(out, f"{e}.txt"), "w") as f:
            f.write(unrolled_text(kind, decl, d, left, right, word, root, labels[e] if train else None))
        np.save(os.path.join(out, f"{e}-word.npy"), np.asarray(word, np.int64))
        if train:
            np.save(os.path.join(out, f"{e}-label.npy"), np.asarray(labels[e], np.int64))
    return n


def write_kind(folder, kind, v, d, seed):
    r = np.random.default_rng(seed)
    decl, offset, blobs = [], 0, []
    for name, shape in kind_shapes(kind, v, d).items():
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
    for train in (False, True):
        with open(os.path.join(folder, kind + ("-train" if train else "") + ".txt"), "w") as f:
            f.write(model_text(kind, decl, d, train))
        for form in ("iter", "levels"):
            with open(os.path.join(folder, f"{kind}-{form}" + ("-train" if train else "") + ".txt"), "w") as f:
                f.write(iter_text(kind, decl, d, train, form == "levels"))


def write(folder, v, d, seed):
    os.makedirs(folder, exist_ok=True)
    for kind in KINDS:
        write_kind(folder, kind, v, d, seed)


def load_weights(folder, kind="treelstm"):
    """The weights of DIR/KIND.txt, from the external data file beside it."""
    raw = np.fromfile(os.path.join(folder, kind + ".bin"), "<f4")
    text = open(os.path.join(folder, kind + ".txt")).read()
    out = {}
    for name in KINDS[kind]:
        head = text.index(f"] {name} = [")
        dims = [int(x) for x in text[text.rindex("float[", 0, head) + 6:head].split(",")]
        at = text.index('"offset": "', head) + 11
        off = int(text[at:text.index('"', at)]) // 4
        out[name] = raw[off:off + int(np.prod(dims))].reshape(dims)
    return out


def reference(p, left, right, word, root, kind="treelstm", label=None):
    """numpy's recursion of KIND on weights p: the root's 5 scores, or with label the model's loss
    (the mean over the tree's nodes of each node's cross-entropy)."""
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    d = p["emb"].shape[1]

    def node(k):
        if left[k] < 0:
            if kind != "treelstm":
                h, c, below = np.tanh(p["emb"][word[k]]), None, 0.0
            else:
                g = p["emb"][word[k]] @ p["wleaf"] + p["bleaf"]
                c = sig(g[:d]) * np.tanh(g[2 * d:])
                h, below = sig(g[d:2 * d]) * np.tanh(c), 0.0
        else:
            ha, ca, la = node(left[k])
            hb, cb, lb = node(right[k])
            x = np.concatenate([ha, hb])
            g = x @ p["winner"] + p["binner"]
            if kind == "treelstm":
                gi, gfa, gfb, go, gu = np.split(g, 5)
                c = sig(gi) * np.tanh(gu) + sig(gfa) * ca + sig(gfb) * cb
                h = sig(go) * np.tanh(c)
            else:
                if kind == "rntn":
                    g = g + (x @ p["tensor"]).reshape(d, 2 * d) @ x
                h, c = np.tanh(g), None
            below = la + lb
        if label is None:
            return h, c, 0.0
        z = h @ p["wout"] + p["bout"]
        lz = z - z.max() - np.log(np.exp(z - z.max()).sum())
        return h, c, below - lz[label[k]]

    h, _, loss = node(int(root))
    return h @ p["wout"] + p["bout"] if label is None else loss / len(left)


def read_seq(path):
    """One of make_treebank.py's SequenceProto files: a list of numpy arrays, one a tree."""
    import onnx
    from onnx import numpy_helper as nh
    q = onnx.SequenceProto()
    with open(path, "rb") as f:
        q.ParseFromString(f.read())
    return [nh.to_array(t) for t in q.tensor_values]


def torch_tree(p, kind, left, right, word, k, label=None):
    """PyTorch eager recursion of KIND on weights p (torch tensors), the twin of reference(): node k's
    (h, c, the summed cross-entropy of its subtree's nodes, 0 without label)."""
    import torch
    d = p["emb"].shape[1]
    if left[k] < 0:
        if kind == "treelstm":
            g = p["emb"][int(word[k])] @ p["wleaf"] + p["bleaf"]
            c = torch.sigmoid(g[:d]) * torch.tanh(g[2 * d:])
            h = torch.sigmoid(g[d:2 * d]) * torch.tanh(c)
        else:
            h, c = torch.tanh(p["emb"][int(word[k])]), None
        below = 0
    else:
        ha, ca, la = torch_tree(p, kind, left, right, word, int(left[k]), label)
        hb, cb, lb = torch_tree(p, kind, left, right, word, int(right[k]), label)
        x = torch.cat([ha, hb])
        g = x @ p["winner"] + p["binner"]
        if kind == "treelstm":
            gi, gfa, gfb, go, gu = g.chunk(5)
            c = torch.sigmoid(gi) * torch.tanh(gu) + torch.sigmoid(gfa) * ca + torch.sigmoid(gfb) * cb
            h = torch.sigmoid(go) * torch.tanh(c)
        else:
            if kind == "rntn":
                g = g + (x @ p["tensor"]).view(d, 2 * d) @ x
            h, c = torch.tanh(g), None
        below = la + lb
    if label is None:
        return h, c, 0
    return h, c, below - torch.log_softmax(h @ p["wout"] + p["bout"], 0)[int(label[k])]


def compare(folder, split, out, kind="treelstm"):
    sys.setrecursionlimit(10000)
    p = {k: v.astype(np.float64) for k, v in load_weights(folder, kind).items()}
    left, right, word, root = (read_seq(os.path.join(split, k + ".pb")) for k in ("left", "right", "word", "root"))
    worst = 0.0
    for e in range(len(left)):
        want = reference(p, left[e], right[e], word[e], root[e], kind)
        got = np.load(os.path.join(out, "logits", f"{e}.npy"))
        worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-6)))
    print(f"{len(left)} trees: largest difference {worst:.2e} of the scores' scale")
    return 0 if worst <= 1e-4 else 1


def accuracy(split, out):
    """The roots' sign from tern-run's logits (P(3) + P(4) > P(0) + P(1), as make_treebank.py
    --check-tree scores its TreeLSTM) against the treebank's sign of each root."""
    signs = [int(t) for t in read_seq(os.path.join(split, "sign.pb"))]
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
                    help="the model --compare and --unroll read (DIR/KIND.txt)")
    ap.add_argument("--unroll", action="store_true")
    ap.add_argument("--train", action="store_true", help="--unroll: with the labels and the loss")
    ap.add_argument("--first", type=int, help="--unroll: only the first N trees")
    a = ap.parse_args()
    if a.unroll:
        if len(a.rest) != 2:
            sys.exit("usage: make_recursive_models.py --unroll [--kind K] [--train] [--first N] DIR SPLIT OUT")
        unroll(a.dir, *a.rest, kind=a.kind, train=a.train, first=a.first)
        return 0
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
