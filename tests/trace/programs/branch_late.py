"""A branch first taken at step 3: the loss is clipped only when a fetched value exceeds a bound."""
import numpy as np
import tern

rng = np.random.default_rng(1)
w = tern.Parameter(rng.standard_normal((5, 2)).astype(np.float32))
opt = tern.optim.Adam([w], lr=0.05)
for step in range(5):
    with tern.step():
        x = tern.tensor(rng.standard_normal((6, 5)).astype(np.float32) * (1 + step))
        y = (x @ w).sigmoid()
        loss = ((y - 0.5) ** 2).mean()
        if step >= 2:
            loss = loss * 0.5 + (w * w).sum() * 0.01
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, round(loss.item(), 6))
