#!/usr/bin/env python3
"""References for the gradients of calls and Ifs (t0720-grad-calls.sh).

    recursive-grad.py if-data DIR            x/, c/ (4 examples) for tests/cli/data/if-grad.txt
    recursive-grad.py if-sgd DIR TRAINED     TRAINED's w equals numpy's SGD (lr 0.1) over DIR's examples
    recursive-grad.py loop-data DIR          x.npy, n.npy (2 batches of 2 rows) for tests/cli/data/loop-grad.txt
    recursive-grad.py loop-sgd DIR TRAINED   TRAINED's w equals numpy's SGD (lr 0.1, batches of 2 rows)
        through loop-grad.txt's two Loops (n trips of tanh(a w), then sin(w) added until i reaches 1),
        each step's gradient the central finite differences of the float64 loss
    recursive-grad.py tree-fd MODELS TB BEFORE AFTER
        AFTER is BEFORE after one SGD step (lr 1) of tern-run --train on TB's first training tree:
        BEFORE - AFTER, tern's gradient of the TreeLSTM's loss, equals the central finite differences
        of scripts/make_recursive_models.py's numpy TreeLSTM (float64) on 60 coordinates of every
        weight, within 1e-3 of the weight's largest gradient
    recursive-grad.py tree-torch MODELS TB STEPS LR TRAINED (the recursive or the iterative TreeLSTM's)
        TRAINED (STEPS steps of SGD at LR, one tree a step) equals PyTorch autograd's in float64,
        within 1e-5 of each weight's scale; skipped (exit 0, "no torch") without torch
"""
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper as nh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import make_recursive_models as mr  # noqa: E402


def weights(path):
    return {t.name: nh.to_array(t).astype(np.float64) for t in onnx.load(path).graph.initializer}


def seqs(tb):
    return {k: mr.read_seq(os.path.join(tb, "train", k + ".pb")) for k in ("left", "right", "word", "root", "label")}


def main():
    cmd = sys.argv[1]
    if cmd == "if-data":
        d = sys.argv[2]
        r = np.random.default_rng(0)
        for k in ("x", "c"):
            os.makedirs(os.path.join(d, k), exist_ok=True)
        for i in range(4):
            np.save(os.path.join(d, "x", f"{i}.npy"), r.standard_normal(3).astype(np.float32))
            np.save(os.path.join(d, "c", f"{i}.npy"), np.array(i % 3 == 0))
        return 0
    if cmd == "if-sgd":
        d, trained = sys.argv[2:4]
        w = np.array([0.5, -1.0, 2.0], np.float32)
        for i in range(4):
            x, c = np.load(os.path.join(d, "x", f"{i}.npy")), np.load(os.path.join(d, "c", f"{i}.npy"))
            w = w - np.float32(0.1) * (x if c else np.cos(w))  # y = x * w, or x + sin(w)
        got = weights(trained)["w"]
        assert np.allclose(got, w, rtol=1e-6, atol=1e-7), (got, w)
        return 0
    if cmd == "loop-data":
        d = sys.argv[2]
        r = np.random.default_rng(0)
        np.save(os.path.join(d, "x.npy"), r.standard_normal((4, 4)).astype(np.float32))
        np.save(os.path.join(d, "n.npy"), np.array([3, 0, 4, 0], np.int64))  # a batch's trips: its first
        return 0
    if cmd == "loop-sgd":
        d, trained = sys.argv[2:4]

        def loss(w, x, n):
            a = x.astype(np.float64)
            for _ in range(n):
                a = np.tanh(a * w)
            return (a + 2 * np.sin(w)).sum()  # the second Loop's two trips

        w = np.array([0.5, 1.0, 1.5, -0.5])
        xs, ns = np.load(os.path.join(d, "x.npy")), np.load(os.path.join(d, "n.npy"))
        for i in range(2):
            x, n = xs[2 * i:2 * i + 2], int(ns[2 * i])
            e = np.eye(4) * 1e-6
            w = w - 0.1 * np.array([(loss(w + e[j], x, n) - loss(w - e[j], x, n)) / 2e-6 for j in range(4)])
        got = weights(trained)["w"]
        assert np.allclose(got, w, rtol=1e-5, atol=1e-6), (got, w)
        return 0
    if cmd == "tree-fd":
        _, _, before, after = sys.argv[2:6]
        tb = sys.argv[3]
        p0, p1 = weights(before), weights(after)
        t = seqs(tb)
        args = (t["left"][0], t["right"][0], t["word"][0], t["root"][0])
        r = np.random.default_rng(1)
        worst = 0.0
        for k in mr.WEIGHTS:
            got = p0[k] - p1[k]  # SGD at lr 1
            flat = p0[k].reshape(-1)
            scale = np.abs(got).max() + 1e-12
            for i in r.choice(flat.size, size=min(60, flat.size), replace=False):
                eps = 1e-6
                q = {n: v.copy() for n, v in p0.items()}
                q[k].reshape(-1)[i] += eps
                up = mr.reference(q, *args, label=t["label"][0])
                q[k].reshape(-1)[i] -= 2 * eps
                down = mr.reference(q, *args, label=t["label"][0])
                fd = (up - down) / (2 * eps)
                err = abs(got.reshape(-1)[i] - fd) / scale
                worst = max(worst, err)
                assert err < 1e-3, (k, int(i), float(got.reshape(-1)[i]), fd, scale)
        print(f"largest difference from finite differences: {worst:.2e} of each weight's largest gradient")
        return 0
    if cmd == "tree-torch":
        try:
            import torch
        except ImportError:
            print("no torch")
            return 0
        tb, steps, lr, trained = sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
        models = sys.argv[2]
        p = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in mr.load_weights(models).items()}
        t = seqs(tb)
        for e in range(steps):
            tree = (t["left"][e], t["right"][e], t["word"][e])
            loss = mr.torch_tree(p, "treelstm", *tree, int(t["root"][e]), t["label"][e])[2] / len(t["left"][e])
            for v in p.values():
                v.grad = None
            loss.backward()
            with torch.no_grad():
                for v in p.values():
                    v -= lr * v.grad
        got = weights(trained)
        for k in mr.WEIGHTS:
            want = p[k].detach().numpy()
            rel = np.abs(got[k] - want).max() / (np.abs(want).max() + 1e-12)
            assert rel < 1e-5, (k, rel)
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
