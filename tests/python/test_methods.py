"""tern.Tensor's torch-style methods (tern/_tensor.py) against torch: reductions with indices,
topk/sort, norms, expand/repeat/split/chunk, boolean masks, item assignment and in-place operators,
values and gradients, and their errors."""
import numpy as np
import pytest
import torch

import tern


def arr(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def close(x, y):
    x = x.numpy() if isinstance(x, tern.Tensor) else np.asarray(x)
    y = y.detach().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    assert x.shape == y.shape
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def both(a, requires_grad=False):
    if requires_grad:
        return tern.Parameter(a), torch.tensor(a, requires_grad=True)
    return tern.tensor(a), torch.tensor(a)


CASES = [
    ('max_dim', lambda t: t.max(1).values), ('max_dim_indices', lambda t: t.max(1).indices),
    ('min_keepdim', lambda t: t.min(0, keepdim=True)[0]), ('argmin_pair', lambda t: t.min(-1)[1]),
    ('max_all', lambda t: t.max()), ('topk', lambda t: t.topk(2).values),
    ('topk_smallest_dim0', lambda t: t.topk(2, dim=0, largest=False).indices),
    ('sort_desc', lambda t: t.sort(1, descending=True).values), ('argsort', lambda t: t.argsort(0)),
    ('norm', lambda t: t.norm()), ('norm_dim', lambda t: t.norm(dim=1)),
    ('norm_p1', lambda t: t.norm(p=1, dim=0, keepdim=True)), ('norm_p3', lambda t: t.norm(p=3)),
    ('norm_inf', lambda t: t.norm(p=float('inf'), dim=1)),
    ('repeat', lambda t: t.repeat(2, 1, 2)), ('var', lambda t: t.var(1)), ('std', lambda t: t.std()),
    ('var_biased', lambda t: t.var(0, unbiased=False, keepdim=True)),
    ('square', lambda t: t.square()), ('rsqrt', lambda t: (t * t + 1).rsqrt()),
    ('gather', lambda t: t.gather(1, (tern if isinstance(t, tern.Tensor) else torch).tensor(
        np.array([[0, 1], [2, 0], [1, 1], [0, 4]])))),
    ('index_select', lambda t: t.index_select(1, (tern if isinstance(t, tern.Tensor) else torch).tensor(
        np.array([0, 2])))),
    ('masked_fill', lambda t: t.masked_fill(t > 0.5, 2.0)),
    ('mask', lambda t: t[t > 0]), ('row_mask', lambda t: t[t.sum(1) > 0]),
    ('t', lambda t: t.t()), ('expand', lambda t: t[:1].expand(3, -1)), ('expand_new', lambda t: t[0].expand(2, 4, 5)),
]


@pytest.mark.parametrize('name,fn', CASES, ids=[c[0] for c in CASES])
def test_value_and_grad(name, fn):
    a = arr((4, 5))
    t, T = both(a, requires_grad=True)
    y, Y = fn(t), fn(T)
    close(y, Y)
    if Y.dtype.is_floating_point:
        (y * y).sum().backward()
        (Y * Y).sum().backward()
        close(t.grad, T.grad)


def test_split_chunk_unbind():
    a = arr((6, 5))
    t, T = both(a, requires_grad=True)
    for x, y in zip(t.chunk(4, 1), T.chunk(4, 1)):
        close(x, y)
    for x, y in zip(t.split([1, 3, 2]), T.split([1, 3, 2])):
        close(x, y)
    for x, y in zip(t.split(4), T.split(4)):
        close(x, y)
    parts, P = t.unbind(1), T.unbind(1)
    assert len(parts) == 5
    (parts[0] * parts[3]).sum().backward()
    (P[0] * P[3]).sum().backward()
    close(t.grad, T.grad)
    with pytest.raises(ValueError, match='add up to'):
        t.split([1, 1])


def test_setitem_without_history_writes_the_bytes():
    a = arr((4, 5))
    t, T = both(a)
    view = np.asarray(t)
    t[1:3, 0] = 5.0
    T[1:3, 0] = 5.0
    t[t < -1] = 0
    T[T < -1] = 0
    t[0] = tern.tensor(np.arange(5, dtype=np.float32))
    T[0] = torch.arange(5, dtype=torch.float32)
    t[[1, 3], 2] = -7.0
    T[[1, 3], 2] = -7.0
    close(t, T)
    np.testing.assert_array_equal(view, t.numpy())  # the same bytes


def test_setitem_with_history():
    a = arr((4, 5))
    p, P = both(a, requires_grad=True)
    h, H = p * 2, P * 2
    h[:, 1] = h[:, 0] * 3
    H[:, 1] = H[:, 0] * 3
    h[h > 1] = 0.0
    H[H > 1] = 0.0
    h += p
    H += P
    close(h, H)
    (h * h).sum().backward()
    (H * H).sum().backward()
    close(p.grad, P.grad)


def test_value_with_history_into_plain_tensor():
    v, V = both(arr((3,)), requires_grad=True)
    out, Out = tern.zeros(2, 3), torch.zeros(2, 3)
    out[1] = v * 2
    Out[1] = V * 2
    (out * out).sum().backward()
    (Out * Out).sum().backward()
    close(v.grad, V.grad)


def test_inplace_operators():
    a = arr((3, 4))
    t, T = both(a)
    t += 1
    T += 1
    t *= tern.tensor(a)
    T *= torch.tensor(a)
    t -= 0.5
    T -= 0.5
    t /= 2
    T /= 2
    t.add_(tern.tensor(a), alpha=2)
    T.add_(torch.tensor(a), alpha=2)
    t.clamp_(-1, 1)
    T.clamp_(-1, 1)
    close(t, T)


def test_leaf_update_under_no_grad():
    a = arr((3, 4))
    p = tern.Parameter(a)
    view = np.asarray(p)
    with pytest.raises(RuntimeError, match='leaf tensor that requires grad'):
        p += 1
    with pytest.raises(RuntimeError, match='leaf tensor that requires grad'):
        p[0] = 1.0
    with tern.no_grad():
        p -= 0.5
        p.mul_(2)
    np.testing.assert_allclose(p.numpy(), (a - 0.5) * 2, rtol=1e-6)
    np.testing.assert_array_equal(view, p.numpy())
    assert p.requires_grad and p.is_leaf


def test_manual_sgd_updates_a_module():
    torch.manual_seed(0)
    tm = torch.nn.Linear(3, 2)
    m = tern.nn.Linear(3, 2)
    m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = arr((5, 3))
    for _ in range(3):
        for mod, lib in ((m, tern), (tm, torch)):
            loss = (mod(lib.tensor(x)) ** 2).mean()
            loss.backward()
            with lib.no_grad():
                for q in mod.parameters():
                    q -= 0.1 * q.grad
                    q.grad = None
    close(m.weight, tm.weight)
    close(m.bias, tm.bias)


def test_errors():
    t = tern.tensor(arr((4, 5)))
    with pytest.raises(IndexError, match=r'mask of shape \(3,\)'):
        t[np.array([True, False, True])]
    with pytest.raises(ValueError, match='does not broadcast'):
        u = tern.Parameter(arr((4, 5))) * 1
        u[0] = tern.tensor(arr((3,)))
    with pytest.raises(RuntimeError, match='cannot broadcast the tensor itself'):
        v = tern.tensor(arr((1, 5)))
        v += t
    with pytest.raises(ValueError, match='topk: k=9'):
        t.topk(9)
    with pytest.raises(IndexError, match='out of range'):
        t.max(2)
    with pytest.raises(TypeError, match='cannot be deleted'):
        del t[0]
