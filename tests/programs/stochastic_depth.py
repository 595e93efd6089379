"""Stochastic depth (Huang et al. 2016; the SDPoint idea of a different network each step): a
residual CNN on 8x8 digits whose residual blocks are skipped at random during training. Which
blocks run is drawn by Python's `random` every step (survival probability falling linearly with
depth to P_LAST); a skipped block is not executed at all, which no fixed graph expresses. At
evaluation every block runs, its residual branch scaled by its survival probability.

SiLU, not ReLU, for the reason early_stop.py gives (kinks turn float noise into 1e-3 drift).

Compared: the loss per step, final weights, the blocks drawn each step (exactly), the evaluation
logits and predictions.
"""
import numpy as np

import harness

STEPS = 40
BATCH = 32
DEPTH = 6
P_LAST = 0.5


def make_model(B):
    nn, F = B.nn, B.F

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.act = nn.SiLU()

        def branch(self, x):
            return self.bn2(self.conv2(self.act(self.bn1(self.conv1(x)))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(1, 8, 3, padding=1)
            self.blocks = nn.ModuleList([Block(8) for _ in range(DEPTH)])
            self.pool = nn.AvgPool2d(2)
            self.fc = nn.Linear(8 * 4 * 4, 10)
            self.survival = [1.0 - (i + 1) / DEPTH * (1.0 - P_LAST) for i in range(DEPTH)]

        def forward(self, x, active=None):
            x = F.silu(self.stem(x))
            for i, blk in enumerate(self.blocks):
                if active is None:                      # evaluation: every block, scaled
                    x = F.silu(x + blk.branch(x) * self.survival[i])
                elif active[i]:                         # training: only the drawn blocks run
                    x = F.silu(x + blk.branch(x))
            x = self.pool(x)
            return self.fc(x.reshape(x.shape[0], -1))

    return Net()


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    pyr = harness.pyrandom(seed)
    x, y = harness.digits()
    order = rng.permutation(len(x))
    tr, te = order[:1280], order[1280:1536]

    model = B.build(make_model, seed)
    opt = B.optim.Adam(model.parameters(), lr=3e-3)
    timer = harness.StepTimer(B)
    losses, drawn = [], []
    model.train()
    for step in range(STEPS):
        idx = rng.choice(tr, BATCH, replace=False)
        active = [pyr.random() < p for p in model.survival]
        drawn.append(''.join('1' if a else '0' for a in active))
        with timer.step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(B.input(x[idx]), active), B.input(y[idx], 'int64'))
            loss.backward()
            opt.step()
            losses.append(loss.item())

    model.eval()
    with B.no_grad():
        logits = B.numpy(model(B.tensor(x[te])))
    return harness.result(
        losses, harness.params_of(model),
        outputs={'drawn': drawn, 'eval_logits': logits, 'eval_pred': logits.argmax(1).astype(np.int64)},
        step_ms=timer.median_ms())
