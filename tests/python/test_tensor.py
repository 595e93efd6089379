"""tern.Tensor against numpy: conversion both ways, dtypes, arithmetic and comparisons with
broadcasting, numbers and arrays, indexing, the convenience methods, factories and the grad mode."""
import copy
import pickle

import numpy as np
import pytest

import tern


def arr(shape, dtype=np.float32, seed=0, low=-2.0, high=2.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(dtype)


# ---------------------------------------------------------------- conversion


@pytest.mark.parametrize('dtype', ['float32', 'float64', 'float16', 'int64', 'int32', 'int8', 'int16', 'uint8',
                                   'uint16', 'uint32', 'uint64', 'bool', 'complex64', 'complex128'])
def test_numpy_round_trip(dtype):
    a = (arr((2, 3, 4)) * 10).astype(dtype)
    t = tern.tensor(a)
    assert t.dtype == dtype
    assert t.shape == (2, 3, 4)
    assert t.ndim == 3 and len(t) == 2 and t.numel() == 24
    b = t.numpy()
    assert b.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(a, b)
    # numpy() is a copy
    b[...] = 0
    np.testing.assert_array_equal(t.numpy(), a)


def test_buffer_protocol():
    a = arr((3, 5))
    t = tern.tensor(a)
    m = memoryview(t)
    assert m.format == 'f' and m.shape == (3, 5) and m.strides == (20, 4) and m.itemsize == 4
    assert m.c_contiguous and not m.readonly
    np.testing.assert_array_equal(np.asarray(t), a)
    # 0-d and empty tensors
    assert memoryview(tern.tensor(3.0)).shape == ()
    e = tern.zeros(0, 4)
    assert e.shape == (0, 4) and e.numpy().shape == (0, 4)
    assert tern.tensor(np.zeros((2, 0), np.int32)).shape == (2, 0)


def test_non_contiguous_and_scalars():
    a = arr((4, 6))[:, ::2].T
    np.testing.assert_array_equal(tern.tensor(a).numpy(), a)
    assert tern.tensor(np.float64(2.5)).dtype == 'float64'
    assert tern.tensor(np.int32(7)).dtype == 'int32'
    assert tern.tensor(np.bool_(True)).dtype == 'bool'


def test_default_dtypes():
    assert tern.tensor(1.5).dtype == 'float32'
    assert tern.tensor(3).dtype == 'int64'
    assert tern.tensor(True).dtype == 'bool'
    assert tern.tensor([1.0, 2.0]).dtype == 'float32'
    assert tern.tensor([[1, 2], [3, 4]]).dtype == 'int64'
    assert tern.tensor([True, False]).dtype == 'bool'
    assert tern.tensor(np.array([1.0, 2.0])).dtype == 'float64'
    assert tern.tensor([1, 2], dtype='float64').dtype == 'float64'
    assert tern.tensor(np.arange(3), dtype=np.float32).dtype == 'float32'
    assert tern.tensor([1, 2], dtype=tern.float16).numpy().tolist() == [1.0, 2.0]
    assert tern.tensor([1.5], dtype='bfloat16').numpy().dtype == np.float32  # no numpy bfloat16
    assert tern.tensor(tern.tensor([1, 2])).dtype == 'int64'
    assert tern.Tensor([1.0]).dtype == 'float32'
    import torch
    assert tern.tensor(torch.ones(2, dtype=torch.float64)).dtype == 'float64'  # by numpy.asarray
    assert tern.tensor(torch.ones(2)).tolist() == [1.0, 1.0]


def test_bad_conversions():
    with pytest.raises(TypeError):
        tern.tensor(['a', 'b'])
    with pytest.raises(TypeError):
        tern.tensor([1.0], dtype='no-such-type')
    with pytest.raises(ValueError):
        tern.tensor(np.zeros((1,) * 9))
    with pytest.raises(ValueError):
        tern.tensor([[1, 2], [3]])


def test_scalars_out():
    t = tern.tensor([[2.5]])
    assert t.item() == 2.5 and float(t) == 2.5 and int(t) == 2 and bool(t)
    assert isinstance(tern.tensor(3).item(), int)
    assert tern.tensor(True).item() is True
    assert [1, 2, 3][tern.tensor(1)] == 2  # __index__
    assert not bool(tern.tensor(0.0))
    with pytest.raises(ValueError):
        bool(tern.tensor([1.0, 2.0]))
    with pytest.raises(ValueError):
        tern.tensor([1.0, 2.0]).item()
    with pytest.raises(TypeError):
        [1, 2][tern.tensor(1.0)]
    with pytest.raises(TypeError):
        len(tern.tensor(1.0))
    assert tern.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]


def test_repr():
    assert repr(tern.tensor([1.0, 2.0])) == 'tensor([1., 2.], dtype=float32)'
    assert repr(tern.tensor(3)) == 'tensor(3, dtype=int64)'
    assert 'requires_grad=True' in repr(tern.Parameter([1.0]))
    assert 'bfloat16' in repr(tern.tensor([1.0], dtype='bfloat16'))


def test_iteration_and_hash():
    a = arr((3, 2))
    rows = [r.numpy() for r in tern.tensor(a)]
    assert len(rows) == 3
    np.testing.assert_array_equal(np.stack(rows), a)
    t = tern.tensor(a)
    assert {t: 1}[t] == 1
    with pytest.raises(TypeError):
        iter(tern.tensor(1.0))


def test_pickle_and_copy():
    t = tern.tensor(arr((2, 3)))
    for u in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t), copy.copy(t)):
        assert type(u) is tern.Tensor and u.dtype == 'float32'
        np.testing.assert_array_equal(u.numpy(), t.numpy())
    p = pickle.loads(pickle.dumps(tern.Parameter([1.0, 2.0])))
    assert isinstance(p, tern.Parameter) and p.requires_grad


# ---------------------------------------------------------------- arithmetic


BINARY = [
    ('+', lambda a, b: a + b),
    ('-', lambda a, b: a - b),
    ('*', lambda a, b: a * b),
    ('/', lambda a, b: a / b),
    ('**', lambda a, b: a ** b),
]
COMPARE = [
    ('==', lambda a, b: a == b),
    ('!=', lambda a, b: a != b),
    ('<', lambda a, b: a < b),
    ('<=', lambda a, b: a <= b),
    ('>', lambda a, b: a > b),
    ('>=', lambda a, b: a >= b),
]
SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (2, 1)), ((), (2, 2)), ((3, 1), (1, 4))]


@pytest.mark.parametrize('name,fn', BINARY + COMPARE, ids=[n for n, _ in BINARY + COMPARE])
@pytest.mark.parametrize('sa,sb', SHAPES)
def test_binary_broadcasting(name, fn, sa, sb):
    a, b = arr(sa, seed=1), arr(sb, seed=2)
    if name == '**':
        a = (np.abs(a) + 0.5).astype(np.float32)
    if name in ('==', '!='):
        b = np.where(arr(sb, seed=3) > 0, b, 1.0).astype(np.float32)
        a = np.ones(sa, np.float32)
    r = fn(tern.tensor(a), tern.tensor(b))
    want = fn(a, b)
    assert r.shape == want.shape
    assert r.dtype == str(want.dtype)
    np.testing.assert_allclose(r.numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('name,fn', BINARY + COMPARE, ids=[n for n, _ in BINARY + COMPARE])
def test_numbers_both_sides(name, fn):
    a = np.abs(arr((3, 4), seed=4)) + 0.5
    t = tern.tensor(a)
    for n in (2, 0.5, 1.25):
        for r, want in ((fn(t, n), fn(a, np.float32(n))), (fn(n, t), fn(np.float32(n), a))):
            assert r.dtype == str(want.dtype)
            np.testing.assert_allclose(r.numpy(), want, rtol=1e-6)


def test_numbers_keep_the_tensor_dtype():
    d = tern.tensor(np.array([1.0, 2.0]))
    assert (d + 1).dtype == 'float64' and (2.5 * d).dtype == 'float64'
    i = tern.tensor([1, 2, 3])
    assert (i + 1).dtype == 'int64' and (i * 2).tolist() == [2, 4, 6]
    assert (10 - i).tolist() == [9, 8, 7]
    assert (i ** 2).tolist() == [1, 4, 9]
    # torch's promotions: an int tensor and a float number are float32; / is true division
    assert (i * 0.5).dtype == 'float32' and (i * 0.5).tolist() == [0.5, 1.0, 1.5]
    assert (i / 2).dtype == 'float32' and (i / 2).tolist() == [0.5, 1.0, 1.5]
    assert (tern.tensor([True, False]) + 1).tolist() == [2, 1]
    h = tern.tensor([1.0, 2.0], dtype='float16')
    assert (h * 3).dtype == 'float16' and (h * 3).tolist() == [3.0, 6.0]
    assert (i % 2).tolist() == [1, 0, 1]
    assert (tern.tensor(np.int32([5])) + np.int32(1)).dtype == 'int32'


def test_tensor_promotions():
    f, d = tern.tensor([1.5, -2.0]), tern.tensor(np.array([1.0, 2.0]))
    i, b = tern.tensor([2, 3]), tern.tensor([True, False])
    h = tern.tensor([1.0, 2.0], dtype='float16')
    for x, y, want in ((f, b, 'float32'), (b, f, 'float32'), (f, i, 'float32'), (i, d, 'float64'), (f, d, 'float64'),
                       (h, f, 'float32'), (i, b, 'int64'), (tern.tensor(np.int32([1, 2])), i, 'int64'),
                       (tern.tensor(np.uint8([1, 2])), tern.tensor(np.int8([1, 2])), 'int64')):
        assert (x + y).dtype == want and (x * y).dtype == want and (y - x).dtype == want
    assert (f * (f > 0)).tolist() == [1.5, 0.0]
    assert (i == tern.tensor([2.0, 2.5])).tolist() == [True, False]
    assert (i / i).dtype == 'float32'


def test_numpy_operands():
    a, b = arr((2, 3), seed=5), arr((3,), seed=6)
    t = tern.tensor(a)
    for r, want in ((t + b, a + b), (b + t, b + a), (b - t, b - a), (t * [1.0, 2.0, 3.0], a * [1, 2, 3]),
                    (np.float32(2) * t, 2 * a), (t < b, a < b)):
        assert isinstance(r, tern.Tensor)
        np.testing.assert_allclose(r.numpy(), want, rtol=1e-6)
    # a float64 array beside a float32 tensor takes the tensor's type
    assert (t + np.ones(3)).dtype == 'float32'


def test_matmul():
    for sa, sb in (((2, 3), (3, 4)), ((5, 2, 3), (3, 2)), ((3,), (3, 2)), ((2, 1, 4, 3), (5, 3, 2))):
        a, b = arr(sa, seed=7), arr(sb, seed=8)
        r = tern.tensor(a) @ tern.tensor(b)
        np.testing.assert_allclose(r.numpy(), a @ b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose((a @ tern.tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tern.tensor(a).matmul(b).numpy(), a @ b, rtol=1e-5, atol=1e-6)


def test_unary_and_logic():
    a = arr((3, 3), seed=9)
    t = tern.tensor(a)
    np.testing.assert_array_equal((-t).numpy(), -a)
    np.testing.assert_array_equal(abs(t).numpy(), np.abs(a))
    assert (+t) is t
    m, n = tern.tensor(a > 0), tern.tensor(a > 0.5)
    np.testing.assert_array_equal((m & n).numpy(), (a > 0) & (a > 0.5))
    np.testing.assert_array_equal((m | n).numpy(), (a > 0) | (a > 0.5))
    np.testing.assert_array_equal((m ^ n).numpy(), (a > 0) ^ (a > 0.5))
    np.testing.assert_array_equal((~m).numpy(), ~(a > 0))


def test_comparison_with_other_objects():
    t = tern.tensor([1.0])
    assert (t == None) is False  # noqa: E711 (NotImplemented both ways: identity)
    assert t != 'x'
    assert t in [t]
    with pytest.raises(TypeError):
        t + 'x'
    with pytest.raises(TypeError):
        t < None


def test_dtype_mismatch_raises():
    with pytest.raises(ValueError, match='MatMul'):
        tern.tensor([[1.0]]) @ tern.tensor(np.array([[1.0]]))
    with pytest.raises(ValueError, match='Add'):
        tern.tensor([1.0, 2.0]) + tern.tensor([1.0, 2.0, 3.0])


# ---------------------------------------------------------------- indexing


INDEXES = [
    1, -1, (0, 2), (-2, -3), slice(1, 3), slice(None, None, -1), slice(3, 0, -2), slice(-10, 10), slice(4, 2),
    (slice(None), 0), (Ellipsis, slice(None, None, 2)), (0, Ellipsis, 1), None, (None, 1), (slice(None), None, 2),
    (1, None, slice(1, None), None), Ellipsis, (), (slice(None), slice(None, None, -1), -1),
    [2, 0, 0], (slice(None), [1, 2]), (0, [[1, 0], [2, 3]]), (Ellipsis, [0]), (None, [1, 1]),
]


@pytest.mark.parametrize('index', INDEXES, ids=[repr(i) for i in INDEXES])
def test_indexing_like_numpy(index):
    a = arr((3, 4, 5), seed=10)
    r = tern.tensor(a)[index]
    want = a[index]
    assert r.shape == want.shape
    np.testing.assert_array_equal(r.numpy(), want)


def test_index_with_tensors():
    a = arr((5, 3), seed=11)
    t = tern.tensor(a)
    np.testing.assert_array_equal(t[tern.tensor([4, 0])].numpy(), a[[4, 0]])
    np.testing.assert_array_equal(t[:, tern.tensor(np.int32([2, 1]))].numpy(), a[:, [2, 1]])
    np.testing.assert_array_equal(t[tern.tensor(3)].numpy(), a[3])
    np.testing.assert_array_equal(t[np.int64(2)].numpy(), a[2])
    np.testing.assert_array_equal(t[np.array([1, 1])].numpy(), a[[1, 1]])


def test_bad_indexes():
    t = tern.tensor(arr((3, 4)))
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[0, -5]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[..., ...]
    with pytest.raises(IndexError):
        t[[0], [1]]
    with pytest.raises(IndexError):
        t['a']
    with pytest.raises(IndexError):
        t[tern.tensor([0.5])]
    with pytest.raises(TypeError):
        del t[0]


# ---------------------------------------------------------------- methods


def test_reductions():
    a = arr((2, 3, 4), seed=12)
    t = tern.tensor(a)
    for name in ('sum', 'mean', 'max', 'min'):
        f = getattr(np, name)
        np.testing.assert_allclose(getattr(t, name)().numpy(), f(a), rtol=1e-5)
        assert getattr(t, name)().shape == ()
        for axis in (0, -1, (0, 2)):
            for keep in (False, True):
                r = getattr(t, name)(axis=axis, keepdims=keep)
                np.testing.assert_allclose(r.numpy(), f(a, axis=axis, keepdims=keep), rtol=1e-5)
        r = getattr(t, name)(dim=1, keepdim=True)
        if name in ('max', 'min'):  # torch's (values, indices) with dim
            r, i = r
            np.testing.assert_array_equal(i.numpy(), getattr(np, 'arg' + name)(a, axis=1)[:, None])
        np.testing.assert_allclose(r.numpy(), f(a, axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(t.argmax().numpy(), np.argmax(a))
    np.testing.assert_array_equal(t.argmax(axis=1).numpy(), np.argmax(a, axis=1))
    np.testing.assert_array_equal(t.argmin(axis=-1, keepdims=True).numpy(), np.argmin(a, axis=-1)[..., None])
    assert t.argmax(1).dtype == 'int64'


def test_shape_methods():
    a = arr((2, 3, 4), seed=13)
    t = tern.tensor(a)
    np.testing.assert_array_equal(t.reshape(4, 6).numpy(), a.reshape(4, 6))
    np.testing.assert_array_equal(t.reshape((-1, 2)).numpy(), a.reshape(-1, 2))
    np.testing.assert_array_equal(t.view([24]).numpy(), a.reshape(24))
    np.testing.assert_array_equal(t.transpose().numpy(), a.transpose())
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.swapaxes(0, 2))
    np.testing.assert_array_equal(t.transpose(1, 2, 0).numpy(), a.transpose(1, 2, 0))
    np.testing.assert_array_equal(t.transpose((2, 0, 1)).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.permute(2, 1, 0).numpy(), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(t.T.numpy(), a.T)
    np.testing.assert_array_equal(t.unsqueeze(1).numpy(), a[:, None])
    np.testing.assert_array_equal(t.unsqueeze(1).squeeze(1).numpy(), a)
    np.testing.assert_array_equal(tern.tensor(a[:1, :, :1]).squeeze().numpy(), a[0, :, 0])
    assert t.size() == (2, 3, 4) and t.size(-1) == 4 and t.dim() == 3
    with pytest.raises(ValueError):
        t.reshape(5, 5)


def test_elementwise_methods():
    a = np.abs(arr((3, 5), seed=14)) + 0.1
    t = tern.tensor(a)
    for name, want in (('exp', np.exp(a)), ('log', np.log(a)), ('relu', np.maximum(a - 1, 0)),
                       ('sigmoid', 1 / (1 + np.exp(-a))), ('tanh', np.tanh(a)), ('sqrt', np.sqrt(a)),
                       ('abs', a), ('neg', -a)):
        src = t - 1 if name == 'relu' else t
        np.testing.assert_allclose(getattr(src, name)().numpy(), want, rtol=1e-5, atol=1e-6)
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(t.softmax(1).numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(t.softmax(axis=0).numpy().sum(axis=0), np.ones(5), rtol=1e-5)
    np.testing.assert_allclose(t.log_softmax(-1).numpy(), np.log(e / e.sum(axis=1, keepdims=True)), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(t.pow(3).numpy(), a ** 3, rtol=1e-5)
    assert t.clone().shape == t.shape


def test_casts():
    t = tern.tensor([1.7, -2.2, 0.0])
    assert t.astype('int64').tolist() == [1, -2, 0]
    assert t.astype(np.int32).dtype == 'int32'
    assert t.long().dtype == 'int64' and t.double().dtype == 'float64'
    assert tern.tensor([1, 2]).float().dtype == 'float32'
    assert t.astype('bool').tolist() == [True, True, False]
    assert t.to('float16').dtype == 'float16'
    assert t.astype(tern.float64).dtype == 'float64'


def test_in_place_writes():
    t = tern.zeros(2, 3)
    t.copy_(np.arange(6).reshape(2, 3))
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    t.fill_(2.5)
    assert t.tolist() == [[2.5] * 3] * 2
    t.zero_()
    assert t.sum().item() == 0
    with pytest.raises(ValueError):
        t.copy_([1.0, 2.0])
    # the buffer is writable; detach() shares the bytes
    d = t.detach()
    np.asarray(d)[0, 0] = 7
    assert t[0, 0].item() == 7


# ---------------------------------------------------------------- factories and modes


def test_factories():
    z = tern.zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype == 'float32' and z.sum().item() == 0
    assert tern.zeros((4,), dtype='int64').dtype == 'int64'
    o = tern.ones([2, 2], dtype='float64')
    assert o.dtype == 'float64' and o.tolist() == [[1, 1], [1, 1]]
    assert tern.ones(3, dtype='float16').tolist() == [1, 1, 1]
    assert tern.ones(2, dtype='bool').tolist() == [True, True]
    assert tern.zeros(()).shape == ()
    assert tern.full((2,), 3).dtype == 'int64' and tern.full((2,), 3).tolist() == [3, 3]
    assert tern.full((2,), 0.5, dtype='float64').tolist() == [0.5, 0.5]
    assert tern.zeros(2, requires_grad=True).requires_grad
    assert tern.zeros_like(o).dtype == 'float64' and tern.ones_like(z).shape == (2, 3)
    assert tern.arange(4).tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(tern.arange(0, 1, 0.25).numpy(), [0, 0.25, 0.5, 0.75])
    c = tern.cat([tern.ones(2, 1), tern.zeros(2, 2)], axis=1)
    assert c.shape == (2, 3)
    assert tern.stack([tern.ones(3), tern.zeros(3)]).shape == (2, 3)
    assert tern.where(tern.tensor([True, False]), tern.ones(2), 0.0).tolist() == [1, 0]
    with pytest.raises(ValueError):
        tern.zeros(-1)
    with pytest.raises(TypeError):
        tern.zeros(2, colour='red')


def test_random_and_seed():
    tern.manual_seed(123)
    a = tern.randn(1000)
    b = tern.rand(3, 4)
    tern.manual_seed(123)
    a2 = tern.randn(1000)
    b2 = tern.rand((3, 4))
    np.testing.assert_array_equal(a.numpy(), a2.numpy())
    np.testing.assert_array_equal(b.numpy(), b2.numpy())
    assert not np.array_equal(a.numpy(), tern.randn(1000).numpy())
    x = a.numpy()
    assert abs(x.mean()) < 0.15 and 0.85 < x.std() < 1.15
    u = tern.rand(1000).numpy()
    assert u.min() >= 0 and u.max() < 1 and 0.4 < u.mean() < 0.6
    assert tern.randn(2, dtype='float64').dtype == 'float64'
    assert tern.randn(2, 2, requires_grad=True).is_leaf


def test_grad_mode():
    assert tern.is_grad_enabled()
    with tern.no_grad():
        assert not tern.is_grad_enabled()
        with tern.enable_grad():
            assert tern.is_grad_enabled()
        assert not tern.is_grad_enabled()
    assert tern.is_grad_enabled()

    @tern.no_grad()
    def f():
        return tern.is_grad_enabled()

    assert f() is False and tern.is_grad_enabled()

    @tern.no_grad
    def g():
        return tern.is_grad_enabled()

    assert g() is False and tern.is_grad_enabled()
    tern.set_grad_enabled(False)
    assert not tern.is_grad_enabled()
    tern.set_grad_enabled(True)
    with tern.set_grad_enabled(False):
        assert not tern.is_grad_enabled()
    assert tern.is_grad_enabled()
    # restored after an exception too
    with pytest.raises(KeyError):
        with tern.no_grad():
            raise KeyError
    assert tern.is_grad_enabled()


def test_step_counter():
    n = tern.steps_taken()
    for _ in range(3):
        with tern.step():
            pass
    assert tern.steps_taken() == n + 3


def test_cache_stats():
    h0, m0 = tern.cache_stats()
    x = tern.tensor(arr((7, 3), seed=99))
    for _ in range(5):
        x.exp()
    h1, m1 = tern.cache_stats()
    assert h1 - h0 >= 4 and m1 >= m0


def test_freed_context():
    t = tern.tensor([1.0, 2.0])
    tern._tern._free_context_for_test()
    # still readable
    assert t.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match='freed context'):
        t + t
    with pytest.raises(tern.UsageError, match='freed context'):
        tern.op.Relu(t)
    with pytest.raises(tern.Error):
        t.exp()
    # the new context works
    assert (tern.tensor([1.0]) + 1).tolist() == [2.0]


def test_docstring_example():
    import doctest
    assert doctest.testmod(tern).failed == 0


def test_flatten_and_clamp_as_torch():
    torch = pytest.importorskip('torch')
    a = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    t, tt = tern.tensor(a), torch.tensor(a)
    for args in [(), (1,), (0, 1), (-2, -1)]:
        assert np.array_equal(t.flatten(*args).numpy(), tt.flatten(*args).numpy())
    for kw in [dict(min=-0.5, max=0.5), dict(min=0.0), dict(max=0.1)]:
        assert np.array_equal(t.clamp(**kw).numpy(), tt.clamp(**kw).numpy())
    p, pt = tern.Parameter(a), torch.tensor(a, requires_grad=True)
    (p.clamp(-0.5, 0.5).flatten(1) * 2).sum().backward()
    (pt.clamp(-0.5, 0.5).flatten(1) * 2).sum().backward()
    assert np.allclose(p.grad.numpy(), pt.grad.numpy())
    with pytest.raises(IndexError, match='flatten'):
        t.flatten(2, 1)
