"""Models for t0510-blocked.sh: convolutions written with tern's blocked operators beside the same
convolutions as plain ONNX, and a small residual network for the blocked-conv pass.

    make-blocked.py pairs DIR     DIR/cK.plain.onnx and DIR/cK.blocked.onnx for each case K
    make-blocked.py winograd      the cases K whose BlockedConv runs as Winograd's F(2 x 2, 3 x 3)
    make-blocked.py net FILE      a residual network: 12 convolutions, a Concat, Relu and Add between
    make-blocked.py pair2 FILE    two convolutions only (too few for the pass)
    make-blocked.py elu FILE      nine convolutions, each with Elu (an activation kept planar)
    make-blocked.py pools DIR     DIR/pK.plain.onnx and DIR/pK.blocked.onnx: MaxPool and AveragePool, and
                                  tern.BlockedMaxPool and tern.BlockedAveragePool
    make-blocked.py mobile FILE   inverted residual blocks: depthwise convolutions, 24 and 40 channels,
                                  squeeze-and-excitation (GlobalAveragePool, a per-channel Mul)
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# (in channels, height, width, out channels, kernel, stride, dilation, pad, bias, residual, activation
#  [, group: 0 for depthwise, one group per channel [, planar: BlockedConv reads the planar input]])
CASES = [
    (16, 8, 8, 16, 1, 1, 1, 0, 0, 0, ""),
    (32, 9, 11, 48, 3, 1, 1, 1, 1, 1, "Relu"),
    (20, 13, 13, 32, 3, 2, 1, 1, 1, 0, "Sigmoid"),
    (64, 7, 7, 40, 5, 1, 2, 4, 1, 1, "Relu"),
    (3, 30, 30, 32, 7, 2, 1, 3, 1, 0, "Relu"),
    (64, 28, 28, 64, 1, 1, 1, 0, 0, 1, "Relu"),
    (48, 6, 40, 16, 3, 1, 1, 0, 1, 0, "HardSwish"),
    (16, 5, 5, 32, 3, 1, 1, 2, 0, 0, ""),
    (32, 7, 7, 32, 1, 2, 1, 0, 1, 1, "LeakyRelu"),
    (16, 9, 57, 48, 3, 2, 1, 1, 1, 1, "Relu"),
    (96, 7, 7, 160, 1, 1, 1, 0, 1, 1, "Relu"),
    (64, 3, 9, 48, 3, 2, 1, 1, 1, 0, ""),
    (32, 6, 47, 40, 1, 2, 1, 0, 0, 0, ""),
    (32, 14, 14, 32, 3, 1, 1, 1, 1, 1, "Relu", 0),
    (48, 15, 17, 48, 3, 2, 1, 1, 1, 0, "HardSwish", 0),
    (16, 11, 9, 16, 5, 1, 1, 2, 0, 0, "", 0),
    (64, 28, 28, 64, 5, 2, 1, 2, 1, 0, "Sigmoid", 0),
    (20, 9, 9, 20, 3, 1, 2, 2, 1, 1, "Relu", 0),
    (32, 8, 30, 32, 7, 1, 1, 3, 1, 0, "", 0),
    (24, 10, 37, 24, 3, 1, 1, 0, 1, 1, "Relu", 0),
    (16, 3, 4, 16, 5, 1, 1, 2, 1, 0, "", 0),
    (32, 9, 41, 32, 5, 2, 1, 0, 0, 1, "", 0),
    (16, 12, 45, 16, 3, 2, 1, 1, 1, 0, "Relu", 0),
    (16, 7, 50, 16, 4, 3, 1, 1, 1, 0, "", 0),
    (3, 30, 30, 32, 3, 2, 1, 1, 1, 0, "Relu", 1, 1),
    (3, 17, 19, 64, 7, 2, 1, 3, 1, 1, "HardSwish", 1, 1),
    (1, 12, 12, 16, 3, 1, 1, 1, 0, 0, "", 1, 1),
    (5, 9, 13, 48, 5, 1, 2, 0, 1, 0, "Sigmoid", 1, 1),
    # 3 x 3, stride 1, more than 16 input channels, outputs of 8 or more a side: Winograd's F(2 x 2, 3 x 3)
    (40, 17, 13, 24, 3, 1, 1, 1, 1, 0, "Sigmoid"),
    (64, 12, 10, 64, 3, 1, 1, 0, 0, 1, ""),
    (33, 30, 29, 70, 3, 1, 1, 1, 1, 1, "LeakyRelu"),
    (64, 56, 56, 32, 3, 1, 1, 1, 1, 1, "Relu"),
]
WINOGRAD = [1, 28, 29, 30, 31]  # the cases above that run so


# (channels, height, width, kernel, stride, dilation, pads, ceil_mode[, average: count_include_pad + 1])
POOLS = [
    (64, 16, 16, 3, 2, 1, 1, 0),
    (96, 15, 15, 3, 2, 1, 0, 1),
    (32, 12, 10, 2, 2, 1, 0, 0),
    (24, 9, 9, 3, 1, 1, 1, 0),
    (16, 11, 13, 3, 1, 2, 2, 1),
    (48, 7, 7, 5, 3, 1, 2, 1),
    (64, 9, 9, 3, 1, 1, 1, 0, 2),
    (40, 10, 12, 3, 2, 1, 1, 0, 1),
    (32, 8, 8, 2, 2, 1, 0, 0, 1),
    (16, 7, 9, 5, 1, 1, 2, 0, 2),
    (32, 6, 40, 3, 2, 1, 1, 0, 1),
    (16, 5, 33, 3, 1, 1, 1, 0, 2),
    (24, 7, 31, 3, 2, 1, 0, 1),
    (16, 9, 45, 3, 1, 1, 1, 0),
    (16, 2, 2, 3, 1, 1, 1, 0, 1),
]


def save(nodes, inputs, outputs, inits, path, tern=False):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    ops = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("tern", 1)] if tern else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    onnx.save(m, path)


def pair(c, h, w, m, k, s, d, pad, bias, resid, act, *rest):
    *opts, stem = rest
    group = (opts[0] if opts else 1) or c
    planar = len(opts) > 1 and opts[1]
    rng = np.random.default_rng(len(stem))
    oh = (h + 2 * pad - d * (k - 1) - 1) // s + 1
    ow = (w + 2 * pad - d * (k - 1) - 1) // s + 1
    attrs = dict(kernel_shape=[k, k], strides=[s, s], dilations=[d, d], pads=[pad] * 4, group=group)
    ci = c // group
    inits = [numpy_helper.from_array((rng.standard_normal((m, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32), "W")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B"))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, h, w])]
    if resid:
        ins.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, m, oh, ow]))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, m, oh, ow])]
    nodes = [helper.make_node("Conv", ["x", "W"] + (["B"] if bias else []), ["c"], **attrs)]
    cur = "c"
    if resid:
        nodes.append(helper.make_node("Add", [cur, "z"], ["a"]))
        cur = "a"
    nodes.append(helper.make_node(act or "Identity", [cur], ["y"]))
    save(nodes, ins, outs, inits, stem + ".plain.onnx")
    nodes = [] if planar else [helper.make_node("ToBlocks", ["x"], ["xb"], domain="tern")]
    conv_in = ["x" if planar else "xb", "W", "B" if bias else ""]
    if resid:
        nodes.append(helper.make_node("ToBlocks", ["z"], ["zb"], domain="tern"))
        conv_in.append("zb")
    nodes.append(helper.make_node("BlockedConv", conv_in, ["yb"], domain="tern", activation=act, **attrs))
    nodes.append(helper.make_node("FromBlocks", ["yb"], ["y"], domain="tern", channels=m))
    save(nodes, ins, outs, inits, stem + ".blocked.onnx", tern=True)


def pool_pair(c, h, w, k, s, d, pad, ceil, *rest):
    *avg, stem = rest
    op = "AveragePool" if avg else "MaxPool"
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4, ceil_mode=ceil)
    if avg:
        attrs["count_include_pad"] = avg[0] - 1
    else:
        attrs["dilations"] = [d, d]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, h, w])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    save([helper.make_node(op, ["x"], ["y"], **attrs)], ins, outs, [], stem + ".plain.onnx")
    nodes = [helper.make_node("ToBlocks", ["x"], ["xb"], domain="tern"),
             helper.make_node("Blocked" + op, ["xb"], ["yb"], domain="tern", **attrs),
             helper.make_node("FromBlocks", ["yb"], ["y"], domain="tern", channels=c)]
    save(nodes, ins, outs, [], stem + ".blocked.onnx", tern=True)


def net(path, convs):
    """x -> conv -> relu -> conv -> (+ x) -> relu -> concat with conv of x -> conv -> 8 convs -> y."""
    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def conv(x, cin, cout, k, name):
        w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32) * 0.1
        inits.extend([numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], kernel_shape=[k, k],
                                      pads=[k // 2] * 4, name=name))
        return name

    a = conv("x", 32, 32, 3, "a")
    nodes.append(helper.make_node("Relu", [a], ["ar"]))
    if convs == 2:
        conv("ar", 32, 16, 1, "y")
    else:
        b = conv("ar", 32, 32, 3, "b")
        nodes.append(helper.make_node("Add", [b, "x"], ["s"]))
        nodes.append(helper.make_node("Relu", ["s"], ["sr"]))
        c = conv("x", 32, 16, 1, "c")
        nodes.append(helper.make_node("Concat", ["sr", c], ["cat"], axis=1))
        d = conv("cat", 48, 32, 1, "d")
        nodes.append(helper.make_node("Sigmoid", [d], ["side"]))  # a graph output read planar
        e = d
        for i in range(7):  # enough convolutions for the three conversions
            e = conv(e, 32, 32, 3, "e%d" % i)
            nodes.append(helper.make_node("Relu", [e], [e + "r"]))
            e = e + "r"
        conv(e, 32, 16, 3, "y")
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])]
    if convs != 2:
        outs.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 32, 12, 12]))
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 12, 12])], outs, inits, path)


def elu(path):
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(9):
        w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "w%d" % i))
        nodes.append(helper.make_node("Conv", [x, "w%d" % i], ["c%d" % i], kernel_shape=[3, 3], pads=[1] * 4))
        nodes.append(helper.make_node("Elu", ["c%d" % i], ["e%d" % i]))
        x = "e%d" % i
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
         [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 32, 8, 8])], inits, path)


def mobile(path):
    """A stem, then three inverted residual blocks (1x1 expand, depthwise 3x3 or 5x5, squeeze-and-
    excitation on two of them, 1x1 project, a residual Add), a last 1x1 convolution, the global pool."""
    rng = np.random.default_rng(5)
    nodes, inits = [], []

    def const(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a, dtype=np.float32), name))
        return name

    def conv(x, cin, cout, k, name, stride=1, group=1, act="Relu"):
        w = const(name + "_w", rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k))
        b = const(name + "_b", rng.standard_normal(cout) * 0.1)
        nodes.append(helper.make_node("Conv", [x, w, b], [name + "_c"], kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[k // 2] * 4, group=group))
        if act == "Clip":
            nodes.append(helper.make_node("Clip", [name + "_c", const(name + "_lo", 0), const(name + "_hi", 6)],
                                          [name]))
        elif act:
            nodes.append(helper.make_node(act, [name + "_c"], [name]))
        else:
            return name + "_c"
        return name

    def block(x, cin, cout, expand, k, stride, se, name):
        mid = cin * expand
        e = conv(x, cin, mid, 1, name + "e", act="HardSwish")
        d = conv(e, mid, mid, k, name + "d", stride=stride, group=mid, act="Clip")
        if se:
            nodes.append(helper.make_node("GlobalAveragePool", [d], [name + "g"]))
            q = conv(name + "g", mid, 8, 1, name + "q")
            r = conv(q, 8, mid, 1, name + "r", act="HardSigmoid")
            nodes.append(helper.make_node("Mul", [d, r], [name + "s"]))
            d = name + "s"
        p = conv(d, mid, cout, 1, name + "p", act=None)
        if cin == cout and stride == 1:
            nodes.append(helper.make_node("Add", [x, p], [name + "a"]))
            return name + "a"
        return p

    x = conv("x", 3, 16, 3, "stem", stride=2)
    x = block(x, 16, 24, 4, 3, 2, True, "b1")
    x = block(x, 24, 24, 3, 5, 1, False, "b2")
    x = block(x, 24, 40, 3, 3, 1, True, "b3")
    x = conv(x, 40, 48, 1, "last")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["y"]))
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 32, 32])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48, 1, 1])], inits, path)


if __name__ == "__main__":
    if sys.argv[1] == "pairs":
        for i, case in enumerate(CASES):
            pair(*case, "%s/c%d" % (sys.argv[2], i))
        print(len(CASES))
    elif sys.argv[1] == "winograd":
        print(" ".join(map(str, WINOGRAD)))
    elif sys.argv[1] == "pools":
        for i, case in enumerate(POOLS):
            pool_pair(*case, "%s/p%d" % (sys.argv[2], i))
        print(len(POOLS))
    elif sys.argv[1] == "net":
        net(sys.argv[2], 5)
    elif sys.argv[1] == "pair2":
        net(sys.argv[2], 2)
    elif sys.argv[1] == "elu":
        elu(sys.argv[2])
    elif sys.argv[1] == "mobile":
        mobile(sys.argv[2])
