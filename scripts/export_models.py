#!/usr/bin/env python3
"""Exports the models of the `models` test suite to ONNX (opset 17) with random, seeded weights.

Freshly initialised BatchNorm layers (mean 0, variance 1) let activations vanish through a deep
network, which would make a comparison of outputs meaningless; their statistics are therefore
measured on a few random batches first, so every layer sees activations of unit scale.

Nothing is downloaded: torchvision models are built with weights=None. A model whose file already
exists in the output folder is left alone, so the folder works as a cache.

Usage: .venv/bin/python scripts/export_models.py DIR [NAME...]
"""
import argparse
import os
import sys
import tempfile
import warnings

OPSET = 17
SEED = 0


class Input:
    """One model input: name, shape, dtype ("float32" or "int64"), and for integers the exclusive
    upper bound of the values (token ids)."""

    def __init__(self, name, shape, dtype="float32", high=None):
        self.name, self.shape, self.dtype, self.high = name, tuple(shape), dtype, high


def _vision(builder, size=224):
    def build():
        import torchvision.models as tvm

        return getattr(tvm, builder[0])(weights=None, **builder[1])

    return build, [Input("image", (1, 3, size, size))]


def _transformer(d_model=128, nhead=4):
    def build():
        import torch.nn as nn

        layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=nhead, dim_feedforward=4 * d_model, batch_first=True)
        return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    return build


VOCAB = 1000


def _recurrent_lm(layer):
    """Embedding, two recurrent layers (nn.LSTM or nn.GRU by name), and a linear head over the vocabulary."""

    def build():
        import torch.nn as nn

        class RecurrentLanguageModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(VOCAB, 128)
                self.rnn = getattr(nn, layer)(128, 256, num_layers=2, batch_first=True)
                self.head = nn.Linear(256, VOCAB)

            def forward(self, tokens):
                h, _ = self.rnn(self.embed(tokens))
                return self.head(h)

        return RecurrentLanguageModel()

    return build


def _gru_classifier():
    import torch.nn as nn

    class GruClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(64, 128, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(256, 10)

        def forward(self, x):
            h, _ = self.gru(x)
            return self.head(h[:, -1])

    return GruClassifier()



# name -> (builder, inputs)
MODELS = {
    "resnet50": _vision(("resnet50", {})),
    "mobilenet_v2": _vision(("mobilenet_v2", {})),
    "inception_v3": _vision(("inception_v3", {"aux_logits": False, "init_weights": False}), 299),
    "efficientnet_b0": _vision(("efficientnet_b0", {})),
    "googlenet": _vision(("googlenet", {"aux_logits": False, "init_weights": False})),
    "transformer_encoder": (_transformer(), [Input("x", (1, 32, 128))]),
    "lstm_lm": (_recurrent_lm("LSTM"), [Input("tokens", (1, 32), "int64", VOCAB)]),
    "gru_classifier": (_gru_classifier, [Input("x", (2, 20, 64))]),
    # the smaller networks whose depthwise, grouped and 1 x 1 convolutions dominate at batch 1
    "mnasnet": _vision(("mnasnet1_0", {})),
    "mobilenet_v3_small": _vision(("mobilenet_v3_small", {})),
    "squeezenet": _vision(("squeezenet1_0", {})),
    "regnet_y_400mf": _vision(("regnet_y_400mf", {})),
    "resnet18": _vision(("resnet18", {})),
    "shufflenet_v2": _vision(("shufflenet_v2_x1_0", {})),
    "transformer_d192": (_transformer(192, 4), [Input("x", (1, 32, 192))]),
    "gru_lm": (_recurrent_lm("GRU"), [Input("tokens", (1, 32), "int64", VOCAB)]),
}


def calibrate_batchnorm(model, inputs):
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a plain average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(*(random_args(inputs, batch=4)))
    model.eval()


def random_args(inputs, batch=None):
    import torch

    def shape(i):
        return (batch,) + i.shape[1:] if batch else i.shape

    return tuple(
        torch.randint(0, i.high, shape(i)) if i.dtype == "int64" else torch.randn(shape(i)) for i in inputs
    )


def model_path(folder, name):
    return os.path.join(folder, name + ".onnx")


def export(folder, name):
    """Writes folder/name.onnx unless it exists; returns its path."""
    path = model_path(folder, name)
    if os.path.exists(path):
        return path
    import torch

    build, inputs = MODELS[name]
    torch.manual_seed(SEED)
    model = build()
    calibrate_batchnorm(model, inputs)
    model.eval()
    args = random_args(inputs)
    os.makedirs(folder, exist_ok=True)
    # Written beside the target and renamed, so an interrupted export leaves no half file in the cache.
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=folder)
    os.close(fd)
    try:
        # Not under no_grad: with gradients enabled, torch's fused TransformerEncoder fast path (which
        # has no ONNX export) stays off.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                args,
                tmp,
                opset_version=OPSET,
                input_names=[i.name for i in inputs],
                output_names=["output"],
                do_constant_folding=True,
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main():
    ap = argparse.ArgumentParser(description="Export the models suite's models to ONNX.")
    ap.add_argument("folder")
    ap.add_argument("names", nargs="*", metavar="NAME", help="models to export (default: all)")
    opt = ap.parse_args()
    for name in opt.names or MODELS:
        if name not in MODELS:
            sys.exit(f"export_models: unknown model {name!r} (known: {', '.join(MODELS)})")
        print(export(opt.folder, name))


if __name__ == "__main__":
    main()
