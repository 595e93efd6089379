"""Tensor methods written in Python over tern.op (added to tern.Tensor when tern is imported), and
the hooks behind ``t[k] = v``, ``t[mask]`` and ``t += x``.

In-place operations follow PyTorch where it can be followed without version counters:

- With no history to record (under tern.no_grad(), or when nothing involved requires a gradient),
  the result is written into the tensor's own bytes, so that a parameter updated in place stays the
  module's parameter and numpy views of the bytes see the change.
- With a history, the result (a new operation on the tape) stands in for the tensor: the same
  Python object now holds it, and gradients flow through the operation as through any other. Other
  tensors that shared the old bytes (a reshape made before) keep the old values.
- A leaf that requires a gradient cannot be changed in place while gradients are recorded (as in
  PyTorch); under tern.no_grad() it can.

Bytes that a recorded operation saved for backward are not guarded: writing into them under
no_grad before backward() changes what backward reads (PyTorch raises an error there).
"""
import collections

import numpy as np

from . import _tern

Tensor = _tern.Tensor
op = _tern.op

# torch.return_types.max and friends: (values, indices), by name as well
ValuesIndices = collections.namedtuple('ValuesIndices', ['values', 'indices'])


def _int64(values):
    return _tern.tensor(np.asarray(values, dtype=np.int64))


def _axis(t, dim):
    r = t.ndim
    if not -r <= dim < max(r, 1):
        raise IndexError(f"dimension {dim} is out of range for a tensor of {r} dimensions")
    return dim + r if dim < 0 else dim


def _like(t, value):
    """value as a tensor of t's dtype (a Tensor of another dtype is cast)."""
    if isinstance(value, Tensor):
        return value if value.dtype == t.dtype else value.astype(t.dtype)
    return _tern.tensor(np.asarray(value), dtype=t.dtype)


def _host_key(key):
    """An index with every Tensor in it as a numpy array (for numpy to apply)."""
    if isinstance(key, tuple):
        return tuple(_host_key(k) for k in key)
    if isinstance(key, Tensor):
        return key.numpy()
    return key


def _recording(*tensors):
    return _tern.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _check_leaf(t, what):
    if _tern.is_grad_enabled() and t.is_leaf and t.requires_grad:
        raise RuntimeError(f"{what}: a leaf tensor that requires grad is used in an in-place operation "
                           "(update it under tern.no_grad())")


def _finish_inplace(t, result, what):
    """t op= x from result = t op x: into t's bytes without a history, else result stands in for t."""
    _check_leaf(t, what)
    if not isinstance(result, Tensor):
        result = _like(t, result)
    if tuple(result.shape) != tuple(t.shape):
        raise RuntimeError(f"{what}: the result's shape {tuple(result.shape)} is not the tensor's "
                           f"{tuple(t.shape)} (an in-place operation cannot broadcast the tensor itself)")
    if result.requires_grad and _tern.is_grad_enabled():
        return t._assign_(result if result.dtype == t.dtype else result.astype(t.dtype))
    return t.copy_(result if result.dtype == t.dtype else result.astype(t.dtype))


def _setitem(t, key, value):
    """t[key] = value with numpy's indexing rules (basic, integer arrays, boolean masks)."""
    _check_leaf(t, "item assignment")
    if not _recording(t, value):
        view = np.asarray(t)  # the tensor's own bytes
        view[_host_key(key)] = value.numpy() if isinstance(value, Tensor) else value
        return
    # with a history: ScatterElements of the value, broadcast, into the positions the key selects
    positions = np.arange(int(np.prod(t.shape, dtype=np.int64)), dtype=np.int64).reshape(t.shape)[_host_key(key)]
    v = _like(t, value)
    if tuple(v.shape) != positions.shape:
        try:
            np.broadcast_shapes(tuple(v.shape), positions.shape)
        except ValueError:
            raise ValueError(f"item assignment: a value of shape {tuple(v.shape)} does not broadcast to "
                             f"the indexed shape {positions.shape}") from None
        v = op.Expand(v, _int64(positions.shape))
    flat = op.ScatterElements(t.reshape(-1), _int64(positions.reshape(-1)), v.reshape(-1), axis=0)
    t._assign_(flat.reshape(t.shape))


def _mask_index(t, mask):
    """t[mask]: the elements (or, for a mask over leading axes, the sub-tensors) where mask is true."""
    m = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask, dtype=bool)
    lead = tuple(t.shape[:m.ndim])
    if m.shape != lead:
        raise IndexError(f"a boolean mask of shape {m.shape} does not match the tensor's leading "
                         f"dimensions {lead} (shape {tuple(t.shape)})")
    rows = t.reshape((-1,) + tuple(t.shape[m.ndim:]))
    return op.Gather(rows, _int64(np.flatnonzero(m)), axis=0)


def _reduce_pair(t, dim, keepdim, largest):
    """max(dim)/min(dim): values and indices (TopK of 1 along dim, the first of ties)."""
    ax = _axis(t, dim)
    fn = op.ReduceMax if largest else op.ReduceMin
    values = fn(t, _int64([ax]), keepdims=int(keepdim))
    indices = (op.ArgMax if largest else op.ArgMin)(t, axis=ax, keepdims=int(keepdim), select_last_index=0)
    return ValuesIndices(values, indices)


_c_max, _c_min = Tensor.max, Tensor.min


def _max(self, dim=None, keepdim=False, axis=None, keepdims=False):
    """max(): the largest element; max(dim, keepdim=False): (values, indices) along dim, as torch;
    max(other): the elementwise Max; max(axis=..., keepdims=...): the values only, as numpy."""
    if isinstance(dim, Tensor):
        return op.Max(self, _like(self, dim))
    if dim is None:
        return _c_max(self, axis=axis, keepdims=keepdims)
    return _reduce_pair(self, dim, keepdim, True)


def _min(self, dim=None, keepdim=False, axis=None, keepdims=False):
    """min(), min(dim) -> (values, indices), min(other), min(axis=...): as max."""
    if isinstance(dim, Tensor):
        return op.Min(self, _like(self, dim))
    if dim is None:
        return _c_min(self, axis=axis, keepdims=keepdims)
    return _reduce_pair(self, dim, keepdim, False)


def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002 (torch's argument name; builtins.sorted unused here)
    """The k largest (smallest) elements along dim and their indices (TopK)."""
    ax = _axis(self, dim)
    if not 0 <= k <= self.shape[ax]:
        raise ValueError(f"topk: k={k} is outside 0..{self.shape[ax]} (the size of dimension {dim})")
    v, i = op.TopK(self, _int64([k]), axis=ax, largest=int(largest), sorted=int(sorted))
    return ValuesIndices(v, i)


def sort(self, dim=-1, descending=False):
    """(values, indices) sorted along dim (TopK of the whole dimension; ties keep index order)."""
    ax = _axis(self, dim)
    v, i = op.TopK(self, _int64([self.shape[ax]]), axis=ax, largest=int(descending), sorted=1)
    return ValuesIndices(v, i)


def argsort(self, dim=-1, descending=False):
    """The indices that sort the tensor along dim."""
    return sort(self, dim, descending).indices


def norm(self, p='fro', dim=None, keepdim=False):
    """The vector p-norm (2 and 'fro': the square root of the sum of squares; 1; inf; any p > 0) of
    all elements, or along dim (an int or a tuple)."""
    axes = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    kw = dict(keepdims=int(keepdim))
    args = () if axes is None else (_int64([_axis(self, a) for a in axes]),)
    if p in ('fro', 2, 2.0):
        return op.ReduceL2(self, *args, **kw)
    if p in (1, 1.0):
        return op.ReduceL1(self, *args, **kw)
    if p == float('inf'):
        return op.ReduceMax(abs(self), *args, **kw)
    if isinstance(p, (int, float)) and p > 0:
        return op.ReduceSum(abs(self) ** float(p), *args, **kw) ** (1.0 / p)
    raise ValueError(f"norm: p={p!r} is not supported (2, 'fro', 1, inf or a positive number)")


def expand(self, *sizes):
    """The tensor broadcast to sizes (-1 keeps a dimension), as torch's expand (Expand)."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    lead = len(sizes) - self.ndim
    if lead < 0:
        raise ValueError(f"expand: {len(sizes)} sizes for a tensor of {self.ndim} dimensions")
    shape = [self.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(sizes)]
    if any(s < 0 for s in shape):
        raise ValueError(f"expand: -1 for a new leading dimension in {sizes}")
    return op.Expand(self, _int64(shape))


def expand_as(self, other):
    """expand(other.shape)."""
    return expand(self, *other.shape)


def repeat(self, *sizes):
    """The tensor tiled sizes times along each dimension (new leading ones first), as torch (Tile)."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    if len(sizes) < self.ndim:
        raise ValueError(f"repeat: {len(sizes)} counts for a tensor of {self.ndim} dimensions")
    x = self.reshape((1,) * (len(sizes) - self.ndim) + tuple(self.shape))
    return op.Tile(x, _int64(sizes))


def split(self, split_size_or_sections, dim=0):
    """Pieces along dim: of split_size each (the last smaller), or of the listed sizes (Split)."""
    ax = _axis(self, dim)
    n = self.shape[ax]
    if isinstance(split_size_or_sections, int):
        s = split_size_or_sections
        if s <= 0:
            raise ValueError(f"split: a size of {s}")
        sizes = [s] * (n // s) + ([n % s] if n % s else [])
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} add up to {sum(sizes)}, not {n} (dimension {dim})")
    if len(sizes) == 1:
        return (self,)
    out = op.Split(self, _int64(sizes), axis=ax)
    return tuple(out) if isinstance(out, tuple) else (out,)


def chunk(self, chunks, dim=0):
    """At most chunks pieces of equal size along dim (the last smaller), as torch."""
    n = self.shape[_axis(self, dim)]
    return split(self, -(-n // chunks) if n else 1, dim) if n else (self,)


def unbind(self, dim=0):
    """The slices along dim, that dimension removed."""
    ax = _axis(self, dim)
    return tuple(p.squeeze(ax) for p in split(self, 1, ax))


def masked_fill(self, mask, value):
    """value where mask (broadcast to the tensor) is true."""
    return op.Where(mask if isinstance(mask, Tensor) else _tern.tensor(np.asarray(mask, dtype=bool)),
                    _like(self, value), self)


def gather(self, dim, index):
    """torch.gather: out[i][j] = self[index[i][j]][j] along dim (GatherElements)."""
    return op.GatherElements(self, index if isinstance(index, Tensor) else _int64(index), axis=_axis(self, dim))


def index_select(self, dim, index):
    """The entries of index along dim (Gather)."""
    return op.Gather(self, index if isinstance(index, Tensor) else _int64(index), axis=_axis(self, dim))


def var(self, dim=None, unbiased=True, keepdim=False):
    """The variance over all elements or along dim (Bessel's correction unless unbiased=False)."""
    axes = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    n = int(np.prod(self.shape)) if axes is None else int(np.prod([self.shape[a] for a in axes]))
    mean = self.mean(axis=axes, keepdims=True) if axes is not None else self.mean()
    sq = (self - mean) * (self - mean)
    s = sq.sum(axis=axes, keepdims=keepdim) if axes is not None else sq.sum()
    return s / float(n - 1 if unbiased else n)


def std(self, dim=None, unbiased=True, keepdim=False):
    """The square root of var()."""
    return var(self, dim, unbiased, keepdim).sqrt()


def _inplace_method(name, fn):
    def method(self, *args, **kwargs):
        return _finish_inplace(self, fn(self, *args, **kwargs), name)
    method.__name__ = name
    method.__doc__ = f"In place: the tensor becomes {name[:-1]}(...)'s result (see tern._tensor)."
    return method


def _add(self, other, alpha=1):
    return self + (other * alpha if alpha != 1 else other)


def _sub(self, other, alpha=1):
    return self - (other * alpha if alpha != 1 else other)


_methods = dict(
    max=_max, min=_min, topk=topk, sort=sort, argsort=argsort, norm=norm, expand=expand, expand_as=expand_as,
    repeat=repeat, split=split, chunk=chunk, unbind=unbind, masked_fill=masked_fill, gather=gather,
    index_select=index_select, var=var, std=std,
    add=_add, sub=_sub,
    mul=lambda self, other: self * other, div=lambda self, other: self / other,
    square=lambda self: self * self,
    rsqrt=lambda self: op.Reciprocal(op.Sqrt(self)),
    log1p=lambda self: op.Log(self + 1.0),
    sin=lambda self: op.Sin(self), cos=lambda self: op.Cos(self), erf=lambda self: op.Erf(self),
    floor=lambda self: op.Floor(self), ceil=lambda self: op.Ceil(self), round=lambda self: op.Round(self),
    sign=lambda self: op.Sign(self), reciprocal=lambda self: op.Reciprocal(self),
    t=lambda self: self if self.ndim < 2 else self.transpose(0, 1),
    contiguous=lambda self: self, cpu=lambda self: self,
    type_as=lambda self, other: self.astype(other.dtype),
    new_zeros=lambda self, *shape, dtype=None: _tern.zeros(*shape, dtype=dtype or self.dtype),
    new_ones=lambda self, *shape, dtype=None: _tern.ones(*shape, dtype=dtype or self.dtype),
    new_tensor=lambda self, data, dtype=None: _tern.tensor(data, dtype=dtype or self.dtype),
    any=lambda self: _tern.tensor(np.any(self.numpy())), all=lambda self: _tern.tensor(np.all(self.numpy())),
)
_methods['masked_fill_'] = _inplace_method('masked_fill_', masked_fill)
for _name, _fn in [('add_', _add), ('sub_', _sub), ('mul_', _methods['mul']), ('div_', _methods['div']),
                   ('clamp_', lambda self, *a, **k: self.clamp(*a, **k)),
                   ('relu_', lambda self: self.relu()), ('neg_', lambda self: -self),
                   ('exp_', lambda self: self.exp()), ('sqrt_', lambda self: self.sqrt())]:
    _methods[_name] = _inplace_method(_name, _fn)
for _name in ('square', 'rsqrt', 'log1p', 'sin', 'cos', 'erf', 'floor', 'ceil', 'round', 'sign', 'reciprocal', 't',
              'contiguous', 'cpu', 'type_as', 'new_zeros', 'new_ones', 'new_tensor', 'any', 'all', 'mul', 'div'):
    _methods[_name].__name__ = _name
_methods['add'].__name__, _methods['sub'].__name__ = 'add', 'sub'
_max.__name__, _min.__name__ = 'max', 'min'

_tern._add_tensor_methods(_methods)
_tern._set_hooks(_setitem, _mask_index, _finish_inplace)
