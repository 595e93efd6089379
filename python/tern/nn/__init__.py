"""tern.nn: PyTorch-style layers (torch.nn's names, arguments, parameter names and state_dict keys)
on tern's eager operators. tern.nn.functional holds the functions, tern.nn.init the initialisers.

    import tern, tern.nn as nn
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model.load_state_dict({k: v.numpy() for k, v in torch_model.state_dict().items()})
"""
from . import functional
from . import init
from . import utils
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all

__all__ = list(_modules_all) + ['Parameter', 'functional', 'init']


def __getattr__(name):
    # tern.nn.Parameter is tern.Parameter (looked up late: tern may import tern.nn while it loads)
    if name == 'Parameter':
        import tern
        return tern.Parameter
    raise AttributeError("module 'tern.nn' has no attribute '%s'" % name)
