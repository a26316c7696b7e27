"""Inner optimizers: pure ``init``/``update`` over NamedTuple states, step for step equal to
``torch.optim`` in float64, one module per algorithm, each with its tangent rule beside it
(:mod:`hypergrad.optim.base` describes the interface).

Each argument (``lr``, ``momentum``, ``betas``, ``weight_decay``, ``eps``, ...) is either a
constant number or the *name* of a hyperparameter, read at every step from ``hp`` (a mapping name
-> value; per-tensor hyperparameters give a dict param name -> value). Every factory also takes
``clip_grad_norm=c``: the gradient clipped to global norm ``c`` before the update, as
``torch.nn.utils.clip_grad_norm_`` (:mod:`hypergrad.optim.clip`, with its tangent).

Example:
    >>> opt = sgd(lr="lr", momentum=0.9, weight_decay="wd")
    >>> sorted(opt.bound_names())
    ['lr', 'wd']
"""

from __future__ import annotations

from .adagrad import Adagrad, AdagradState, adagrad
from .adam import Adam, AdamState, AdamW, adam, adamw
from .base import Optimizer, PerParam, TangentContext, create, register, registered, safe_sqrt
from .clip import ClipGradNorm, clip_grad_norm
from .rmsprop import RMSprop, RMSpropState, rmsprop
from .schedulefree import AdamWScheduleFree, ScheduleFreeState, adamw_schedulefree
from .sgd import SGD, SGDState, sgd

__all__ = ["Optimizer", "PerParam", "TangentContext", "safe_sqrt", "register", "registered",
           "create", "SGD", "SGDState", "sgd", "Adam", "AdamW", "AdamState", "adam", "adamw",
           "RMSprop", "RMSpropState", "rmsprop", "Adagrad", "AdagradState", "adagrad",
           "AdamWScheduleFree", "ScheduleFreeState", "adamw_schedulefree",
           "ClipGradNorm", "clip_grad_norm"]
