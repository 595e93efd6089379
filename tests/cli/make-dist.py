#!/usr/bin/env python3
"""Models, data and a comparison for the distributed-training tests (t0900, t0910), in the working folder.

    make-dist.py models VOCAB DIM CLASSES CONTEXT SEED W_SCALE
        lm.onnx (Gather of an embedding VOCAB x DIM over CONTEXT tokens, mean, Gemm to CLASSES) with
        tokens.npy and lm_target.npy; cnn.onnx (3x3 convolution, Relu, Gemm to 3 classes on 6x6 images)
        with x.npy and cnn_target.npy; 96 samples each, from numpy's generator seeded SEED
    make-dist.py same EXPECTED GOT [UNTRAINED]
        GOT's initializers equal EXPECTED's (float ones to rtol 1e-5, atol 1e-6); with UNTRAINED, some
        float parameter of EXPECTED moved from it by more than 1e-3 (the run trained)
"""
import sys

import numpy as np
import onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T


def save(nodes, name, inputs, outputs, inits):
    g = h.make_graph(nodes, name, inputs, outputs, [nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), name + ".onnx")


def models(V, D, C, ctx, seed, w_scale):
    r = np.random.default_rng(seed)
    save([h.make_node("Gather", ["emb", "tokens"], ["e"]),
          h.make_node("ReduceMean", ["e"], ["s"], axes=[1], keepdims=0),
          h.make_node("Gemm", ["s", "w", "b"], ["logits"])], "lm",
         [h.make_tensor_value_info("tokens", T.INT64, ["N", ctx])],
         [h.make_tensor_value_info("logits", T.FLOAT, ["N", C])],
         {"emb": r.standard_normal((V, D)).astype(np.float32),
          "w": (r.standard_normal((D, C)) * w_scale).astype(np.float32), "b": np.zeros(C, np.float32)})
    np.save("tokens.npy", r.integers(0, V, (96, ctx)).astype(np.int64))
    np.save("lm_target.npy", r.integers(0, C, (96,)).astype(np.int64))
    save([h.make_node("Conv", ["x", "k", "kb"], ["c"], pads=[1, 1, 1, 1]),
          h.make_node("Relu", ["c"], ["a"]),
          h.make_node("Flatten", ["a"], ["f"]),
          h.make_node("Gemm", ["f", "w", "b"], ["y"])], "cnn",
         [h.make_tensor_value_info("x", T.FLOAT, ["N", 1, 6, 6])], [h.make_tensor_value_info("y", T.FLOAT, ["N", 3])],
         {"k": (r.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32), "kb": np.zeros(4, np.float32),
          "w": (r.standard_normal((144, 3)) * 0.1).astype(np.float32), "b": np.zeros(3, np.float32)})
    np.save("x.npy", r.standard_normal((96, 1, 6, 6)).astype(np.float32))
    np.save("cnn_target.npy", r.integers(0, 3, (96,)).astype(np.int64))


def same(expected, got, untrained=None):
    a = {t.name: nh.to_array(t) for t in onnx.load(expected).graph.initializer}
    b = {t.name: nh.to_array(t) for t in onnx.load(got).graph.initializer}
    for k, v in a.items():
        assert k in b, k
        if v.dtype.kind == "f":
            assert np.allclose(b[k], v, rtol=1e-5, atol=1e-6), (k, np.max(np.abs(b[k] - v)))
        else:
            assert np.array_equal(b[k], v), (k, v, b[k])
    if untrained:
        moved = [np.max(np.abs(v - nh.to_array(t))) for t in onnx.load(untrained).graph.initializer
                 for k, v in a.items() if t.name == k and v.dtype.kind == "f"]
        assert max(moved) > 1e-3, "the parameters did not train"


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "models":
        V, D, C, ctx, seed = (int(x) for x in sys.argv[2:7])
        models(V, D, C, ctx, seed, float(sys.argv[7]))
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "same":
        same(*sys.argv[2:])
    else:
        sys.exit(__doc__)
