#!/usr/bin/env python3
"""An imperative tern program for the demo: an MLP on the digits that demo.sh wrote to DIR, trained
with tern.nn and tern.optim, with host code in the loop (numpy batches, a learning rate lowered
when the loss has not improved, printing). tern-trace turns its first steps into a graph.

    eager_digits.py DIR [STEPS]"""
import sys

import numpy as np

import tern
import tern.nn as nn
import tern.nn.functional as F

folder = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
x = np.load(folder + '/x_train.npy').reshape(-1, 64)
y = np.load(folder + '/y_train.npy')
tern.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
opt = tern.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
rng = np.random.default_rng(0)
best = float('inf')
for step in range(steps):
    with tern.step():
        idx = rng.choice(len(y), 32, replace=False)
        loss = F.cross_entropy(net(tern.tensor(x[idx])), tern.tensor(y[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        if value >= best:  # host code reads the loss and changes the learning rate
            opt.param_groups[0]['lr'] *= 0.98
        best = min(best, value)
    if step % 20 == 0 or step == steps - 1:
        print(f"step {step}: loss {value:.4f}, lr {opt.param_groups[0]['lr']:.3f}")
