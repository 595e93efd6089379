#!/usr/bin/env python3
"""Writes a DARTS-like cell network to ONNX (opset 17): many small parallel branches, the kind of graph
whose speed depends on running independent operators at the same time.

The shape is that of DARTS's search network on CIFAR-10 (Liu et al., 2019), with one operation per edge
instead of a mixture: a stem convolution to 3C channels, then CELLS cells, of which those at one and two
thirds of the depth are reduction cells (stride 2, twice the channels). Each cell takes the outputs of
the two cells before it (s0, s1), reduces both to C channels with a 1x1 convolution (a factorized
reduction for s0 after a reduction cell), and computes four nodes; a node sums two operations applied
to two different earlier states (s0, s1 or an earlier node). The operations are DARTS's: separable
convolutions 3x3 and 5x5 (ReLU, depthwise, pointwise, BatchNorm, twice), dilated separable convolutions
3x3 and 5x5 (dilation 2), max and average pooling 3x3, and identity (a factorized reduction where it
must halve the size). The cell's output is its four nodes concatenated (4C channels). A global
average pool and a linear layer end it. Each cell's choice of operations and inputs is drawn from a
seeded generator, so the file is the same for the same options. Weights are random (seeded); BatchNorm
statistics are measured on random batches, as scripts/export_models.py does, so activations keep unit
scale and outputs can be compared between runtimes. Batch 1, input "image" (1, 3, SIZE, SIZE).

--no-reduction keeps every cell at the stem's size and C channels (each cell's concatenation then
goes back to C channels through a 1x1 convolution): with --channels 64 that is the network earlier
versions of this script wrote.

Usage: .venv/bin/python scripts/make_cell_network.py OUT.onnx [--cells 8] [--channels 16] [--size 32]
                                                              [--no-reduction] [--seed 0]
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


def separable(c, kernel, dilation=1, stride=1):
    """Depthwise then pointwise convolution, each after ReLU and followed by BatchNorm."""
    return [nn.ReLU(), nn.Conv2d(c, c, kernel, stride=stride, padding=dilation * (kernel // 2), dilation=dilation,
                                 groups=c, bias=False), nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)]


class FactorizedReduce(nn.Module):
    """Halves height and width: two 1x1 stride-2 convolutions, the second offset by one pixel, concatenated."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.conv2 = nn.Conv2d(c_in, c_out - c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x):
        x = self.relu(x)
        return self.bn(torch.cat([self.conv1(x), self.conv2(x[:, :, 1:, 1:])], dim=1))


def operation(name, c, stride=1):
    if name == "sep_conv_3x3":
        return nn.Sequential(*separable(c, 3, stride=stride), *separable(c, 3))
    if name == "sep_conv_5x5":
        return nn.Sequential(*separable(c, 5, stride=stride), *separable(c, 5))
    if name == "dil_conv_3x3":
        return nn.Sequential(*separable(c, 3, 2, stride))
    if name == "dil_conv_5x5":
        return nn.Sequential(*separable(c, 5, 2, stride))
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride=stride, padding=1)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)
    return FactorizedReduce(c, c) if stride == 2 else nn.Identity()


class Cell(nn.Module):
    def __init__(self, c_prev_prev, c_prev, c, reduction, reduction_prev, project, rng):
        super().__init__()
        self.pre0 = FactorizedReduce(c_prev_prev, c) if reduction_prev else nn.Sequential(
            *relu_conv_bn(c_prev_prev, c, 1))
        self.pre1 = nn.Sequential(*relu_conv_bn(c_prev, c, 1))
        # Per node: two distinct earlier states (0: s0, 1: s1, 2...: earlier nodes) and an operation on each;
        # in a reduction cell the operations on s0 and s1 have stride 2.
        self.inputs = [tuple(rng.sample(range(2 + i), 2)) for i in range(NODES)]
        self.ops = nn.ModuleList(
            operation(rng.choice(OPERATIONS), c, 2 if reduction and self.inputs[j // 2][j % 2] < 2 else 1)
            for j in range(2 * NODES))
        self.post = nn.Sequential(*relu_conv_bn(NODES * c, c, 1)) if project else nn.Identity()

    def forward(self, s0, s1):
        states = [self.pre0(s0), self.pre1(s1)]
        for i, (a, b) in enumerate(self.inputs):
            states.append(self.ops[2 * i](states[a]) + self.ops[2 * i + 1](states[b]))
        return self.post(torch.cat(states[2:], dim=1))


class CellNetwork(nn.Module):
    def __init__(self, cells, c, seed, reduction=True, classes=10):
        super().__init__()
        rng = random.Random(seed)
        stem = 3 * c if reduction else c
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, padding=1, bias=False), nn.BatchNorm2d(stem))
        self.cells = nn.ModuleList()
        c_pp, c_p, reduction_prev = stem, stem, False
        for i in range(cells):
            reduce = reduction and i in (cells // 3, 2 * cells // 3)
            if reduce:
                c *= 2
            self.cells.append(Cell(c_pp, c_p, c, reduce, reduction_prev, not reduction, rng))
            c_pp, c_p, reduction_prev = c_p, (NODES * c if reduction else c), reduce
        self.head = nn.Linear(c_p, classes)

    def forward(self, image):
        s0 = s1 = self.stem(image)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(s1, 1), 1))


def main():
    ap = argparse.ArgumentParser(description="Write a DARTS-like cell network of many parallel branches to ONNX.")
    ap.add_argument("out")
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--channels", type=int, default=16, help="C, the first cells' channels (default 16)")
    ap.add_argument("--size", type=int, default=32, help="input height and width (default 32)")
    ap.add_argument("--no-reduction", dest="reduction", action="store_false",
                    help="no reduction cells: every cell at the stem's size with C channels")
    ap.add_argument("--seed", type=int, default=0)
    opt = ap.parse_args()

    torch.manual_seed(opt.seed)
    model = CellNetwork(opt.cells, opt.channels, opt.seed, opt.reduction)
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
