#!/usr/bin/env python3
"""Examples of their own sizes for tern-run --train (t0710): a bag-of-words classifier over token lists
of different lengths, the examples as folders of .npy files, and the same training in numpy.

    make-examples.py data VOCAB DIM CLASSES EXAMPLES SEED
        bow.onnx (Gather of an embedding VOCAB x DIM over a [1, L] token list, mean over L, Gemm to
        CLASSES); tokens/0.npy ... (int64 [1, L], L from 1 to 12) and target/0.npy ... (int64 [1]);
        tokens.pb and target.pb, the same as ONNX SequenceProto files; numpy's generator seeded SEED
    make-examples.py sgd MODEL STEPS LR OUT
        STEPS steps of plain SGD on cross-entropy, one example a step in order (cycling), in float32
        numpy from MODEL's weights on tokens/ and target/; OUT gets the trained model
"""
import os
import sys

import numpy as np
import onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T


def data(V, D, C, n, seed):
    r = np.random.default_rng(seed)
    inits = {"emb": r.standard_normal((V, D)).astype(np.float32),
             "w": (r.standard_normal((D, C)) * 0.5).astype(np.float32), "b": np.zeros(C, np.float32)}
    g = h.make_graph([h.make_node("Gather", ["emb", "tokens"], ["e"]),
                      h.make_node("ReduceMean", ["e"], ["s"], axes=[1], keepdims=0),
                      h.make_node("Gemm", ["s", "w", "b"], ["logits"])], "bow",
                     [h.make_tensor_value_info("tokens", T.INT64, ["N", "L"])],
                     [h.make_tensor_value_info("logits", T.FLOAT, ["N", C])],
                     [nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), "bow.onnx")
    tokens = [r.integers(0, V, (1, int(r.integers(1, 13)))).astype(np.int64) for _ in range(n)]
    target = [r.integers(0, C, (1,)).astype(np.int64) for _ in range(n)]
    for name, items in (("tokens", tokens), ("target", target)):
        os.makedirs(name, exist_ok=True)
        for i, a in enumerate(items):
            np.save(os.path.join(name, "%d.npy" % i), a)
        seq = onnx.SequenceProto(name=name, elem_type=onnx.SequenceProto.TENSOR)
        seq.tensor_values.extend(nh.from_array(a) for a in items)
        with open(name + ".pb", "wb") as f:
            f.write(seq.SerializeToString())


def sgd(model, steps, lr, out):
    m = onnx.load(model)
    p = {t.name: nh.to_array(t).copy() for t in m.graph.initializer}
    n = len([f for f in os.listdir("tokens") if f.endswith(".npy")])
    for k in range(steps):
        tok = np.load("tokens/%d.npy" % (k % n))[0]
        y = int(np.load("target/%d.npy" % (k % n))[0])
        s = p["emb"][tok].mean(axis=0, dtype=np.float32)
        z = s @ p["w"] + p["b"]
        e = np.exp(z - z.max())
        dz = (e / e.sum()).astype(np.float32)
        dz[y] -= 1
        ds = p["w"] @ dz
        demb = np.zeros_like(p["emb"])
        np.add.at(demb, tok, ds / np.float32(len(tok)))
        p["w"] -= np.float32(lr) * np.outer(s, dz)
        p["b"] -= np.float32(lr) * dz
        p["emb"] -= np.float32(lr) * demb
    for t in m.graph.initializer:
        t.CopyFrom(nh.from_array(p[t.name], t.name))
    onnx.save(m, out)


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "data":
        data(*(int(x) for x in sys.argv[2:7]))
    elif len(sys.argv) == 6 and sys.argv[1] == "sgd":
        sgd(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(__doc__)
