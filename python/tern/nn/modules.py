"""tern.nn's modules: PyTorch's torch.nn layers on tern's eager operators.

Layers keep PyTorch's constructor arguments, parameter names, layouts and state_dict keys, so a
PyTorch state_dict converted to numpy ({k: v.numpy()}) loads unchanged with load_state_dict.
"""
import math
from collections import OrderedDict, namedtuple

import numpy as np

import tern

from . import functional as F
from . import init as _init
from .functional import _i64, _const, _np, _np_dtype, _is_tensor, _as_tensor, _ndim

__all__ = [
    'ConvTranspose2d',
    'Module', 'Sequential', 'ModuleList', 'ModuleDict', 'Linear', 'Bilinear', 'Conv1d', 'Conv2d', 'BatchNorm1d',
    'BatchNorm2d', 'LayerNorm', 'Embedding', 'RNN', 'LSTM', 'GRU', 'Dropout', 'MultiheadAttention', 'ReLU',
    'ReLU6', 'LeakyReLU', 'ELU', 'GELU', 'SiLU', 'Sigmoid', 'Tanh', 'Softplus', 'Softmax', 'LogSoftmax',
    'Flatten', 'Unflatten', 'Identity', 'MaxPool1d', 'MaxPool2d', 'AvgPool1d', 'AvgPool2d', 'AdaptiveAvgPool2d',
    'CrossEntropyLoss', 'NLLLoss', 'MSELoss', 'L1Loss', 'SmoothL1Loss', 'BCELoss', 'BCEWithLogitsLoss',
]


# ---------------------------------------------------------------- parameters

def _parameter_class():
    p = getattr(tern, 'Parameter', None)
    return p if isinstance(p, type) else None


def _is_parameter(value):
    cls = _parameter_class()
    if cls is not None and cls is not F._tensor_type():
        return isinstance(value, cls)
    # tern.Parameter is a factory (or the Tensor type itself): a leaf tensor that requires a gradient
    return _is_tensor(value) and bool(getattr(value, 'requires_grad', False)) and \
        bool(getattr(value, 'is_leaf', True))


def _new_parameter(array, requires_grad=True):
    return tern.Parameter(np.array(array, dtype=np.float32, order="C"), requires_grad=bool(requires_grad))


def _clear_grad(p):
    """Removes p's gradient."""
    if getattr(p, 'grad', None) is None:
        return
    try:
        p.grad = None
        return
    except (AttributeError, TypeError):
        pass
    # no setter: an optimizer's zero_grad clears it
    tern._tern.Optimizer('sgd', [p], 0.0).zero_grad()


_IncompatibleKeys = namedtuple('IncompatibleKeys', ['missing_keys', 'unexpected_keys'])


# ---------------------------------------------------------------- Module

class Module:
    """Base class of layers: parameters, buffers and submodules assigned as attributes are registered
    (in order) and reached by parameters(), named_parameters(), buffers(), state_dict(), ..."""

    training = True

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError('Module.__init__() takes no arguments')
        object.__setattr__(self, 'training', True)
        object.__setattr__(self, '_parameters', OrderedDict())
        object.__setattr__(self, '_buffers', OrderedDict())
        object.__setattr__(self, '_non_persistent_buffers_set', set())
        object.__setattr__(self, '_modules', OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError('Module [%s] is missing the required "forward" function' % type(self).__name__)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------ registration

    def _check_name(self, name, what):
        if '_parameters' not in self.__dict__:
            raise AttributeError('cannot assign %s before Module.__init__() call' % what)
        if not isinstance(name, str):
            raise TypeError('%s name should be a string. Got %s' % (what, type(name).__name__))
        if '.' in name:
            raise KeyError('%s name can\'t contain "."' % what)
        if name == '':
            raise KeyError('%s name can\'t be empty string ""' % what)

    def _forget(self, name):
        self.__dict__.pop(name, None)
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        self._non_persistent_buffers_set.discard(name)

    def register_parameter(self, name, param):
        self._check_name(name, 'parameter')
        if hasattr(self, name) and name not in self._parameters and name not in self.__dict__ and \
                name not in self._buffers and name not in self._modules:
            raise KeyError("attribute '%s' already exists" % name)
        if param is not None and not _is_parameter(param):
            raise TypeError("cannot assign '%s' object to parameter '%s' (tern.nn.Parameter or None required)"
                            % (type(param).__name__, name))
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        self._check_name(name, 'buffer')
        if tensor is not None and not _is_tensor(tensor):
            tensor = _as_tensor(tensor)
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name, module):
        self._check_name(name, 'module')
        if module is not None and not isinstance(module, Module):
            raise TypeError('%s is not a Module subclass' % type(module).__name__)
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name, value):
        params = self.__dict__.get('_parameters')
        if params is not None and _is_parameter(value):
            self._forget(name)
            params[name] = value
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError("cannot assign '%s' as parameter '%s' (tern.nn.Parameter or None expected)"
                                % (type(value).__name__, name))
            params[name] = None
            return
        modules = self.__dict__.get('_modules')
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError('cannot assign module before Module.__init__() call')
            self._forget(name)
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError("cannot assign '%s' as child module '%s' (tern.nn.Module or None expected)"
                                % (type(value).__name__, name))
            modules[name] = None
            return
        buffers = self.__dict__.get('_buffers')
        if buffers is not None and name in buffers:
            if value is not None and not _is_tensor(value):
                raise TypeError("cannot assign '%s' as buffer '%s' (tern.Tensor or None expected)"
                                % (type(value).__name__, name))
            buffers[name] = value
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ('_parameters', '_buffers', '_modules'):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError("'%s' object has no attribute '%s'" % (type(self).__name__, name))

    def __delattr__(self, name):
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = list(object.__dir__(self)) + list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(set(k for k in keys if not k[0].isdigit()))

    # ------------------------------------------------ traversal

    def named_modules(self, memo=None, prefix='', remove_duplicate=True):
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ('.' if prefix else '') + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, get, prefix='', recurse=True):
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for k, v in get(m):
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                yield mprefix + ('.' if mprefix else '') + k, v

    def named_parameters(self, prefix='', recurse=True):
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix='', recurse=True):
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target):
        if target == '':
            return self
        mod = self
        for item in target.split('.'):
            if item not in mod._modules:
                raise AttributeError(type(mod).__name__ + ' has no attribute `' + item + '`')
            mod = mod._modules[item]
        return mod

    def get_parameter(self, target):
        module_path, _, name = target.rpartition('.')
        mod = self.get_submodule(module_path)
        if name not in mod._parameters:
            raise AttributeError(type(mod).__name__ + ' has no parameter `' + name + '`')
        return mod._parameters[name]

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------ modes and gradients

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError('training mode is expected to be boolean')
        object.__setattr__(self, 'training', mode)
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            _clear_grad(p)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def float(self):
        return self

    def to(self, *args, **kwargs):
        for a in list(args) + list(kwargs.values()):
            if a is not None and str(a) not in ('cpu', 'float32', 'torch.float32'):
                raise NotImplementedError('tern.nn.Module.to: only float32 on the CPU')
        return self

    def cpu(self):
        return self

    # ------------------------------------------------ state

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else _np(p)
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else _np(b)

    def state_dict(self, destination=None, prefix='', keep_vars=False):
        """An OrderedDict of numpy copies of the parameters and persistent buffers under PyTorch's keys
        (keep_vars=True: the tensors themselves)."""
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination, prefix + name + '.', keep_vars)
        return destination

    def _state_slots(self, prefix=''):
        """(key, module, name, kind) for every state_dict entry."""
        # as state_dict: every path to a shared submodule has its keys
        for name, p in self._parameters.items():
            if p is not None:
                yield prefix + name, self, name, 'parameter'
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                yield prefix + name, self, name, 'buffer'
        for name, module in self._modules.items():
            if module is not None:
                yield from module._state_slots(prefix + name + '.')

    def load_state_dict(self, state_dict, strict=True):
        """Copies the arrays of state_dict (numpy arrays, tern tensors, or anything with .numpy()) into
        the parameters and buffers under PyTorch's keys. strict: the keys must match exactly."""
        expected = OrderedDict()
        for key, m, name, kind in self._state_slots():
            expected.setdefault(key, (m, name, kind))
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        errors = []
        if strict and (missing or unexpected):
            if unexpected:
                errors.append('Unexpected key(s) in state_dict: %s. ' % ', '.join('"%s"' % k for k in unexpected))
            if missing:
                errors.append('Missing key(s) in state_dict: %s. ' % ', '.join('"%s"' % k for k in missing))
        values = {}
        for key, (m, name, kind) in expected.items():
            if key not in state_dict:
                continue
            cur = getattr(m, name)
            v = np.asarray(_np(state_dict[key]))
            if tuple(v.shape) != tuple(cur.shape):
                errors.append('size mismatch for %s: copying a param with shape %s from checkpoint, the shape in '
                              'current model is %s.' % (key, tuple(v.shape), tuple(cur.shape)))
                continue
            values[key] = v
        if errors:
            raise RuntimeError('Error(s) in loading state_dict for %s:\n\t%s' % (type(self).__name__,
                                                                                 '\n\t'.join(errors)))
        for key, v in values.items():
            m, name, kind = expected[key]
            cur = getattr(m, name)
            v = np.array(v.astype(_np_dtype(cur)), order="C")
            if _init.copy_into(cur, v):
                continue
            if kind == 'parameter':
                m._parameters[name] = _new_parameter(v, bool(getattr(cur, 'requires_grad', True)))
            else:
                m._buffers[name] = tern.tensor(v)
        return _IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------ printing

    def extra_repr(self):
        return ''

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split('\n')
        child = []
        for name, module in self._modules.items():
            s = repr(module).replace('\n', '\n  ')
            child.append('(' + name + '): ' + s)
        lines = lines + child
        main = self._get_name() + '('
        if lines:
            if len(lines) == 1 and not child:
                main += lines[0]
            else:
                main += '\n  ' + '\n  '.join(lines) + '\n'
        return main + ')'


# ---------------------------------------------------------------- containers

class Sequential(Module):
    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def _index(self, idx):
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError('index %d is out of range' % idx)
        return idx % n

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[self._index(idx)]

    def __setitem__(self, idx, module):
        key = list(self._modules.keys())[self._index(idx)]
        self.add_module(key, module)

    def __delitem__(self, idx):
        if isinstance(idx, slice):
            for key in list(self._modules.keys())[idx]:
                del self._modules[key]
        else:
            del self._modules[list(self._modules.keys())[self._index(idx)]]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, sequential):
        for m in sequential:
            self.append(m)
        return self

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx):
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError('index %d is out of range' % idx)
        return idx % n

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(self._index(idx))]

    def __setitem__(self, idx, module):
        self.add_module(str(self._index(idx)), module)

    def __delitem__(self, idx):
        mods = list(self._modules.values())
        if isinstance(idx, slice):
            del mods[idx]
        else:
            del mods[self._index(idx)]
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        return ModuleList(list(self) + list(other))

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)

    def forward(self, *args, **kwargs):
        raise NotImplementedError('ModuleList has no forward')


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def pop(self, key):
        return self._modules.pop(key)

    def clear(self):
        self._modules.clear()

    def update(self, modules):
        items = modules.items() if hasattr(modules, 'items') else modules
        for k, m in items:
            self[k] = m


# ---------------------------------------------------------------- linear, convolution

class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x W^T + b, weight [out_features, in_features] (kaiming-uniform, a = sqrt 5, as PyTorch)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.weight = _new_parameter(np.zeros((self.out_features, self.in_features), np.float32))
        if bias:
            self.bias = _new_parameter(np.zeros(self.out_features, np.float32))
        else:
            self.register_parameter('bias', None)
        self.reset_parameters()

    def reset_parameters(self):
        rng = _init.generator()
        shape = (self.out_features, self.in_features)
        self.weight = _new_parameter(_init.kaiming_uniform(shape, a=math.sqrt(5), rng=rng))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            self.bias = _new_parameter(_init.uniform((self.out_features,), -bound, bound, rng))

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return 'in_features=%d, out_features=%d, bias=%s' % (self.in_features, self.out_features,
                                                             self.bias is not None)


class Bilinear(Module):
    def __init__(self, in1_features, in2_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        bound = 1 / math.sqrt(in1_features)
        rng = _init.generator()
        self.weight = _new_parameter(_init.uniform((out_features, in1_features, in2_features), -bound, bound, rng))
        if bias:
            self.bias = _new_parameter(_init.uniform((out_features,), -bound, bound, rng))
        else:
            self.register_parameter('bias', None)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)


class _ConvNd(Module):
    _n = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode='zeros', device=None, dtype=None):
        super().__init__()
        n = self._n
        if groups <= 0:
            raise ValueError('groups must be a positive integer')
        if in_channels % groups != 0:
            raise ValueError('in_channels must be divisible by groups')
        if out_channels % groups != 0:
            raise ValueError('out_channels must be divisible by groups')
        if padding_mode not in ('zeros', 'reflect', 'replicate', 'circular'):
            raise ValueError("padding_mode must be one of 'zeros', 'reflect', 'replicate', 'circular'")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = tuple(F._pair(kernel_size, n))
        self.stride = tuple(F._pair(stride, n))
        if isinstance(padding, str):
            if padding not in ('same', 'valid'):
                raise ValueError("Invalid padding string %r, should be one of {'valid', 'same'}" % padding)
            if padding == 'same' and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = tuple(F._pair(padding, n))
        self.dilation = tuple(F._pair(dilation, n))
        self.groups = int(groups)
        self.padding_mode = padding_mode
        self.weight = _new_parameter(np.zeros((out_channels, in_channels // groups) + self.kernel_size, np.float32))
        if bias:
            self.bias = _new_parameter(np.zeros(out_channels, np.float32))
        else:
            self.register_parameter('bias', None)
        self.reset_parameters()

    def reset_parameters(self):
        rng = _init.generator()
        shape = tuple(self.weight.shape)
        self.weight = _new_parameter(_init.kaiming_uniform(shape, a=math.sqrt(5), rng=rng))
        if self.bias is not None:
            fan_in, _ = _init.fan_in_and_fan_out(shape)
            bound = 1 / math.sqrt(fan_in) if fan_in != 0 else 0
            self.bias = _new_parameter(_init.uniform((self.out_channels,), -bound, bound, rng))

    def _conv(self, input, fn):
        if self.padding_mode != 'zeros':
            if isinstance(self.padding, str):
                pads = F._conv_pads(self.padding, self.weight.shape, list(self.dilation), self._n)
                begin, end = pads[:self._n], pads[self._n:]
            else:
                begin = end = list(self.padding)
            torch_pad = []
            for d in reversed(range(self._n)):
                torch_pad += [begin[d], end[d]]
            input = F.pad(input, torch_pad, mode=self.padding_mode)
            return fn(input, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return fn(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        s = '%d, %d, kernel_size=%s, stride=%s' % (self.in_channels, self.out_channels, self.kernel_size,
                                                   self.stride)
        if self.padding != (0,) * self._n:
            s += ', padding=%s' % (self.padding,)
        if self.dilation != (1,) * self._n:
            s += ', dilation=%s' % (self.dilation,)
        if self.groups != 1:
            s += ', groups=%d' % self.groups
        if self.bias is None:
            s += ', bias=False'
        if self.padding_mode != 'zeros':
            s += ', padding_mode=%s' % self.padding_mode
        return s


class Conv1d(_ConvNd):
    _n = 1

    def forward(self, input):
        return self._conv(input, F.conv1d)


class Conv2d(_ConvNd):
    _n = 2

    def forward(self, input):
        return self._conv(input, F.conv2d)


class ConvTranspose2d(Module):
    """torch.nn.ConvTranspose2d: weight [in_channels, out_channels / groups, kH, kW], bias [out_channels]."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode='zeros', device=None, dtype=None):
        super().__init__()
        if padding_mode != 'zeros':
            raise ValueError('Only "zeros" padding mode is supported for ConvTranspose2d')
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError('in_channels and out_channels must be divisible by groups')
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = tuple(F._pair(kernel_size, 2))
        self.stride = tuple(F._pair(stride, 2))
        self.padding = tuple(F._pair(padding, 2))
        self.output_padding = tuple(F._pair(output_padding, 2))
        self.dilation = tuple(F._pair(dilation, 2))
        self.groups = int(groups)
        self.padding_mode = padding_mode
        shape = (self.in_channels, self.out_channels // self.groups) + self.kernel_size
        rng = _init.generator()
        self.weight = _new_parameter(_init.kaiming_uniform(shape, a=math.sqrt(5), rng=rng))
        if bias:
            # torch computes the fan-in of the transposed weight as of a convolution's: dim 1 x kernel
            fan_in, _ = _init.fan_in_and_fan_out(shape)
            bound = 1 / math.sqrt(fan_in) if fan_in != 0 else 0
            self.bias = _new_parameter(_init.uniform((self.out_channels,), -bound, bound, rng))
        else:
            self.register_parameter('bias', None)

    def forward(self, input):
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)

    def extra_repr(self):
        return '%d, %d, kernel_size=%s, stride=%s, padding=%s' % (self.in_channels, self.out_channels,
                                                                   self.kernel_size, self.stride, self.padding)


# ---------------------------------------------------------------- normalisation

class _BatchNorm(Module):
    _ranks = (4,)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None):
        super().__init__()
        self.num_features = int(num_features)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = _new_parameter(np.ones(self.num_features, np.float32))
            self.bias = _new_parameter(np.zeros(self.num_features, np.float32))
        else:
            self.register_parameter('weight', None)
            self.register_parameter('bias', None)
        if track_running_stats:
            self.register_buffer('running_mean', tern.tensor(np.zeros(self.num_features, np.float32)))
            self.register_buffer('running_var', tern.tensor(np.ones(self.num_features, np.float32)))
            self.register_buffer('num_batches_tracked', tern.tensor(np.asarray(0, np.int64)))
        else:
            self.register_buffer('running_mean', None)
            self.register_buffer('running_var', None)
            self.register_buffer('num_batches_tracked', None)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean = tern.tensor(np.zeros(self.num_features, np.float32))
            self.running_var = tern.tensor(np.ones(self.num_features, np.float32))
            self.num_batches_tracked = tern.tensor(np.asarray(0, np.int64))

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            self.weight = _new_parameter(np.ones(self.num_features, np.float32))
            self.bias = _new_parameter(np.zeros(self.num_features, np.float32))

    def _check_input_dim(self, input):
        if _ndim(input) not in self._ranks:
            raise ValueError('expected %s input (got %dD input)' % (' or '.join('%dD' % r for r in self._ranks),
                                                                     _ndim(input)))

    def forward(self, input):
        input = _as_tensor(input)
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError('expected %d channels, got input of shape %r' % (self.num_features, tuple(input.shape)))
        if self.training and self.track_running_stats and self.running_mean is not None:
            # one call: the output and the running statistics after it
            tracked = int(_np(self.num_batches_tracked)) + 1
            f = 1.0 / tracked if self.momentum is None else float(self.momentum)
            y, mean, var = F._batch_norm_train(input, self.running_mean, self.running_var, self.weight, self.bias,
                                               self.eps, f)
            with tern.no_grad():
                self.running_mean.copy_(mean)
                self.running_var.copy_(var)
            if not _init.copy_into(self.num_batches_tracked, np.asarray(tracked, np.int64)):
                self.num_batches_tracked = tern.tensor(np.asarray(tracked, np.int64))
            return y
        if self.training and self.track_running_stats:
            self._update_running_stats(input)
        use_batch = self.training or self.running_mean is None
        return F._batch_norm_forward(input, self.running_mean, self.running_var, self.weight, self.bias, use_batch,
                                     self.eps)

    def _update_running_stats(self, input):
        # PyTorch's: running = (1 - f) running + f batch, the batch's variance unbiased, f = momentum
        # (or 1 / num_batches_tracked for momentum=None: the cumulative average); written in place
        tracked = int(_np(self.num_batches_tracked)) + 1
        f = 1.0 / tracked if self.momentum is None else float(self.momentum)
        new_mean, new_var = F._bn_running_update(input, self.running_mean, self.running_var, f)
        nbt = np.asarray(tracked, np.int64)
        for name, value in (('running_mean', new_mean), ('running_var', new_var), ('num_batches_tracked', nbt)):
            if not _init.copy_into(getattr(self, name), value):
                setattr(self, name, tern.tensor(value))

    def extra_repr(self):
        return '%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s' % (
            self.num_features, self.eps, self.momentum, self.affine, self.track_running_stats)


class BatchNorm1d(_BatchNorm):
    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    _ranks = (4,)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = _new_parameter(np.ones(self.normalized_shape, np.float32))
            self.bias = _new_parameter(np.zeros(self.normalized_shape, np.float32))
        else:
            self.register_parameter('weight', None)
            self.register_parameter('bias', None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return '%s, eps=%s, elementwise_affine=%s' % (self.normalized_shape, self.eps, self.elementwise_affine)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if padding_idx > 0:
                assert padding_idx < self.num_embeddings, 'Padding_idx must be within num_embeddings'
            elif padding_idx < 0:
                assert padding_idx >= -self.num_embeddings, 'Padding_idx must be within num_embeddings'
                padding_idx = self.num_embeddings + padding_idx
        self.padding_idx = padding_idx
        if max_norm is not None or scale_grad_by_freq:
            raise NotImplementedError('Embedding: max_norm and scale_grad_by_freq are not supported')
        self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse = max_norm, norm_type, False, sparse
        if _weight is None:
            w = _init.normal((self.num_embeddings, self.embedding_dim))
            if padding_idx is not None:
                w[padding_idx] = 0
        else:
            w = _np(_weight)
            if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
                raise ValueError('Shape of weight does not match num_embeddings and embedding_dim')
        self.weight = _new_parameter(w, requires_grad=not _freeze)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        w = _np(embeddings)
        if w.ndim != 2:
            raise ValueError('Embeddings parameter is expected to be 2-dimensional')
        return cls(w.shape[0], w.shape[1], padding_idx=padding_idx, _weight=w, _freeze=freeze)

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self):
        s = '%d, %d' % (self.num_embeddings, self.embedding_dim)
        if self.padding_idx is not None:
            s += ', padding_idx=%d' % self.padding_idx
        return s


# ---------------------------------------------------------------- recurrent

class _RNNBase(Module):
    """PyTorch's parameters (weight_ih_l{k}[_reverse] [G*H, in], weight_hh_l{k} [G*H, H], bias_ih_l{k},
    bias_hh_l{k} [G*H]) run through ONNX's LSTM/GRU/RNN, one call per layer (both directions in one)."""

    _gates = 1
    _onnx_order = (0,)  # ONNX's gate order in PyTorch's gate numbers

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        if proj_size:
            raise NotImplementedError('proj_size is not supported')
        if not 0 <= dropout <= 1:
            raise ValueError('dropout should be a number in range [0, 1]')
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, 0
        dirs = 2 if bidirectional else 1
        G, H = self._gates, self.hidden_size
        self._names = []
        for layer in range(self.num_layers):
            for d in range(dirs):
                sfx = '_reverse' if d == 1 else ''
                in_size = self.input_size if layer == 0 else H * dirs
                names = ['weight_ih_l%d%s' % (layer, sfx), 'weight_hh_l%d%s' % (layer, sfx)]
                shapes = [(G * H, in_size), (G * H, H)]
                if bias:
                    names += ['bias_ih_l%d%s' % (layer, sfx), 'bias_hh_l%d%s' % (layer, sfx)]
                    shapes += [(G * H,), (G * H,)]
                for n, s in zip(names, shapes):
                    setattr(self, n, _new_parameter(np.zeros(s, np.float32)))
                self._names.append(names)
        self.reset_parameters()
        rows = np.concatenate([np.arange(g * H, (g + 1) * H) for g in self._onnx_order]).astype(np.int64)
        self._rows = rows

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        rng = _init.generator()
        for names in self._names:
            for n in names:
                setattr(self, n, _new_parameter(_init.uniform(getattr(self, n).shape, -stdv, stdv, rng)))

    def _onnx_weights(self, layer):
        dirs = 2 if self.bidirectional else 1
        rows = _i64(self._rows)
        Ws, Rs, Bs = [], [], []
        for d in range(dirs):
            names = self._names[layer * dirs + d]
            Ws.append(_unsq(tern.op.Gather(getattr(self, names[0]), rows, axis=0)))
            Rs.append(_unsq(tern.op.Gather(getattr(self, names[1]), rows, axis=0)))
            if self.bias:
                Bs.append(_unsq(tern.op.Concat(tern.op.Gather(getattr(self, names[2]), rows, axis=0),
                                               tern.op.Gather(getattr(self, names[3]), rows, axis=0), axis=0)))
        W = Ws[0] if dirs == 1 else tern.op.Concat(*Ws, axis=0)
        R = Rs[0] if dirs == 1 else tern.op.Concat(*Rs, axis=0)
        B = None
        if Bs:
            B = Bs[0] if dirs == 1 else tern.op.Concat(*Bs, axis=0)
        return W, R, B

    def _call(self, x, W, R, B, states, direction):
        raise NotImplementedError

    def _run(self, input, states):
        """input [seq, batch, in] (after batch_first and unbatched handling); states: list of
        [layers*dirs, batch, H] tensors or None. Returns output and the final states."""
        dirs = 2 if self.bidirectional else 1
        H = self.hidden_size
        x = input
        seq, batch = x.shape[0], x.shape[1]
        direction = 'bidirectional' if dirs == 2 else 'forward'
        finals = [[] for _ in range(self._n_states)]
        for layer in range(self.num_layers):
            W, R, B = self._onnx_weights(layer)
            st = [None if s is None else F._slice(s, layer * dirs, (layer + 1) * dirs, 0) for s in states]
            outs = self._call(x, W, R, B, st, direction)
            Y = outs[0]  # [seq, dirs, batch, H]
            x = F._reshape(F._transpose(Y, [0, 2, 1, 3]), [seq, batch, dirs * H])
            for i in range(self._n_states):
                finals[i].append(outs[1 + i])
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        finals = [f[0] if len(f) == 1 else tern.op.Concat(*f, axis=0) for f in finals]
        return x, finals

    def _prepare(self, input, hx):
        input = _as_tensor(input)
        batched = _ndim(input) == 3
        if _ndim(input) not in (2, 3):
            raise ValueError('%s: Expected input to be 2D or 3D, got %dD instead' % (type(self).__name__,
                                                                                     _ndim(input)))
        if not batched:
            input = F._unsqueeze(input, 1)
        elif self.batch_first:
            input = F._transpose(input, [1, 0, 2])
        if input.shape[2] != self.input_size:
            raise ValueError('input.size(-1) must be equal to input_size. Expected %d, got %d'
                             % (self.input_size, input.shape[2]))
        if hx is None:
            states = [None] * self._n_states
        else:
            states = list(hx) if isinstance(hx, (tuple, list)) else [hx]
            states = [_as_tensor(s) for s in states]
            if not batched:
                states = [F._unsqueeze(s, 1) for s in states]
        return input, states, batched

    def _finish(self, output, batched):
        if not batched:
            return F._squeeze(output, 1)
        if self.batch_first:
            return F._transpose(output, [1, 0, 2])
        return output

    def extra_repr(self):
        s = '%d, %d' % (self.input_size, self.hidden_size)
        if self.num_layers != 1:
            s += ', num_layers=%d' % self.num_layers
        if self.bias is not True:
            s += ', bias=%s' % self.bias
        if self.batch_first:
            s += ', batch_first=True'
        if self.dropout:
            s += ', dropout=%s' % self.dropout
        if self.bidirectional:
            s += ', bidirectional=True'
        return s


def _unsq(t):
    return F._unsqueeze(t, 0)


def _unbatch_states(states, batched):
    return states if batched else [F._squeeze(s, 1) for s in states]


class LSTM(_RNNBase):
    """PyTorch's gates i, f, g, o run as ONNX's i, o, f, c."""

    _gates = 4
    _onnx_order = (0, 3, 1, 2)
    _n_states = 2

    def _call(self, x, W, R, B, st, direction):
        batch = x.shape[1]
        h0, c0 = st
        dirs = 2 if direction == 'bidirectional' else 1
        if h0 is None:
            h0 = _const(np.zeros((dirs, batch, self.hidden_size)), like=x)
        if c0 is None:
            c0 = _const(np.zeros((dirs, batch, self.hidden_size)), like=x)
        return tern.op.LSTM(x, W, R, B, None, h0, c0, hidden_size=self.hidden_size, direction=direction,
                            _outputs=3)

    def forward(self, input, hx=None):
        x, states, batched = self._prepare(input, hx)
        out, (h, c) = self._run(x, states)
        h, c = _unbatch_states([h, c], batched)
        return self._finish(out, batched), (h, c)


class GRU(_RNNBase):
    """PyTorch's gates r, z, n run as ONNX's z, r, h with linear_before_reset=1."""

    _gates = 3
    _onnx_order = (1, 0, 2)
    _n_states = 1

    def _call(self, x, W, R, B, st, direction):
        h0 = st[0]
        if h0 is None:
            dirs = 2 if direction == 'bidirectional' else 1
            h0 = _const(np.zeros((dirs, x.shape[1], self.hidden_size)), like=x)
        return tern.op.GRU(x, W, R, B, None, h0, hidden_size=self.hidden_size, direction=direction,
                           linear_before_reset=1, _outputs=2)

    def forward(self, input, hx=None):
        x, states, batched = self._prepare(input, hx)
        out, (h,) = self._run(x, states)
        (h,) = _unbatch_states([h], batched)
        return self._finish(out, batched), h


class RNN(_RNNBase):
    _gates = 1
    _onnx_order = (0,)
    _n_states = 1

    def __init__(self, *args, nonlinearity='tanh', **kwargs):
        if nonlinearity not in ('tanh', 'relu'):
            raise ValueError("Unknown nonlinearity '%s'" % nonlinearity)
        self.__dict__['nonlinearity'] = nonlinearity
        super().__init__(*args, **kwargs)
        self.nonlinearity = nonlinearity

    def _call(self, x, W, R, B, st, direction):
        h0 = st[0]
        dirs = 2 if direction == 'bidirectional' else 1
        if h0 is None:
            h0 = _const(np.zeros((dirs, x.shape[1], self.hidden_size)), like=x)
        act = 'Tanh' if self.nonlinearity == 'tanh' else 'Relu'
        return tern.op.RNN(x, W, R, B, None, h0, hidden_size=self.hidden_size, direction=direction,
                           activations=[act] * dirs, _outputs=2)

    def forward(self, input, hx=None):
        x, states, batched = self._prepare(input, hx)
        out, (h,) = self._run(x, states)
        (h,) = _unbatch_states([h], batched)
        return self._finish(out, batched), h


# ---------------------------------------------------------------- dropout, attention

class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError('dropout probability has to be between 0 and 1, but got %r' % p)
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training)

    def extra_repr(self):
        return 'p=%s, inplace=%s' % (self.p, self.inplace)


def _mask_array(mask, shape_hint=None):
    """A float additive mask (0 / -inf) from a bool mask, or the float mask itself, as numpy float32."""
    m = _np(mask)
    if m.dtype == np.bool_:
        return np.where(m, -np.inf, 0.0).astype(np.float32)
    if m.dtype.kind in 'iu':
        return np.where(m != 0, -np.inf, 0.0).astype(np.float32)
    return m.astype(np.float32)


class MultiheadAttention(Module):
    """PyTorch's MultiheadAttention: in_proj_weight [3E, E] (or q/k/v_proj_weight), in_proj_bias [3E],
    out_proj; returns (output, attention weights averaged over the heads (or per head))."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        self.embed_dim = int(embed_dim)
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = int(num_heads)
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != self.embed_dim:
            raise ValueError('embed_dim must be divisible by num_heads')
        E = self.embed_dim
        rng = _init.generator()
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = _new_parameter(_init.xavier_uniform((E, E), rng=rng))
            self.k_proj_weight = _new_parameter(_init.xavier_uniform((E, self.kdim), rng=rng))
            self.v_proj_weight = _new_parameter(_init.xavier_uniform((E, self.vdim), rng=rng))
            self.register_parameter('in_proj_weight', None)
        else:
            self.in_proj_weight = _new_parameter(_init.xavier_uniform((3 * E, E), rng=rng))
            self.register_parameter('q_proj_weight', None)
            self.register_parameter('k_proj_weight', None)
            self.register_parameter('v_proj_weight', None)
        if bias:
            self.in_proj_bias = _new_parameter(np.zeros(3 * E, np.float32))
        else:
            self.register_parameter('in_proj_bias', None)
        self.out_proj = Linear(E, E, bias=bias)
        if bias:
            self.out_proj.bias = _new_parameter(np.zeros(E, np.float32))
        if add_bias_kv:
            self.bias_k = _new_parameter(_init.xavier_normal((1, 1, E), rng=rng))
            self.bias_v = _new_parameter(_init.xavier_normal((1, 1, E), rng=rng))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn

    def _proj(self, x, i):
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            w = F._slice(self.in_proj_weight, i * E, (i + 1) * E, 0)
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else F._slice(self.in_proj_bias, i * E, (i + 1) * E, 0)
        return F.linear(x, w, b)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        query, key, value = _as_tensor(query), _as_tensor(key), _as_tensor(value)
        batched = _ndim(query) == 3
        if batched and self.batch_first:
            query, key, value = (F._transpose(t, [1, 0, 2]) for t in (query, key, value))
        if not batched:
            query, key, value = (F._unsqueeze(t, 1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = _np(key_padding_mask)[None]
        L, N, E = query.shape
        S = key.shape[0]
        nh, hd = self.num_heads, self.head_dim
        # projections, in PyTorch's [L, N, E] -> [N*heads, L, head_dim]
        q = self._proj(F._reshape(query, [L * N, E]), 0)
        k = self._proj(F._reshape(key, [S * N, key.shape[2]]), 1)
        v = self._proj(F._reshape(value, [S * N, value.shape[2]]), 2)
        q = F._reshape(q, [L, N, E])
        k = F._reshape(k, [S, N, E])
        v = F._reshape(v, [S, N, E])
        mask = None
        if attn_mask is not None:
            mask = _mask_array(attn_mask)
            if mask.ndim == 2:
                mask = mask[None]
        kpm = None if key_padding_mask is None else _mask_array(key_padding_mask)  # [N, S]
        if self.bias_k is not None:
            k = tern.op.Concat(k, tern.op.Expand(self.bias_k, _i64([1, N, E])), axis=0)
            v = tern.op.Concat(v, tern.op.Expand(self.bias_v, _i64([1, N, E])), axis=0)
            S += 1
            if mask is not None:
                mask = np.concatenate([mask, np.zeros(mask.shape[:-1] + (1,), np.float32)], axis=-1)
            if kpm is not None:
                kpm = np.concatenate([kpm, np.zeros((kpm.shape[0], 1), np.float32)], axis=-1)
        q = F._transpose(F._reshape(q, [L, N * nh, hd]), [1, 0, 2])
        k = F._transpose(F._reshape(k, [S, N * nh, hd]), [1, 0, 2])
        v = F._transpose(F._reshape(v, [S, N * nh, hd]), [1, 0, 2])
        if self.add_zero_attn:
            zeros = _const(np.zeros((N * nh, 1, hd)), like=k)
            k = tern.op.Concat(k, zeros, axis=1)
            v = tern.op.Concat(v, zeros, axis=1)
            S += 1
            if mask is not None:
                mask = np.concatenate([mask, np.zeros(mask.shape[:-1] + (1,), np.float32)], axis=-1)
            if kpm is not None:
                kpm = np.concatenate([kpm, np.zeros((kpm.shape[0], 1), np.float32)], axis=-1)
        if is_causal and mask is None:
            mask = np.triu(np.full((L, S), -np.inf, np.float32), 1)[None]
        if kpm is not None:
            kpm_full = np.broadcast_to(kpm[:, None, None, :], (N, nh, 1, S)).reshape(N * nh, 1, S)
            mask = kpm_full if mask is None else mask + kpm_full
        q = tern.op.Mul(q, F._scalar(1.0 / math.sqrt(hd), q))
        scores = tern.op.MatMul(q, F._transpose(k, [0, 2, 1]))  # [N*nh, L, S]
        if mask is not None:
            scores = tern.op.Add(scores, _const(mask, like=scores))
        attn = tern.op.Softmax(scores, axis=-1)
        if self.dropout > 0.0 and self.training:
            attn = F.dropout(attn, self.dropout, True)
        out = tern.op.MatMul(attn, v)  # [N*nh, L, hd]
        out = F._reshape(F._transpose(out, [1, 0, 2]), [L * N, E])
        out = F._reshape(self.out_proj(out), [L, N, E])
        if batched and self.batch_first:
            out = F._transpose(out, [1, 0, 2])
        if not batched:
            out = F._squeeze(out, 1)
        if not need_weights:
            return out, None
        w = F._reshape(attn, [N, nh, L, S])
        if average_attn_weights:
            w = tern.op.ReduceMean(w, _i64([1]), keepdims=0)
        if not batched:
            w = F._squeeze(w, 0)
        return out, w


# ---------------------------------------------------------------- activations and shapes

class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input)


class ReLU6(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu6(input)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope)


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.elu(input, self.alpha)


class GELU(Module):
    def __init__(self, approximate='none'):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, self.approximate)


class SiLU(Module):
    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, input):
        return F.silu(input)


class Sigmoid(Module):
    def forward(self, input):
        return F.sigmoid(input)


class Tanh(Module):
    def forward(self, input):
        return F.tanh(input)


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)


class LogSoftmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.log_softmax(input, self.dim)


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        x = _as_tensor(input)
        shape = list(x.shape)
        r = len(shape)
        if r == 0:
            return F._reshape(x, [1])
        s, e = self.start_dim % r, self.end_dim % r
        if s > e:
            raise ValueError('flatten() has invalid args: start_dim cannot come after end_dim')
        new = shape[:s] + [int(np.prod(shape[s:e + 1]))] + shape[e + 1:]
        return F._reshape(x, new)


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input):
        shape = list(input.shape)
        d = self.dim % len(shape)
        return F._reshape(input, shape[:d] + list(self.unflattened_size) + shape[d + 1:])


class MaxPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input):
        return F.max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)


class MaxPool2d(MaxPool1d):
    def forward(self, input):
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self):
        return 'kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s' % (
            self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AvgPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, input):
        return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, input):
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self):
        return 'output_size=%s' % (self.output_size,)


# ---------------------------------------------------------------- losses

class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction='mean'):
        super().__init__()
        self.reduction = F._reduction_arg(size_average, reduce, reduction)


class CrossEntropyLoss(_Loss):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean',
                 label_smoothing=0.0):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer('weight', None if weight is None else _as_tensor(weight))
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_Loss):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean'):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer('weight', None if weight is None else _as_tensor(weight))
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, size_average=None, reduce=None, reduction='mean', beta=1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class BCELoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction='mean'):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer('weight', None if weight is None else _as_tensor(weight))

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction='mean', pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer('weight', None if weight is None else _as_tensor(weight))
        self.register_buffer('pos_weight', None if pos_weight is None else _as_tensor(pos_weight))

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
