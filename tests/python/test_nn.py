#!/usr/bin/env python3
"""tern.nn and tern.nn.functional against PyTorch: forward outputs with weights copied from torch layers
(state_dict -> numpy -> load_state_dict), gradients of a loss w.r.t. parameters and inputs, state_dict
keys, train/eval behaviour, and the Module API.

Run with PYTHONPATH=BUILD/python (the meson build folder's python/). Prints one line per test and exits
1 if any failed (77, meson's skip, when torch or tern cannot be imported)."""
import math
import sys
import traceback
import warnings
from collections import OrderedDict

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
except ImportError as e:
    print('SKIP: tern is not importable (%s); set PYTHONPATH=BUILD/python' % e)
    sys.exit(77)

import torch.nn as tnn
import torch.nn.functional as TF

warnings.filterwarnings('ignore', category=UserWarning)  # torch's notes (padding='same' with even kernels)

RTOL, ATOL = 1e-5, 1e-6
_worst = {'abs': 0.0, 'rel': 0.0, 'what': ''}


def _reset_worst():
    _worst.update(abs=0.0, rel=0.0, what='')


def arr(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if hasattr(x, 'numpy'):
        return np.asarray(x.numpy())
    return np.asarray(x)


def close(got, want, what='', rtol=RTOL, atol=ATOL):
    g, w = arr(got), arr(want)
    assert g.shape == w.shape, '%s: shape %s, torch %s' % (what, g.shape, w.shape)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    if g.size:
        fin = np.isfinite(w64)
        assert np.array_equal(np.isfinite(g64), fin), '%s: non-finite values differ' % what
        d = np.abs(g64[fin] - w64[fin])
        if d.size:
            i = int(np.argmax(d / (atol + rtol * np.abs(w64[fin]))))
            rel = float(d[i] / max(abs(w64[fin][i]), 1e-30))
            if d[i] > _worst['abs']:
                _worst.update(abs=float(d[i]), rel=rel, what=what)
    np.testing.assert_allclose(g64, w64, rtol=rtol, atol=atol, err_msg=what, equal_nan=True)


def tt(a, grad=False):
    """numpy -> torch float32 (leaf)."""
    return torch.tensor(np.asarray(a), requires_grad=grad)


def ta(a, grad=False):
    """numpy -> tern (a Parameter when the gradient is wanted)."""
    a = np.asarray(a)
    return tern.Parameter(a) if grad else tern.tensor(a)


def copy_weights(mine, theirs):
    sd = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    mine.load_state_dict(sd)
    return sd


def tern_loss(y, r):
    return (y * tern.tensor(r)).sum()


def torch_loss(y, r):
    return (y * torch.tensor(r)).sum()


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(*shape, seed=0):
    return rng(seed).standard_normal(shape).astype(np.float32)


def check_grads(mine, theirs, prefix=''):
    mp = dict(mine.named_parameters())
    tp = dict(theirs.named_parameters())
    assert sorted(mp) == sorted(tp), '%sparameter names %s vs torch %s' % (prefix, sorted(mp), sorted(tp))
    for k, p in tp.items():
        if p.grad is None:
            assert mp[k].grad is None, prefix + k + ': tern has a gradient, torch none'
            continue
        assert mp[k].grad is not None, prefix + k + ': no gradient'
        close(mp[k].grad, p.grad, prefix + k + '.grad')


def run_layer(mine, theirs, x, what, x_grad=True, out_index=None, train=True, extra=()):
    """Copies weights, compares forward and the gradients of sum(y * r) w.r.t. parameters and input."""
    copy_weights(mine, theirs)
    mine.train(train)
    theirs.train(train)
    xt = tt(x, grad=x_grad)
    xm = ta(x, grad=x_grad)
    yt = theirs(xt, *extra)
    ym = mine(xm, *extra)
    if out_index is not None:
        yt, ym = yt[out_index], ym[out_index]
    close(ym, yt, what + ' output')
    r = randn(*yt.shape, seed=99)
    torch_loss(yt, r).backward()
    tern_loss(ym, r).backward()
    check_grads(mine, theirs, what + ' ')
    if x_grad:
        close(xm.grad, xt.grad, what + ' input.grad')
    return ym, yt


# ---------------------------------------------------------------- layers

def test_state_dict_keys():
    torch.manual_seed(0)
    pairs = [
        (nn.Linear(3, 4), tnn.Linear(3, 4)),
        (nn.Linear(3, 4, bias=False), tnn.Linear(3, 4, bias=False)),
        (nn.Conv2d(3, 6, 3, stride=2, padding=1, groups=3), tnn.Conv2d(3, 6, 3, stride=2, padding=1, groups=3)),
        (nn.Conv2d(3, 6, 3, bias=False), tnn.Conv2d(3, 6, 3, bias=False)),
        (nn.BatchNorm2d(5), tnn.BatchNorm2d(5)),
        (nn.BatchNorm1d(5, affine=False), tnn.BatchNorm1d(5, affine=False)),
        (nn.BatchNorm2d(5, track_running_stats=False), tnn.BatchNorm2d(5, track_running_stats=False)),
        (nn.LayerNorm([4, 5]), tnn.LayerNorm([4, 5])),
        (nn.Embedding(10, 3, padding_idx=0), tnn.Embedding(10, 3, padding_idx=0)),
        (nn.LSTM(3, 4, num_layers=2, bidirectional=True), tnn.LSTM(3, 4, num_layers=2, bidirectional=True)),
        (nn.GRU(3, 4, bias=False), tnn.GRU(3, 4, bias=False)),
        (nn.RNN(3, 4, num_layers=2), tnn.RNN(3, 4, num_layers=2)),
        (nn.MultiheadAttention(8, 2), tnn.MultiheadAttention(8, 2)),
        (nn.MultiheadAttention(8, 2, kdim=5, vdim=6, add_bias_kv=True),
         tnn.MultiheadAttention(8, 2, kdim=5, vdim=6, add_bias_kv=True)),
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2)),
         tnn.Sequential(tnn.Conv2d(1, 2, 3), tnn.BatchNorm2d(2), tnn.ReLU(), tnn.Flatten(), tnn.Linear(8, 2))),
        (nn.ModuleList([nn.Linear(2, 2), nn.LayerNorm(2)]), tnn.ModuleList([tnn.Linear(2, 2), tnn.LayerNorm(2)])),
    ]
    for mine, theirs in pairs:
        ms, ts = mine.state_dict(), theirs.state_dict()
        assert list(ms) == list(ts), '%s: keys %s, torch %s' % (type(theirs).__name__, list(ms), list(ts))
        for k in ts:
            assert isinstance(ms[k], np.ndarray), k
            assert ms[k].shape == tuple(ts[k].shape), '%s: shape %s, torch %s' % (k, ms[k].shape, tuple(ts[k].shape))
            assert ms[k].dtype == ts[k].numpy().dtype, '%s: dtype %s, torch %s' % (k, ms[k].dtype, ts[k].dtype)
        assert [n for n, _ in mine.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        assert [n for n, _ in mine.named_buffers()] == [n for n, _ in theirs.named_buffers()]
        mine.load_state_dict({k: v.numpy() for k, v in ts.items()})
        for k, v in mine.state_dict().items():
            assert np.array_equal(v, ts[k].numpy()), k + ' not loaded'


def test_linear():
    torch.manual_seed(1)
    run_layer(nn.Linear(5, 3), tnn.Linear(5, 3), randn(4, 5), 'Linear 2D')
    run_layer(nn.Linear(5, 3), tnn.Linear(5, 3), randn(2, 4, 5), 'Linear 3D')
    run_layer(nn.Linear(5, 3, bias=False), tnn.Linear(5, 3, bias=False), randn(4, 5), 'Linear no bias')
    run_layer(nn.Linear(5, 3, bias=False), tnn.Linear(5, 3, bias=False), randn(2, 2, 5), 'Linear 3D no bias')


def test_conv2d():
    torch.manual_seed(2)
    configs = [
        dict(in_channels=3, out_channels=4, kernel_size=3),
        dict(in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1),
        dict(in_channels=4, out_channels=6, kernel_size=(3, 2), padding=(1, 0), dilation=2, groups=2),
        dict(in_channels=4, out_channels=4, kernel_size=3, padding=1, groups=4, bias=False),
        dict(in_channels=3, out_channels=2, kernel_size=4, padding='same'),
        dict(in_channels=3, out_channels=2, kernel_size=3, padding='valid'),
        dict(in_channels=3, out_channels=2, kernel_size=3, padding=1, padding_mode='reflect'),
        dict(in_channels=3, out_channels=2, kernel_size=3, padding=1, padding_mode='replicate'),
        dict(in_channels=3, out_channels=2, kernel_size=3, padding=1, padding_mode='circular'),
    ]
    for c in configs:
        x = randn(2, c['in_channels'], 9, 8, seed=3)
        run_layer(nn.Conv2d(**c), tnn.Conv2d(**c), x, 'Conv2d %s' % c)
    c = dict(in_channels=3, out_channels=4, kernel_size=3, stride=2)
    run_layer(nn.Conv1d(**c), tnn.Conv1d(**c), randn(2, 3, 11), 'Conv1d')
    run_layer(nn.Conv2d(**c), tnn.Conv2d(**c), randn(3, 7, 7), 'Conv2d unbatched')


def test_batchnorm2d_train_eval():
    torch.manual_seed(3)
    for kw in (dict(), dict(momentum=0.3, eps=1e-3), dict(momentum=None), dict(affine=False)):
        mine, theirs = nn.BatchNorm2d(4, **kw), tnn.BatchNorm2d(4, **kw)
        if kw.get('affine', True):
            with torch.no_grad():
                theirs.weight.uniform_(0.5, 1.5)
                theirs.bias.uniform_(-0.5, 0.5)
        copy_weights(mine, theirs)
        for step in range(3):
            x = randn(3, 4, 5, 6, seed=10 + step) * (step + 1) + step
            mine.train()
            theirs.train()
            xt, xm = tt(x, True), ta(x, True)
            yt, ym = theirs(xt), mine(xm)
            close(ym, yt, 'BatchNorm2d %s train output %d' % (kw, step))
            r = randn(*yt.shape, seed=50 + step)
            torch_loss(yt, r).backward()
            tern_loss(ym, r).backward()
            close(xm.grad, xt.grad, 'BatchNorm2d train input.grad')
            check_grads(mine, theirs, 'BatchNorm2d train ')
            mine.zero_grad()
            theirs.zero_grad()
            for k, v in theirs.state_dict().items():
                close(mine.state_dict()[k], v, 'BatchNorm2d %s %s after step %d' % (kw, k, step))
        mine.eval()
        theirs.eval()
        x = randn(2, 4, 3, 3, seed=20)
        xt, xm = tt(x, True), ta(x, True)
        yt, ym = theirs(xt), mine(xm)
        close(ym, yt, 'BatchNorm2d eval output')
        r = randn(*yt.shape, seed=51)
        torch_loss(yt, r).backward()
        tern_loss(ym, r).backward()
        close(xm.grad, xt.grad, 'BatchNorm2d eval input.grad')
        check_grads(mine, theirs, 'BatchNorm2d eval ')
        assert int(mine.state_dict()['num_batches_tracked']) == 3
    # no running statistics: batch statistics in eval too
    mine, theirs = nn.BatchNorm2d(4, track_running_stats=False), tnn.BatchNorm2d(4, track_running_stats=False)
    run_layer(mine, theirs, randn(2, 4, 3, 3, seed=4), 'BatchNorm2d no stats eval', train=False)


def test_batchnorm1d():
    torch.manual_seed(4)
    for shape in ((6, 5), (4, 5, 7)):
        mine, theirs = nn.BatchNorm1d(5), tnn.BatchNorm1d(5)
        with torch.no_grad():
            theirs.weight.uniform_(0.5, 1.5)
            theirs.bias.uniform_(-0.5, 0.5)
        run_layer(mine, theirs, randn(*shape, seed=5) * 2 + 1, 'BatchNorm1d %s train' % (shape,), train=True)
        for k, v in theirs.state_dict().items():
            close(mine.state_dict()[k], v, 'BatchNorm1d %s' % k)
        run_layer(mine, theirs, randn(*shape, seed=6), 'BatchNorm1d %s eval' % (shape,), train=False)


def test_layernorm():
    torch.manual_seed(5)
    for shape, ns, kw in (((4, 6), 6, {}), ((2, 3, 4, 5), (4, 5), {}), ((3, 7), 7, dict(elementwise_affine=False)),
                          ((3, 7), [7], dict(eps=1e-2))):
        mine, theirs = nn.LayerNorm(ns, **kw), tnn.LayerNorm(ns, **kw)
        if kw.get('elementwise_affine', True):
            with torch.no_grad():
                theirs.weight.uniform_(0.5, 1.5)
                theirs.bias.uniform_(-0.5, 0.5)
        run_layer(mine, theirs, randn(*shape, seed=7) * 3 + 1, 'LayerNorm %s %s' % (ns, kw))


def test_embedding():
    torch.manual_seed(6)
    idx = np.array([[1, 0, 3], [4, 4, 9]], dtype=np.int64)
    for kw in ({}, dict(padding_idx=0), dict(padding_idx=-1)):
        mine, theirs = nn.Embedding(10, 4, **kw), tnn.Embedding(10, 4, **kw)
        copy_weights(mine, theirs)
        yt, ym = theirs(torch.tensor(idx)), mine(tern.tensor(idx))
        close(ym, yt, 'Embedding %s output' % kw)
        r = randn(2, 3, 4, seed=8)
        torch_loss(yt, r).backward()
        tern_loss(ym, r).backward()
        check_grads(mine, theirs, 'Embedding %s ' % kw)
    ym = F.embedding(tern.tensor(idx), tern.tensor(randn(10, 4)))
    close(ym, TF.embedding(torch.tensor(idx), torch.tensor(randn(10, 4))), 'F.embedding')
    e = nn.Embedding.from_pretrained(randn(5, 2))
    close(e(tern.tensor(np.array([4, 1]))), randn(5, 2)[[4, 1]], 'Embedding.from_pretrained')


def _rnn_case(cls_m, cls_t, kw, batched=True, with_state=False, seed=0):
    torch.manual_seed(seed)
    mine, theirs = cls_m(**kw), cls_t(**kw)
    copy_weights(mine, theirs)
    dirs = 2 if kw.get('bidirectional') else 1
    L, H = kw.get('num_layers', 1), kw['hidden_size']
    seq, batch = 5, 3
    if batched:
        shape = (batch, seq, kw['input_size']) if kw.get('batch_first') else (seq, batch, kw['input_size'])
    else:
        shape = (seq, kw['input_size'])
    x = randn(*shape, seed=seed + 1)
    xt, xm = tt(x, True), ta(x, True)
    st_shape = (L * dirs, batch, H) if batched else (L * dirs, H)
    is_lstm = cls_t is tnn.LSTM
    args_t, args_m, states_t, states_m = [], [], [], []
    if with_state:
        h0 = randn(*st_shape, seed=seed + 2)
        states_t.append(tt(h0, True))
        states_m.append(ta(h0, True))
        if is_lstm:
            c0 = randn(*st_shape, seed=seed + 3)
            states_t.append(tt(c0, True))
            states_m.append(ta(c0, True))
        args_t = [tuple(states_t) if is_lstm else states_t[0]]
        args_m = [tuple(states_m) if is_lstm else states_m[0]]
    what = '%s %s%s%s' % (cls_t.__name__, kw, '' if batched else ' unbatched', ' with state' if with_state else '')
    yt, hn_t = theirs(xt, *args_t)
    ym, hn_m = mine(xm, *args_m)
    close(ym, yt, what + ' output')
    if is_lstm:
        close(hn_m[0], hn_t[0], what + ' h_n')
        close(hn_m[1], hn_t[1], what + ' c_n')
        outs_t, outs_m = [yt, hn_t[0], hn_t[1]], [ym, hn_m[0], hn_m[1]]
    else:
        close(hn_m, hn_t, what + ' h_n')
        outs_t, outs_m = [yt, hn_t], [ym, hn_m]
    lt, lm = None, None
    for i, (a, b) in enumerate(zip(outs_t, outs_m)):
        r = randn(*a.shape, seed=100 + i)
        lt = torch_loss(a, r) if lt is None else lt + torch_loss(a, r)
        lm = tern_loss(b, r) if lm is None else lm + tern_loss(b, r)
    lt.backward()
    lm.backward()
    check_grads(mine, theirs, what + ' ')
    close(xm.grad, xt.grad, what + ' input.grad')
    for a, b, n in zip(states_m, states_t, ('h0', 'c0')):
        close(a.grad, b.grad, what + ' ' + n + '.grad')


def test_lstm():
    base = dict(input_size=4, hidden_size=3)
    _rnn_case(nn.LSTM, tnn.LSTM, base, seed=10)
    _rnn_case(nn.LSTM, tnn.LSTM, base, with_state=True, seed=11)
    _rnn_case(nn.LSTM, tnn.LSTM, dict(base, num_layers=2, batch_first=True), with_state=True, seed=12)
    _rnn_case(nn.LSTM, tnn.LSTM, dict(base, bidirectional=True), seed=13)
    _rnn_case(nn.LSTM, tnn.LSTM, dict(base, num_layers=2, bidirectional=True, batch_first=True), with_state=True,
              seed=14)
    _rnn_case(nn.LSTM, tnn.LSTM, dict(base, bias=False), seed=15)
    _rnn_case(nn.LSTM, tnn.LSTM, base, batched=False, with_state=True, seed=16)


def test_gru():
    base = dict(input_size=4, hidden_size=3)
    _rnn_case(nn.GRU, tnn.GRU, base, seed=20)
    _rnn_case(nn.GRU, tnn.GRU, base, with_state=True, seed=21)
    _rnn_case(nn.GRU, tnn.GRU, dict(base, num_layers=2, batch_first=True), with_state=True, seed=22)
    _rnn_case(nn.GRU, tnn.GRU, dict(base, num_layers=2, bidirectional=True), with_state=True, seed=23)
    _rnn_case(nn.GRU, tnn.GRU, dict(base, bias=False), seed=24)
    _rnn_case(nn.GRU, tnn.GRU, base, batched=False, seed=25)


def test_rnn():
    base = dict(input_size=4, hidden_size=3)
    _rnn_case(nn.RNN, tnn.RNN, base, seed=30)
    _rnn_case(nn.RNN, tnn.RNN, dict(base, nonlinearity='relu', num_layers=2, bidirectional=True), with_state=True,
              seed=31)


def test_dropout():
    x = randn(200, 50, seed=9)
    d = nn.Dropout(0.5)
    d.eval()
    close(d(tern.tensor(x)), x, 'Dropout eval')
    d0 = nn.Dropout(0.0)
    close(d0(tern.tensor(x)), x, 'Dropout p=0 train')
    close(F.dropout(tern.tensor(x), 0.5, training=False), x, 'F.dropout training=False')
    tern.manual_seed(123)
    d.train()
    xm = ta(x, True)
    y = d(xm)
    yn = arr(y)
    kept = yn != 0
    frac = kept.mean()
    assert 0.45 < frac < 0.55, 'kept fraction %.3f' % frac
    close(yn[kept], 2 * x[kept], 'Dropout survivors scaled by 1/(1-p)')
    y.sum().backward()
    close(xm.grad, kept * 2.0, 'Dropout gradient = mask / (1-p)')
    # the mask is drawn from tern's random stream: the same seed gives the same mask
    tern.manual_seed(123)
    y2 = d(tern.tensor(x))
    assert np.array_equal(arr(y2), yn), 'tern.manual_seed does not reproduce the dropout mask'
    y3 = d(tern.tensor(x))
    assert not np.array_equal(arr(y3), yn), 'two dropout calls drew the same mask'
    close(F.dropout(tern.tensor(x), 1.0), np.zeros_like(x), 'F.dropout p=1')


def _mha_case(kw, batch_first=False, masks=False, need_weights=True, average=True, batched=True, self_attn=False,
              seed=0):
    torch.manual_seed(seed)
    E = kw['embed_dim']
    mine, theirs = nn.MultiheadAttention(batch_first=batch_first, **kw), \
        tnn.MultiheadAttention(batch_first=batch_first, **kw)
    with torch.no_grad():
        for p in theirs.parameters():
            p.uniform_(-0.5, 0.5)
    copy_weights(mine, theirs)
    L, S, N = 4, 6, 2
    if self_attn:
        S = L

    def shape(n, d):
        if not batched:
            return (n, d)
        return (N, n, d) if batch_first else (n, N, d)
    q = randn(*shape(L, E), seed=seed + 1)
    k = q if self_attn else randn(*shape(S, kw.get('kdim') or E), seed=seed + 2)
    v = q if self_attn else randn(*shape(S, kw.get('vdim') or E), seed=seed + 3)
    qt, kt, vt = tt(q, True), tt(k, True), tt(v, True)
    qm, km, vm = ta(q, True), ta(k, True), ta(v, True)
    extra_t, extra_m = {}, {}
    if masks:
        am = np.triu(np.ones((L, S), bool), 1)
        kpm = np.zeros((N, S), bool) if batched else np.zeros(S, bool)
        if batched:
            kpm[1, -1] = True
        else:
            kpm[-1] = True
        extra_t = dict(attn_mask=torch.tensor(am), key_padding_mask=torch.tensor(kpm))
        extra_m = dict(attn_mask=am, key_padding_mask=kpm)
    ot, wt = theirs(qt, kt, vt, need_weights=need_weights, average_attn_weights=average, **extra_t)
    om, wm = mine(qm, km, vm, need_weights=need_weights, average_attn_weights=average, **extra_m)
    what = 'MultiheadAttention %s bf=%s masks=%s nw=%s avg=%s batched=%s' % (kw, batch_first, masks, need_weights,
                                                                            average, batched)
    close(om, ot, what + ' output')
    if need_weights:
        close(wm, wt, what + ' weights')
    else:
        assert wm is None
    r = randn(*ot.shape, seed=77)
    lt, lm = torch_loss(ot, r), tern_loss(om, r)
    if need_weights:
        r2 = randn(*wt.shape, seed=78)
        lt, lm = lt + torch_loss(wt, r2), lm + tern_loss(wm, r2)
    lt.backward()
    lm.backward()
    check_grads(mine, theirs, what + ' ')
    close(qm.grad, qt.grad, what + ' query.grad')
    if not self_attn:
        close(km.grad, kt.grad, what + ' key.grad')
        close(vm.grad, vt.grad, what + ' value.grad')


def test_multihead_attention():
    _mha_case(dict(embed_dim=8, num_heads=2), seed=40)
    _mha_case(dict(embed_dim=8, num_heads=2), batch_first=True, masks=True, seed=41)
    _mha_case(dict(embed_dim=8, num_heads=4), need_weights=False, seed=42)
    _mha_case(dict(embed_dim=8, num_heads=2), average=False, masks=True, seed=43)
    _mha_case(dict(embed_dim=8, num_heads=2, kdim=5, vdim=3), seed=44)
    _mha_case(dict(embed_dim=8, num_heads=2, bias=False), seed=45)
    _mha_case(dict(embed_dim=8, num_heads=2, add_bias_kv=True, add_zero_attn=True), masks=True, seed=46)
    _mha_case(dict(embed_dim=8, num_heads=2), batched=False, masks=True, seed=47)
    _mha_case(dict(embed_dim=8, num_heads=2), self_attn=True, seed=48)
    # eval mode (torch may take its fast path)
    torch.manual_seed(49)
    mine, theirs = nn.MultiheadAttention(8, 2, batch_first=True), tnn.MultiheadAttention(8, 2, batch_first=True)
    copy_weights(mine, theirs)
    mine.eval()
    theirs.eval()
    x = randn(2, 5, 8, seed=50)
    with torch.no_grad():
        ot, wt = theirs(tt(x), tt(x), tt(x))
    om, wm = mine(ta(x), ta(x), ta(x))
    close(om, ot, 'MultiheadAttention eval output')
    close(wm, wt, 'MultiheadAttention eval weights')


def test_activations():
    x = randn(3, 4, 5, seed=11) * 2
    pairs = [
        (nn.ReLU(), tnn.ReLU()), (nn.GELU(), tnn.GELU()), (nn.GELU('tanh'), tnn.GELU('tanh')),
        (nn.Sigmoid(), tnn.Sigmoid()), (nn.Tanh(), tnn.Tanh()), (nn.Softmax(dim=1), tnn.Softmax(dim=1)),
        (nn.Softmax(dim=-1), tnn.Softmax(dim=-1)), (nn.LogSoftmax(dim=2), tnn.LogSoftmax(dim=2)),
        (nn.LogSoftmax(dim=0), tnn.LogSoftmax(dim=0)), (nn.Flatten(), tnn.Flatten()),
        (nn.Flatten(0, 1), tnn.Flatten(0, 1)), (nn.Identity(), tnn.Identity()),
        (nn.LeakyReLU(0.2), tnn.LeakyReLU(0.2)), (nn.ELU(), tnn.ELU()), (nn.SiLU(), tnn.SiLU()),
        (nn.ReLU6(), tnn.ReLU6()), (nn.Softplus(), tnn.Softplus()), (nn.Softplus(2.0, 3.0), tnn.Softplus(2.0, 3.0)),
        (nn.Unflatten(2, (1, 5)), tnn.Unflatten(2, (1, 5))),
    ]
    for mine, theirs in pairs:
        run_layer(mine, theirs, x, type(theirs).__name__ + ' ' + repr(theirs))
    for fm, ft in ((F.relu, TF.relu), (F.gelu, TF.gelu), (F.sigmoid, torch.sigmoid), (F.tanh, torch.tanh),
                   (F.silu, TF.silu)):
        xt, xm = tt(x, True), ta(x, True)
        yt, ym = ft(xt), fm(xm)
        close(ym, yt, fm.__name__)
        ym.sum().backward()
        yt.sum().backward()
        close(xm.grad, xt.grad, fm.__name__ + ' grad')
    for dim in (0, 1, 2, -1):
        close(F.softmax(ta(x), dim), TF.softmax(tt(x), dim), 'F.softmax dim %d' % dim)
        close(F.log_softmax(ta(x), dim=dim), TF.log_softmax(tt(x), dim=dim), 'F.log_softmax dim %d' % dim)
    x2 = randn(4, 6)
    close(F.softmax(ta(x2)), TF.softmax(tt(x2), dim=1), 'F.softmax implicit dim')


def test_pools():
    x = randn(2, 3, 7, 8, seed=12)
    pairs = [
        (nn.MaxPool2d(2), tnn.MaxPool2d(2)),
        (nn.MaxPool2d(3, stride=1, padding=1), tnn.MaxPool2d(3, stride=1, padding=1)),
        (nn.MaxPool2d((3, 2), stride=(2, 1), dilation=(1, 2)), tnn.MaxPool2d((3, 2), stride=(2, 1), dilation=(1, 2))),
        (nn.MaxPool2d(2, ceil_mode=True), tnn.MaxPool2d(2, ceil_mode=True)),
        (nn.AvgPool2d(2), tnn.AvgPool2d(2)),
        (nn.AvgPool2d(3, stride=2, padding=1), tnn.AvgPool2d(3, stride=2, padding=1)),
        (nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
         tnn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)),
        (nn.AdaptiveAvgPool2d(1), tnn.AdaptiveAvgPool2d(1)),
        (nn.AdaptiveAvgPool2d((1, 1)), tnn.AdaptiveAvgPool2d((1, 1))),
        (nn.AdaptiveAvgPool2d((7, 4)), tnn.AdaptiveAvgPool2d((7, 4))),
        (nn.AdaptiveAvgPool2d(3), tnn.AdaptiveAvgPool2d(3)),
    ]
    for mine, theirs in pairs:
        run_layer(mine, theirs, x, repr(theirs))
    x1 = randn(2, 3, 9, seed=13)
    run_layer(nn.MaxPool1d(3, 2), tnn.MaxPool1d(3, 2), x1, 'MaxPool1d')
    run_layer(nn.AvgPool1d(3, 2, 1), tnn.AvgPool1d(3, 2, 1), x1, 'AvgPool1d')
    yt, it = TF.max_pool2d(tt(x), 2, return_indices=True)
    ym, im = F.max_pool2d(ta(x), 2, return_indices=True)
    close(ym, yt, 'max_pool2d return_indices output')
    assert np.array_equal(arr(im), arr(it)), 'max_pool2d indices differ'
    close(F.avg_pool2d(ta(x), 2, 1), TF.avg_pool2d(tt(x), 2, 1), 'F.avg_pool2d')


def test_functional_layers():
    x = randn(4, 5, seed=14)
    w, b = randn(3, 5, seed=15), randn(3, seed=16)
    close(F.linear(ta(x), ta(w), ta(b)), TF.linear(tt(x), tt(w), tt(b)), 'F.linear')
    close(F.linear(ta(x), ta(w)), TF.linear(tt(x), tt(w)), 'F.linear no bias')
    xi, wi, bi = randn(2, 4, 6, 6, seed=17), randn(6, 2, 3, 3, seed=18), randn(6, seed=19)
    close(F.conv2d(ta(xi), ta(wi), ta(bi), stride=2, padding=1, groups=2),
          TF.conv2d(tt(xi), tt(wi), tt(bi), stride=2, padding=1, groups=2), 'F.conv2d')
    close(F.max_pool2d(ta(xi), 3, 2, 1), TF.max_pool2d(tt(xi), 3, 2, 1), 'F.max_pool2d')
    g, bb = randn(6, seed=20), randn(6, seed=21)
    close(F.layer_norm(ta(xi), (6, 6)), TF.layer_norm(tt(xi), (6, 6)), 'F.layer_norm')
    close(F.layer_norm(ta(x), (5,), ta(randn(5)), ta(randn(5, seed=3))),
          TF.layer_norm(tt(x), (5,), tt(randn(5)), tt(randn(5, seed=3))), 'F.layer_norm affine')
    rm, rv = randn(4, seed=22), np.abs(randn(4, seed=23)) + 0.5
    close(F.batch_norm(ta(xi), ta(rm), ta(rv), ta(g[:4]), ta(bb[:4])),
          TF.batch_norm(tt(xi), tt(rm), tt(rv), tt(g[:4]), tt(bb[:4])), 'F.batch_norm eval')
    close(F.batch_norm(ta(xi), None, None, training=True), TF.batch_norm(tt(xi), None, None, training=True),
          'F.batch_norm batch statistics')
    rm_m, rv_m, rm_t, rv_t = ta(rm), ta(rv), tt(rm), tt(rv)
    close(F.batch_norm(ta(xi), rm_m, rv_m, training=True, momentum=0.2),
          TF.batch_norm(tt(xi), rm_t, rv_t, training=True, momentum=0.2), 'F.batch_norm training')
    close(rm_m, rm_t, 'F.batch_norm running_mean updated in place')
    close(rv_m, rv_t, 'F.batch_norm running_var updated in place')
    lab = np.array([[0, 2], [3, 1]], dtype=np.int64)
    assert np.array_equal(arr(F.one_hot(tern.tensor(lab), 5)), TF.one_hot(torch.tensor(lab), 5).numpy())
    assert np.array_equal(arr(F.one_hot(tern.tensor(lab))), TF.one_hot(torch.tensor(lab)).numpy())
    pads = (1, 2, 0, 1)
    for mode in ('constant', 'reflect', 'replicate', 'circular'):
        close(F.pad(ta(xi), pads, mode=mode), TF.pad(tt(xi), pads, mode=mode), 'F.pad ' + mode)
    close(F.normalize(ta(x)), TF.normalize(tt(x)), 'F.normalize')


# ---------------------------------------------------------------- losses

def _loss_case(fm, ft, x, target, what, target_float=False, **kw):
    xt, xm = tt(x, True), ta(x, True)
    t_t = torch.tensor(target)
    t_m = tern.tensor(target)
    lt = ft(xt, t_t, **{k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()})
    lm = fm(xm, t_m, **{k: (tern.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()})
    close(lm, lt, what + ' value')
    if lt.dim() == 0:
        lt.backward()
        lm.backward()
    else:
        r = randn(*lt.shape, seed=5)
        torch_loss(lt, r).backward()
        tern_loss(lm, r).backward()
    close(xm.grad, xt.grad, what + ' input.grad')


def test_cross_entropy():
    x = randn(6, 5, seed=30) * 2
    t = np.array([0, 4, 2, 2, 1, 3], dtype=np.int64)
    w = np.abs(randn(5, seed=31)) + 0.1
    for red in ('mean', 'sum', 'none'):
        _loss_case(F.cross_entropy, TF.cross_entropy, x, t, 'cross_entropy %s' % red, reduction=red)
        _loss_case(F.cross_entropy, TF.cross_entropy, x, t, 'cross_entropy weighted %s' % red, weight=w,
                   reduction=red)
    t_ign = t.copy()
    t_ign[[1, 4]] = -100
    _loss_case(F.cross_entropy, TF.cross_entropy, x, t_ign, 'cross_entropy ignore_index')
    t_ign2 = t.copy()
    t_ign2[2] = 3
    _loss_case(F.cross_entropy, TF.cross_entropy, x, t_ign2, 'cross_entropy ignore_index=3 weighted',
               ignore_index=3, weight=w)
    x4 = randn(2, 5, 3, 4, seed=32)
    t4 = rng(33).integers(0, 5, size=(2, 3, 4)).astype(np.int64)
    _loss_case(F.cross_entropy, TF.cross_entropy, x4, t4, 'cross_entropy 4D')
    _loss_case(F.cross_entropy, TF.cross_entropy, x4, t4, 'cross_entropy 4D none', reduction='none')
    x3 = randn(2, 5, 7, seed=34)
    t3 = rng(35).integers(0, 5, size=(2, 7)).astype(np.int64)
    _loss_case(F.cross_entropy, TF.cross_entropy, x3, t3, 'cross_entropy 3D weighted sum', weight=w, reduction='sum')
    for red in ('mean', 'sum', 'none'):
        _loss_case(F.cross_entropy, TF.cross_entropy, x, t, 'cross_entropy label_smoothing %s' % red,
                   label_smoothing=0.1, reduction=red)
        _loss_case(F.cross_entropy, TF.cross_entropy, x, t_ign, 'cross_entropy label_smoothing ignore %s' % red,
                   label_smoothing=0.2, reduction=red)
    _loss_case(F.cross_entropy, TF.cross_entropy, x, t_ign, 'cross_entropy label_smoothing weighted',
               label_smoothing=0.2, weight=w)
    probs = TF.softmax(torch.tensor(randn(6, 5, seed=36)), 1).numpy()
    _loss_case(F.cross_entropy, TF.cross_entropy, x, probs, 'cross_entropy probabilities')
    _loss_case(F.cross_entropy, TF.cross_entropy, x, probs, 'cross_entropy probabilities weighted smoothing sum',
               weight=w, label_smoothing=0.1, reduction='sum')
    _loss_case(F.cross_entropy, TF.cross_entropy, x[0], np.array(3, dtype=np.int64), 'cross_entropy unbatched')
    # the module
    lt = tnn.CrossEntropyLoss(weight=torch.tensor(w))(torch.tensor(x), torch.tensor(t))
    lm = nn.CrossEntropyLoss(weight=w)(tern.tensor(x), tern.tensor(t))
    close(lm, lt, 'CrossEntropyLoss')


def test_nll_loss():
    x = TF.log_softmax(torch.tensor(randn(6, 5, seed=40)), 1).numpy()
    t = np.array([0, 4, 2, 2, 1, 3], dtype=np.int64)
    w = np.abs(randn(5, seed=41)) + 0.1
    for red in ('mean', 'sum', 'none'):
        _loss_case(F.nll_loss, TF.nll_loss, x, t, 'nll_loss %s' % red, reduction=red)
        _loss_case(F.nll_loss, TF.nll_loss, x, t, 'nll_loss weighted %s' % red, weight=w, reduction=red)
    t2 = t.copy()
    t2[0] = -100
    _loss_case(F.nll_loss, TF.nll_loss, x, t2, 'nll_loss ignore_index')


def test_regression_losses():
    x, y = randn(4, 3, seed=50), randn(4, 3, seed=51)
    for red in ('mean', 'sum', 'none'):
        _loss_case(F.mse_loss, TF.mse_loss, x, y, 'mse_loss %s' % red, reduction=red)
        _loss_case(F.l1_loss, TF.l1_loss, x, y, 'l1_loss %s' % red, reduction=red)
        _loss_case(F.smooth_l1_loss, TF.smooth_l1_loss, x, y, 'smooth_l1_loss %s' % red, reduction=red)
    _loss_case(F.smooth_l1_loss, TF.smooth_l1_loss, x, y, 'smooth_l1_loss beta 0.5', beta=0.5)
    close(nn.MSELoss()(tern.tensor(x), tern.tensor(y)), tnn.MSELoss()(torch.tensor(x), torch.tensor(y)), 'MSELoss')
    close(nn.L1Loss(reduction='sum')(tern.tensor(x), tern.tensor(y)),
          tnn.L1Loss(reduction='sum')(torch.tensor(x), torch.tensor(y)), 'L1Loss')


def test_binary_cross_entropy():
    x = randn(5, 4, seed=60) * 3
    x[0, 0] = 40.0  # large logits stay finite
    x[0, 1] = -40.0
    t = (rng(61).random((5, 4)) > 0.5).astype(np.float32)
    t[1, 1] = 0.3  # soft target
    w = np.abs(randn(5, 4, seed=62))
    pw = np.abs(randn(4, seed=63)) + 0.5
    for red in ('mean', 'sum', 'none'):
        _loss_case(F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits, x, t,
                   'bce_with_logits %s' % red, reduction=red)
    _loss_case(F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits, x, t,
               'bce_with_logits weight', weight=w)
    _loss_case(F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits, x, t,
               'bce_with_logits pos_weight', pos_weight=pw)
    _loss_case(F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits, x, t,
               'bce_with_logits weight pos_weight sum', weight=w, pos_weight=pw, reduction='sum')
    p = torch.sigmoid(torch.tensor(randn(5, 4, seed=64))).numpy()
    _loss_case(F.binary_cross_entropy, TF.binary_cross_entropy, p, t, 'binary_cross_entropy')
    _loss_case(F.binary_cross_entropy, TF.binary_cross_entropy, p, t, 'binary_cross_entropy weighted none',
               weight=w, reduction='none')
    close(nn.BCEWithLogitsLoss(pos_weight=pw)(tern.tensor(x), tern.tensor(t)),
          tnn.BCEWithLogitsLoss(pos_weight=torch.tensor(pw))(torch.tensor(x), torch.tensor(t)), 'BCEWithLogitsLoss')


# ---------------------------------------------------------------- models and the Module API

class _TorchCNN(tnn.Module):
    def __init__(self):
        super().__init__()
        self.features = tnn.Sequential(tnn.Conv2d(1, 4, 3, padding=1), tnn.BatchNorm2d(4), tnn.ReLU(),
                                       tnn.MaxPool2d(2), tnn.Conv2d(4, 6, 3), tnn.GELU(), tnn.AdaptiveAvgPool2d(1))
        self.head = tnn.Sequential(tnn.Flatten(), tnn.Dropout(0.0), tnn.Linear(6, 5), tnn.Tanh(), tnn.Linear(5, 3))

    def forward(self, x):
        return self.head(self.features(x))


class _TernCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(4, 6, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.0), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))

    def forward(self, x):
        return self.head(self.features(x))


def test_cnn_model():
    torch.manual_seed(70)
    theirs, mine = _TorchCNN(), _TernCNN()
    copy_weights(mine, theirs)
    x = randn(4, 1, 8, 8, seed=71)
    t = np.array([0, 2, 1, 2], dtype=np.int64)
    for step in range(2):
        lt = TF.cross_entropy(theirs(tt(x)), torch.tensor(t))
        lm = F.cross_entropy(mine(ta(x)), tern.tensor(t))
        close(lm, lt, 'CNN train loss %d' % step)
        theirs.zero_grad()
        mine.zero_grad()
        lt.backward()
        lm.backward()
        check_grads(mine, theirs, 'CNN ')
    for k, v in theirs.state_dict().items():
        close(mine.state_dict()[k], v, 'CNN state ' + k)
    theirs.eval()
    mine.eval()
    close(mine(ta(x)), theirs(tt(x)), 'CNN eval output')


class _TorchSeq(tnn.Module):
    def __init__(self):
        super().__init__()
        self.emb = tnn.Embedding(12, 6, padding_idx=0)
        self.rnn = tnn.LSTM(6, 5, batch_first=True)
        self.attn = tnn.MultiheadAttention(5, 1, batch_first=True)
        self.norm = tnn.LayerNorm(5)
        self.out = tnn.Linear(5, 12)

    def forward(self, idx):
        h, _ = self.rnn(self.emb(idx))
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.out(self.norm(h + a))


class _TernSeq(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 6, padding_idx=0)
        self.rnn = nn.LSTM(6, 5, batch_first=True)
        self.attn = nn.MultiheadAttention(5, 1, batch_first=True)
        self.norm = nn.LayerNorm(5)
        self.out = nn.Linear(5, 12)

    def forward(self, idx):
        h, _ = self.rnn(self.emb(idx))
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.out(self.norm(h + a))


def test_sequence_model():
    torch.manual_seed(72)
    theirs, mine = _TorchSeq(), _TernSeq()
    assert list(mine.state_dict()) == list(theirs.state_dict())
    copy_weights(mine, theirs)
    idx = rng(73).integers(0, 12, size=(3, 7)).astype(np.int64)
    tgt = rng(74).integers(0, 12, size=(3, 7)).astype(np.int64)
    yt = theirs(torch.tensor(idx))
    ym = mine(tern.tensor(idx))
    close(ym, yt, 'sequence model logits')
    lt = TF.cross_entropy(yt.transpose(1, 2), torch.tensor(tgt))
    lm = F.cross_entropy(tern.op.Transpose(ym, perm=[0, 2, 1]), tern.tensor(tgt))
    close(lm, lt, 'sequence model loss')
    lt.backward()
    lm.backward()
    check_grads(mine, theirs, 'sequence model ')


def test_module_api():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.bn = nn.BatchNorm1d(3)
            self.scale = nn.Parameter(np.ones(3, np.float32))
            self.register_buffer('step', tern.tensor(np.zeros(1, np.float32)))
            self.register_buffer('cache', tern.tensor(np.zeros(2, np.float32)), persistent=False)
            self.plain = 3

        def forward(self, x):
            return self.bn(self.fc(x)) * self.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Block()
            self.blocks = nn.ModuleList([Block(), Block()])
            self.shared = self.a.fc

    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ['a.scale', 'a.fc.weight', 'a.fc.bias', 'a.bn.weight', 'a.bn.bias',
                     'blocks.0.scale', 'blocks.0.fc.weight', 'blocks.0.fc.bias', 'blocks.0.bn.weight',
                     'blocks.0.bn.bias', 'blocks.1.scale', 'blocks.1.fc.weight', 'blocks.1.fc.bias',
                     'blocks.1.bn.weight', 'blocks.1.bn.bias'], names
    assert len(list(net.parameters())) == 15
    keys = list(net.state_dict())
    assert 'a.step' in keys and 'a.cache' not in keys and 'shared.weight' in keys, keys
    assert 'a.bn.num_batches_tracked' in keys
    assert [n for n, _ in net.named_children()] == ['a', 'blocks', 'shared'], list(net.named_children())
    assert len(list(net.modules())) == 11, len(list(net.modules()))
    assert net.a.plain == 3 and net.training
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    x = randn(4, 3, seed=80)
    net.a(tern.tensor(x)).sum().backward()
    assert net.a.fc.weight.grad is not None
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    # strict loading
    sd = net.state_dict()
    bad = dict(sd)
    bad['extra'] = np.zeros(1, np.float32)
    del bad['a.fc.bias']
    try:
        net.load_state_dict(bad)
        raise AssertionError('strict load_state_dict accepted missing and unexpected keys')
    except RuntimeError as e:
        assert 'a.fc.bias' in str(e) and 'extra' in str(e), str(e)
    res = net.load_state_dict(bad, strict=False)
    assert res.missing_keys == ['a.fc.bias'] and res.unexpected_keys == ['extra'], res
    wrong = dict(sd)
    wrong['a.fc.weight'] = np.zeros((2, 3), np.float32)
    try:
        net.load_state_dict(wrong)
        raise AssertionError('load_state_dict accepted a wrong shape')
    except RuntimeError as e:
        assert 'size mismatch' in str(e), str(e)
    sd2 = {k: v + 1 if v.dtype.kind == 'f' else v for k, v in sd.items()}
    net.load_state_dict(sd2)
    for k, v in net.state_dict().items():
        assert np.array_equal(v, sd2[k]), k
    assert net.shared is net.a.fc
    # Sequential
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and isinstance(seq[-1], nn.Linear)
    assert len(seq[:2]) == 2 and list(seq[1:].state_dict()) == ['2.weight', '2.bias']
    od = nn.Sequential(OrderedDict([('fc', nn.Linear(2, 2)), ('act', nn.Tanh())]))
    assert list(od.state_dict()) == ['fc.weight', 'fc.bias']
    assert tuple(od(tern.tensor(randn(3, 2))).shape) == (3, 2)
    ml = nn.ModuleList([nn.Linear(1, 1)])
    ml.append(nn.Linear(1, 2))
    ml.extend([nn.Identity()])
    assert len(ml) == 3 and list(ml.state_dict()) == ['0.weight', '0.bias', '1.weight', '1.bias']
    md = nn.ModuleDict({'x': nn.Linear(1, 1)})
    assert list(md.state_dict()) == ['x.weight', 'x.bias'] and 'x' in md
    # deleting and reassigning
    b = Block()
    b.fc = None
    assert b.fc is None and 'fc.weight' not in b.state_dict()
    del b.scale
    assert 'scale' not in dict(b.named_parameters())
    try:
        b.bn.weight = tern.tensor(np.ones(3, np.float32))
        raise AssertionError('a plain tensor was accepted as a parameter')
    except TypeError:
        pass
    repr(net)
    assert net.get_submodule('blocks.1.fc') is net.blocks[1].fc


def test_dropout_inside_layers():
    # dropout between LSTM/GRU layers and on attention weights: active in training, off in eval
    torch.manual_seed(81)
    x = randn(6, 3, 4, seed=82)
    for cls_m, cls_t in ((nn.LSTM, tnn.LSTM), (nn.GRU, tnn.GRU)):
        mine, theirs = cls_m(4, 5, num_layers=3, dropout=0.5), cls_t(4, 5, num_layers=3, dropout=0.5)
        copy_weights(mine, theirs)
        mine.train()
        xm = ta(x, True)
        ym, _ = mine(xm)
        (ym * ym).sum().backward()
        assert all(p.grad is not None for p in mine.parameters())
        y2, _ = mine(ta(x))
        assert not np.allclose(arr(ym), arr(y2)), cls_t.__name__ + ': two training passes drew the same dropout'
        mine.eval()
        theirs.eval()
        close(mine(ta(x))[0], theirs(tt(x))[0], cls_t.__name__ + ' eval with dropout=0.5')
    mine, theirs = nn.MultiheadAttention(8, 2, dropout=0.5), tnn.MultiheadAttention(8, 2, dropout=0.5)
    copy_weights(mine, theirs)
    q = randn(4, 2, 8, seed=83)
    o, w = mine(ta(q), ta(q), ta(q))
    assert tuple(o.shape) == (4, 2, 8) and tuple(w.shape) == (2, 4, 4)
    mine.eval()
    theirs.eval()
    with torch.no_grad():
        ot, wt = theirs(tt(q), tt(q), tt(q))
    om, wm = mine(ta(q), ta(q), ta(q))
    close(om, ot, 'MultiheadAttention eval with dropout=0.5')
    close(wm, wt, 'MultiheadAttention eval weights with dropout=0.5')


def test_load_state_dict_in_place_and_no_grad():
    torch.manual_seed(84)
    mine, theirs = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), tnn.Sequential(tnn.Linear(3, 4),
                                                                                    tnn.BatchNorm1d(4))
    w = mine[0].weight
    copy_weights(mine, theirs)
    assert mine[0].weight is w, 'load_state_dict replaced the Parameter object'
    assert np.array_equal(arr(w), theirs[0].weight.detach().numpy())
    mine.eval()
    theirs.eval()
    with tern.no_grad():
        y = mine(ta(randn(5, 3), True))
    assert not y.requires_grad
    close(y, theirs(tt(randn(5, 3))), 'no_grad eval output')
    mine.requires_grad_(False)
    assert not any(p.requires_grad for p in mine.parameters())
    mine.requires_grad_(True)
    assert all(p.requires_grad for p in mine.parameters())


def test_init_and_seed():
    tern.manual_seed(5)
    a = nn.Linear(20, 10)
    tern.manual_seed(5)
    b = nn.Linear(20, 10)
    assert np.array_equal(arr(a.weight), arr(b.weight)), 'tern.manual_seed does not reproduce the initialisation'
    c = nn.Linear(20, 10)
    assert not np.array_equal(arr(a.weight), arr(c.weight))
    bound = 1 / math.sqrt(20)
    assert np.abs(arr(a.weight)).max() <= bound and np.abs(arr(a.bias)).max() <= bound
    assert np.abs(arr(a.weight)).max() > 0.8 * bound
    conv = nn.Conv2d(4, 8, 3, groups=2)
    cb = 1 / math.sqrt(2 * 9)
    assert np.abs(arr(conv.weight)).max() <= cb
    lstm = nn.LSTM(3, 16)
    assert np.abs(arr(lstm.weight_hh_l0)).max() <= 0.25
    e = nn.Embedding(1000, 8, padding_idx=2)
    w = arr(e.weight)
    assert np.all(w[2] == 0) and 0.9 < w.std() < 1.1
    m = nn.MultiheadAttention(8, 2)
    assert np.all(arr(m.in_proj_bias) == 0) and np.all(arr(m.out_proj.bias) == 0)
    assert np.abs(arr(m.in_proj_weight)).max() <= math.sqrt(6 / 32)
    for p in a.parameters():
        assert p.requires_grad and str(p.dtype) == 'float32'


def test_conv_transpose2d_as_torch():
    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    for kw in [dict(), dict(stride=2, padding=1, output_padding=1), dict(stride=2, groups=2),
               dict(dilation=2, padding=2, bias=False)]:
        tm = torch.nn.ConvTranspose2d(4, 6, 3, **kw)
        m = tern.nn.ConvTranspose2d(4, 6, 3, **kw)
        m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        assert sorted(m.state_dict()) == sorted(tm.state_dict())
        x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
        y, yt = m(tern.tensor(x)), tm(torch.tensor(x))
        assert tuple(y.shape) == tuple(yt.shape)
        assert np.allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
        (y * y).sum().backward()
        (yt * yt).sum().backward()
        assert np.allclose(m.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_clip_grad_as_torch():
    a = np.random.default_rng(5).standard_normal((5, 3)).astype(np.float32)
    b = np.random.default_rng(6).standard_normal(3).astype(np.float32)
    p = [tern.Parameter(a), tern.Parameter(b)]
    pt = [torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)]
    ((tern.tensor(np.ones((2, 5), np.float32)) @ p[0] + p[1]) ** 2).sum().backward()
    ((torch.ones(2, 5) @ pt[0] + pt[1]) ** 2).sum().backward()
    n, nt = tern.nn.utils.clip_grad_norm_(p, 1.0), torch.nn.utils.clip_grad_norm_(pt, 1.0)
    assert abs(float(n) - float(nt)) <= 1e-5 * float(nt)
    for x, y in zip(p, pt):
        assert np.allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-5, atol=1e-7)
    tern.nn.utils.clip_grad_value_(p, 0.01)
    torch.nn.utils.clip_grad_value_(pt, 0.01)
    for x, y in zip(p, pt):
        assert np.array_equal(x.grad.numpy(), y.grad.numpy())


TESTS = [v for k, v in list(globals().items()) if k.startswith('test_') and callable(v)]


def main():
    failed = 0
    for t in TESTS:
        _reset_worst()
        try:
            t()
        except Exception as e:  # noqa: BLE001
            failed += 1
            print('FAIL %s: %s: %s' % (t.__name__, type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip()
                                        else ''))
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
