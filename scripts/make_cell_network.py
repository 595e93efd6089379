#!/usr/bin/env python3
"""Writes a NASNet/DARTS-like cell network to ONNX (opset 17): many small parallel branches, the kind
of graph whose speed depends on running independent operators at the same time.

Each cell takes the outputs of the two cells before it (s0, s1), reduces both to C channels with a
1x1 convolution, and computes four nodes; a node sums two operations applied to two different earlier
states (s0, s1 or an earlier node). The operations are DARTS's: separable convolutions 3x3 and 5x5
(ReLU, depthwise, pointwise, BatchNorm, twice), dilated separable convolutions 3x3 and 5x5 (dilation
2), max and average pooling 3x3, and identity. The cell's four nodes are concatenated and brought back
to C channels by a 1x1 convolution. Each cell's choice of operations and inputs is drawn from a seeded
generator, so the file is the same for the same options. Weights are random (seeded); BatchNorm
statistics are measured on random batches, as scripts/export_models.py does, so activations keep unit
scale and outputs can be compared between runtimes. Batch 1, input "image" (1, 3, SIZE, SIZE).

Usage: .venv/bin/python scripts/make_cell_network.py OUT.onnx [--cells 8] [--channels 64] [--size 32]
                                                              [--seed 0]
"""
import argparse
import os
import random
import sys
import tempfile
import warnings

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models  # noqa: E402

OPERATIONS = ["sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5", "max_pool_3x3", "avg_pool_3x3",
              "skip_connect"]
NODES = 4


def relu_conv_bn(c_in, c_out, kernel, dilation=1, groups=1):
    return [nn.ReLU(), nn.Conv2d(c_in, c_out, kernel, padding=dilation * (kernel // 2), dilation=dilation,
                                 groups=groups, bias=False), nn.BatchNorm2d(c_out)]


def separable(c, kernel, dilation=1):
    """Depthwise then pointwise convolution, each after ReLU and followed by BatchNorm."""
    return [nn.ReLU(), nn.Conv2d(c, c, kernel, padding=dilation * (kernel // 2), dilation=dilation, groups=c,
                                 bias=False), nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)]


def operation(name, c):
    if name == "sep_conv_3x3":
        return nn.Sequential(*separable(c, 3), *separable(c, 3))
    if name == "sep_conv_5x5":
        return nn.Sequential(*separable(c, 5), *separable(c, 5))
    if name == "dil_conv_3x3":
        return nn.Sequential(*separable(c, 3, 2))
    if name == "dil_conv_5x5":
        return nn.Sequential(*separable(c, 5, 2))
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride=1, padding=1)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    return nn.Identity()


class Cell(nn.Module):
    def __init__(self, c_prev_prev, c_prev, c, rng):
        super().__init__()
        self.pre0 = nn.Sequential(*relu_conv_bn(c_prev_prev, c, 1))
        self.pre1 = nn.Sequential(*relu_conv_bn(c_prev, c, 1))
        # Per node: two distinct earlier states (0: s0, 1: s1, 2...: earlier nodes) and an operation on each.
        self.inputs = [tuple(rng.sample(range(2 + i), 2)) for i in range(NODES)]
        self.ops = nn.ModuleList(operation(rng.choice(OPERATIONS), c) for _ in range(2 * NODES))
        self.post = nn.Sequential(*relu_conv_bn(NODES * c, c, 1))

    def forward(self, s0, s1):
        states = [self.pre0(s0), self.pre1(s1)]
        for i, (a, b) in enumerate(self.inputs):
            states.append(self.ops[2 * i](states[a]) + self.ops[2 * i + 1](states[b]))
        return self.post(torch.cat(states[2:], dim=1))


class CellNetwork(nn.Module):
    def __init__(self, cells, c, seed, classes=10):
        super().__init__()
        rng = random.Random(seed)
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.cells = nn.ModuleList(Cell(c, c, c, rng) for _ in range(cells))
        self.head = nn.Linear(c, classes)

    def forward(self, image):
        s0 = s1 = self.stem(image)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(s1, 1), 1))


def main():
    ap = argparse.ArgumentParser(description="Write a DARTS-like cell network of many parallel branches to ONNX.")
    ap.add_argument("out")
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--size", type=int, default=32, help="input height and width (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    opt = ap.parse_args()

    torch.manual_seed(opt.seed)
    model = CellNetwork(opt.cells, opt.channels, opt.seed)
    inputs = [export_models.Input("image", (1, 3, opt.size, opt.size))]
    export_models.calibrate_batchnorm(model, inputs)
    model.eval()
    folder = os.path.dirname(os.path.abspath(opt.out))
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=folder)
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, tuple(export_models.random_args(inputs)), tmp, opset_version=export_models.OPSET,
                              input_names=["image"], output_names=["output"], do_constant_folding=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, opt.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    main()
