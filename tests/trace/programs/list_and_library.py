"""A Python list of tensors mutated between steps, and a library call (numpy's sort) between two
tensor operations inside a step."""
import numpy as np
import tern

rng = np.random.default_rng(3)
w = tern.Parameter(rng.standard_normal((4, 4)).astype(np.float32) * 0.3)
bank = []
for step in range(4):
    with tern.step():
        x = tern.tensor(rng.standard_normal((2, 4)).astype(np.float32))
        h = (x @ w).tanh()
        order = np.argsort(h.numpy().sum(1))          # the host reads, computes, feeds back
        h = h[tern.tensor(order)]
        bank.append(h.detach())
        if len(bank) > 2:
            bank.pop(0)
        mem = tern.cat(bank, 0).mean()
        loss = (h * mem).sum()
        loss.backward()
        with tern.no_grad():
            w -= 0.1 * w.grad
        w.grad = None
        print(step, loss.item())
