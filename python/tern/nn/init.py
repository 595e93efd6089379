"""tern.nn.init: PyTorch's initialisation distributions.

The draws come from a numpy Generator seeded from tern's random stream, so tern.manual_seed(n) makes
a model's initial parameters reproducible (they are not torch's values: copy torch's with
load_state_dict when those are wanted).

The functions named like torch.nn.init's (uniform_, normal_, ...) write into an existing tensor in
place and return it; the underscore-free helpers return numpy arrays.
"""
import math

import numpy as np

import tern

from .functional import _np_dtype

__all__ = ['calculate_gain', 'uniform_', 'normal_', 'constant_', 'zeros_', 'ones_', 'xavier_uniform_',
           'xavier_normal_', 'kaiming_uniform_', 'kaiming_normal_']


def generator():
    """A numpy Generator seeded by four draws from tern's random stream."""
    u = np.asarray(tern.rand(4).numpy(), dtype=np.float64).ravel()
    return np.random.default_rng([int(v * (1 << 24)) for v in u])


def calculate_gain(nonlinearity, param=None):
    linear_fns = ['linear', 'conv1d', 'conv2d', 'conv3d', 'conv_transpose1d', 'conv_transpose2d',
                  'conv_transpose3d']
    if nonlinearity in linear_fns or nonlinearity == 'sigmoid':
        return 1
    if nonlinearity == 'tanh':
        return 5.0 / 3
    if nonlinearity == 'relu':
        return math.sqrt(2.0)
    if nonlinearity == 'leaky_relu':
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == 'selu':
        return 3.0 / 4
    raise ValueError('Unsupported nonlinearity %s' % nonlinearity)


def fan_in_and_fan_out(shape):
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError('Fan in and fan out can not be computed for tensor with fewer than 2 dimensions')
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def uniform(shape, low, high, rng=None, dtype=np.float32):
    rng = rng or generator()
    return rng.uniform(low, high, size=tuple(shape)).astype(dtype)


def normal(shape, mean=0.0, std=1.0, rng=None, dtype=np.float32):
    rng = rng or generator()
    return rng.normal(mean, std, size=tuple(shape)).astype(dtype)


def kaiming_uniform(shape, a=0.0, mode='fan_in', nonlinearity='leaky_relu', rng=None):
    fan_in, fan_out = fan_in_and_fan_out(shape)
    fan = fan_in if mode == 'fan_in' else fan_out
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform(shape, -bound, bound, rng)


def kaiming_normal(shape, a=0.0, mode='fan_in', nonlinearity='leaky_relu', rng=None):
    fan_in, fan_out = fan_in_and_fan_out(shape)
    fan = fan_in if mode == 'fan_in' else fan_out
    return normal(shape, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan), rng)


def xavier_uniform(shape, gain=1.0, rng=None):
    fan_in, fan_out = fan_in_and_fan_out(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform(shape, -bound, bound, rng)


def xavier_normal(shape, gain=1.0, rng=None):
    fan_in, fan_out = fan_in_and_fan_out(shape)
    return normal(shape, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), rng)


# ---------------------------------------------------------------- in place, as torch.nn.init

def copy_into(t, array):
    """Writes array into tensor t's storage in place (autograd does not see it); True on success."""
    array = np.asarray(array, dtype=_np_dtype(t))
    if tuple(array.shape) != tuple(t.shape):
        raise ValueError('shape mismatch: tensor %r, value %r' % (tuple(t.shape), tuple(array.shape)))
    for name in ('copy_', '_copy_from', 'set_data_'):
        fn = getattr(t, name, None)
        if fn is not None:
            try:
                fn(array)
                return True
            except Exception:  # noqa: BLE001 - try the next way
                pass
    try:
        view = t.numpy()
    except Exception:  # noqa: BLE001
        return False
    if not isinstance(view, np.ndarray) or not view.flags.writeable:
        return False
    view[...] = array
    return bool(np.array_equal(np.asarray(t.numpy()), array, equal_nan=array.dtype.kind == 'f'))


def _inplace(t, array):
    if not copy_into(t, array):
        raise RuntimeError('tern.nn.init: this tern tensor cannot be written in place')
    return t


def uniform_(tensor, a=0.0, b=1.0):
    return _inplace(tensor, uniform(tensor.shape, a, b))


def normal_(tensor, mean=0.0, std=1.0):
    return _inplace(tensor, normal(tensor.shape, mean, std))


def constant_(tensor, val):
    return _inplace(tensor, np.full(tuple(tensor.shape), val))


def zeros_(tensor):
    return constant_(tensor, 0)


def ones_(tensor):
    return constant_(tensor, 1)


def xavier_uniform_(tensor, gain=1.0):
    return _inplace(tensor, xavier_uniform(tensor.shape, gain))


def xavier_normal_(tensor, gain=1.0):
    return _inplace(tensor, xavier_normal(tensor.shape, gain))


def kaiming_uniform_(tensor, a=0, mode='fan_in', nonlinearity='leaky_relu'):
    return _inplace(tensor, kaiming_uniform(tensor.shape, a, mode, nonlinearity))


def kaiming_normal_(tensor, a=0, mode='fan_in', nonlinearity='leaky_relu'):
    return _inplace(tensor, kaiming_normal(tensor.shape, a, mode, nonlinearity))
