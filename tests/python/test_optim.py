#!/usr/bin/env python3
"""tern.optim against torch.optim: SGD (momentum, nesterov, weight decay), Adam, AdamW and Adagrad over
10 steps on a small MLP whose weights come from torch, the parameters compared after every step; the
learning rate changed through param_groups mid-way; parameter groups with their own hyper-parameters;
argument checks; zero_grad; learning-rate schedulers.

Run with PYTHONPATH=BUILD/python. Prints one line per test and exits 1 if any failed (77 when torch or
tern cannot be imported)."""
import sys
import traceback

import numpy as np

try:
    import torch
except ImportError:
    print('SKIP: torch is not importable')
    sys.exit(77)
try:
    import tern
    import tern.nn as nn
    import tern.nn.functional as F
    import tern.optim as optim
except ImportError as e:
    print('SKIP: tern is not importable (%s); set PYTHONPATH=BUILD/python' % e)
    sys.exit(77)

import torch.nn as tnn
import torch.nn.functional as TF

RTOL, ATOL = 1e-5, 1e-6
STEPS = 10
_worst = {'abs': 0.0, 'rel': 0.0, 'what': ''}


def arr(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x.numpy() if hasattr(x, 'numpy') else x)


def close(got, want, what='', rtol=RTOL, atol=ATOL):
    g, w = arr(got).astype(np.float64), arr(want).astype(np.float64)
    assert g.shape == w.shape, '%s: shape %s, torch %s' % (what, g.shape, w.shape)
    if g.size:
        d = np.abs(g - w)
        i = np.unravel_index(np.argmax(d / (atol + rtol * np.abs(w))), d.shape)
        if d[i] > _worst['abs']:
            _worst.update(abs=float(d[i]), rel=float(d[i] / max(abs(w[i]), 1e-30)), what=what)
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)


def models(seed=0):
    torch.manual_seed(seed)
    theirs = tnn.Sequential(tnn.Linear(4, 8), tnn.Tanh(), tnn.Linear(8, 3))
    mine = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return mine, theirs


_rs = np.random.default_rng(1)
X = _rs.standard_normal((16, 4)).astype(np.float32)
Y = _rs.integers(0, 3, size=16).astype(np.int64)


def compare_params(mine, theirs, what):
    mp = dict(mine.named_parameters())
    for k, p in theirs.named_parameters():
        close(mp[k], p, '%s %s' % (what, k))


def train(mine, theirs, make_mine, make_theirs, what, lr_changes=None, steps=STEPS, skip=None, skip_steps=None):
    """Runs both for steps steps; lr_changes: {step: [lr of group 0, ...]} set through param_groups;
    skip: names of parameters whose gradient is dropped (left out of the update) at the steps in
    skip_steps (None: every step)."""
    om, ot = make_mine(mine), make_theirs(theirs)
    xm, xt = tern.tensor(X), torch.tensor(X)
    ym, yt = tern.tensor(Y), torch.tensor(Y)
    for step in range(steps):
        if lr_changes and step in lr_changes:
            for gm, gt, lr in zip(om.param_groups, ot.param_groups, lr_changes[step]):
                gm['lr'] = lr
                gt['lr'] = lr
        om.zero_grad()
        ot.zero_grad(set_to_none=True)
        lm = F.cross_entropy(mine(xm), ym)
        lt = TF.cross_entropy(theirs(xt), yt)
        close(lm, lt, '%s loss at step %d' % (what, step))
        lm.backward()
        lt.backward()
        if skip and (skip_steps is None or step in skip_steps):
            tp = dict(theirs.named_parameters())
            mp = dict(mine.named_parameters())
            for n in skip:
                tp[n].grad = None
                nn.modules._clear_grad(mp[n])
        om.step()
        ot.step()
        compare_params(mine, theirs, '%s after step %d' % (what, step + 1))
    return om, ot


CONFIGS = [
    ('SGD', dict(lr=0.1)),
    ('SGD', dict(lr=0.1, momentum=0.9)),
    ('SGD', dict(lr=0.05, momentum=0.9, nesterov=True)),
    ('SGD', dict(lr=0.1, weight_decay=0.1)),
    ('SGD', dict(lr=0.05, momentum=0.5, nesterov=True, weight_decay=0.01)),
    ('Adam', dict()),
    ('Adam', dict(lr=0.01)),
    ('Adam', dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    ('AdamW', dict(lr=0.01)),
    ('AdamW', dict(lr=0.01, betas=(0.85, 0.99), weight_decay=0.2)),
    ('Adagrad', dict()),
    ('Adagrad', dict(lr=0.1)),
    ('Adagrad', dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, eps=1e-6)),
]


def _one(name, kw, lr_change):
    mine, theirs = models(seed=sum(map(ord, name)) % 100)
    lr = kw['lr'] if 'lr' in kw else getattr(torch.optim, name)([torch.zeros(1, requires_grad=True)]).defaults['lr']
    changes = {5: [lr * 0.3], 8: [lr * 2.0]} if lr_change else None
    train(mine, theirs, lambda m: getattr(optim, name)(m.parameters(), **kw),
          lambda m: getattr(torch.optim, name)(m.parameters(), **kw), '%s %s' % (name, kw), changes)


def test_sgd():
    for name, kw in CONFIGS:
        if name == 'SGD':
            _one(name, kw, False)


def test_adam():
    for name, kw in CONFIGS:
        if name == 'Adam':
            _one(name, kw, False)


def test_adamw():
    for name, kw in CONFIGS:
        if name == 'AdamW':
            _one(name, kw, False)


def test_adagrad():
    for name, kw in CONFIGS:
        if name == 'Adagrad':
            _one(name, kw, False)


def test_lr_change_through_param_groups():
    for name, kw in CONFIGS:
        _one(name, kw, True)


def test_param_groups():
    cases = [
        ('SGD', [dict(lr=0.1, momentum=0.9), dict(lr=0.01, momentum=0.5, weight_decay=0.1)], dict(lr=0.2)),
        ('Adam', [dict(lr=0.01), dict(betas=(0.5, 0.9), weight_decay=0.05)], dict(lr=0.02)),
        ('AdamW', [dict(), dict(lr=0.005, weight_decay=0.0)], dict(lr=0.01)),
        ('Adagrad', [dict(lr=0.2, lr_decay=0.1), dict()], dict(lr=0.05)),
    ]
    for name, groups, defaults in cases:
        mine, theirs = models(seed=3)

        def make(m, lib, groups=groups, defaults=defaults):
            ps = list(m.parameters())
            gs = [dict(g, params=ps[:2]) for g in groups[:1]] + [dict(g, params=ps[2:]) for g in groups[1:]]
            return getattr(lib, name)(gs, **defaults)
        om, ot = train(mine, theirs, lambda m: make(m, optim), lambda m: make(m, torch.optim),
                       '%s groups' % name, lr_changes={4: [0.05, 0.001], 7: [0.02, 0.03]})
        assert len(om.param_groups) == 2
        for gm, gt in zip(om.param_groups, ot.param_groups):
            for k in gt:
                if k in ('params', 'foreach', 'maximize', 'capturable', 'differentiable', 'fused'):
                    continue
                assert k in gm and gm[k] == gt[k], '%s group key %s: %r vs torch %r' % (name, k, gm.get(k), gt[k])
            assert [id(p) for p in gm['params']] != []


def test_params_without_grad_untouched():
    for name, kw in (('SGD', dict(lr=0.1, momentum=0.9)), ('Adam', dict(lr=0.01)), ('Adagrad', dict(lr=0.1))):
        mine, theirs = models(seed=5)
        before = arr(dict(mine.named_parameters())['2.bias'])
        train(mine, theirs, lambda m: getattr(optim, name)(m.parameters(), **kw),
              lambda m: getattr(torch.optim, name)(m.parameters(), **kw), '%s skip' % name, skip=['2.bias'])
        assert np.array_equal(arr(dict(mine.named_parameters())['2.bias']), before)
    # skipped at some steps only: torch.optim's per-parameter step counts (Adam's bias correction,
    # Adagrad's lr_decay) stay behind for that parameter
    for name, kw in (('SGD', dict(lr=0.1, momentum=0.9, weight_decay=0.1)), ('Adam', dict(lr=0.01)),
                     ('AdamW', dict(lr=0.01)), ('Adagrad', dict(lr=0.1, lr_decay=0.1))):
        mine, theirs = models(seed=6)
        train(mine, theirs, lambda m: getattr(optim, name)(m.parameters(), **kw),
              lambda m: getattr(torch.optim, name)(m.parameters(), **kw), '%s skip at steps 2-4' % name,
              skip=['2.bias', '0.weight'], skip_steps={2, 3, 4})


def test_zero_grad():
    mine, _ = models()
    opt = optim.SGD(mine.parameters(), lr=0.1)
    F.cross_entropy(mine(tern.tensor(X)), tern.tensor(Y)).backward()
    assert all(p.grad is not None for p in mine.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in mine.parameters())
    before = [arr(p) for p in mine.parameters()]
    opt.step()  # no gradients: nothing moves
    assert all(np.array_equal(a, arr(p)) for a, p in zip(before, mine.parameters()))


def test_zero_grad_to_zeros_and_frozen():
    # set_to_none=False leaves zero gradients: momentum and weight decay still move the parameters
    mine, theirs = models(seed=6)
    om = optim.SGD(mine.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    ot = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    for step in range(4):
        om.zero_grad(set_to_none=False)
        ot.zero_grad(set_to_none=False)
        if step < 2:
            F.cross_entropy(mine(tern.tensor(X)), tern.tensor(Y)).backward()
            TF.cross_entropy(theirs(torch.tensor(X)), torch.tensor(Y)).backward()
        else:
            assert all(p.grad is not None and not arr(p.grad).any() for p in mine.parameters())
        om.step()
        ot.step()
        compare_params(mine, theirs, 'zero_grad(set_to_none=False) after step %d' % (step + 1))
    # a frozen parameter (requires_grad False) is accepted and never moves
    mine, theirs = models(seed=7)
    first = dict(mine.named_parameters())['0.weight']
    first.requires_grad = False
    dict(theirs.named_parameters())['0.weight'].requires_grad_(False)
    before = arr(first)
    train(mine, theirs, lambda m: optim.Adam(m.parameters(), lr=0.01),
          lambda m: torch.optim.Adam(m.parameters(), lr=0.01), 'Adam frozen first layer', steps=4)
    assert np.array_equal(arr(first), before)


def test_optimizer_before_load_state_dict():
    # load_state_dict writes in place: an optimizer made before it still drives the same tensors
    torch.manual_seed(12)
    theirs = tnn.Sequential(tnn.Linear(4, 8), tnn.Tanh(), tnn.Linear(8, 3))
    mine = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    om = optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    ot = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    train(mine, theirs, lambda m: om, lambda m: ot, 'SGD made before load_state_dict', steps=3)


def test_argument_checks():
    p = [tern.Parameter(np.zeros(2, np.float32))]

    def raises(exc, fn):
        try:
            fn()
        except exc:
            return
        raise AssertionError('%s not raised' % exc.__name__)
    raises(NotImplementedError, lambda: optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5))
    raises(ValueError, lambda: optim.SGD(p, lr=0.1, nesterov=True))
    raises(ValueError, lambda: optim.SGD(p))
    raises(ValueError, lambda: optim.SGD([], lr=0.1))
    raises(ValueError, lambda: optim.SGD(p, lr=-1.0))
    raises(ValueError, lambda: optim.Adam(p, betas=(1.0, 0.9)))
    raises(NotImplementedError, lambda: optim.Adam(p, amsgrad=True))
    raises(NotImplementedError, lambda: optim.Adagrad(p, initial_accumulator_value=0.1))
    raises(TypeError, lambda: optim.SGD(p[0], lr=0.1))
    raises(ValueError, lambda: optim.SGD([{'params': p}, {'params': p}], lr=0.1))
    o = optim.AdamW(p)
    assert o.param_groups[0]['weight_decay'] == 0.01 and o.param_groups[0]['lr'] == 1e-3
    assert o.param_groups[0]['betas'] == (0.9, 0.999) and o.param_groups[0]['eps'] == 1e-8
    o = optim.Adagrad(p)
    assert o.param_groups[0]['lr'] == 0.01 and o.param_groups[0]['eps'] == 1e-10
    o = optim.SGD(p, lr=0.1, momentum=0.9)
    o.param_groups[0]['momentum'] = 0.5
    raises(ValueError, o.step)


def test_closure_and_scheduler():
    mine, theirs = models(seed=8)
    om = optim.SGD(mine.parameters(), lr=0.5, momentum=0.9)
    ot = torch.optim.SGD(theirs.parameters(), lr=0.5, momentum=0.9)
    sm = optim.lr_scheduler.StepLR(om, step_size=3, gamma=0.5)
    st = torch.optim.lr_scheduler.StepLR(ot, step_size=3, gamma=0.5)
    for step in range(8):
        def cm():
            om.zero_grad()
            loss = F.cross_entropy(mine(tern.tensor(X)), tern.tensor(Y))
            loss.backward()
            return loss

        def ct():
            ot.zero_grad()
            loss = TF.cross_entropy(theirs(torch.tensor(X)), torch.tensor(Y))
            loss.backward()
            return loss
        lm, lt = om.step(cm), ot.step(ct)
        close(lm, lt, 'closure loss %d' % step)
        sm.step()
        st.step()
        assert abs(om.param_groups[0]['lr'] - ot.param_groups[0]['lr']) < 1e-12
        compare_params(mine, theirs, 'StepLR after step %d' % (step + 1))
    mine, theirs = models(seed=9)
    om, ot = optim.Adam(mine.parameters(), lr=0.01), torch.optim.Adam(theirs.parameters(), lr=0.01)
    sm = optim.lr_scheduler.ExponentialLR(om, 0.8)
    st = torch.optim.lr_scheduler.ExponentialLR(ot, 0.8)
    for step in range(5):
        for o, m, x, y, lossf in ((om, mine, tern.tensor(X), tern.tensor(Y), F.cross_entropy),
                                  (ot, theirs, torch.tensor(X), torch.tensor(Y), TF.cross_entropy)):
            o.zero_grad()
            lossf(m(x), y).backward()
            o.step()
        sm.step()
        st.step()
        compare_params(mine, theirs, 'ExponentialLR after step %d' % (step + 1))


def test_mse_regression_adam():
    # a second loss and model shape: Linear -> ReLU -> Linear on MSE, Adam with weight decay
    torch.manual_seed(11)
    theirs = tnn.Sequential(tnn.Linear(4, 6), tnn.ReLU(), tnn.Linear(6, 2))
    mine = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    target = np.random.default_rng(2).standard_normal((16, 2)).astype(np.float32)
    om = optim.Adam(mine.parameters(), lr=0.02, weight_decay=0.01)
    ot = torch.optim.Adam(theirs.parameters(), lr=0.02, weight_decay=0.01)
    for step in range(STEPS):
        om.zero_grad()
        ot.zero_grad()
        lm = F.mse_loss(mine(tern.tensor(X)), tern.tensor(target))
        lt = TF.mse_loss(theirs(torch.tensor(X)), torch.tensor(target))
        close(lm, lt, 'mse loss %d' % step)
        lm.backward()
        lt.backward()
        om.step()
        ot.step()
        compare_params(mine, theirs, 'mse Adam after step %d' % (step + 1))


def test_state_dict():
    """torch's optimizer state (as numpy) loaded into tern's mid-training, and tern's own round trip:
    after it both continue in step, as if never interrupted."""
    def np_state(sd):
        return {'state': {i: {k: (v.detach().numpy() if isinstance(v, torch.Tensor) else v) for k, v in e.items()}
                          for i, e in sd['state'].items()},
                'param_groups': sd['param_groups']}

    for name, kw in [('SGD', dict(lr=0.1, momentum=0.9, nesterov=True)), ('SGD', dict(lr=0.1)),
                     ('Adam', dict(lr=0.01, weight_decay=0.1)), ('AdamW', dict(lr=0.01)),
                     ('Adagrad', dict(lr=0.1, lr_decay=0.05))]:
        mine, theirs = models(seed=21)
        ot = getattr(torch.optim, name)(theirs.parameters(), **kw)
        xt, yt = torch.tensor(X), torch.tensor(Y)
        for _ in range(4):  # torch alone
            ot.zero_grad()
            TF.cross_entropy(theirs(xt), yt).backward()
            ot.step()
        mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
        om = getattr(optim, name)(mine.parameters(), **kw)
        om.load_state_dict(np_state(ot.state_dict()))
        saved = om.state_dict()
        assert sorted(saved['state']) == sorted(ot.state_dict()['state']), (name, saved['state'].keys())
        for i, e in ot.state_dict()['state'].items():
            for k, v in e.items():
                if v is None:
                    assert saved['state'][i][k] is None, (name, k)
                else:
                    close(np.asarray(saved['state'][i][k]), v, '%s state %d %s' % (name, i, k))
        # a fresh tern optimizer from tern's own state dict: continues exactly like the first
        om2 = getattr(optim, name)(mine.parameters(), **kw)
        om2.load_state_dict(saved)
        xm, ym = tern.tensor(X), tern.tensor(Y)
        for step in range(3):
            om2.zero_grad()
            ot.zero_grad()
            F.cross_entropy(mine(xm), ym).backward()
            TF.cross_entropy(theirs(xt), yt).backward()
            om2.step()
            ot.step()
            compare_params(mine, theirs, '%s %s resumed, step %d' % (name, kw, step + 1))
    om = optim.Adam(models()[0].parameters())
    bad = om.state_dict()
    bad['param_groups'][0]['betas'] = (0.5, 0.5)
    try:
        om.load_state_dict(bad)
        raise AssertionError('changed betas loaded')
    except ValueError as e:
        assert 'betas' in str(e)
    bad = om.state_dict()
    bad['param_groups'][0]['params'] = [0]
    try:
        om.load_state_dict(bad)
        raise AssertionError('wrong parameter count loaded')
    except ValueError as e:
        assert "doesn't match the size" in str(e)


TESTS = [v for k, v in list(globals().items()) if k.startswith('test_') and callable(v)]


def main():
    failed = 0
    for t in TESTS:
        _worst.update(abs=0.0, rel=0.0, what='')
        try:
            t()
        except Exception as e:  # noqa: BLE001
            failed += 1
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ''
            print('FAIL %s: %s: %s' % (t.__name__, type(e).__name__, msg))
            traceback.print_exc(file=sys.stdout)
            continue
        extra = ''
        if _worst['what']:
            extra = ' (worst |diff| %.2g, rel %.2g: %s)' % (_worst['abs'], _worst['rel'], _worst['what'])
        print('PASS %s%s' % (t.__name__, extra))
    print('%d passed, %d failed' % (len(TESTS) - failed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
