"""A program that never calls tern.step(): its whole run is the one step traced."""
import numpy as np
import tern

a = tern.tensor(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3))
b = (a * 2 + 1).relu().sum(axis=1)
print(b.numpy())
