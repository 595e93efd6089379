"""Autograd and optimizers against torch: gradients of expressions, of indexing and of an MLP's
loss (rtol 1e-5), accumulation, no_grad, leaf rules, the errors, and tern._tern.Optimizer's SGD and
Adam steps against torch.optim."""
import numpy as np
import pytest
import torch

import tern

torch.set_default_dtype(torch.float32)


def arr(shape, dtype=np.float32, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(dtype)


def pair(a):
    """The same leaf in tern and in torch."""
    return tern.Parameter(a, dtype=str(a.dtype)), torch.tensor(a, requires_grad=True)


def close(t, ref, rtol=1e-5, atol=1e-6):
    assert t is not None, 'no gradient'
    np.testing.assert_allclose(t.numpy(), ref.detach().numpy(), rtol=rtol, atol=atol)


EXPRESSIONS = [
    ('arith', lambda x, y, m: ((x * y + x / (y * y + 1) - y) ** 2).sum()),
    ('numbers', lambda x, y, m: (2.0 - x * 3 + 1 / (x * x + 2) + x ** 3 - 0.5 * y).mean()),
    ('broadcast', lambda x, y, m: (x + y[0] * x[:, :1]).sum()),
    ('matmul', lambda x, y, m: (m.tanh(x @ y.T) * 2).sum()),
    ('unary', lambda x, y, m: (m.exp(x) + m.log(y * y + 1) + m.sigmoid(x) * m.relu(y)).sum()),
    ('index', lambda x, y, m: (x[1] * 2 + x[:, 2].sum() + x[..., ::2].sum() + y[None, 0, 1:3].sum()).sum()),
    ('gather', lambda x, y, m: x[[2, 0, 2]].sum() + (y[:, [1, 1]] ** 2).sum()),
    ('reduce', lambda x, y, m: (m.sum(x, 1) * m.mean(y, 1)).sum() + m.amax(x, 0).sum()),
    ('shape', lambda x, y, m: (m.reshape(x, (4, 3)).T @ m.reshape(y, (4, 3))).sum()),
    ('softmax', lambda x, y, m: (m.softmax(x, 1) * y).sum() + (m.log_softmax(y, 0) * x).sum()),
    ('compare', lambda x, y, m: (x * (x > 0) + y * (y <= 0.25)).sum()),
    ('neg', lambda x, y, m: (-(x - y) * abs(y)).sum()),
]


class TernOps:
    tanh = staticmethod(lambda t: t.tanh())
    exp = staticmethod(lambda t: t.exp())
    log = staticmethod(lambda t: t.log())
    sigmoid = staticmethod(lambda t: t.sigmoid())
    relu = staticmethod(lambda t: t.relu())
    sum = staticmethod(lambda t, a: t.sum(axis=a))
    mean = staticmethod(lambda t, a: t.mean(axis=a))
    amax = staticmethod(lambda t, a: t.max(axis=a))
    reshape = staticmethod(lambda t, s: t.reshape(s))
    softmax = staticmethod(lambda t, a: t.softmax(a))
    log_softmax = staticmethod(lambda t, a: t.log_softmax(a))


class TorchOps:
    tanh = staticmethod(torch.tanh)
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    sigmoid = staticmethod(torch.sigmoid)
    relu = staticmethod(torch.relu)
    sum = staticmethod(lambda t, a: t.sum(dim=a))
    mean = staticmethod(lambda t, a: t.mean(dim=a))
    amax = staticmethod(lambda t, a: t.amax(dim=a))
    reshape = staticmethod(lambda t, s: t.reshape(s))
    softmax = staticmethod(lambda t, a: torch.softmax(t, a))
    log_softmax = staticmethod(lambda t, a: torch.log_softmax(t, a))


@pytest.mark.parametrize('name,fn', EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_gradients_match_torch(name, fn):
    a, b = arr((3, 4), seed=1), arr((3, 4), seed=2)
    x, tx = pair(a)
    y, ty = pair(b)
    loss = fn(x, y, TernOps)
    tloss = fn(tx, ty, TorchOps)
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    assert loss.requires_grad and not loss.is_leaf
    loss.backward()
    tloss.backward()
    close(x.grad, tx.grad)
    close(y.grad, ty.grad)


def test_float64_gradients():
    a = arr((2, 5), np.float64, seed=3)
    x, tx = pair(a)
    assert x.dtype == 'float64'
    loss = (x.exp() * x).sum()
    loss.backward()
    (tx.exp() * tx).sum().backward()
    close(x.grad, tx.grad, rtol=1e-12)


def test_mlp_loss_matches_torch():
    rng = np.random.default_rng(4)
    n, d, h, k = 16, 5, 8, 3
    xs = rng.normal(size=(n, d)).astype(np.float32)
    labels = rng.integers(0, k, size=n)
    onehot = np.eye(k, dtype=np.float32)[labels]
    w1, b1 = arr((d, h), seed=5) * 0.5, arr((h,), seed=6) * 0.1
    w2, b2 = arr((h, k), seed=7) * 0.5, arr((k,), seed=8) * 0.1
    tern_p = [tern.Parameter(v) for v in (w1, b1, w2, b2)]
    torch_p = [torch.tensor(v, requires_grad=True) for v in (w1, b1, w2, b2)]

    W1, B1, W2, B2 = tern_p
    hid = (tern.tensor(xs) @ W1 + B1).relu()
    logits = hid @ W2 + B2
    loss = -(logits.log_softmax(axis=1) * onehot).sum() / n

    T1, C1, T2, C2 = torch_p
    tlogits = torch.relu(torch.from_numpy(xs) @ T1 + C1) @ T2 + C2
    tloss = torch.nn.functional.cross_entropy(tlogits, torch.from_numpy(labels))

    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    loss.backward()
    tloss.backward()
    for p, tp in zip(tern_p, torch_p):
        close(p.grad, tp.grad)


def test_accumulation_and_clearing():
    x = tern.Parameter([1.0, 2.0, 3.0])
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 7.0, 9.0])
    x.grad = None
    assert x.grad is None
    (x * 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0, 1.0])
    x.grad = tern.zeros(3)
    assert x.grad.sum().item() == 0
    with pytest.raises(ValueError):
        x.grad = tern.zeros(4)
    with pytest.raises(TypeError):
        x.grad = [1.0, 2.0, 3.0]


def test_backward_with_gradient():
    a = arr((2, 3), seed=9)
    seed = arr((2, 3), seed=10)
    x, tx = pair(a)
    (x * x).backward(seed)
    (tx * tx).backward(torch.from_numpy(seed))
    close(x.grad, tx.grad)
    y = tern.Parameter([1.0, 2.0])
    (y * 2).backward(tern.tensor([1.0, 0.5]))
    np.testing.assert_allclose(y.grad.numpy(), [2.0, 1.0])


def test_leaves_and_detach():
    x = tern.Parameter([1.0, 2.0])
    assert isinstance(x, tern.Tensor) and x.is_leaf and x.requires_grad
    y = x * 2
    assert not y.is_leaf and y.requires_grad
    with pytest.raises(ValueError, match='leaf'):
        y.requires_grad = False
    d = y.detach()
    assert d.is_leaf and not d.requires_grad
    assert not x.data.requires_grad
    t = tern.tensor([1.0])
    assert not t.requires_grad
    t.requires_grad = True
    assert t.requires_grad and t.requires_grad_(False) is t and not t.requires_grad
    with pytest.raises(ValueError, match='floating-point'):
        tern.tensor([1, 2]).requires_grad = True
    # an operation on tensors that need no gradient records nothing
    z = tern.tensor([1.0]) * 3
    assert z.is_leaf and not z.requires_grad
    # Parameter(t) shares t's bytes as a new leaf
    p = tern.Parameter(d)
    assert p.is_leaf and p.requires_grad
    np.asarray(d)[0] = 9
    assert p[0].item() == 9
    assert not tern.Parameter([1.0], requires_grad=False).requires_grad
    assert tern.Parameter(np.zeros(2)).dtype == 'float32'


def test_no_grad():
    x = tern.Parameter([1.0, 2.0])
    with tern.no_grad():
        y = x * 2
        assert not y.requires_grad
    assert (x * 2).requires_grad

    @tern.no_grad()
    def f(t):
        return t + 1

    assert not f(x).requires_grad
    with pytest.raises(ValueError, match='does not require a gradient'):
        y.sum().backward()


def test_backward_errors():
    x = tern.Parameter([1.0, 2.0])
    y = x * 2
    with pytest.raises(ValueError, match='needs a gradient'):
        y.backward()
    with pytest.raises(ValueError, match='gradient given'):
        y.backward(tern.tensor([1.0, 2.0, 3.0]))
    loss = y.sum()
    loss.backward()
    with pytest.raises(ValueError, match='released'):
        loss.backward()
    with pytest.raises(ValueError, match='does not require'):
        tern.tensor([1.0]).sum().backward()


def test_freed_context_backward():
    x = tern.Parameter([1.0, 2.0])
    loss = (x * x).sum()
    tern._tern._free_context_for_test()
    with pytest.raises(tern.UsageError, match='freed context'):
        loss.backward()
    assert x.grad is None


def train(kind, steps, torch_opt, **kw):
    rng = np.random.default_rng(11)
    xs = rng.normal(size=(8, 4)).astype(np.float32)
    ys = rng.normal(size=(8, 2)).astype(np.float32)
    w0, b0 = arr((4, 2), seed=12), arr((2,), seed=13)
    w, b = tern.Parameter(w0), tern.Parameter(b0)
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    opt = tern._tern.Optimizer(kind, [w, b], **kw)
    topt = torch_opt([tw, tb])
    for _ in range(steps):
        opt.zero_grad()
        (((tern.tensor(xs) @ w + b - ys) ** 2).mean()).backward()
        opt.step()
        topt.zero_grad()
        (((torch.from_numpy(xs) @ tw + tb - torch.from_numpy(ys)) ** 2).mean()).backward()
        topt.step()
    assert opt.steps == steps
    close(w, tw, rtol=1e-5, atol=1e-6)
    close(b, tb, rtol=1e-5, atol=1e-6)
    return opt


def test_optimizer_sgd_momentum():
    opt = train('sgd', 5, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), lr=0.1, momentum=0.9,
                nesterov=True)
    assert opt.kind == 'sgd' and len(opt.params) == 2
    assert opt.lr == pytest.approx(0.1)
    opt.lr = 0.01
    assert opt.lr == pytest.approx(0.01)


def test_optimizer_adam():
    train('adam', 5, lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99)), lr=0.01, betas=(0.8, 0.99))
    train('adamw', 4, lambda p: torch.optim.AdamW(p, lr=0.01), lr=0.01)
    train('adagrad', 4, lambda p: torch.optim.Adagrad(p, lr=0.1), lr=0.1)


def test_optimizer_errors():
    with pytest.raises(ValueError, match='unknown optimizer'):
        tern._tern.Optimizer('rmsprop', [tern.Parameter([1.0])], 0.1)
    with pytest.raises(TypeError):
        tern._tern.Optimizer('sgd', [[1.0]], 0.1)
    with pytest.raises(ValueError):
        tern._tern.Optimizer('sgd', [tern.tensor([1, 2])], 0.1)
    with pytest.raises(TypeError):
        tern._tern.Optimizer('adam', [tern.Parameter([1.0])], 0.1, betas=0.9)
    # a parameter without a gradient is left alone
    p = tern.Parameter([1.0])
    opt = tern._tern.Optimizer('sgd', [p], 0.1)
    opt.step()
    assert p.item() == 1.0


def test_roi_align_against_torchvision():
    """RoiAlign (half_pixel, adaptive sampling) and its gradient equal torchvision.ops.roi_align
    (aligned=True) and its backward."""
    tv = pytest.importorskip('torchvision.ops')
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    boxes = np.array([[0, 0.5, 1.2, 7.3, 6.1], [1, 2.0, 0.3, 10.2, 8.4], [1, 0.0, 0.0, 3.0, 3.0]], np.float32)
    g = rng.standard_normal((3, 3, 4, 5)).astype(np.float32)
    X = torch.tensor(x, requires_grad=True)
    Y = tv.roi_align(X, torch.tensor(boxes), (4, 5), spatial_scale=0.8, sampling_ratio=-1, aligned=True)
    (Y * torch.tensor(g)).sum().backward()
    t = tern.Parameter(x)
    y = tern.op.RoiAlign(t, tern.tensor(boxes[:, 1:]), tern.tensor(boxes[:, 0].astype(np.int64)), output_height=4,
                         output_width=5, spatial_scale=0.8, sampling_ratio=0,
                         coordinate_transformation_mode='half_pixel')
    (y * tern.tensor(g)).sum().backward()
    np.testing.assert_allclose(y.numpy(), Y.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(t.grad.numpy(), X.grad.numpy(), atol=1e-5)
