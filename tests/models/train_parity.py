#!/usr/bin/env python3
"""Training parity with PyTorch: the same model, initial weights and batches, 20 steps of SGD with
momentum and 20 of Adam, in PyTorch and in tern (tern-autodiff, then tern-run --train).

    train_parity.py --bin BUILD/bin --work DIR [--optimizers sgd,adam,...] [NAME...]
        NAME: mlp cnn lstm transformer; optimizers: sgd adam nesterov adamw adagrad adagrad-plain clip

The loss at every step and the parameters at the end must agree within a relative 1e-4 of their
scale (max |tern - torch| <= 1e-4 max |torch|). Prints one line per model and optimizer; exits 1
when one disagrees.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

STEPS = 20
BATCH = 8


class LM(nn.Module):
    def __init__(self, vocab=50, dim=16, hidden=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        h, _ = self.lstm(self.emb(tokens))
        return self.out(h).transpose(1, 2)  # [N, vocab, T]: classes on axis 1


class Encoder(nn.Module):
    def __init__(self, dim=16, classes=5):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.0, batch_first=True)
        self.out = nn.Linear(dim, classes)

    def forward(self, x):
        return self.out(self.layer(x).mean(dim=1))


def make(name):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    n = STEPS * BATCH
    if name == "mlp":
        net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))
        x = torch.randn(n, 12, generator=g)
        y = torch.randint(0, 5, (n,), generator=g)
    elif name == "cnn":
        # no bias before BatchNormalization (it cancels it: Adam would chase rounding noise)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 4))
        x = torch.randn(n, 3, 8, 8, generator=g)
        y = torch.randint(0, 4, (n,), generator=g)
    elif name == "lstm":
        net = LM()
        x = torch.randint(0, 50, (n, 7), generator=g)
        y = torch.randint(0, 50, (n, 7), generator=g)
    elif name == "transformer":
        net = Encoder()
        x = torch.randn(n, 6, 16, generator=g)
        y = torch.randint(0, 5, (n,), generator=g)
    else:
        raise SystemExit(f"unknown model {name}")
    return net, x, y


def export(net, x, path):
    # in training mode, so that BatchNormalization stays (an eval export folds it into the convolution)
    net.train()
    torch.onnx.export(net, x[:BATCH], path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    # ONNX initializer names for the torch parameters (the exporter keeps state_dict names)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


# optimizer: (tern-autodiff's options, torch.optim's constructor, clip norm)
OPTIMIZERS = {
    "sgd": (["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), None),
    "adam": (["--optimizer", "adam", "--lr", "1e-3"], lambda p: torch.optim.Adam(p, lr=1e-3), None),
    "nesterov": (["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.8", "--nesterov", "--weight-decay", "0.01"],
                 lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01), None),
    "adamw": (["--optimizer", "adamw", "--lr", "2e-3", "--betas", "0.8,0.99", "--eps", "1e-6"],
              lambda p: torch.optim.AdamW(p, lr=2e-3, betas=(0.8, 0.99), eps=1e-6), None),
    "adagrad": (["--optimizer", "adagrad", "--lr", "0.05", "--weight-decay", "0.001"],
                lambda p: torch.optim.Adagrad(p, lr=0.05, weight_decay=0.001), None),
    # no weight decay: the rows of an embedding with no gradient are left as they are
    "adagrad-plain": (["--optimizer", "adagrad", "--lr", "0.05"], lambda p: torch.optim.Adagrad(p, lr=0.05), None),
    "clip": (["--optimizer", "sgd", "--lr", "0.5", "--clip-norm", "0.5"], lambda p: torch.optim.SGD(p, lr=0.5), 0.5),
}


def torch_train(net, x, y, opt_name):
    net.train()
    opt = OPTIMIZERS[opt_name][1](net.parameters())
    clip = OPTIMIZERS[opt_name][2]
    losses = []
    # the largest gradient each parameter element ever had: elements whose gradient is zero in exact
    # arithmetic (a bias before a normalisation, attention's key bias) get rounding noise, which Adam
    # scales up to full steps in either framework; they cannot be compared
    peak = {k: torch.zeros_like(p) for k, p in net.named_parameters()}
    for s in range(STEPS):
        xb, yb = x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        for k, p in net.named_parameters():
            peak[k] = torch.maximum(peak[k], p.grad.abs())
        opt.step()
        losses.append(loss.item())
    noise = {k: (v <= 1e-6 * float(v.max())).numpy() for k, v in peak.items()}
    return losses, {k: v.detach().numpy() for k, v in net.state_dict().items()}, noise


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--optimizers", default="sgd,adam", help="comma-separated: " + ",".join(OPTIMIZERS))
    ap.add_argument("--eager-grad", metavar="PROGRAM",
                    help="also check eager gradients against tern-autodiff's with this program "
                         "(BUILD/tests/grad/eager_vs_graph) on each exported model's first batch")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.work, exist_ok=True)
    failed = 0
    for name in a.names or ["mlp", "cnn", "lstm", "transformer"]:
        if a.eager_grad:
            net, x, y = make(name)
            model = os.path.join(a.work, f"{name}.onnx")
            export(net, x, model)
            np.save(os.path.join(a.work, "xb.npy"), x[:BATCH].numpy())
            np.save(os.path.join(a.work, "yb.npy"), y[:BATCH].numpy().astype(np.int64))
            p = subprocess.run([a.eager_grad, model, os.path.join(a.work, "xb.npy"), os.path.join(a.work, "yb.npy")],
                               capture_output=True, text=True)
            out = (p.stdout.strip().splitlines() or [p.stderr.strip()])[-1]
            print(f"{'ok  ' if p.returncode == 0 else 'FAIL'} {name} eager gradients vs tern-autodiff's: "
                  f"{out.replace('ok   ', '').replace('FAIL ', '')}" + ("" if p.returncode == 0 else " " + p.stderr.strip()))
            failed += p.returncode != 0
        for opt_name in a.optimizers.split(","):
            net, x, y = make(name)
            model = os.path.join(a.work, f"{name}.onnx")
            export(net, x, model)
            net, x, y = make(name)  # the same initial weights again for training
            # a training-mode export runs the model once, which moves BatchNormalization's running
            # statistics: start PyTorch from the exported values, as tern does
            exported = {t.name: numpy_helper.to_array(t) for t in onnx.load(model).graph.initializer}
            with torch.no_grad():
                for k, v in net.state_dict().items():
                    if k.endswith(("running_mean", "running_var")) and k in exported:
                        v.copy_(torch.from_numpy(exported[k].reshape(v.shape)))
            want_losses, want_params, noise = torch_train(net, x, y, opt_name)
            np.save(os.path.join(a.work, "x.npy"), x.numpy())
            np.save(os.path.join(a.work, "y.npy"), y.numpy().astype(np.int64))
            train = os.path.join(a.work, f"{name}-{opt_name}-train.onnx")
            trained = os.path.join(a.work, f"{name}-{opt_name}-trained.onnx")
            log = os.path.join(a.work, f"{name}-{opt_name}.jsonl")
            args = OPTIMIZERS[opt_name][0]
            p = subprocess.run([os.path.join(a.bin, "tern-autodiff"), "--loss", "cross-entropy", *args, model,
                                "-o", train], capture_output=True, text=True)
            if p.returncode == 0:
                p = subprocess.run([os.path.join(a.bin, "tern-run"), "--train", train, "-i", "x=" +
                                    os.path.join(a.work, "x.npy"), "-i", "target=" + os.path.join(a.work, "y.npy"),
                                    "--batch", str(BATCH), "--steps", str(STEPS), "--log", log, "-o", trained],
                                   capture_output=True, text=True)
            if p.returncode != 0:
                print(f"FAIL {name} {opt_name}: {p.stderr.strip()}")
                failed += 1
                continue
            got_losses = [json.loads(l)["loss"] for l in open(log) if '"loss"' in l]
            got = {t.name: numpy_helper.to_array(t) for t in onnx.load(trained).graph.initializer}
            loss_err = max(abs(g - w) for g, w in zip(got_losses, want_losses)) / max(abs(w) for w in want_losses)
            worst, where, skipped = 0.0, "", 0
            for k, w in want_params.items():
                if k.endswith("num_batches_tracked") or k not in got:
                    continue
                d = np.abs(got[k].reshape(w.shape) - w)
                if k in noise:
                    skipped += int(noise[k].sum())
                    d = np.where(noise[k], 0, d)
                e = float(d.max() / max(np.abs(w).max(), 1e-12))
                if e > worst:
                    worst, where = e, k
            ok = len(got_losses) == STEPS and loss_err <= 1e-4 and worst <= 1e-4
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name} {opt_name}: losses {want_losses[0]:.5f} -> {want_losses[-1]:.5f}, "
                  f"worst relative difference: loss {loss_err:.2e}, parameters {worst:.2e} ({where})"
                  + (f"; {skipped} elements with no gradient not compared" if skipped else ""))
    print(f"{'all agree' if not failed else f'{failed} disagree'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
