"""tern.nn.functional: PyTorch's torch.nn.functional on tern's eager operators.

Every function here is built from tern.op calls (ONNX operators with gradient rules), so what it
returns is differentiable wherever the operators are. Inputs may be tern tensors or array-likes
(converted with tern.tensor); integer targets and indices are int64.
"""
import math

import numpy as np

import tern

__all__ = [
    'linear', 'bilinear', 'conv1d', 'conv2d', 'max_pool1d', 'max_pool2d', 'avg_pool1d', 'avg_pool2d',
    'adaptive_avg_pool2d', 'pad', 'relu', 'relu6', 'leaky_relu', 'elu', 'gelu', 'silu', 'sigmoid',
    'tanh', 'softplus', 'softmax', 'log_softmax', 'dropout', 'batch_norm', 'layer_norm', 'embedding',
    'one_hot', 'cross_entropy', 'nll_loss', 'mse_loss', 'l1_loss', 'smooth_l1_loss',
    'binary_cross_entropy', 'binary_cross_entropy_with_logits', 'normalize',
]


# ---------------------------------------------------------------- helpers (used by tern.nn too)

def _tensor_type():
    t = getattr(tern, 'Tensor', None)
    if isinstance(t, type):
        return t
    return type(tern.tensor([0.0]))


def _is_tensor(x):
    return isinstance(x, _tensor_type())


def _as_tensor(x, dtype=None):
    """x as a tern tensor (tensors pass through unchanged)."""
    if _is_tensor(x):
        return x
    a = np.asarray(x)
    if dtype is not None:
        a = a.astype(dtype)
    elif a.dtype == np.float64:
        a = a.astype(np.float32)
    return tern.tensor(a)


def _np(x):
    """x as a numpy array (a copy for tensors)."""
    if _is_tensor(x):
        return np.array(x.numpy())
    if hasattr(x, 'detach') and hasattr(x, 'cpu'):  # a torch tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _i64(values):
    """Shapes, axes, pads and slice bounds as int64: the trace-only baseline follows them as
    torch.jit.trace follows sizes (tern.step_input)."""
    return tern.step_input(np.asarray(values, dtype=np.int64))


def _np_dtype(x):
    try:
        return np.dtype(x.dtype)
    except TypeError:
        return np.dtype(np.float32)


def _scalar(value, like):
    """A rank-0 tensor of value in like's element type."""
    return tern.tensor(np.asarray(value, dtype=_np_dtype(like)))


def _const(array, like=None, dtype=None):
    if dtype is None:
        dtype = _np_dtype(like) if like is not None else np.float32
    return tern.tensor(np.asarray(array, dtype=dtype))


def _first(r):
    return r[0] if isinstance(r, (tuple, list)) else r


def _ndim(x):
    return len(x.shape)


def _pair(v, n=2):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return [int(v[0])] * n
        if len(v) != n:
            raise ValueError('expected %d values, got %r' % (n, v))
        return [int(e) for e in v]
    return [int(v)] * n


def _index_tensor(x):
    """Indices/targets as an int64 tern tensor."""
    if _is_tensor(x):
        if str(x.dtype) in ('int64',):
            return x
        return tern.op.Cast(x, to=7)  # INT64
    return tern.tensor(np.asarray(_np(x), dtype=np.int64))


def _reshape(x, shape):
    return tern.op.Reshape(x, _i64(list(shape)))


def _unsqueeze(x, axis):
    return tern.op.Unsqueeze(x, _i64([axis]))


def _squeeze(x, axis):
    return tern.op.Squeeze(x, _i64([axis]))


def _transpose(x, perm):
    return tern.op.Transpose(x, perm=[int(p) for p in perm])


def _slice(x, start, end, axis):
    return tern.op.Slice(x, _i64([start]), _i64([end]), _i64([axis]))


def _reduce(loss, reduction):
    if reduction == 'mean':
        return tern.op.ReduceMean(loss, keepdims=0)
    if reduction == 'sum':
        return tern.op.ReduceSum(loss, keepdims=0)
    if reduction == 'none':
        return loss
    raise ValueError('%s is not a valid value for reduction' % reduction)


def _reduction_arg(size_average, reduce, reduction):
    # PyTorch's legacy size_average/reduce arguments
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return 'none'
    return 'mean' if size_average else 'sum'


# ---------------------------------------------------------------- linear and convolution

def linear(input, weight, bias=None):
    """y = input @ weight.T + bias (weight [out, in], as PyTorch)."""
    input = _as_tensor(input)
    if _ndim(input) == 2:
        if bias is None:
            return tern.op.Gemm(input, weight, transB=1)
        return tern.op.Gemm(input, weight, bias, transB=1)
    y = tern.op.MatMul(input, _transpose(weight, [1, 0]))
    if bias is not None:
        y = tern.op.Add(y, bias)
    return y


def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o]."""
    y = tern.op.Einsum(input1, weight, input2, equation='...i,oij,...j->...o')
    if bias is not None:
        y = tern.op.Add(y, bias)
    return y


def _conv_pads(padding, weight_shape, dilation, n):
    if isinstance(padding, str):
        if padding == 'valid':
            return [0] * (2 * n)
        if padding == 'same':
            begin, end = [], []
            for k, d in zip(weight_shape[2:], dilation):
                total = d * (k - 1)
                begin.append(total // 2)
                end.append(total - total // 2)
            return begin + end
        raise ValueError("invalid padding string %r, should be one of {'valid', 'same'}" % padding)
    p = _pair(padding, n)
    return p + p


def _convnd(n, input, weight, bias, stride, padding, dilation, groups):
    input = _as_tensor(input)
    batched = _ndim(input) == n + 2
    if not batched:
        input = _unsqueeze(input, 0)
    stride = _pair(stride, n)
    dilation = _pair(dilation, n)
    if isinstance(padding, str) and padding == 'same' and any(s != 1 for s in stride):
        raise ValueError("padding='same' is not supported for strided convolutions")
    pads = _conv_pads(padding, weight.shape, dilation, n)
    args = (input, weight) if bias is None else (input, weight, bias)
    y = tern.op.Conv(*args, kernel_shape=[int(k) for k in weight.shape[2:]], pads=pads, strides=stride,
                     dilations=dilation, group=int(groups))
    return y if batched else _squeeze(y, 0)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(2, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """PyTorch's F.conv_transpose2d through ONNX ConvTranspose (the weight's layout, [in, out / groups,
    kH, kW], is the same in both)."""
    input = _as_tensor(input)
    batched = _ndim(input) == 4
    if not batched:
        input = _unsqueeze(input, 0)
    stride, dilation = _pair(stride, 2), _pair(dilation, 2)
    padding, output_padding = _pair(padding, 2), _pair(output_padding, 2)
    args = (input, weight) if bias is None else (input, weight, bias)
    y = tern.op.ConvTranspose(*args, kernel_shape=[int(k) for k in weight.shape[2:]], pads=list(padding) * 2,
                              strides=stride, dilations=dilation, output_padding=output_padding,
                              group=int(groups))
    return y if batched else _squeeze(y, 0)


def pad(input, pad, mode='constant', value=None):
    """PyTorch's F.pad: pad lists (begin, end) pairs from the last dimension backwards."""
    input = _as_tensor(input)
    if len(pad) % 2:
        raise ValueError('Padding length must be divisible by 2')
    r = _ndim(input)
    if len(pad) // 2 > r:
        raise ValueError('Padding length too large')
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        d = r - 1 - i
        begins[d], ends[d] = int(pad[2 * i]), int(pad[2 * i + 1])
    onnx_mode = {'constant': 'constant', 'reflect': 'reflect', 'replicate': 'edge', 'circular': 'wrap'}.get(mode)
    if onnx_mode is None:
        raise ValueError('unsupported padding mode %r' % mode)
    if onnx_mode == 'constant':
        return tern.op.Pad(input, _i64(begins + ends), _scalar(0 if value is None else value, input), mode='constant')
    return tern.op.Pad(input, _i64(begins + ends), mode=onnx_mode)


# ---------------------------------------------------------------- pooling

def _pool_args(n, kernel_size, stride, padding, dilation=1):
    k = _pair(kernel_size, n)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else _pair(stride, n)
    p = _pair(padding, n)
    d = _pair(dilation, n)
    for kk, pp in zip(k, p):
        if pp > kk // 2:
            raise ValueError('pad should be at most half of effective kernel size, but got pad=%d and kernel_size=%d'
                             % (pp, kk))
    return k, s, p, d


def _max_poolnd(n, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    input = _as_tensor(input)
    batched = _ndim(input) == n + 2
    if not batched:
        input = _unsqueeze(input, 0)
    k, s, p, d = _pool_args(n, kernel_size, stride, padding, dilation)
    if return_indices:
        y, idx = tern.op.MaxPool(input, kernel_shape=k, strides=s, pads=p + p, dilations=d,
                                 ceil_mode=int(bool(ceil_mode)), _outputs=2)
        # ONNX counts the indices over the whole tensor; PyTorch within each (n, c) plane.
        plane = int(np.prod(input.shape[2:]))
        ii = _np(idx) % plane
        idx = tern.tensor(ii.astype(np.int64))
        if not batched:
            y, idx = _squeeze(y, 0), _squeeze(idx, 0)
        return y, idx
    y = _first(tern.op.MaxPool(input, kernel_shape=k, strides=s, pads=p + p, dilations=d,
                               ceil_mode=int(bool(ceil_mode))))
    return y if batched else _squeeze(y, 0)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_poolnd(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_poolnd(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _avg_poolnd(n, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    if divisor_override is not None:
        raise NotImplementedError('avg_pool: divisor_override is not supported')
    input = _as_tensor(input)
    batched = _ndim(input) == n + 2
    if not batched:
        input = _unsqueeze(input, 0)
    k, s, p, _ = _pool_args(n, kernel_size, stride, padding)
    y = tern.op.AveragePool(input, kernel_shape=k, strides=s, pads=p + p, ceil_mode=int(bool(ceil_mode)),
                            count_include_pad=int(bool(count_include_pad)))
    return y if batched else _squeeze(y, 0)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_poolnd(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_poolnd(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size):
    """PyTorch's adaptive average pooling: cell i spans [floor(i*in/out), ceil((i+1)*in/out))."""
    input = _as_tensor(input)
    batched = _ndim(input) == 4
    if not batched:
        input = _unsqueeze(input, 0)
    h, w = input.shape[2], input.shape[3]
    if isinstance(output_size, (list, tuple)):
        oh, ow = output_size
    else:
        oh = ow = output_size
    oh = h if oh is None else int(oh)
    ow = w if ow is None else int(ow)
    if oh == 1 and ow == 1:
        y = tern.op.GlobalAveragePool(input)
    elif h % oh == 0 and w % ow == 0:
        y = tern.op.AveragePool(input, kernel_shape=[h // oh, w // ow], strides=[h // oh, w // ow])
    else:
        rows = []
        for i in range(oh):
            h0, h1 = (i * h) // oh, -((-(i + 1) * h) // oh)
            cols = []
            for j in range(ow):
                w0, w1 = (j * w) // ow, -((-(j + 1) * w) // ow)
                cell = tern.op.Slice(input, _i64([h0, w0]), _i64([h1, w1]), _i64([2, 3]))
                cols.append(tern.op.ReduceMean(cell, _i64([2, 3]), keepdims=1))
            rows.append(tern.op.Concat(*cols, axis=3) if len(cols) > 1 else cols[0])
        y = tern.op.Concat(*rows, axis=2) if len(rows) > 1 else rows[0]
    return y if batched else _squeeze(y, 0)


# ---------------------------------------------------------------- activations

def relu(input, inplace=False):
    return tern.op.Relu(_as_tensor(input))


def relu6(input, inplace=False):
    x = _as_tensor(input)
    return tern.op.Clip(x, _scalar(0.0, x), _scalar(6.0, x))


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return tern.op.LeakyRelu(_as_tensor(input), alpha=float(negative_slope))


def elu(input, alpha=1.0, inplace=False):
    return tern.op.Elu(_as_tensor(input), alpha=float(alpha))


def gelu(input, approximate='none'):
    """0.5 x (1 + erf(x / sqrt 2)), or with approximate='tanh' 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _as_tensor(input)
    half = tern.op.Mul(x, _scalar(0.5, x))
    if approximate == 'none':
        inner = tern.op.Erf(tern.op.Mul(x, _scalar(1.0 / math.sqrt(2.0), x)))
    elif approximate == 'tanh':
        x3 = tern.op.Mul(tern.op.Mul(x, x), x)
        u = tern.op.Mul(tern.op.Add(x, tern.op.Mul(x3, _scalar(0.044715, x))), _scalar(math.sqrt(2.0 / math.pi), x))
        inner = tern.op.Tanh(u)
    else:
        raise ValueError("approximate must be 'none' or 'tanh', not %r" % approximate)
    return tern.op.Mul(half, tern.op.Add(inner, _scalar(1.0, x)))


def silu(input, inplace=False):
    x = _as_tensor(input)
    return tern.op.Mul(x, tern.op.Sigmoid(x))


def sigmoid(input):
    return tern.op.Sigmoid(_as_tensor(input))


def tanh(input):
    return tern.op.Tanh(_as_tensor(input))


def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as PyTorch)."""
    x = _as_tensor(input)
    if beta == 1.0:
        sp = tern.op.Softplus(x)
    else:
        sp = tern.op.Div(tern.op.Softplus(tern.op.Mul(x, _scalar(beta, x))), _scalar(beta, x))
    over = tern.op.Greater(tern.op.Mul(x, _scalar(beta, x)), _scalar(threshold, x))
    return tern.op.Where(over, x, sp)


def _softmax_dim(ndim):
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, dtype=None):
    x = _as_tensor(input)
    if dtype is not None:
        x = x.astype(dtype)
    if dim is None:
        dim = _softmax_dim(_ndim(x))
    return tern.op.Softmax(x, axis=int(dim))


def log_softmax(input, dim=None, dtype=None):
    x = _as_tensor(input)
    if dtype is not None:
        x = x.astype(dtype)
    if dim is None:
        dim = _softmax_dim(_ndim(x))
    return tern.op.LogSoftmax(x, axis=int(dim))


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """x / max(||x||_p over dim, eps)."""
    x = _as_tensor(input)
    if p == 2:
        n = tern.op.ReduceL2(x, _i64([dim]), keepdims=1)
    elif p == 1:
        n = tern.op.ReduceL1(x, _i64([dim]), keepdims=1)
    else:
        raise NotImplementedError('normalize: only p=1 and p=2')
    return tern.op.Div(x, tern.op.Max(n, _scalar(eps, x)))


def dropout(input, p=0.5, training=True, inplace=False):
    """Zeroes elements with probability p and scales the rest by 1/(1-p), in training only; the mask
    comes from tern.op.Dropout, seeded from tern's random stream (tern.manual_seed)."""
    if p < 0.0 or p > 1.0:
        raise ValueError('dropout probability has to be between 0 and 1, but got %r' % p)
    x = _as_tensor(input)
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return tern.op.Mul(x, _scalar(0.0, x))
    ratio = _scalar(p, x)
    mode = tern.tensor(np.asarray(True))
    return _first(tern.op.Dropout(x, ratio, mode))


# ---------------------------------------------------------------- normalisation and lookup

def _bn_running_update(input, running_mean, running_var, factor):
    """PyTorch's running statistics after a training batch: (1 - f) running + f batch, the batch's
    variance unbiased; numpy arrays (computed in float64, stored in the buffers' dtype)."""
    x = _np(input).astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    n = x.size // x.shape[1]
    if n <= 1:
        raise ValueError('Expected more than 1 value per channel when training, got input size %r'
                         % (tuple(input.shape),))
    mean = x.mean(axis=axes)
    var = x.var(axis=axes, ddof=1)
    dt = _np_dtype(running_mean)
    rm = _np(running_mean).astype(np.float64)
    rv = _np(running_var).astype(np.float64)
    return ((1.0 - factor) * rm + factor * mean).astype(dt), ((1.0 - factor) * rv + factor * var).astype(dt)


def _batch_norm_train(x, running_mean, running_var, weight, bias, eps, factor):
    """Training-mode batch normalisation and PyTorch's running statistics after it, in one operator
    call: (y, new running mean, new running variance). ONNX's BatchNormalization with momentum 1 - f
    gives (1 - f) running + f batch with the batch's biased variance; PyTorch's variance is unbiased,
    (1 - f) rv + (onnx - (1 - f) rv) n / (n - 1) with n the values a channel has."""
    c = x.shape[1]
    if weight is None:
        weight = _const(np.ones(c), like=x)
    if bias is None:
        bias = _const(np.zeros(c), like=x)
    rank2 = _ndim(x) == 2
    if rank2:
        x = _unsqueeze(x, 2)
    n = x.shape[0] * int(np.prod(x.shape[2:]))
    if n <= 1:
        raise ValueError('Expected more than 1 value per channel when training, got input size %r' % (x.shape,))
    y, mean, var = tern.op.BatchNormalization(x, weight, bias, running_mean, running_var, epsilon=float(eps),
                                              momentum=float(1.0 - factor), training_mode=1, _outputs=3)
    with tern.no_grad():
        keep = running_var * float(1.0 - factor)
        var = keep + (var.detach() - keep) * float(n / (n - 1))
        mean = mean.detach()
    return (_squeeze(y, 2) if rank2 else y), mean, var


def _batch_norm_forward(x, running_mean, running_var, weight, bias, use_batch, eps):
    c = x.shape[1]
    if weight is None:
        weight = _const(np.ones(c), like=x)
    if bias is None:
        bias = _const(np.zeros(c), like=x)
    rank2 = _ndim(x) == 2
    if rank2:
        x = _unsqueeze(x, 2)
    if use_batch:
        n = x.shape[0] * int(np.prod(x.shape[2:]))
        if n <= 1:
            raise ValueError('Expected more than 1 value per channel when training, got input size %r' % (x.shape,))
        mean = running_mean if running_mean is not None else _const(np.zeros(c), like=x)
        var = running_var if running_var is not None else _const(np.ones(c), like=x)
        y = _first(tern.op.BatchNormalization(x, weight, bias, mean, var, epsilon=float(eps), momentum=0.9,
                                              training_mode=1, _outputs=3))
    else:
        y = _first(tern.op.BatchNormalization(x, weight, bias, running_mean, running_var, epsilon=float(eps)))
    return _squeeze(y, 2) if rank2 else y


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Normalises with the batch's statistics (training, or no running statistics) or the running ones;
    in training, running_mean and running_var (when given) are updated in place as PyTorch does
    (momentum, unbiased batch variance)."""
    x = _as_tensor(input)
    if training and running_mean is not None and running_var is not None:
        from .init import copy_into
        new_mean, new_var = _bn_running_update(x, running_mean, running_var, float(momentum))
        if not (copy_into(running_mean, new_mean) and copy_into(running_var, new_var)):
            raise RuntimeError('batch_norm: the running statistics cannot be written in place')
    use_batch = training or running_mean is None or running_var is None
    return _batch_norm_forward(x, running_mean, running_var, weight, bias, use_batch, eps)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    x = _as_tensor(input)
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(d) for d in normalized_shape)
    if tuple(x.shape[len(x.shape) - len(normalized_shape):]) != normalized_shape:
        raise ValueError('Given normalized_shape=%r, expected input with shape [*, %s], but got input of size %r'
                         % (list(normalized_shape), ', '.join(map(str, normalized_shape)), x.shape))
    if weight is None:
        weight = _const(np.ones(normalized_shape), like=x)
    args = (x, weight) if bias is None else (x, weight, bias)
    return _first(tern.op.LayerNormalization(*args, axis=-len(normalized_shape), epsilon=float(eps)))


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """Rows of weight at input's indices; rows at padding_idx get no gradient (as PyTorch)."""
    if max_norm is not None:
        raise NotImplementedError('embedding: max_norm is not supported')
    if scale_grad_by_freq:
        raise NotImplementedError('embedding: scale_grad_by_freq is not supported')
    idx = _index_tensor(input)
    out = tern.op.Gather(weight, idx, axis=0)
    if padding_idx is not None and getattr(weight, 'requires_grad', False):
        if padding_idx < 0:
            padding_idx += weight.shape[0]
        ii = _np(idx)
        if (ii == padding_idx).any():
            keep = (ii != padding_idx).astype(_np_dtype(out))[..., None]
            frozen = tern.op.Gather(weight.detach(), idx, axis=0)
            out = tern.op.Add(tern.op.Mul(out, _const(keep, like=out)),
                              tern.op.Mul(frozen, _const(1.0 - keep, like=out)))
    return out


def one_hot(tensor, num_classes=-1):
    """An int64 tensor with one more axis of num_classes (max + 1 when -1)."""
    idx = _np(tensor).astype(np.int64)
    if num_classes < 0:
        num_classes = int(idx.max()) + 1 if idx.size else 0
    if idx.size and (idx.min() < 0 or idx.max() >= num_classes):
        raise ValueError('Class values must be non-negative and smaller than num_classes.')
    return tern.tensor(np.eye(num_classes, dtype=np.int64)[idx])


# ---------------------------------------------------------------- losses

def _loss_input_target(input, target):
    x = _as_tensor(input)
    if _is_tensor(target):
        return x, target
    return x, _as_tensor(np.asarray(target, dtype=_np_dtype(x)))


def _is_float_dtype(t):
    return str(t.dtype).startswith(('float', 'bfloat', 'double', 'half'))


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean'):
    reduction = _reduction_arg(size_average, reduce, reduction)
    x = _as_tensor(input)
    t = _index_tensor(target)
    if _ndim(x) == 1:
        x, t = _unsqueeze(x, 0), _unsqueeze(t, 0)
    args = (x, t) if weight is None else (x, t, _as_tensor(weight))
    return tern.op.NegativeLogLikelihoodLoss(*args, reduction=reduction, ignore_index=int(ignore_index))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean',
                  label_smoothing=0.0):
    """Softmax cross entropy over axis 1 (classes): integer targets [N, d1, ...] for input [N, C, d1, ...]
    (or [C] and a scalar target), or class probabilities of input's shape."""
    reduction = _reduction_arg(size_average, reduce, reduction)
    x = _as_tensor(input)
    if _is_tensor(target):
        t = target
    else:
        ta = _np(target)
        t = tern.tensor(ta.astype(_np_dtype(x)) if ta.dtype.kind == 'f' else ta.astype(np.int64))
    unbatched = _ndim(x) == 1
    if unbatched:
        x, t = _unsqueeze(x, 0), _unsqueeze(t, 0)
    c = x.shape[1]
    w = None if weight is None else _as_tensor(weight)
    if _is_float_dtype(t):  # class probabilities
        if tuple(t.shape) != tuple(x.shape):
            raise ValueError('cross_entropy: probability targets must have the input\'s shape')
        if label_smoothing > 0:
            t = tern.op.Add(tern.op.Mul(t, _scalar(1.0 - label_smoothing, t)), _scalar(label_smoothing / c, t))
        logp = tern.op.LogSoftmax(x, axis=1)
        prod = tern.op.Mul(logp, t)
        if w is not None:
            shape = [1, c] + [1] * (_ndim(x) - 2)
            prod = tern.op.Mul(prod, _reshape(w, shape))
        loss = tern.op.Neg(tern.op.ReduceSum(prod, _i64([1]), keepdims=0))
        if reduction == 'mean':
            return tern.op.ReduceMean(loss, keepdims=0)
        out = _reduce(loss, reduction)
        return _squeeze(out, 0) if unbatched and reduction == 'none' else out
    t = _index_tensor(t)
    if label_smoothing == 0.0:
        args = (x, t) if w is None else (x, t, w)
        out = _first(tern.op.SoftmaxCrossEntropyLoss(*args, reduction=reduction, ignore_index=int(ignore_index)))
        return _squeeze(out, 0) if unbatched and reduction == 'none' else out
    # label smoothing as PyTorch: (1 - eps) nll + eps / C * (the sum over classes of -log p (weighted))
    logp = tern.op.LogSoftmax(x, axis=1)
    nll = nll_loss(logp, t, weight=w, ignore_index=ignore_index, reduction=reduction)
    ti = _np(t)
    keep = (ti != ignore_index)
    if w is not None:
        shape = [1, c] + [1] * (_ndim(x) - 2)
        smooth = tern.op.Neg(tern.op.ReduceSum(tern.op.Mul(logp, _reshape(w, shape)), _i64([1]), keepdims=0))
    else:
        smooth = tern.op.Neg(tern.op.ReduceSum(logp, _i64([1]), keepdims=0))
    smooth = tern.op.Mul(smooth, _const(keep.astype(np.float64), like=smooth))
    if reduction == 'mean':
        if w is not None:
            wn = _np(w)
            denom = float(wn[ti[keep]].sum())
        else:
            denom = float(keep.sum())
        smooth = tern.op.Div(tern.op.ReduceSum(smooth, keepdims=0), _scalar(denom, smooth))
    elif reduction == 'sum':
        smooth = tern.op.ReduceSum(smooth, keepdims=0)
    out = tern.op.Add(tern.op.Mul(nll, _scalar(1.0 - label_smoothing, nll)),
                      tern.op.Mul(smooth, _scalar(label_smoothing / c, smooth)))
    return _squeeze(out, 0) if unbatched and reduction == 'none' else out


def mse_loss(input, target, size_average=None, reduce=None, reduction='mean'):
    reduction = _reduction_arg(size_average, reduce, reduction)
    x, t = _loss_input_target(input, target)
    d = tern.op.Sub(x, t)
    return _reduce(tern.op.Mul(d, d), reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction='mean'):
    reduction = _reduction_arg(size_average, reduce, reduction)
    x, t = _loss_input_target(input, target)
    return _reduce(tern.op.Abs(tern.op.Sub(x, t)), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction='mean', beta=1.0):
    reduction = _reduction_arg(size_average, reduce, reduction)
    x, t = _loss_input_target(input, target)
    d = tern.op.Sub(x, t)
    a = tern.op.Abs(d)
    if beta == 0.0:
        return _reduce(a, reduction)
    quad = tern.op.Mul(tern.op.Mul(d, d), _scalar(0.5 / beta, d))
    lin = tern.op.Sub(a, _scalar(0.5 * beta, d))
    return _reduce(tern.op.Where(tern.op.Less(a, _scalar(beta, d)), quad, lin), reduction)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction='mean'):
    """-(t log p + (1 - t) log(1 - p)), the logs clamped at -100 as PyTorch."""
    reduction = _reduction_arg(size_average, reduce, reduction)
    p, t = _loss_input_target(input, target)
    lo = _scalar(-100.0, p)
    logp = tern.op.Max(tern.op.Log(p), lo)
    log1p = tern.op.Max(tern.op.Log(tern.op.Sub(_scalar(1.0, p), p)), lo)
    one_t = tern.op.Sub(_scalar(1.0, t), t)
    loss = tern.op.Neg(tern.op.Add(tern.op.Mul(t, logp), tern.op.Mul(one_t, log1p)))
    if weight is not None:
        loss = tern.op.Mul(loss, _as_tensor(weight))
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction='mean',
                                     pos_weight=None):
    """pos_weight t softplus(-x) + (1 - t) softplus(x): PyTorch's loss, with gradient sigmoid(x) - t
    (pos_weight 1)."""
    reduction = _reduction_arg(size_average, reduce, reduction)
    x, t = _loss_input_target(input, target)
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError('Target size (%r) must be the same as input size (%r)' % (tuple(t.shape), tuple(x.shape)))
    one_t = tern.op.Sub(_scalar(1.0, t), t)
    pos = t if pos_weight is None else tern.op.Mul(t, _as_tensor(pos_weight))
    loss = tern.op.Add(tern.op.Mul(one_t, tern.op.Softplus(x)), tern.op.Mul(pos, tern.op.Softplus(tern.op.Neg(x))))
    if weight is not None:
        loss = tern.op.Mul(loss, _as_tensor(weight))
    return _reduce(loss, reduction)
