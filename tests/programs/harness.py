"""Shared harness of the imperative programs in tests/programs/ (run by run_all.py).

Each program is a module NAME.py defining

    def run(backend, seed):   # backend: "tern" or "torch"
        ...
        return harness.result(losses=..., params=..., outputs=..., step_ms=...)

It builds its model with that library, trains / runs it with data and random numbers drawn on the
host (numpy's or Python's RNG from `seed`, identical for both backends), and returns a dict:

    losses   list of floats, one (or a few) per step of the main loop
    params   {name: numpy array} at the end (harness.params_of(model) for a module)
    outputs  {name: value} anything else comparable: float arrays / floats are compared to
             relative tolerance of their scale, ints / strings / bools / int arrays exactly
    step_ms  median milliseconds per step of the main loop (harness.StepTimer)

The tern twin is written the way a user of `tern` writes it; the few API differences go through the
Backend object `B = harness.backend(name)`:

    B.name            "tern" or "torch"
    B.lib             the module (tern or torch); B.nn, B.F (nn.functional), B.optim
    B.tensor(a)       a float32 tensor from array_like (numpy float64 becomes float32)
    B.long(a)         an int64 tensor
    B.numpy(t)        a numpy array of a tensor (detached)
    B.no_grad()       the no-grad context
    B.build(factory, seed)
                      calls factory(B) to build the model; on torch under torch.manual_seed(seed),
                      on tern it builds the torch twin the same way first and loads its state_dict
                      into the tern model (load_state_dict({k: v.numpy()})): same initial weights.
    B.load_from_torch(model, torch_state)   that load by hand (numpy dict or torch state_dict)

Timing:

    timer = harness.StepTimer(B)
    for ...:
        with timer.step():       # tern.step() on tern; perf_counter around the whole step on both
            ...
    timer.median_ms()

Random numbers: harness.rng(seed) is numpy's Generator (PCG64) and harness.pyrandom(seed) a
random.Random; both backends draw the same sequence. Datasets: harness.digits() (scikit-learn's
bundled 8x8 digits, no download), harness.TEXT (a short English text).

Optimizers: call opt.zero_grad(set_to_none=True) on both. The torch here is 1.13, whose default
is set_to_none=False (gradients become zeros, and Adam/momentum still move a parameter that got
no gradient in a step); tern.optim's default is True (torch 2's): a parameter that took no part in
a step (a skipped block) is then left alone by both.

Keeping within 1e-4 for dozens of steps: the two libraries differ by float rounding (1e-7), which
training grows. Smooth activations (SiLU, GELU, ELU, tanh) keep it near 1e-6; at ReLU's kink (and
max-pool ties) a unit within 1e-7 of 0 can take different branches, a discrete jump that training
then amplifies (seen as 1e-3 loss drift after 10-40 steps on some seeds). A bias whose gradient is
0 in exact arithmetic (a conv bias before BatchNorm, an attention key bias) gets float noise that
Adam turns into full-size steps: leave such biases out.

Tolerances: run_all.py compares at relative 1e-4 of each quantity's scale (max |torch value| of
that quantity, at least harness.ABS_FLOOR). A program may set a module-level RTOL to loosen it (and
must say why in a comment).
"""
import contextlib
import random
import statistics
import time

import numpy as np

BACKENDS = ('tern', 'torch')
RTOL = 1e-4
ABS_FLOOR = 1e-6

_torch_ready = False


def _torch():
    global _torch_ready
    import torch
    if not _torch_ready:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process
            pass
        _torch_ready = True
    return torch


class Backend:
    """The library behind one twin, and the few calls that differ between tern and torch."""

    def __init__(self, name):
        if name not in BACKENDS:
            raise ValueError('backend must be one of %s, not %r' % (BACKENDS, name))
        self.name = name
        if name == 'torch':
            torch = _torch()
            import torch.nn.functional as F
            self.lib, self.nn, self.F, self.optim = torch, torch.nn, F, torch.optim
        else:
            import tern
            import tern.nn.functional as F
            self.lib, self.nn, self.F, self.optim = tern, tern.nn, F, tern.optim

    is_tern = property(lambda self: self.name == 'tern')
    is_torch = property(lambda self: self.name == 'torch')

    def __repr__(self):
        return 'Backend(%r)' % self.name

    # ------------------------------------------------ tensors

    def tensor(self, a, dtype=None, step_input=False):
        """A float32 tensor (or dtype: 'float32', 'int64', 'bool', ...) holding a copy of a; on tern
        with step_input, marked as the step's input data (tern.step_input)."""
        a = np.asarray(a)
        if dtype is None:
            dtype = 'float32' if a.dtype.kind == 'f' else str(a.dtype)
        a = np.ascontiguousarray(a.astype(dtype, copy=False))
        if self.is_torch:
            return self.lib.from_numpy(a.copy())
        return self.lib.step_input(a) if step_input else self.lib.tensor(a)

    def long(self, a):
        return self.tensor(np.asarray(a), dtype='int64')

    def input(self, a, dtype=None):
        """tensor(a, dtype) holding the step's input data (a minibatch, its labels): on tern marked
        as such (tern.step_input), which only tern-trace --trace-only tells apart, as torch.jit.trace
        does the traced function's arguments."""
        return self.tensor(a, dtype, step_input=True)

    def numpy(self, t):
        if isinstance(t, np.ndarray):
            return t
        if self.is_torch:
            return t.detach().cpu().numpy().copy()
        return np.array(t.detach().numpy(), copy=True)

    def item(self, t):
        return float(t.item()) if not isinstance(t, (int, float)) else float(t)

    def no_grad(self):
        return self.lib.no_grad()

    # ------------------------------------------------ models

    def build(self, factory, seed):
        """factory(B) -> model, with torch's initial weights (under torch.manual_seed(seed))."""
        torch = _torch()
        torch.manual_seed(seed)
        twin = factory(backend('torch'))
        if self.is_torch:
            return twin
        model = factory(self)
        self.load_from_torch(model, twin.state_dict())
        return model

    def load_from_torch(self, model, state):
        if self.is_torch:
            model.load_state_dict({k: _torch().as_tensor(np.asarray(v)) for k, v in state.items()})
            return model
        state = {k: (v.detach().cpu().numpy() if hasattr(v, 'detach') else np.asarray(v))
                 for k, v in state.items()}
        model.load_state_dict(state)
        return model


_backends = {}


def backend(name):
    """The (cached) Backend of that name."""
    if name not in _backends:
        _backends[name] = Backend(name)
    return _backends[name]


# ---------------------------------------------------------------- results

def params_of(*models, prefixes=None):
    """{name: numpy array} of the models' named_parameters() (and persistent buffers, e.g. BN's
    running statistics; not num_batches_tracked). Several models: names prefixed by prefixes
    (default 'm0.', 'm1.', ...)."""
    out = {}
    for i, model in enumerate(models):
        pre = '' if len(models) == 1 and prefixes is None else (prefixes[i] if prefixes else 'm%d.' % i)
        for k, v in model.state_dict().items():
            if k.endswith('num_batches_tracked'):
                continue
            if hasattr(v, 'detach'):
                v = v.detach()
            if hasattr(v, 'cpu'):
                v = v.cpu()
            if hasattr(v, 'numpy'):
                v = v.numpy()
            out[pre + k] = np.array(v, copy=True)
    return out


def result(losses, params, outputs=None, step_ms=float('nan')):
    return {
        'losses': [float(x) for x in losses],
        'params': {k: np.asarray(v) for k, v in params.items()},
        'outputs': dict(outputs or {}),
        'step_ms': float(step_ms),
    }


class StepTimer:
    """perf_counter around each whole step: on tern, tern.step()'s entry and exit are inside it (what
    tracing and co-execution do there, such as writing the graph again after a divergence, is timed)."""

    def __init__(self, B):
        self.B = B
        self.times = []

    @contextlib.contextmanager
    def step(self):
        ctx = self.B.lib.step() if self.B.is_tern else contextlib.nullcontext()
        t0 = time.perf_counter()
        with ctx:
            yield
        self.times.append(time.perf_counter() - t0)

    def median_ms(self):
        return 1000.0 * statistics.median(self.times) if self.times else float('nan')


# ---------------------------------------------------------------- host randomness and data

def rng(seed):
    return np.random.default_rng(seed)


def pyrandom(seed):
    return random.Random(seed)


_digits = None


def digits():
    """(images float32 [1797, 1, 8, 8] scaled to [0, 1], labels int64 [1797]): scikit-learn's
    bundled digits."""
    global _digits
    if _digits is None:
        from sklearn.datasets import load_digits
        d = load_digits()
        x = (d.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
        _digits = (x, d.target.astype(np.int64))
    return _digits[0].copy(), _digits[1].copy()


TEXT = ("the quick brown fox jumps over the lazy dog. "
        "a small model learns to spell a few words. "
        "the dog sleeps and the fox runs away. ")


# ---------------------------------------------------------------- comparison (run_all.py)

def _is_discrete(v):
    if isinstance(v, (bool, int, str, np.integer, np.bool_)):
        return True
    if isinstance(v, np.ndarray):
        return v.dtype.kind in 'biuUSO'
    return False


def _to_array(v):
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, (list, tuple)):
        try:
            a = np.asarray(v)
            if a.dtype.kind in 'biufUS':
                return a
        except (ValueError, TypeError):
            return None
    if isinstance(v, (int, float, np.number, bool)):
        return np.asarray(v)
    return None


def compare(name, a, b, rtol=RTOL):
    """None when a (tern) agrees with b (torch), else a one-line reason. Discrete values exactly;
    float arrays to rtol of b's scale (max |b|, at least ABS_FLOOR)."""
    if isinstance(b, dict):
        if not isinstance(a, dict):
            return '%s: tern gave %s, torch a dict' % (name, type(a).__name__)
        if set(a) != set(b):
            return '%s: keys differ: only tern %s, only torch %s' % (
                name, sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5])
        for k in b:
            why = compare('%s[%s]' % (name, k), a[k], b[k], rtol)
            if why:
                return why
        return None
    aa, ba = _to_array(a), _to_array(b)
    if ba is None or aa is None:
        if isinstance(b, (list, tuple)) and isinstance(a, (list, tuple)):
            if len(a) != len(b):
                return '%s: lengths %d (tern) vs %d (torch)' % (name, len(a), len(b))
            for i, (x, y) in enumerate(zip(a, b)):
                why = compare('%s[%d]' % (name, i), x, y, rtol)
                if why:
                    return why
            return None
        return None if a == b else '%s: %r (tern) vs %r (torch)' % (name, a, b)
    if aa.shape != ba.shape:
        return '%s: shape %s (tern) vs %s (torch)' % (name, aa.shape, ba.shape)
    if _is_discrete(ba) or _is_discrete(b):
        if aa.dtype.kind == 'f' and ba.dtype.kind != 'f':
            return '%s: tern gave floats, torch %s' % (name, ba.dtype)
        if not np.array_equal(aa, ba):
            bad = np.argwhere(aa != ba) if aa.ndim else [()]
            i = tuple(bad[0])
            return '%s: differs at %s: %r (tern) vs %r (torch), %d of %d' % (
                name, i, aa[i].tolist(), ba[i].tolist(), len(bad), ba.size)
        return None
    aa, ba = aa.astype(np.float64), ba.astype(np.float64)
    if ba.size == 0:
        return None
    if not np.all(np.isfinite(aa)) and np.all(np.isfinite(ba)):
        return '%s: tern has non-finite values' % name
    scale = max(float(np.max(np.abs(ba))), ABS_FLOOR)
    err = np.abs(aa - ba)
    worst = float(np.max(err))
    if not worst <= rtol * scale:
        i = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
        return '%s: max error %.3g at %s (tern %.7g, torch %.7g), scale %.3g, rtol %g' % (
            name, worst, tuple(int(j) for j in i), float(aa[i]), float(ba[i]), scale, rtol)
    return None


def compare_results(rt, rb, rtol=RTOL):
    """None when the tern result rt agrees with the torch result rb, else why not. Losses are
    compared step by step (the first step that differs is named), then params, then outputs."""
    lt, lb = rt['losses'], rb['losses']
    if len(lt) != len(lb):
        return 'losses: %d steps (tern) vs %d (torch)' % (len(lt), len(lb))
    if lb:
        scale = max(max(abs(x) for x in lb), ABS_FLOOR)
        for i, (x, y) in enumerate(zip(lt, lb)):
            if not abs(x - y) <= rtol * scale:
                return 'losses: step %d: %.7g (tern) vs %.7g (torch), scale %.3g, rtol %g' % (
                    i, x, y, scale, rtol)
    why = compare('params', rt['params'], rb['params'], rtol)
    if why:
        return why
    return compare('outputs', rt['outputs'], rb['outputs'], rtol)


# ---------------------------------------------------------------- host-side box code (the detectors)

def iou(a, b):
    """Intersection over union of boxes a [N, 4] and b [M, 4] (x0 y0 x1 y1): [N, M]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda x: np.prod(x[:, 2:] - x[:, :2], -1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter)


def nms(boxes, scores, thresh):
    """Indices kept by greedy non-maximum suppression, best score first."""
    order = list(np.argsort(-scores, kind='stable'))
    keep = []
    while order:
        i = order.pop(0)
        keep.append(i)
        if order:
            ov = iou(boxes[i:i + 1], boxes[np.array(order)])[0]
            order = [j for j, o in zip(order, ov) if o <= thresh]
    return np.array(keep, np.int64)
