"""tern.op: registry operators by name with ONNX attributes of every kind, several outputs,
optional inputs, tern's own domain, and the errors (which must be exceptions, never a crash)."""
import numpy as np
import pytest
import torch

import tern


def arr(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(dtype)


def test_operator_objects():
    relu = tern.op.Relu
    assert relu.__name__ == 'Relu' and relu.domain == ''
    assert 'Relu' in repr(relu)
    assert 'tern' in repr(tern._tern.OpNamespace('tern').ReluGrad)
    assert tern.op_outputs('LSTM') == 3 and tern.op_outputs('Relu') == 1 and tern.op_outputs('TopK') == 2
    with pytest.raises(AttributeError):
        tern.op._private


def test_single_output_and_numbers():
    a = arr((3, 4))
    x = tern.tensor(a)
    np.testing.assert_array_equal(tern.op.Relu(x).numpy(), np.maximum(a, 0))
    np.testing.assert_allclose(tern.op.Add(x, 1.5).numpy(), a + 1.5)
    np.testing.assert_allclose(tern.op.Pow(x, 2).numpy(), a ** 2, rtol=1e-6)
    np.testing.assert_array_equal(tern.op.Reshape(x, [2, 6]).numpy(), a.reshape(2, 6))
    np.testing.assert_array_equal(tern.op.Gather(x, [0, 2], axis=1).numpy(), a[:, [0, 2]])
    np.testing.assert_array_equal(tern.op.Relu(a).numpy(), np.maximum(a, 0))  # a numpy input
    d = tern.tensor(a.astype(np.float64))
    assert tern.op.Mul(d, 2.0).dtype == 'float64'  # a float takes the float input's type


def test_attribute_kinds():
    a = arr((2, 3))
    x = tern.tensor(a)
    # INT, FLOAT
    np.testing.assert_allclose(tern.op.LeakyRelu(x, alpha=0.25).numpy(), np.where(a > 0, a, 0.25 * a), rtol=1e-6)
    np.testing.assert_allclose(tern.op.LeakyRelu(x, alpha=2).numpy(), np.where(a > 0, a, 2 * a))  # int for a float
    np.testing.assert_allclose(tern.op.LeakyRelu(x, alpha=np.float32(0.5)).numpy(), np.where(a > 0, a, 0.5 * a))
    b = arr((4, 3), seed=1)
    np.testing.assert_allclose(tern.op.Gemm(x, b, alpha=2.0, transB=1).numpy(), 2 * a @ b.T, rtol=1e-5)
    np.testing.assert_allclose(tern.op.Gemm(x, b, transB=True).numpy(), a @ b.T, rtol=1e-5)
    # INTS (list and tuple)
    np.testing.assert_array_equal(tern.op.Transpose(x, perm=[1, 0]).numpy(), a.T)
    y = tern.tensor(arr((2, 3, 4)))
    assert tern.op.Transpose(y, perm=(2, 0, 1)).shape == (4, 2, 3)
    # STRING (str and bytes)
    e = tern.op.Einsum(x, tern.tensor(b), equation='ij,kj->ik')
    np.testing.assert_allclose(e.numpy(), a @ b.T, rtol=1e-5)
    np.testing.assert_allclose(tern.op.Einsum(x, equation=b'ij->ji').numpy(), a.T)
    # TENSOR (numpy array, Tensor), FLOATS, INTS, STRINGS
    np.testing.assert_array_equal(tern.op.Constant(value=np.arange(3)).numpy(), [0, 1, 2])
    np.testing.assert_array_equal(tern.op.Constant(value=x).numpy(), a)
    assert tern.op.Constant(value_floats=[1.0, 2.5]).tolist() == [1.0, 2.5]
    assert tern.op.Constant(value_ints=[4, 5]).tolist() == [4, 5]
    assert tern.op.Constant(value_float=0.5).item() == 0.5
    s = tern.op.Constant(value_strings=['ab', 'c'])
    assert s.dtype == 'string' and s.tolist() == ['ab', 'c']
    # dtype names for to / dtype
    assert tern.op.Cast(x, to='int64').dtype == 'int64'
    assert tern.op.Cast(x, to=11).dtype == 'float64'
    assert tern.op.EyeLike(tern.tensor(np.zeros((2, 2))), dtype='int32').tolist() == [[1, 0], [0, 1]]


def test_conv_and_pool_against_torch():
    a = arr((2, 3, 9, 8), seed=2)
    w = arr((4, 3, 3, 3), seed=3)
    bias = arr((4,), seed=4)
    got = tern.op.Conv(tern.tensor(a), tern.tensor(w), tern.tensor(bias), kernel_shape=[3, 3], pads=[1, 2, 1, 2],
                       strides=[2, 1], dilations=[1, 1], group=1)
    want = torch.nn.functional.conv2d(torch.from_numpy(np.pad(a, ((0, 0), (0, 0), (1, 1), (2, 2)))),
                                      torch.from_numpy(w), torch.from_numpy(bias), stride=(2, 1))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    mp = tern.op.MaxPool(tern.tensor(a), kernel_shape=[2, 2], strides=[2, 2])
    np.testing.assert_array_equal(mp.numpy(), torch.nn.functional.max_pool2d(torch.from_numpy(a), 2).numpy())


def test_several_outputs():
    a = arr((4, 6), seed=5)
    x = tern.tensor(a)
    parts = tern.op.Split(x, axis=1, num_outputs=3)
    assert isinstance(parts, tuple) and len(parts) == 3
    for p, want in zip(parts, np.split(a, 3, axis=1)):
        np.testing.assert_array_equal(p.numpy(), want)
    parts = tern.op.Split(x, [1, 5], axis=1)
    assert [p.shape for p in parts] == [(4, 1), (4, 5)]
    values, indices = tern.op.TopK(x, [2], axis=-1)
    order = np.argsort(-a, axis=-1)[:, :2]
    np.testing.assert_array_equal(indices.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(a, order, axis=-1))
    assert indices.dtype == 'int64'
    small = tern.op.TopK(x, [3], axis=0, largest=0)[0]
    np.testing.assert_array_equal(small.numpy(), np.sort(a, axis=0)[:3])
    u = tern.op.Unique(tern.tensor(np.array([3, 1, 3, 2], np.int64)), sorted=1)
    assert len(u) == 4 and u[0].tolist() == [1, 2, 3]


def test_lstm_shapes():
    seq, batch, inp, hidden = 5, 3, 4, 6
    x = tern.tensor(arr((seq, batch, inp), seed=6))
    w = tern.tensor(arr((1, 4 * hidden, inp), seed=7) * 0.3)
    r = tern.tensor(arr((1, 4 * hidden, hidden), seed=8) * 0.3)
    b = tern.tensor(arr((1, 8 * hidden), seed=9) * 0.1)
    y, y_h, y_c = tern.op.LSTM(x, w, r, b, hidden_size=hidden)
    assert y.shape == (seq, 1, batch, hidden)
    assert y_h.shape == (1, batch, hidden) and y_c.shape == (1, batch, hidden)
    np.testing.assert_allclose(y[-1].numpy(), y_h.numpy(), rtol=1e-6)
    # against torch.nn.LSTM (gates i, o, f, c in ONNX; i, f, g, o in torch)
    lstm = torch.nn.LSTM(inp, hidden)
    iofc = lambda m: np.concatenate([m[0:hidden], m[2 * hidden:3 * hidden], m[3 * hidden:], m[hidden:2 * hidden]])
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.from_numpy(iofc(w.numpy()[0])))
        lstm.weight_hh_l0.copy_(torch.from_numpy(iofc(r.numpy()[0])))
        lstm.bias_ih_l0.copy_(torch.from_numpy(iofc(b.numpy()[0, :4 * hidden])))
        lstm.bias_hh_l0.copy_(torch.from_numpy(iofc(b.numpy()[0, 4 * hidden:])))
        ty, (th, tc) = lstm(torch.from_numpy(x.numpy()))
    np.testing.assert_allclose(y.numpy()[:, 0], ty.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y_c.numpy(), tc.numpy(), rtol=1e-4, atol=1e-5)
    # _outputs: fewer than the default
    only = tern.op.LSTM(x, w, r, b, hidden_size=hidden, _outputs=1)
    assert isinstance(only, tern.Tensor) and only.shape == (seq, 1, batch, hidden)
    two = tern.op.LSTM(x, w, r, b, hidden_size=hidden, _outputs=2)
    assert isinstance(two, tuple) and len(two) == 2


def test_optional_inputs():
    a = arr((3, 3), seed=10)
    x = tern.tensor(a)
    np.testing.assert_array_equal(tern.op.Clip(x, None, 0.5).numpy(), np.minimum(a, 0.5))
    np.testing.assert_array_equal(tern.op.Clip(x, -0.5).numpy(), np.maximum(a, -0.5))
    np.testing.assert_array_equal(tern.op.Clip(x, -0.5, 0.5).numpy(), np.clip(a, -0.5, 0.5))
    # Dropout's mask is an output only when asked for
    y = tern.op.Dropout(x)
    assert isinstance(y, tern.Tensor)
    y, mask = tern.op.Dropout(x, 0.5, True, _outputs=2)
    assert mask.dtype == 'bool' and mask.shape == (3, 3)


def test_tern_domain():
    a = arr((2, 5), seed=11)
    dy = np.ones_like(a)
    g = tern.op.ReluGrad(tern.tensor(dy), tern.tensor(a), _domain='tern')
    assert g.shape == (2, 5)
    np.testing.assert_array_equal(g.numpy(), np.where(a > 0, dy, 0))
    with pytest.raises(tern.UsageError, match='unknown operator'):
        tern.op.Relu(tern.tensor(a), _domain='tern')


ERRORS = [
    ('unknown operator', lambda x: tern.op.NoSuchOperator(x), 'NoSuchOperator: unknown operator'),
    ('unknown attribute', lambda x: tern.op.Softmax(x, axes=1), "unknown attribute 'axes'"),
    ('attribute kind', lambda x: tern.op.Softmax(x, axis='last'), "'axis' takes an int"),
    ('attribute value', lambda x: tern.op.Softmax(x, axis=7), 'Softmax'),
    ('shapes', lambda x: tern.op.MatMul(x, x), 'MatMul'),
    ('dtypes', lambda x: tern.op.Add(x, tern.tensor([1, 2, 3])), 'Add'),
    ('rank', lambda x: tern.op.Conv(x, x), 'Conv'),
    ('missing input', lambda x: tern.op.Reshape(x), 'Reshape'),
    ('no inputs', lambda x: tern.op.Conv(), 'Conv'),
    ('bad axis', lambda x: tern.op.Slice(x, [0], [1], [5]), 'Slice'),
    ('gather range', lambda x: tern.op.Gather(x, [10]), 'Gather'),
    ('reshape size', lambda x: tern.op.Reshape(x, [7]), 'Reshape'),
    ('split sizes', lambda x: tern.op.Split(x, [1, 1], axis=1), 'Split'),
    ('too many outputs', lambda x: tern.op.Relu(x, _outputs=0), '_outputs'),
    ('subgraph', lambda x: tern.op.If(tern.tensor(True)), 'If'),
]


@pytest.mark.parametrize('name,call,message', ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_are_exceptions(name, call, message):
    x = tern.tensor(arr((2, 3), seed=12))
    with pytest.raises((ValueError, TypeError)) as info:
        call(x)
    assert message in str(info.value)
    assert '\n' not in str(info.value)


def test_python_side_argument_errors():
    x = tern.tensor([1.0])
    with pytest.raises(TypeError, match="attribute 'alpha'"):
        tern.op.LeakyRelu(x, alpha={'a': 1})
    with pytest.raises(TypeError, match='all ints'):
        tern.op.Transpose(x, perm=[1, 'a'])
    with pytest.raises(TypeError):
        tern.op.Relu(object())
    with pytest.raises(ValueError, match='at most 64'):
        tern.op.Concat(*([x] * 65), axis=0)
    # the error types: UsageError is a ValueError and a TypeError and a tern.Error (a RuntimeError)
    assert issubclass(tern.UsageError, ValueError) and issubclass(tern.UsageError, TypeError)
    assert issubclass(tern.DataError, ValueError) and issubclass(tern.Error, RuntimeError)


def test_random_operators_follow_the_seed():
    tern.manual_seed(7)
    a = tern.op.RandomNormal(shape=[4], dtype=1)
    tern.manual_seed(7)
    b = tern.op.RandomNormal(shape=[4], dtype=1)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    c = tern.op.RandomUniform(shape=[3], seed=5.0)
    d = tern.op.RandomUniform(shape=[3], seed=5.0)
    np.testing.assert_array_equal(c.numpy(), d.numpy())


def test_max_roi_pool_as_torchvision():
    torch = pytest.importorskip('torch')
    torchvision = pytest.importorskip('torchvision')
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 12, 10)).astype(np.float32)
    rois = np.array([[0, 1, 1, 6, 8], [1, 0, 0, 9, 11], [0, 3.4, 2.6, 3.4, 2.6], [1, 5, 7, 20, 20],
                     [0, 2, 3, 7, 5]], np.float32)
    for shape, scale in [((2, 2), 1.0), ((3, 4), 0.5), ((1, 1), 1.0)]:
        y = tern.op.MaxRoiPool(tern.tensor(x), tern.tensor(rois), pooled_shape=list(shape), spatial_scale=scale)
        want = torchvision.ops.roi_pool(torch.tensor(x), torch.tensor(rois), list(shape), scale).numpy()
        assert np.array_equal(y.numpy(), want)
    with pytest.raises(ValueError, match='image 5'):
        tern.op.MaxRoiPool(tern.tensor(x), tern.tensor(np.array([[5, 0, 0, 1, 1]], np.float32)), pooled_shape=[2, 2])
