"""make-models.py — writes the models of the cli tests that the text syntax cannot express: one
malformed model per class of bad input, and a model whose names are as awkward as protobuf allows.
Usage: make-models.py DIR"""
import os
import random
import sys

from onnx import TensorProto, helper

FLOAT = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + list(extra_opsets)
    return helper.make_model(graph, opset_imports=opsets, ir_version=8, producer_name="tern-tests")


def vi(name, shape, dtype=FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def raw_tensor(name, dims, data):
    """A tensor whose data need not match its shape (helper.make_tensor checks that)."""
    t = TensorProto(name=name, data_type=FLOAT, raw_data=data)
    t.dims.extend(dims)
    return t


def bad_models():
    x, y = vi("x", [2, 3]), vi("y", [2, 3])
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    yield "cycle", model([helper.make_node("Relu", ["b"], ["a"], name="first"),
                          helper.make_node("Relu", ["a"], ["b"], name="second"),
                          helper.make_node("Add", ["a", "x"], ["y"], name="join")], [x], [y])
    yield "undefined-input", model([helper.make_node("Relu", ["nowhere"], ["y"], name="relu")], [x], [y])
    yield "duplicate-output", model([relu, helper.make_node("Neg", ["x"], ["y"], name="neg")], [x], [y])
    softmax = helper.make_node("Softmax", ["x"], ["y"], name="softmax")
    softmax.attribute.append(helper.make_attribute("axis", 1.5))
    yield "wrong-attribute-type", model([softmax], [x], [y])
    yield "negative-dimension", model([relu], [vi("x", [2, -3])], [y])
    huge = raw_tensor("w", [1 << 40, 1 << 40], b"\0" * 16)
    yield "absurd-dimension", model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [x], [y], [huge])
    short = raw_tensor("w", [2, 3], b"\0" * 8)
    yield "short-initializer", model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [x], [y], [short])
    yield "unknown-opset", model([relu], [x], [y], opset=9999)
    yield "unknown-operator", model([helper.make_node("NoSuchOperator", ["x"], ["y"], name="mystery")], [x], [y])
    yield "no-graph", helper.make_model(helper.make_graph([], "g", [], []), ir_version=8)


def odd_names():
    """Names with quotes, backslashes, markup, DOT keywords, non-Latin text, a newline and a very long
    one; 'BADUTF8!' is replaced by invalid UTF-8 bytes after serialising."""
    names = ['say "hi"', "back\\slash\\", "<b>html</b>", "node", "digraph", "{edge}", "\u0436\u2713\U0001f600",
             "new\nline", "L" * 5000, "BADUTF8!"]
    values = ["in " + names[0]] + ["v" + str(i) + " " + n for i, n in enumerate(names)]
    nodes = [helper.make_node("Relu", [values[i]], [values[i + 1]], name=n) for i, n in enumerate(names)]
    m = model(nodes, [vi(values[0], ["N \"batch\\", 3])], [vi(values[-1], ["N \"batch\\", 3])])
    data = m.SerializeToString()
    assert data.count(b"BADUTF8!") == 3
    return data.replace(b"BADUTF8!", b"\xff\xfe\xc3(\xed\xa0\x80!")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, m in bad_models():
        with open(os.path.join(out, name + ".onnx"), "wb") as f:
            f.write(m.SerializeToString())
    with open(os.path.join(out, "random-bytes.onnx"), "wb") as f:
        f.write(random.Random(1).randbytes(4096))
    with open(os.path.join(out, "odd-names.onnx"), "wb") as f:
        f.write(odd_names())


if __name__ == "__main__":
    main()
