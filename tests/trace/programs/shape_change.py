"""The batch size changes mid-run (a short last batch): the traced inputs get a symbolic dimension."""
import numpy as np
import tern

rng = np.random.default_rng(2)
lin = tern.nn.Linear(3, 4)
opt = tern.optim.SGD(lin.parameters(), lr=0.1, momentum=0.5)
for step, n in enumerate([8, 8, 5, 8]):
    with tern.step():
        x = tern.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        t = tern.tensor(rng.integers(0, 4, n))
        loss = tern.nn.functional.cross_entropy(lin(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, loss.item())
