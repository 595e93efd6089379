#!/usr/bin/env python3
"""Real data for training from the shell: scikit-learn's bundled handwritten digits (no download).

    digits.py data DIR          x_train.npy y_train.npy x_test.npy y_test.npy in DIR (80/20 split, seed 0)
    digits.py model FILE        a small CNN (two 3x3 convolutions, max pooling, a linear layer), exported
                                from PyTorch with random weights (seed 0) and a dynamic batch axis
    digits.py wide-model FILE   the same with 64 and 128 channels and two hidden layers of 1024 (1.66 M
                                parameters): as much communication as computation for data parallelism
    digits.py accuracy LOGITS LABELS   the share of argmax(LOGITS, axis 1) == LABELS, printed

Images are 8x8, scaled to [0, 1], shaped [N, 1, 8, 8] float32; labels int64 0-9.
"""
import os
import sys

import numpy as np


def data(folder):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    cut = int(round(0.8 * len(y)))
    os.makedirs(folder, exist_ok=True)
    for name, arr in (("x_train", x[:cut]), ("y_train", y[:cut]), ("x_test", x[cut:]), ("y_test", y[cut:])):
        np.save(os.path.join(folder, name + ".npy"), np.ascontiguousarray(arr))
    print(f"{cut} training and {len(y) - cut} test digits in {folder}")


def model(path, wide=False):
    import torch
    from torch import nn
    torch.manual_seed(0)
    if wide:
        net = nn.Sequential(
            nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128 * 2 * 2, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
            nn.Linear(1024, 10))
    else:
        net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 2 * 2, 10))
    net.eval()
    torch.onnx.export(net, torch.zeros(1, 1, 8, 8), path, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, opset_version=17)
    print(f"wrote {path}")


def accuracy(logits, labels):
    z = np.load(logits)
    y = np.load(labels)
    print(f"{float((z.argmax(axis=1) == y).mean()):.4f}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "data":
        data(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] in ("model", "wide-model"):
        model(sys.argv[2], sys.argv[1] == "wide-model")
    elif len(sys.argv) == 4 and sys.argv[1] == "accuracy":
        accuracy(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
