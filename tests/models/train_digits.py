#!/usr/bin/env python3
"""Convergence on real data: scikit-learn's bundled digits, a small CNN exported from PyTorch, trained
from the shell as the README's demo does (tern-autodiff, tern-run --train); the trained model is then
scored by onnxruntime on the held-out digits and must reach 97 % accuracy.

    train_digits.py --bin BUILD/bin --work DIR
"""
import argparse
import os
import subprocess
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digits = os.path.join(src, "scripts", "digits.py")
    w = a.work
    run = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True, text=True)
    run(sys.executable, digits, "data", w)
    run(sys.executable, digits, "model", os.path.join(w, "cnn.onnx"))
    run(os.path.join(a.bin, "tern-autodiff"), "--loss", "cross-entropy", "--target", "label", "--optimizer", "adam",
        "--lr", "3e-3", "--lr-schedule", "cosine:675", os.path.join(w, "cnn.onnx"), "-o", os.path.join(w, "train.onnx"))
    p = run(os.path.join(a.bin, "tern-run"), "--train", os.path.join(w, "train.onnx"),
            "-i", "x=" + os.path.join(w, "x_train.npy"), "-i", "label=" + os.path.join(w, "y_train.npy"),
            "--batch", "32", "--epochs", "15", "--shuffle", "-o", os.path.join(w, "trained.onnx"))
    import onnxruntime as ort
    s = ort.InferenceSession(os.path.join(w, "trained.onnx"), providers=["CPUExecutionProvider"])
    z = s.run(None, {"x": np.load(os.path.join(w, "x_test.npy"))})[0]
    acc = float((z.argmax(axis=1) == np.load(os.path.join(w, "y_test.npy"))).mean())
    print(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")
    print(f"{'ok  ' if acc >= 0.97 else 'FAIL'} test accuracy {acc:.4f} (onnxruntime on the trained model; >= 0.97)")
    return 0 if acc >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
