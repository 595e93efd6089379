"""An exception raised inside a step, caught outside it: that step is left out of the trace."""
import numpy as np
import tern

w = tern.Parameter(np.ones((3,), np.float32))
done = 0
for step in range(5):
    try:
        with tern.step():
            y = (tern.tensor(np.arange(3, dtype=np.float32) + step) * w).sum()
            if step == 1:
                raise ValueError('bad batch')
            print(step, y.item())
            done += 1
    except ValueError:
        print(step, 'skipped')
