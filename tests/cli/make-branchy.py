#!/usr/bin/env python3
"""Writes a seeded random branchy graph of elementwise nodes (a cell network in miniature) to
argv[1]: many independent chains that fork from and join into shared values, the shape of graph
that multi-stream scheduling is for."""
import random
import sys

import onnx
from onnx import TensorProto, helper

path, seed = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
rng = random.Random(seed)
nodes, live = [], ["x"]
for i in range(120):
    op = rng.choice(["Add", "Mul", "Sub", "Relu", "Sigmoid", "Tanh", "Abs"])
    a = rng.choice(live[-12:])
    out = f"v{i}"
    if op in ("Add", "Mul", "Sub"):
        nodes.append(helper.make_node(op, [a, rng.choice(live)], [out], name=f"n{i}"))
    else:
        nodes.append(helper.make_node(op, [a], [out], name=f"n{i}"))
    live.append(out)
# Join every value nobody reads into the output, so that every branch matters.
used = {i for n in nodes for i in n.input}
ends = [v for v in live[1:] if v not in used]
acc = ends[0]
for j, v in enumerate(ends[1:]):
    nodes.append(helper.make_node("Add", [acc, v], [f"j{j}"], name=f"join{j}"))
    acc = f"j{j}"
nodes.append(helper.make_node("Identity", [acc], ["y"], name="out"))
graph = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
onnx.checker.check_model(model)
onnx.save(model, path)
