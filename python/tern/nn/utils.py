"""tern.nn.utils: gradient clipping as torch.nn.utils'."""
import math

import tern

__all__ = ['clip_grad_norm_', 'clip_grad_value_']


def _grads(parameters):
    if isinstance(parameters, tern.Tensor):
        parameters = [parameters]
    return [p for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scales the gradients of parameters so that their global norm is at most max_norm, as
    torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), applied when below 1);
    returns the norm before clipping, a 0-d tensor."""
    ps = _grads(parameters)
    if not ps:
        return tern.tensor(0.0)
    with tern.no_grad():
        if math.isinf(norm_type):
            total = max(float(abs(p.grad).max().item()) for p in ps)
        else:
            total = sum(float((abs(p.grad) ** norm_type).sum().item()) for p in ps) ** (1.0 / norm_type)
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1:
            for p in ps:
                p.grad = (p.grad * coef).detach()
    return tern.tensor(total)


def clip_grad_value_(parameters, clip_value):
    """Limits every gradient element to [-clip_value, clip_value]."""
    with tern.no_grad():
        for p in _grads(parameters):
            p.grad = p.grad.clamp(-float(clip_value), float(clip_value)).detach()
