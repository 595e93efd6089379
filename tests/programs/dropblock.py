"""DropBlock (Ghiasi et al. 2018) on a small CNN for 8x8 digits, with the block masks built on the
host: the feature map's shape is read from the tensor (x.shape), numpy draws the block centres
(Bernoulli with the paper's gamma) and grows each into a BLOCK x BLOCK square, and the mask,
rescaled by count / kept, is multiplied in. The drop probability ramps up linearly over training
(a Python schedule). AdamW trains it.

SiLU and average pooling, not ReLU and max pooling: kinks turn float noise into 1e-4 drift on
some seeds (see harness.py).

Compared: the loss per step, final weights, the fraction of units each step's masks kept, the
evaluation logits.
"""
import numpy as np

import harness

STEPS = 36
BATCH = 32
BLOCK = 3
DROP_MAX = 0.25


def block_mask(rng, shape, drop_prob, block):
    """float32 mask of shape (N, C, H, W): 0 inside dropped blocks, scaled so its mean is 1."""
    n, c, h, w = shape
    if drop_prob <= 0:
        return np.ones(shape, np.float32), 1.0
    valid = (h - block + 1) * (w - block + 1)
    gamma = drop_prob / (block * block) * (h * w) / valid
    centres = np.zeros(shape, np.float32)
    lo, hi = block // 2, block - 1 - block // 2
    centres[:, :, lo:h - hi, lo:w - hi] = rng.random((n, c, h - block + 1, w - block + 1)) < gamma
    # grow each centre into a block: a max over the block window around every unit
    pad = np.pad(centres, ((0, 0), (0, 0), (lo, hi), (lo, hi)))
    dropped = np.zeros(shape, np.float32)
    for dy in range(block):
        for dx in range(block):
            dropped = np.maximum(dropped, pad[:, :, dy:dy + h, dx:dx + w])
    mask = 1.0 - dropped
    kept = float(mask.sum())
    scale = mask.size / max(kept, 1.0)
    return (mask * scale).astype(np.float32), kept / mask.size


def make_model(B):
    nn = B.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)  # no bias before BN: its gradient is ~0, noise Adam would amplify
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(32)
            self.pool = nn.AvgPool2d(2)
            self.fc = nn.Linear(32 * 4 * 4, 10)

        def forward(self, x, dropblock=None):
            x = B.F.silu(self.bn1(self.conv1(x)))
            if dropblock is not None:
                x = dropblock(x)
            x = B.F.silu(self.bn2(self.conv2(x)))
            if dropblock is not None:
                x = dropblock(x)
            x = self.pool(x)
            return self.fc(x.reshape(x.shape[0], -1))

    return Net()


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    mask_rng = harness.rng(seed + 1)
    x, y = harness.digits()
    order = rng.permutation(len(x))
    tr, te = order[:1280], order[1280:1536]

    model = B.build(make_model, seed)
    opt = B.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    timer = harness.StepTimer(B)
    losses, kept = [], []

    for step in range(STEPS):
        idx = rng.choice(tr, BATCH, replace=False)
        drop_prob = DROP_MAX * min(1.0, step / (STEPS / 2))

        def dropblock(t):
            mask, frac = block_mask(mask_rng, tuple(t.shape), drop_prob, BLOCK)  # shape fetched
            kept.append(frac)
            return t * B.tensor(mask)

        model.train()
        with timer.step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(B.input(x[idx]), dropblock), B.input(y[idx], 'int64'))
            loss.backward()
            opt.step()
            losses.append(loss.item())

    model.eval()
    with B.no_grad():
        logits = B.numpy(model(B.tensor(x[te])))
    return harness.result(
        losses, harness.params_of(model),
        outputs={'kept_fraction': np.array(kept), 'eval_logits': logits,
                 'eval_pred': logits.argmax(1).astype(np.int64)},
        step_ms=timer.median_ms())
