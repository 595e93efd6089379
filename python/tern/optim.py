"""tern.optim: torch.optim's SGD, Adam, AdamW and Adagrad on tern's optimizers (tern._tern.Optimizer,
which applies torch.optim's update rules).

Each parameter group runs on one tern._tern.Optimizer (SGD), or one per parameter (Adam, AdamW and
Adagrad: torch.optim counts steps per parameter, and a parameter without a gradient at a step does
not advance its count, which one optimizer over the group would); the group's 'lr' is copied into
them before every step, so opt.param_groups[i]['lr'] = x takes effect at the next step (as with
torch.optim and its learning-rate schedulers). The other hyper-parameters are fixed when the group
is added.
"""
import tern

__all__ = ['Optimizer', 'SGD', 'Adam', 'AdamW', 'Adagrad', 'lr_scheduler']


class _Required:
    def __repr__(self):
        return '<required parameter>'


required = _Required()


class Optimizer:
    """Base class: param_groups (a list of dicts with 'params' and the hyper-parameters) and one tern
    optimizer per group."""

    _kind = None
    _state_always = False  # Adagrad: a state entry before the first step
    _state_has_step = True  # torch keeps a 'step' (not SGD)
    _fixed = ()  # hyper-parameters that cannot change after the group is added
    _per_param = False  # one tern optimizer per parameter (the update depends on its own step count)

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.param_groups = []
        self._engines = []  # per group: ([(params, tern optimizer), ...], the fixed hyper-parameters)
        self._steps = 0
        self.state = {}
        if _is_tensor_like(params):
            raise TypeError('params argument given to the optimizer should be an iterable of Tensors or dicts, '
                            'but got ' + type(params).__name__)
        groups = list(params)
        if len(groups) == 0:
            raise ValueError('optimizer got an empty parameter list')
        if not isinstance(groups[0], dict):
            groups = [{'params': groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError('param group must be a dict')
        group = dict(param_group)
        params = group['params']
        if _is_tensor_like(params):
            params = [params]
        elif isinstance(params, set):
            raise TypeError('optimizer parameters need to be organized in ordered collections, but the ordering '
                            'of tensors in sets will change between runs. Please use a list instead.')
        else:
            params = list(params)
        for p in params:
            if not _is_tensor_like(p):
                raise TypeError('optimizer can only optimize Tensors, but one of the params is ' + type(p).__name__)
            if not getattr(p, 'is_leaf', True):
                raise ValueError("can't optimize a non-leaf Tensor")
        group['params'] = params
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError("parameter group didn't specify a value of required optimization parameter " + k)
            group.setdefault(k, v)
        seen = set()
        for g in self.param_groups:
            seen.update(id(p) for p in g['params'])
        if any(id(p) in seen for p in params) or len(set(map(id, params))) != len(params):
            raise ValueError('some parameters appear in more than one parameter group')
        self._check(group)
        self.param_groups.append(group)
        if self._per_param:
            engines = [([p], self._make(dict(group, params=[p]))) for p in params]
        else:
            engines = [(params, self._make(group))] if params else []
        self._engines.append((engines, {k: group[k] for k in self._fixed}))

    def _check(self, group):
        pass

    def _make(self, group):
        raise NotImplementedError

    def zero_grad(self, set_to_none=True):
        """Clears the gradients of every parameter (set_to_none=False: sets them to zeros where the tensor
        allows it)."""
        for engines, _ in self._engines:
            for params, engine in engines:
                if set_to_none:
                    engine.zero_grad()
                    continue
                for p in params:
                    g = getattr(p, 'grad', None)
                    if g is not None:
                        p.grad = tern.zeros(tuple(g.shape), dtype=g.dtype)

    def step(self, closure=None):
        """One update of every parameter that has a gradient (torch.optim's rule); closure: re-evaluates
        the model and returns the loss (called first, as torch.optim does)."""
        loss = None
        if closure is not None:
            loss = closure()
        for (engines, fixed), group in zip(self._engines, self.param_groups):
            for k, v in fixed.items():
                if group[k] != v:
                    raise ValueError("tern.optim: '%s' of a parameter group cannot change after it is added "
                                     "(only 'lr' can)" % k)
        for (engines, _), group in zip(self._engines, self.param_groups):
            lr = float(group['lr'])
            for params, engine in engines:
                if self._per_param and params[0].grad is None:
                    continue  # torch.optim skips it: its step count stays
                if engine.lr != lr:
                    engine.lr = lr
                engine.step()
        self._steps += 1
        return loss

    @property
    def steps(self):
        """The number of step() calls."""
        return self._steps

    _state_names = ()  # torch.optim's names of the per-parameter state tensors, in the engine's order

    def _slots(self):
        """Every parameter in param_groups order, with its engine and its index in that engine."""
        for engines, _ in self._engines:
            for params, engine in engines:
                for k, p in enumerate(params):
                    yield p, engine, k

    def state_dict(self):
        """torch.optim's form: {'state': {index: {'step': n, name: ndarray, ...}}, 'param_groups': [group
        with 'params' as indices]}, the tensors as numpy copies. A parameter that has not taken a step has
        no entry (Adagrad's always have one, as torch's)."""
        import numpy as np
        state = {}
        for i, (p, engine, k) in enumerate(self._slots()):
            steps = engine.param_steps(k)
            if steps == 0 and not self._state_always:
                continue
            entry = {'step': float(steps)} if self._state_has_step else {}
            for slot, name in enumerate(self._state_names):
                entry[name] = np.array(engine.state(k, slot).numpy()) if engine.num_state > slot else None
            state[i] = entry
        groups, n = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != 'params'}
            d['params'] = list(range(n, n + len(g['params'])))
            n += len(g['params'])
            groups.append(d)
        return {'state': state, 'param_groups': groups}

    def load_state_dict(self, state_dict):
        """Restores state_dict() (or a torch.optim state_dict with its tensors as numpy arrays): the groups'
        hyper-parameters ('lr' and the others, which must equal this optimizer's where they cannot change),
        and each parameter's state and step count."""
        import numpy as np
        groups = state_dict['param_groups']
        if len(groups) != len(self.param_groups):
            raise ValueError('loaded state dict has a different number of parameter groups (%d, not %d)'
                             % (len(groups), len(self.param_groups)))
        for i, (g, mine) in enumerate(zip(groups, self.param_groups)):
            if len(g['params']) != len(mine['params']):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                                 "optimizer's group (group %d: %d parameters, not %d)"
                                 % (i, len(g['params']), len(mine['params'])))
            for k in self._fixed:
                if k in g and _same(g[k]) != _same(mine[k]):
                    raise ValueError("tern.optim: group %d's '%s' is %r in the state dict and %r here (it cannot "
                                     "change after the group is added)" % (i, k, g[k], mine[k]))
        index = [pid for g in groups for pid in g['params']]
        state = state_dict.get('state', {})
        slots = list(self._slots())
        for pos, (p, engine, k) in enumerate(slots):
            entry = state.get(index[pos])
            if entry is None:
                entry = {}
            for slot, name in enumerate(self._state_names):
                if engine.num_state <= slot:
                    continue
                target = engine.state(k, slot)
                value = entry.get(name)
                value = np.zeros(tuple(target.shape)) if value is None else np.asarray(value)
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError("state '%s' of parameter %d has shape %s, the parameter %s"
                                     % (name, index[pos], tuple(value.shape), tuple(target.shape)))
                target.copy_(value.astype(np.float64 if target.dtype == 'float64' else np.float32))
            # SGD's entries have no 'step' (its count matters to nothing but state_dict): an entry
            # means that the parameter has stepped
            step = entry.get('step', 1.0 if entry else 0.0)
            engine.param_steps(k, int(round(float(np.asarray(step)))))
        for g, mine in zip(groups, self.param_groups):
            for k, v in g.items():
                if k != 'params' and k not in self._fixed:
                    mine[k] = v

    def __repr__(self):
        s = type(self).__name__ + ' ('
        for i, group in enumerate(self.param_groups):
            s += '\nParameter Group %d' % i
            for k in sorted(group):
                if k != 'params':
                    s += '\n    %s: %s' % (k, group[k])
        return s + '\n)'


def _same(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _is_tensor_like(x):
    t = getattr(tern, 'Tensor', None)
    if isinstance(t, type):
        return isinstance(x, t)
    return hasattr(x, 'backward') and hasattr(x, 'shape')


def _no(group, key, what):
    if group.get(key):
        raise NotImplementedError('tern.optim: %s is not supported' % what)


def _engine(kind, group, **kw):
    return tern._tern.Optimizer(kind, list(group['params']), float(group['lr']), **kw)


class SGD(Optimizer):
    """torch.optim.SGD: v = momentum v + g (+ weight_decay p); p -= lr (g + momentum v if nesterov else v).
    dampening must be 0."""

    _fixed = ('momentum', 'dampening', 'weight_decay', 'nesterov', 'maximize')
    _state_names = ('momentum_buffer',)
    _state_has_step = False

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False):
        if lr is not required and lr < 0.0:
            raise ValueError('Invalid learning rate: {}'.format(lr))
        if momentum < 0.0:
            raise ValueError('Invalid momentum value: {}'.format(momentum))
        if weight_decay < 0.0:
            raise ValueError('Invalid weight_decay value: {}'.format(weight_decay))
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError('Nesterov momentum requires a momentum and zero dampening')
        super().__init__(params, defaults)

    def _check(self, group):
        if group['dampening'] != 0:
            raise NotImplementedError('tern.optim.SGD: only dampening=0 is supported')
        if group['nesterov'] and (group['momentum'] <= 0 or group['dampening'] != 0):
            raise ValueError('Nesterov momentum requires a momentum and zero dampening')
        _no(group, 'maximize', 'maximize=True')

    def _make(self, group):
        return _engine('sgd', group, momentum=float(group['momentum']), nesterov=bool(group['nesterov']),
                       weight_decay=float(group['weight_decay']))


class Adam(Optimizer):
    """torch.optim.Adam (weight_decay: L2, added to the gradient)."""

    _kind = 'adam'
    _per_param = True
    _state_names = ('exp_avg', 'exp_avg_sq')
    _fixed = ('betas', 'eps', 'weight_decay', 'amsgrad', 'maximize')

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None):
        if not 0.0 <= lr:
            raise ValueError('Invalid learning rate: {}'.format(lr))
        if not 0.0 <= eps:
            raise ValueError('Invalid epsilon value: {}'.format(eps))
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError('Invalid beta parameter at index 0: {}'.format(betas[0]))
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError('Invalid beta parameter at index 1: {}'.format(betas[1]))
        if not 0.0 <= weight_decay:
            raise ValueError('Invalid weight_decay value: {}'.format(weight_decay))
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _check(self, group):
        group['betas'] = tuple(group['betas'])
        _no(group, 'amsgrad', 'amsgrad=True')
        _no(group, 'maximize', 'maximize=True')

    def _make(self, group):
        b1, b2 = group['betas']
        return _engine(self._kind, group, weight_decay=float(group['weight_decay']), betas=(float(b1), float(b2)),
                       eps=float(group['eps']))


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay: p -= lr weight_decay p)."""

    _kind = 'adamw'

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


class Adagrad(Optimizer):
    """torch.optim.Adagrad: clr = lr / (1 + (t - 1) lr_decay); sum += g^2; p -= clr g / (sqrt(sum) + eps).
    initial_accumulator_value must be 0."""

    _fixed = ('lr_decay', 'weight_decay', 'eps', 'initial_accumulator_value', 'maximize')
    _per_param = True
    _state_names = ('sum',)
    _state_always = True

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False):
        if not 0.0 <= lr:
            raise ValueError('Invalid learning rate: {}'.format(lr))
        if not 0.0 <= lr_decay:
            raise ValueError('Invalid lr_decay value: {}'.format(lr_decay))
        if not 0.0 <= weight_decay:
            raise ValueError('Invalid weight_decay value: {}'.format(weight_decay))
        if not 0.0 <= initial_accumulator_value:
            raise ValueError('Invalid initial_accumulator_value value: {}'.format(initial_accumulator_value))
        if not 0.0 <= eps:
            raise ValueError('Invalid epsilon value: {}'.format(eps))
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, maximize=maximize))

    def _check(self, group):
        if group['initial_accumulator_value'] != 0:
            raise NotImplementedError('tern.optim.Adagrad: only initial_accumulator_value=0 is supported')
        _no(group, 'maximize', 'maximize=True')

    def _make(self, group):
        return _engine('adagrad', group, weight_decay=float(group['weight_decay']), eps=float(group['eps']),
                       lr_decay=float(group['lr_decay']))


class _LRSchedulers:
    """tern.optim.lr_scheduler: StepLR, ExponentialLR, LambdaLR (they write param_groups' 'lr')."""

    class _LRScheduler:
        def __init__(self, optimizer, last_epoch=-1):
            self.optimizer = optimizer
            for g in optimizer.param_groups:
                g.setdefault('initial_lr', g['lr'])
            self.base_lrs = [g['initial_lr'] for g in optimizer.param_groups]
            self.last_epoch = last_epoch
            self.step()

        def get_lr(self):
            raise NotImplementedError

        def get_last_lr(self):
            return self._last_lr

        def step(self):
            self.last_epoch += 1
            for g, lr in zip(self.optimizer.param_groups, self.get_lr()):
                g['lr'] = lr
            self._last_lr = [g['lr'] for g in self.optimizer.param_groups]

    class StepLR(_LRScheduler):
        def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
            self.step_size, self.gamma = step_size, gamma
            super().__init__(optimizer, last_epoch)

        def get_lr(self):
            return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]

    class ExponentialLR(_LRScheduler):
        def __init__(self, optimizer, gamma, last_epoch=-1):
            self.gamma = gamma
            super().__init__(optimizer, last_epoch)

        def get_lr(self):
            return [b * self.gamma ** self.last_epoch for b in self.base_lrs]

    class LambdaLR(_LRScheduler):
        def __init__(self, optimizer, lr_lambda, last_epoch=-1):
            n = len(optimizer.param_groups)
            self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
            super().__init__(optimizer, last_epoch)

        def get_lr(self):
            return [b * f(self.last_epoch) for b, f in zip(self.base_lrs, self.lr_lambdas)]


lr_scheduler = _LRSchedulers
