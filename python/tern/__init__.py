"""tern: eager tensors on tern's operator registry (man page: tern-python(7)).

Tensors are tern_eager.h's reference-counted tensors: every ONNX operator tern implements runs on
them one at a time with the kernels a plan uses (``tern.op.Relu(x)``, ``x @ w + b``), recorded for
autograd when an input requires a gradient (``loss.backward()``). tern.nn holds torch.nn-style
modules and tern.optim the optimizers.

    >>> import tern
    >>> w = tern.Parameter([[1.0, 2.0], [3.0, 4.0]])
    >>> loss = (tern.tensor([[1.0, 1.0]]) @ w).relu().sum()
    >>> loss.backward()
    >>> w.grad.tolist()
    [[1.0, 1.0], [1.0, 1.0]]
"""
import contextlib
import functools

from . import _tern
from ._tern import (
    DataError,
    Error,
    Parameter,
    Tensor,
    UsageError,
    cache_stats,
    full,
    is_grad_enabled,
    manual_seed,
    ones,
    op,
    op_outputs,
    rand,
    randn,
    set_grad_enabled as _set_grad_enabled,
    set_opset,
    tensor,
    zeros,
)

__version__ = _tern.__version__

__all__ = [
    'Tensor', 'Parameter', 'Error', 'UsageError', 'DataError', 'op', 'tensor', 'as_tensor', 'from_numpy',
    'zeros', 'ones', 'full', 'zeros_like', 'ones_like', 'randn', 'rand', 'arange', 'cat', 'stack', 'where',
    'manual_seed', 'no_grad', 'enable_grad', 'set_grad_enabled', 'is_grad_enabled', 'step', 'step_input',
    'steps_taken',
    'cache_stats', 'set_opset', 'op_outputs', 'nn', 'optim',
]  # not the dtype names: `from tern import *` would shadow the builtins bool and float

# Element types by name: tern.tensor(x, dtype=tern.float32) is dtype='float32'.
float32 = 'float32'
float64 = 'float64'
float16 = 'float16'
bfloat16 = 'bfloat16'
int8 = 'int8'
int16 = 'int16'
int32 = 'int32'
int64 = 'int64'
uint8 = 'uint8'
bool = 'bool'  # noqa: A001 (torch's spelling, tern.bool)
float = float32  # noqa: A001
double = float64
long = int64
half = float16


class _GradMode(contextlib.ContextDecorator):
    """Sets the grad mode for a with block or a decorated function, and restores the one before."""

    _enabled = True

    def __new__(cls, *args):
        # @tern.no_grad without parentheses decorates at once
        if cls is not set_grad_enabled and len(args) == 1 and callable(args[0]):
            return cls()(args[0])
        return super().__new__(cls)

    def __init__(self):
        self._saved = []

    def __enter__(self):
        self._saved.append(_set_grad_enabled(self._enabled))
        return self

    def __exit__(self, *exc):
        _set_grad_enabled(self._saved.pop())
        return False

    def __call__(self, fn):
        # a fresh instance per call, so the decorated function can recurse and run in threads
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Nothing is recorded for autograd inside (a context manager and a decorator)::

        with tern.no_grad():
            w2 = w - 0.1 * w.grad
    """

    _enabled = False


class enable_grad(_GradMode):
    """Recording for autograd is on inside, whatever it was (a context manager and a decorator)."""

    _enabled = True


class set_grad_enabled(_GradMode):
    """set_grad_enabled(mode): sets the grad mode now (as a function) or for a with block."""

    def __init__(self, mode):
        super().__init__()
        self._enabled = builtins_bool(mode)
        self._prev = _set_grad_enabled(self._enabled)

    def __enter__(self):
        self._saved.append(self._prev)
        return self

    def __call__(self, fn):
        mode = self._enabled
        _set_grad_enabled(self._prev)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapper


_steps = 0


class step(contextlib.ContextDecorator):
    """Marks one iteration of the program's main loop::

        for batch in data:
            with tern.step():
                loss = model(batch); loss.backward(); opt.step()

    It counts the iterations (tern.steps_taken()), and under tern-trace(1) the first ones are the
    steps traced."""

    def __enter__(self):
        global _steps
        _steps += 1
        _tern._trace_step(True)
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            _tern._trace_step(False)
        else:  # a step that raised is not a step the graph can hold
            _tern._trace_abandon()
        return False


def steps_taken():
    """The number of tern.step() blocks entered."""
    return _steps


def as_tensor(data, dtype=None):
    """data itself when it is a Tensor of dtype (or dtype is None), else tern.tensor(data, dtype)."""
    if isinstance(data, Tensor) and (dtype is None or data.dtype == _tern.tensor(0, dtype=dtype).dtype):
        return data
    return tensor(data, dtype=dtype)


def step_input(data, dtype=None):
    """tern.tensor(data, dtype), marked as input data of the step (a minibatch, its labels). Only
    tern-trace --trace-only tells it apart: like torch.jit.trace, which takes the traced function's
    arguments anew at every call and keeps every other tensor made inside as the constant it was
    when traced, the replay feeds step inputs anew and replays the other tensors that the program
    made inside the traced step (numpy masks, host random numbers) as their first values.
    Everywhere else it is tern.tensor(data, dtype)."""
    t = tensor(data, dtype=dtype)
    _tern._trace_input(t)
    return t


def from_numpy(array):
    """A tensor holding a copy of a numpy array (its dtype kept)."""
    return tensor(array)


def zeros_like(t, dtype=None, requires_grad=False):
    """A tensor of zeros with t's shape (and dtype unless given)."""
    return zeros(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)


def ones_like(t, dtype=None, requires_grad=False):
    """A tensor of ones with t's shape (and dtype unless given)."""
    return ones(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)


def arange(start, end=None, step=1, dtype=None):
    """Range: start, start+step, ... below end (arange(n) is 0..n-1); int64 for ints, float32 else."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = int64 if all(isinstance(v, int) for v in (start, end, step)) else float32
    return op.Range(tensor(start, dtype=dtype), tensor(end, dtype=dtype), tensor(step, dtype=dtype))


def cat(tensors, axis=0, dim=None):
    """Concat along axis (torch's dim accepted)."""
    return op.Concat(*tensors, axis=axis if dim is None else dim)


def stack(tensors, axis=0, dim=None):
    """The tensors (all one shape) stacked along a new axis."""
    axis = axis if dim is None else dim
    return op.Concat(*[t.unsqueeze(axis) for t in tensors], axis=axis)


def where(condition, x, y):
    """Where: x where condition is true, y elsewhere (numbers take the other operand's dtype)."""
    if not isinstance(x, Tensor) and isinstance(y, Tensor):
        x = tensor(x, dtype=y.dtype)
    elif not isinstance(y, Tensor) and isinstance(x, Tensor):
        y = tensor(y, dtype=x.dtype)
    return op.Where(condition, x, y)


# ONNX's AttrType numbers to tern_eager.h's TERN_ATTR_* (0: not checked).
_ONNX_ATTR_KINDS = {1: 2, 2: 1, 3: 3, 4: 4, 6: 6, 7: 5, 8: 7}


_schemas = None  # (domain, name) -> the schema's versions, oldest first


def _attribute_schema(domain, name, opset):
    """What tern.op checks a call of the ONNX operator domain.name at opset (0: the newest onnx
    knows) against, since tern_call ignores attributes an operator does not read and does not check
    that required inputs are there: ({attribute: kind}, min_inputs, max_inputs, (input name, or None
    where optional, ...)). None when onnx is not installed or has no such operator (tern's domain)."""
    global _schemas
    if _schemas is None:
        try:
            import onnx.defs
        except ImportError:
            _schemas = {}
            return None
        # every version of every schema, indexed once: onnx.defs.get_schema raises a C++ exception
        # for unknown operators, which AddressSanitizer's preloaded runtime cannot unwind
        _schemas = {}
        for sc in onnx.defs.get_all_schemas_with_history():
            _schemas.setdefault((sc.domain, sc.name), []).append(sc)
        for versions in _schemas.values():
            versions.sort(key=lambda sc: sc.since_version)
    domain = '' if domain == 'ai.onnx' else domain
    versions = [sc for sc in _schemas.get((domain, name), ()) if not opset or sc.since_version <= opset]
    if not versions:
        return None
    schema = versions[-1]
    import onnx.defs
    attrs = {k: _ONNX_ATTR_KINDS.get(int(a.type), 0) for k, a in schema.attributes.items()}
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    names = tuple(None if p.option == optional else p.name for p in schema.inputs)
    return attrs, schema.min_input, min(schema.max_input, 64), names


_tern._set_attribute_schema(_attribute_schema)

import builtins as _builtins  # noqa: E402 (tern.bool shadows the builtin above)

builtins_bool = _builtins.bool

from . import _tensor  # noqa: E402,F401 (Tensor's methods written in Python)


def _start_trace():
    """Under tern-trace(1) (TERN_TRACE=FILE in the environment): the default context records its
    first TERN_TRACE_STEPS steps and writes their graph to FILE (at the last of them, or at exit);
    with TERN_TRACE_REPLAY (--trace-only) later steps replay the first one's operations."""
    import atexit
    import os
    path = os.environ.get('TERN_TRACE')
    if not path:
        return
    _tern._trace_start(path, int(os.environ.get('TERN_TRACE_STEPS') or 1), os.environ.get('TERN_TRACE_RECORD') or None,
                       builtins_bool(os.environ.get('TERN_TRACE_VERBOSE')), os.path.dirname(os.path.abspath(__file__)),
                       builtins_bool(os.environ.get('TERN_TRACE_REPLAY')), builtins_bool(os.environ.get('TERN_TRACE_COEXEC')))

    def finish():
        try:
            _tern._trace_finish()
        except Error as e:
            import sys
            print('tern-trace: %s' % e, file=sys.stderr)
            os._exit(int(getattr(e, 'status', 70)) if isinstance(getattr(e, 'status', None), int) else 70)
    atexit.register(finish)


_start_trace()
from . import nn, optim  # noqa: E402,F401 (they import tern)
