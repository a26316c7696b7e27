"""Running a user's ``nn.Module`` as a pure function of (parameters, buffers), BatchNorm included.

``torch.func.functional_call`` runs any module on tensors we pass in. One thing it cannot do is
BatchNorm's running statistics: the native kernel updates them *in place*, outside autograd, so
their dependence on the weights (hence on the hyperparameters) is lost, and under ``vmap`` the
in-place update fails. Validation in eval mode reads exactly those statistics: carrying them as
constants gives hypergradients 50-70% off (measured against finite differences). So while the model
runs here, each BatchNorm module computes its statistics out of place and returns the new running
statistics as outputs: they become state with tangents like any other.

The same holds for the other tensors a module's forward updates: spectral normalisation's
power-iteration vectors (run out of place here, see :class:`_SNForward`), and any buffer a user's
forward writes (in place or by assignment), found by one probe pass
(:class:`ModelProbe`, run by ``InnerProblem.check``) and then carried as state: floating buffers
with tangents, integer and boolean ones as numbers without a derivative. What cannot be
differentiated is refused up front, naming the module: weights written in place in forward
(``weight.data.clamp_()``, ``nn.Embedding(max_norm=...)``), buffers updated from the weights under
``torch.no_grad()``, the hook-based ``torch.nn.utils.spectral_norm`` / ``weight_norm``, an
``nn.Embedding(padding_idx=...)`` whose padding row training moves.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import parametrizations as _pz
from torch.nn.utils import parametrize as P

from .rng import STATE_LOCK

__all__ = ["FunctionalModel", "ModelFn", "ModelProbe"]

_SpectralNorm: type[nn.Module] = _pz._SpectralNorm
_WeightNorm: type[nn.Module] = _pz._WeightNorm


def _dense_copy(t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """A copy of ``t`` (in ``dtype`` if given) in torch's default contiguous layout."""
    return t.to(dtype=dtype or t.dtype, memory_format=torch.contiguous_format, copy=True)


def _exact_in(name: str, value: Tensor, dtype: torch.dtype) -> None:
    """Refuse an integer buffer forward writes whose values ``dtype`` (the model's, in which
    the state carries it) cannot hold exactly: a float32 model's counter past 2**24 came back
    rounded (16777217 as 16777216), and a forward reading ``n % 2`` trained otherwise than
    torch, with no word (the dtypes probe)."""
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        return
    if value.numel() == 0 or value.is_meta or torch.compiler.is_compiling():
        return  # no read inside a compiled graph (a graph break there)
    exact = int(2 / torch.finfo(dtype).eps)  # 2**24 in float32, 2**53 in float64
    top = int(value.detach().abs().max())
    if top > exact:
        raise ValueError(
            f"the model's buffer {name!r} ({value.dtype}), written by its forward, reached "
            f"{top}: the training state carries it as {dtype}, exact up to {exact} only, so "
            f"it would be rounded. Build the model in float64 (model.double(), exact to "
            f"2**53), or keep the count smaller (count steps, not examples).")


def _sums(tensors: Sequence[Tensor]) -> Tensor | None:
    """Each tensor's sum and sum of squares in float64, stacked on the first one's device:
    what tells a write through ``.data`` (which leaves ``_version`` as it was) in one
    comparison per run."""
    rows = []
    for t in tensors:
        x = t.detach()
        if x.is_meta:
            continue
        x = torch.view_as_real(x) if x.is_complex() else x
        x = x.to(torch.float64)
        rows.append(torch.stack([x.sum(), x.square().sum()]).to(tensors[0].device))
    return torch.stack(rows) if rows else None


class FunctionalModel:
    """A module split into trainable parameters, tracked buffers (state) and constants.

    - ``param_names``: parameters with ``requires_grad`` (trained, tangents carried). A
      parametrized weight (``torch.nn.utils.parametrize``) is trained through its
      ``parametrizations.<name>.original*`` tensors, so the parametrization runs in every pass.
    - ``state_buffer_names``: the buffers training updates, carried as state with tangents:
      running means/variances of the BatchNorm layers, the ``_u``/``_v`` vectors of
      ``torch.nn.utils.parametrizations.spectral_norm``, and the buffers a probe pass found the
      model's forward writing (:meth:`track`; integer and boolean ones travel as floats of the
      model's dtype without a derivative). ``num_batches_tracked`` counters follow the step
      index and carry no tangent.
    - everything else (frozen parameters, other buffers, the statistics of a BatchNorm in eval
      mode) is a constant.

    Spectral normalisation: its power iteration runs out of place here and is differentiated
    (torch's kernel writes ``_u``/``_v`` under ``torch.no_grad()``, which would leave their
    dependence on the weights out of every derivative). Every value a pass computes equals
    torch's (the vectors, sigma, the normalised weight, the loss); the training gradient adds
    the term through the power iteration that torch's stops, which vanishes as the iteration
    converges. That term makes the step the gradient of one function, so forward mode, reverse
    mode and finite differences agree exactly.

    Train/eval mode: training runs every submodule in the mode it had when this object was built
    (the root module itself in train mode), as Lightning does since 2.2: a BatchNorm or Dropout
    the user put in eval mode (frozen statistics, the classic fine-tuning setup) stays in eval
    mode during training. Validation in ``val_mode="eval"`` runs every module in eval mode.
    """

    def __init__(self, module: nn.Module) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"InnerProblem: model must be a torch.nn.Module, got {type(module).__name__}."
            )
        _refuse_scripted(module)
        _refuse_lazy(module)
        self.module = module
        params = dict(module.named_parameters())
        self.param_names = [k for k, p in params.items() if p.requires_grad]
        if not self.param_names:
            raise ValueError(
                "InnerProblem: the model has no parameter with requires_grad=True; there is "
                "nothing to train."
            )
        for k in self.param_names:
            if not params[k].dtype.is_floating_point:
                # model.double() leaves a complex parameter complex (the dtypes probe)
                fix = ("a complex parameter as two real ones (its real and imaginary parts), "
                       "or torch.view_as_real of it" if params[k].dtype.is_complex else
                       "model.float() or model.double()")
                raise TypeError(
                    f"InnerProblem: parameter {k!r} has dtype {params[k].dtype}; hypergradients "
                    f"need real floating parameters ({fix})."
                )
        meta = [k for k in self.param_names if params[k].is_meta]
        if meta:  # failed as torch's "Tensor.item() cannot be called on meta tensors"
            raise ValueError(
                f"InnerProblem: the model's parameters {meta[:3]} are on the meta device, "
                f"which holds no values: build the model on a real device, or materialise it "
                f"(model.to_empty(device='cpu') and load_state_dict or an initialisation) "
                f"before building the problem.")
        dtypes = {params[k].dtype for k in self.param_names}
        if len(dtypes) > 1:
            raise TypeError(
                f"InnerProblem: trainable parameters mix dtypes {sorted(map(str, dtypes))}; "
                f"convert the model to one dtype (model.double() or model.float())."
            )
        self.dtype = dtypes.pop()
        if self.dtype in (torch.float16, torch.bfloat16):
            raise TypeError(
                f"InnerProblem: the model's parameters are {self.dtype}; hypergradients need "
                f"float32 or float64: tangents carried over T steps and Hessian-vector products "
                f"keep 8 to 11 bits in half precision, so the hypergradient would be rounding "
                f"noise. Use model.float() (or model.double(), which hypergradcheck needs)."
            )
        _refuse_unsupported(module)
        _warn_gradient_hooks(params)
        self.device = params[self.param_names[0]].device
        # the modes training runs each submodule in: the user's, the root in train mode
        self.named_modules = list(module.named_modules())  # walked at every call (_mode)
        self.train_modes = {name: (m.training or name == "") for name, m in self.named_modules}
        self.bn: dict[str, _BatchNorm] = {
            name: m for name, m in module.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and self.train_modes[name]
        }
        self.sn: dict[str, nn.Module] = {
            name: m for name, m in module.named_modules()
            if isinstance(m, _SpectralNorm) and hasattr(m, "_u") and self.train_modes[name]
        }
        self.wn = [m for m in module.modules() if isinstance(m, _WeightNorm)]
        self.rnn = [m for m in module.modules() if isinstance(m, nn.RNNBase)]
        self.sparse = [m for m in module.modules() if isinstance(m, nn.Embedding) and m.sparse]
        """Embeddings with ``sparse=True``: run dense here (the same values; the optimizers
        and every transform take dense gradients)."""
        self.aliases = _aliases(module)
        """A submodule registered under two names (``self.a = self.b = layer``, a ModuleList of
        one shared block): each tensor's name -> the other names that reach it through another
        module (tied weights), all given to the functional call with ``tie_weights=False``
        (torch's own tying swaps the shared module's tensor twice and left the user's module
        holding this run's plain tensors instead of its parameters); ``None`` where no
        submodule has two names."""
        self.parametrized = any(P.is_parametrized(m) for m in module.modules())
        """Whether a submodule has a ``torch.nn.utils.parametrize`` parametrization (refused
        under ``parametrize.cached()``, see :meth:`bind`)."""
        self.attention = any(isinstance(m, _FASTPATH) for m in module.modules())
        """Whether the model has a module with torch's attention fast path: every call here
        runs with the fast path off (see :meth:`ModelFn._patched`)."""
        names = {id(p): k for k, p in params.items() if p.requires_grad}
        self.padded = {name: (names[id(m.weight)], m.padding_idx)
                       for name, m in module.named_modules()
                       if type(m) is nn.Embedding and m.padding_idx is not None
                       and id(m.weight) in names}
        """Embeddings with a ``padding_idx`` whose weight trains: module name -> (weight's
        name, padding row); :meth:`check_padding` refuses those whose padding row moves."""
        self.state_buffer_names = [f"{_pre(n)}{b}" for n in self.bn
                                   for b in ("running_mean", "running_var")]
        self.sn_buffer_names = [f"{_pre(n)}{b}" for n in self.sn for b in ("_u", "_v")]
        """spectral_norm's vectors: state that follows the weights alone."""
        self.state_buffer_names += self.sn_buffer_names
        self.counter_names = [f"{_pre(n)}num_batches_tracked" for n in self.bn]
        self.generic: dict[str, torch.dtype] = {}
        """Buffers the model's forward writes itself, name -> their own dtype (:meth:`track`)."""
        state_like = set(self.state_buffer_names) | set(self.counter_names)
        self.constants = {k: p.detach() for k, p in params.items() if not p.requires_grad}
        self.constants.update({k: b for k, b in module.named_buffers() if k not in state_like})
        self.counters0 = {k: int(module.get_buffer(k)) for k in self.counter_names}
        self.probed = False
        """Whether a probe pass has found the buffers forward writes (``InnerProblem.check``)."""
        self.refused: ValueError | None = None
        """What the probe refused (raised again by later checks: the probe runs once)."""
        self._reader: _Reader | None = None
        self._as_built = {k: (t, t._version) for k, t in
                          [*module.named_parameters(), *module.named_buffers()]}
        """Each parameter and buffer with its version counter when the problem was built: the
        initial weights are read from the module at every run, so training the module (or
        scaling it in place) afterwards moved every later run's start with no word."""
        self._built_sums = _sums([t for t, _ in self._as_built.values()])
        """Their sums and sums of squares then (:meth:`unchanged`: a write through ``.data``
        leaves the version counter as it was)."""
        self.fresh: dict[str, Tensor] | None = None
        """Other initial weights (and running statistics) training starts from instead of the
        module's, by name: set inside :meth:`InnerProblem.variant
        <hypergrad.InnerProblem.variant>` from the problem's ``model_factory``."""

    def check_padding(self, params: Mapping[str, Tensor],
                      grads: Mapping[str, Tensor | None]) -> None:
        """Refuse an ``nn.Embedding(padding_idx=p)`` whose padding row training moves: a
        non-zero row (weight decay or an initial scale moves it) or a non-zero gradient there
        (``grads``, of the training loss at ``params``: the weight is also read elsewhere, e.g.
        tied to an output layer). torch's gradient leaves out the row's lookups although the
        forward pass reads them, so it is not the loss's gradient: once the row moves, the
        methods' derivatives of training disagree with finite differences."""
        for name, (k, pad) in self.padded.items():
            g = grads.get(k)
            if bool(params[k][pad].ne(0).any()):
                why = "its padding row is non-zero (weight decay or an initial scale moves it)"
            elif g is not None and bool(g[pad].ne(0).any()):
                why = (f"the training loss's gradient at {k!r} is non-zero in the padding row "
                       f"(the weight is also read outside the lookup, e.g. tied to an output "
                       f"layer)")
            else:
                continue
            raise ValueError(
                f"InnerProblem: module {name!r} is nn.Embedding(padding_idx={pad}) and {why}; "
                f"torch's gradient leaves out the row's lookups although forward reads them, "
                f"so once the row moves no method can differentiate training (hypergradients "
                f"0.3-11 % off finite differences, measured). Fix: padding_idx=None, masking "
                f"the padded positions yourself (e.g. emb(x) * (x != {pad}).unsqueeze(-1)), or "
                f"keep the row at zero and read the weight nowhere else.")

    def fresh_from(self, other: nn.Module, api: str) -> dict[str, Tensor]:
        """The trainable parameters and state buffers of ``other`` (a model built again),
        as this model's dtype and device; refused where its names or shapes differ."""
        params, bufs = dict(other.named_parameters()), dict(other.named_buffers())
        out: dict[str, Tensor] = {}
        for k in [*self.param_names, *self.state_buffer_names]:
            mine = (self.module.get_parameter(k) if k in self.param_names
                    else self.module.get_buffer(k))
            theirs = params.get(k, bufs.get(k))
            if theirs is None or theirs.shape != mine.shape:
                got = "none" if theirs is None else f"shape {tuple(theirs.shape)}"
                raise ValueError(
                    f"{api}: the model_factory's model has {got} for {k!r}, the problem's "
                    f"model shape {tuple(mine.shape)}; the factory must build the same "
                    f"architecture (only the initial weights may differ).")
            out[k] = theirs.detach().to(device=mine.device, dtype=mine.dtype)
        return out

    def track(self, names: Mapping[str, torch.dtype]) -> None:
        """Carry the buffers ``names`` (name -> their dtype) as training state: the model's
        forward writes them (found by a :class:`ModelProbe`). Each call of the model gets a copy
        in its own dtype and the value forward leaves becomes the new state, in the model's
        dtype (integers and booleans without a derivative)."""
        for k, dt in names.items():
            if k in self.generic or k in self.state_buffer_names:
                continue
            self.generic[k] = dt
            self.state_buffer_names.append(k)
            self.constants.pop(k, None)

    @property
    def reader(self) -> _Reader:
        """The module under a wrapper that also returns the buffers after forward."""
        if self._reader is None:
            self._reader = _Reader(self.module)
        return self._reader

    def unchanged(self) -> None:
        """Refuse a module whose parameters or buffers were written in place, or replaced,
        since the problem was built (its runs would start from other weights)."""
        now = {k: t for k, t in [*self.module.named_parameters(), *self.module.named_buffers()]}
        # a write through .data (a hand-written training loop's p.data -= lr * p.grad)
        # keeps the version counter: the values tell it (one comparison, one sync)
        changed: set[str] = set()
        built = self._built_sums
        sums = _sums([t for t, _ in self._as_built.values()]) if built is not None else None
        if sums is not None and built is not None and sums.shape == built.shape:
            differ = ~((sums == built) | (sums.isnan() & built.isnan())).all(dim=1)
            if bool(differ.any()):
                names = [k for k, (t, _) in self._as_built.items() if not t.is_meta]
                changed = {names[i] for i in differ.nonzero().flatten().tolist()}
        for k, (t, version) in self._as_built.items():
            if now.get(k) is not t or t._version != version or k in changed:
                how = ("replaced" if now.get(k) is not t else "written in place (trained, "
                       "rescaled or loaded)")
                raise ValueError(
                    f"InnerProblem: the model's {k!r} was {how} after the problem was built, "
                    f"so its runs would start from other initial weights than the problem's "
                    f"own (it reads them from the module). Build the problem from a module you "
                    f"leave as it is (InnerProblem(copy.deepcopy(model), ...)) and train or "
                    f"load the other copy, or build a new problem from the changed module.")
        trainable = [k for k, t in self.module.named_parameters() if t.requires_grad]
        if trainable != self.param_names:  # a layer frozen or unfrozen: it trained as before
            frozen = sorted(set(self.param_names) - set(trainable))
            thawed = sorted(set(trainable) - set(self.param_names))
            how = " and ".join(
                [f"{frozen} set to requires_grad=False"] * bool(frozen)
                + [f"{thawed} set to requires_grad=True"] * bool(thawed))
            raise ValueError(
                f"InnerProblem: the model's parameters {how} after the problem was built; the "
                f"problem trains the parameters that required grad when it was built, so the "
                f"change would be ignored. Freeze or unfreeze before building the problem "
                f"(InnerProblem(model, ...) after model.requires_grad_(...)), or build a new "
                f"problem from the changed module.")

    def initial_params(self) -> dict[str, Tensor]:
        """Copies of the initial weights, in torch's default (contiguous) layout: a model
        moved to ``channels_last`` failed in every batched product with torch's "NYI:
        querying is_contiguous inside of vmap" (the layout changes no value)."""
        if self.fresh is not None:
            return {k: _dense_copy(self.fresh[k]) for k in self.param_names}
        self.unchanged()
        return {k: _dense_copy(self.module.get_parameter(k).detach()) for k in self.param_names}

    def initial_buffers(self) -> dict[str, Tensor]:
        out = {}
        for k in self.state_buffer_names:
            b = (self.fresh[k] if self.fresh is not None and k in self.fresh
                 else self.module.get_buffer(k).detach())
            if k in self.generic:
                _exact_in(k, b, self.dtype)
            out[k] = _dense_copy(b, self.dtype if k in self.generic else None)
        return out

    def bind(self, params: dict[str, Tensor], buffers: dict[str, Tensor], train: bool,
             step: int = 0, fused: bool = False) -> ModelFn:
        """The model at ``params``/``buffers``. ``fused``: BatchNorm updates (copies of) its
        running statistics with torch's fused kernel, which no transform can differentiate;
        for plain steps only."""
        if self.parametrized and getattr(P, "_cache_enabled", False):
            # the cached weight is computed once from the module's own tensors, not from the
            # run's: training, forward, reverse and finite differences all read a frozen
            # weight, agreeing with each other and 36 % off torch (the dtypes probe)
            raise RuntimeError(
                "the model has a parametrization (torch.nn.utils.parametrize) and the call is "
                "inside parametrize.cached(), which computes the parametrized weight once "
                "from the module's own tensors: every step would read it frozen. Call "
                "hypergrad outside parametrize.cached().")
        return ModelFn(self, params, buffers, train, step, fused)

    def load_into(self, params: dict[str, Tensor], buffers: dict[str, Tensor], steps: int) -> None:
        """Write trained values back into the module (counters advanced by ``steps``)."""
        with torch.no_grad():
            for k, v in params.items():
                self.module.get_parameter(k).copy_(v)
            for k, v in buffers.items():
                b = self.module.get_buffer(k)
                if b.dtype == torch.bool:
                    v = v != 0
                elif not b.dtype.is_floating_point and not b.dtype.is_complex:
                    v = v.round()
                b.copy_(v)
            for k, c in self.counters0.items():
                self.module.get_buffer(k).fill_(c + steps)


def _pre(name: str) -> str:
    return f"{name}." if name else ""


def _aliases(module: nn.Module) -> dict[str, list[str]] | None:
    """:attr:`FunctionalModel.aliases`: ``None`` unless a submodule holding tensors is
    registered under two names; then each parameter's and buffer's name (as
    ``named_parameters`` / ``named_buffers`` give it) -> the names of its other slots (another
    module object holding the same tensor: tied weights)."""
    seen: dict[int, str] = {}
    shared = False
    slots: dict[int, dict[tuple[int, str], str]] = {}  # tensor -> (owner, attribute) -> name
    for name, m in module.named_modules(remove_duplicate=False):
        own = [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]
        if own and id(m) in seen:
            shared = True
        seen.setdefault(id(m), name)
        for attr, t in own:
            slots.setdefault(id(t), {}).setdefault((id(m), attr), f"{_pre(name)}{attr}")
    if not shared:
        return None
    out: dict[str, list[str]] = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        out[name] = [n for n in slots.get(id(t), {}).values() if n != name]
    return out


def _untied(tensors: dict[str, Tensor], aliases: dict[str, list[str]]) -> dict[str, Tensor]:
    """``tensors`` with each tied tensor's value also under its other slots' names."""
    out = dict(tensors)
    for k, v in tensors.items():
        for other in aliases.get(k, ()):
            out[other] = v
    return out


class ModelFn:
    """The model bound to given tensors: call it like the module. Given to the user's losses.

    Attributes:
        params: dict name -> trainable parameter tensor (read them for explicit penalties).
        buffers: dict name -> running statistics fed in.
        new_buffers: running statistics after the calls so far (train mode updates them).
    """

    def __init__(self, fm: FunctionalModel, params: dict[str, Tensor],
                 buffers: dict[str, Tensor], train: bool, step: int,
                 fused: bool = False, probe: ModelProbe | None = None) -> None:
        self._fm = fm
        self.params = params
        self.buffers = buffers
        self.new_buffers = dict(buffers)
        self.bn_calls: dict[str, int] = {}  # calls of each momentum=None BatchNorm
        self.training = train
        self.step = step
        self.fused = fused
        self._probe = probe

    def train(self, mode: bool = True) -> None:
        """Refused: the model a loss receives runs in the mode hypergrad sets (``m.train()``
        failed as "'bool' object is not callable": the callbacks probe)."""
        self._mode_refused("train")

    def eval(self) -> None:
        """Refused, as :meth:`train`."""
        self._mode_refused("eval")

    def _mode_refused(self, call: str) -> None:
        raise TypeError(
            f"m.{call}() inside a loss: the model a loss receives runs in the mode hypergrad "
            f"sets, training mode in train_loss and val_mode's ('eval' by default) in val_loss "
            f"and select_loss. Choose it with InnerProblem(val_mode='train' or 'eval'), not in "
            f"the loss (m.training says which it is).")

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """``(name, tensor)`` of every parameter of the module, as ``nn.Module``'s: the
        trainable ones at this step's values (``params``, differentiable), the frozen ones as
        the constants they are; for penalties written the usual way
        (``sum(w.pow(2).sum() for w in m.parameters())``)."""
        for k, _ in self._fm.module.named_parameters():
            v = self.params.get(k, self._fm.constants.get(k))
            if v is not None:
                yield k, v

    def parameters(self) -> Iterator[Tensor]:
        """The tensors of :meth:`named_parameters`."""
        for _, v in self.named_parameters():
            yield v

    def __getattr__(self, name: str) -> Any:
        """Only for names it lacks: an attribute of the user's module (``m.head(h)``,
        ``m.fc.weight``) is not reachable through the bound model, which says what is."""
        if name.startswith("__") or "_fm" not in self.__dict__:
            raise AttributeError(name)
        module = self._fm.module
        kind = ("submodule" if isinstance(getattr(module, name, None), torch.nn.Module) else
                "parameter" if name in self.params else
                "attribute" if hasattr(module, name) else None)
        mine = [k for k in self.params if k == name or k.startswith(f"{name}.")]
        hint = (f"read its parameters from m.params ({', '.join(repr(k) for k in mine[:4])}"
                f"{', ...' if len(mine) > 4 else ''})" if mine else
                "read parameters from m.params (a dict: name -> tensor)")
        what = f"your model's {kind} {name!r}" if kind else f"{name!r}"
        raise AttributeError(
            f"The model a loss receives is {type(module).__name__} bound to this step's "
            f"tensors (hypergrad's ModelFn), not the nn.Module itself, so {what} cannot be "
            f"reached through it: call it whole, m(x), which runs your module's forward (put "
            f"what the loss needs, e.g. a submodule's output, into what forward returns), "
            f"and {hint}.")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fm = self._fm
        tensors = {**fm.constants, **self.params, **self.new_buffers}
        if fm.generic or self._probe is not None:
            return self._call_reading(tensors, args, kwargs)
        with _mode(fm.named_modules, fm.train_modes if self.training else None), self._patched():
            if fm.aliases is not None:
                return functional_call(fm.module, _untied(tensors, fm.aliases), args, kwargs,
                                       strict=False, tie_weights=False)
            return functional_call(fm.module, tensors, args, kwargs, strict=False)

    def _call_reading(self, tensors: dict[str, Tensor], args: Any, kwargs: Any) -> Any:
        """The call when forward writes buffers: each gets a copy (in its own dtype) that
        forward may write in place or replace, and the value it leaves is read back inside the
        functional call (where an assignment is still visible)."""
        fm, probe = self._fm, self._probe
        for k, dt in fm.generic.items():
            tensors[k] = self.new_buffers[k].to(dt, copy=True)
        if probe is not None:
            tensors = probe.inputs(tensors)
        read = list(tensors) if probe is not None else list(fm.generic)
        with _mode(fm.named_modules, fm.train_modes if self.training else None), self._patched():
            given = tensors if fm.aliases is None else _untied(tensors, fm.aliases)
            out, after = functional_call(fm.reader, {"m." + k: v for k, v in given.items()},
                                         (args, kwargs, read), strict=False,
                                         tie_weights=fm.aliases is None)
        for k in fm.generic:
            v = after[k]
            if v.dtype != fm.dtype:
                if v.device.type == "cpu":  # on an accelerator the check would wait for it
                    _exact_in(k, v, fm.dtype)
                v = v.to(fm.dtype)
            self.new_buffers[k] = v
        if probe is not None:
            probe.record(tensors, after, self.training)
        return out

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        """BatchNorm and spectral normalisation out of place (their state as outputs), weight
        normalisation written out (torch's fused kernel has no forward-mode derivative),
        sparse embeddings dense."""
        fm = self._fm
        patched: list[nn.Module] = []
        # the flag and the patches are the process's (another thread's call would save the
        # flag this one set, or unpatch a shared module mid-call): one thread at a time
        locked = not torch.compiler.is_compiling() and STATE_LOCK.acquire()
        fastpath = fm.attention and torch.backends.mha.get_fastpath_enabled()  # hot path
        try:
            for name, bn in fm.bn.items():
                bn.forward = _BNForward(self, bn, _pre(name))  # type: ignore[method-assign,assignment]
                patched.append(bn)
            for name, sn in fm.sn.items():
                sn.forward = _SNForward(self, sn, _pre(name))  # type: ignore[method-assign]
                patched.append(sn)
            for wn in fm.wn:
                wn.forward = _WNForward(wn)  # type: ignore[method-assign,assignment]
                patched.append(wn)
            for r in fm.rnn:
                r.flatten_parameters = _Flatten(r)  # type: ignore[method-assign]
            for e in fm.sparse:
                e.sparse = False
            if fm.attention:
                # eager, in eval mode without autograd (finite differences, plain runs, the
                # validation loss), torch's attention takes its fast path, where a
                # TransformerEncoder turns a padded batch into a nested tensor and gives zeros
                # at padded positions; under torch.func it cannot, so the same point had two
                # validation losses (0.685 and 0.724): every call here takes the regular path
                torch.backends.mha.set_fastpath_enabled(False)
            yield
        finally:
            if fm.attention:
                torch.backends.mha.set_fastpath_enabled(fastpath)
            for m in patched:  # not `del m.forward`: torch.compile cannot trace it, and
                # every model with BatchNorm ran eager with "'BatchNorm1d' object has no
                # attribute 'forward'", blaming the model
                m.__dict__.pop("forward", None)
            for e in fm.sparse:
                e.sparse = True
            for r in fm.rnn:
                r.__dict__.pop("flatten_parameters", None)
            if locked:
                STATE_LOCK.release()


_FASTPATH = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)
"""The modules whose forward takes torch's attention fast path (``torch.backends.mha``)."""


class _Flatten:
    """``nn.RNNBase.flatten_parameters`` only for weights with storage. On CUDA, an RNN's
    forward first packs its weights into one buffer for cuDNN, reading each weight's
    ``data_ptr()``: ``torch.func``'s wrapped tensors and the fake tensors of a memory count
    (:mod:`hypergrad.footprint`) have none. Unpacked, cuDNN copies the weights (plain steps), and
    the differentiated passes run :mod:`hypergrad.rnn`'s cells anyway."""

    def __init__(self, m: nn.RNNBase) -> None:
        self.m = m

    def __call__(self) -> None:
        ws = [w for w in self.m._flat_weights if isinstance(w, Tensor)]
        if any(is_fake(w) or torch._C._functorch.is_functorch_wrapped_tensor(w) for w in ws):
            return
        type(self.m).flatten_parameters(self.m)


class _BNForward:
    """Out-of-place BatchNorm: same output as ``F.batch_norm``, running statistics as outputs."""

    def __init__(self, owner: ModelFn, m: _BatchNorm, prefix: str) -> None:
        self.owner, self.m, self.prefix = owner, m, prefix

    def __call__(self, x: Tensor) -> Tensor:
        m, o, pre = self.m, self.owner, self.prefix
        m._check_input_dim(x)
        rm_key, rv_key = pre + "running_mean", pre + "running_var"
        rm, rv = o.new_buffers[rm_key], o.new_buffers[rv_key]
        if not m.training:
            shape = (1, -1) + (1,) * (x.ndim - 2)
            y = (x - rm.reshape(shape)) * torch.rsqrt(rv.reshape(shape) + m.eps)
            if m.affine:
                y = y * m.weight.reshape(shape) + m.bias.reshape(shape)
            return y
        if m.momentum is None:  # cumulative moving average, as torch does
            o.bn_calls[pre] = o.bn_calls.get(pre, 0) + 1
            if o.bn_calls[pre] > 1:
                raise ValueError(
                    f"InnerProblem: the BatchNorm {pre[:-1] or type(m).__name__!r} with "
                    f"momentum=None (a cumulative average over batches) runs {o.bn_calls[pre]} "
                    f"times in one training step: its average counts one batch per step (torch "
                    f"counts one per call), so its running statistics would not be torch's. "
                    f"Call the model once per step (torch.cat the inputs), or give the "
                    f"BatchNorm a momentum (momentum=0.1, torch's default).")
            count = o._fm.counters0[pre + "num_batches_tracked"] + o.step + 1
            f = 1.0 / count
        else:
            f = m.momentum
        if o.fused:  # torch's kernel computes the statistics once and updates the copies
            rm, rv = rm.clone(), rv.clone()
            y = F.batch_norm(x, rm, rv, m.weight, m.bias, True, f, m.eps)
            o.new_buffers[rm_key], o.new_buffers[rv_key] = rm, rv
            return y
        y = F.batch_norm(x, None, None, m.weight, m.bias, True, 0.0, m.eps)
        dims = [0] + list(range(2, x.ndim))
        var, mean = torch.var_mean(x, dim=dims, correction=0)
        n = x.numel() // x.shape[1]
        o.new_buffers[rm_key] = (1 - f) * rm + f * mean
        o.new_buffers[rv_key] = (1 - f) * rv + f * var * (n / max(n - 1, 1))
        return y


class _SNForward:
    """``torch.nn.utils.parametrizations.spectral_norm`` out of place: the power iteration
    reads ``_u``/``_v`` from the state and returns the new vectors as state, differentiably (see
    :class:`FunctionalModel`); eval mode reads them as they are, as torch does."""

    def __init__(self, owner: ModelFn, m: Any, prefix: str) -> None:
        self.owner, self.m, self.prefix = owner, m, prefix

    def __call__(self, weight: Tensor) -> Tensor:
        m, o, pre = self.m, self.owner, self.prefix
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=m.eps)
        wm = m._reshape_weight_to_matrix(weight)
        u, v = o.new_buffers[pre + "_u"], o.new_buffers[pre + "_v"]
        if m.training:
            for _ in range(m.n_power_iterations):
                u = F.normalize(torch.mv(wm, v), dim=0, eps=m.eps)
                v = F.normalize(torch.mv(wm.H, u), dim=0, eps=m.eps)
            o.new_buffers[pre + "_u"], o.new_buffers[pre + "_v"] = u, v
        sigma = torch.vdot(u, torch.mv(wm, v))
        return weight / sigma


class _WNForward:
    """``torch.nn.utils.parametrizations.weight_norm`` written out, ``g v / ||v||`` (the norm
    over every dimension but ``dim``, the whole tensor for ``dim=-1``), as torch's
    ``_weight_norm`` computes it: its fused kernel has no forward-mode derivative."""

    def __init__(self, m: Any) -> None:
        self.dim = m.dim

    def __call__(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        if self.dim == -1:
            norm = torch.linalg.vector_norm(weight_v)
        else:
            keep = self.dim % weight_v.ndim
            dims = [d for d in range(weight_v.ndim) if d != keep]
            norm = torch.linalg.vector_norm(weight_v, dim=dims, keepdim=True)
        return weight_v * (weight_g / norm)


class _Reader(nn.Module):
    """The user's module as child ``m``; ``forward`` also returns the tensors ``read`` as they
    are after the module's forward (inside the functional call, where an assignment such as
    ``self.running_mean = ...`` is still visible). Wrapping does not change the module."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.m = module

    def forward(self, args: Any, kwargs: Any, read: list[str]) -> tuple[Any, dict[str, Tensor]]:
        out = self.m(*args, **(kwargs or {}))
        return out, {k: _lookup(self.m, k) for k in read}


def _lookup(module: nn.Module, name: str) -> Any:
    """The tensor at dotted ``name`` (a parameter, a buffer or a plain attribute)."""
    owner, _, leaf = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, leaf)


class ModelProbe:
    """What a model's forward writes, found in one probe pass (``InnerProblem.check`` runs the
    losses once with a :class:`ModelFn` that holds a probe).

    Every call gets a fresh copy of each constant (``override`` replaces some values), and the
    tensors forward leaves are compared with what went in: a tensor written in place (its
    version counter moved, or its values changed through ``.data``) or replaced by an
    assignment is a *write*. The caller gives trainable parameters that require grad, so that
    it can tell whether a written value depends on the weights through autograd.
    """

    def __init__(self, fm: FunctionalModel, override: Mapping[str, Tensor] | None = None
                 ) -> None:
        self.fm = fm
        self.override = dict(override or {})
        self.writes: dict[str, Tensor] = {}
        """name -> the value forward left, for every tensor it wrote (the last call's)."""
        self.train_writes: set[str] = set()
        """The names written by a call in training mode."""
        self._versions: dict[str, int] = {}
        self._before: dict[str, Tensor] = {}

    def inputs(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """The tensors of one call: trainable parameters as they are (the probe's caller gives
        copies), a copy of everything else."""
        out = {}
        for k, v in tensors.items():
            if k in self.fm.param_names:
                out[k] = v
            else:
                out[k] = self.override.get(k, v).detach().clone()
        self._versions = {k: v._version for k, v in out.items()}
        # what this call was given (a second call of the model in one loss gets the buffers
        # the first left: compared with the module's own values, they read as written)
        self._before = {k: v.detach().clone() for k, v in out.items()}
        return out

    def record(self, tensors: dict[str, Tensor], after: dict[str, Tensor], train: bool) -> None:
        for k, given in tensors.items():
            left = after.get(k, given)
            if not isinstance(left, Tensor):
                continue
            before = self._before[k]
            # an assignment (self.b = ...) is a write whatever its values: one whose first
            # value equals the initial one (a flag still off, an EMA from its second call)
            # was left out of the state and stayed at its initial value (the dtypes probe)
            written = (left is not given or given._version != self._versions[k]
                       or not _same(left, before))
            if written and (train or k not in self.train_writes):
                # the validation pass (under no_grad) writing the buffer again replaced the
                # training write, and a stateful RNN's self.h = hn, written with autograd,
                # was refused as "updated without autograd" (the stateful-models probe)
                self.writes[k] = left
                if train:
                    self.train_writes.add(k)


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.detach(), b.detach().to(a.device)))


def find_writers(fm: FunctionalModel, run: Callable[[], Any], names: list[str]
                 ) -> dict[str, str | None]:
    """For each tensor ``names`` that ``run`` (a probe pass) writes, the module whose own
    forward was running when it changed (``""`` the model itself; ``None``: outside any
    forward, in the loss). Hooks on every submodule compare the tensors between events."""
    stack: list[str] = []
    last: dict[str, tuple[Any, Tensor | None]] = {}
    found: dict[str, str | None] = {}
    mods = dict(fm.module.named_modules())

    def look() -> None:
        for k in names:
            if k in found:
                continue
            try:
                now = _lookup(fm.module, k)
            except AttributeError:
                continue
            if not isinstance(now, Tensor):
                continue
            prev = last.get(k)
            if prev is not None and (prev[0] is not now or prev[1] is None
                                     or not _same(now, prev[1])):
                found[k] = stack[-1] if stack else None
            last[k] = (now, now.detach().clone())

    def pre(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if not stack:
                last.clear()  # a new call: new copies
            look()
            stack.append(name)
        return hook

    def post(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            look()
            stack.pop()
        return hook

    handles = []
    try:
        for name, m in mods.items():
            handles.append(m.register_forward_pre_hook(pre(name)))
            handles.append(m.register_forward_hook(post(name)))
        run()
    finally:
        for h in handles:
            h.remove()
    return found


def describe_module(fm: FunctionalModel, name: str | None) -> str:
    """``module 'lin' (Linear)``, ``the model (MyNet)`` or ``the loss`` for messages."""
    if name is None:
        return "the loss (outside any module's forward)"
    m = fm.module.get_submodule(name) if name else fm.module
    return f"module {name!r} ({type(m).__name__})" if name else f"the model ({type(m).__name__})"


_SCRIPTED = ("under torch.func's transforms, which every method but FiniteDifference "
             "differentiates the training gradient with, TorchScript code's second derivatives "
             "come out as zero (torch {version}), so hypergradients are off by a few per cent "
             "without an error (2-3 % against finite differences, measured). Pass the "
             "un-scripted {what} while tuning (script the trained model afterwards).")


def _refuse_lazy(module: nn.Module) -> None:
    """A lazy module (``nn.LazyLinear``) before its first call has parameters without a shape:
    torch's own error came from hypergrad's internals (``Attempted to use an uninitialized
    parameter in <method 'detach'>``)."""
    from torch.nn.parameter import is_lazy

    lazy = [k for k, t in [*module.named_parameters(), *module.named_buffers()] if is_lazy(t)]
    if lazy:
        owner = lazy[0].rpartition(".")[0]
        kind = type(module.get_submodule(owner)).__name__ if owner else type(module).__name__
        raise ValueError(
            f"InnerProblem: the model's {lazy[0]!r} ({kind}"
            f"{f' {owner!r}' if owner else ''}) is a lazy module's parameter that torch has "
            f"not initialised yet (it gets its shape at the module's first call; "
            f"{len(lazy)} such tensor{'s' if len(lazy) > 1 else ''}). Call the model once on a "
            f"batch before building the problem, e.g. model(x[:2]), so that its parameters "
            f"exist (and hypergrad trains them from those initial values).")


def _refuse_scripted(module: nn.Module) -> None:
    """TorchScript in the model, refused by name: a scripted (sub)module, or a scripted
    function its forward calls by a global name or a closure's, or holds as an attribute."""
    for name, m in module.named_modules():
        where = f"module {name!r}" if name else "the model"
        if isinstance(m, torch.jit.ScriptModule):
            raise ValueError(f"InnerProblem: {where} is a TorchScript module "
                             f"({type(m).__name__}): " + _SCRIPTED.format(
                                 version=torch.__version__, what="module"))
        fwd = getattr(type(m), "forward", None)
        code, scope = getattr(fwd, "__code__", None), getattr(fwd, "__globals__", {})
        found = [n for n in (code.co_names if code is not None else ())
                 if isinstance(scope.get(n), torch.jit.ScriptFunction)]
        cells = getattr(fwd, "__closure__", None) or ()
        found += [n for n, c in zip(code.co_freevars if code is not None else (), cells)
                  if isinstance(_cell(c), torch.jit.ScriptFunction)]
        found += [n for n, v in vars(m).items() if isinstance(v, torch.jit.ScriptFunction)]
        if found:
            raise ValueError(f"InnerProblem: {where} ({type(m).__name__}) calls the TorchScript "
                             f"function {found[0]!r} (torch.jit.script): " + _SCRIPTED.format(
                                 version=torch.__version__, what="function"))


def _cell(c: Any) -> Any:
    """A closure cell's contents (``None`` for an empty cell)."""
    try:
        return c.cell_contents
    except ValueError:
        return None


def _warn_gradient_hooks(params: Mapping[str, Tensor]) -> None:
    """Warn about gradient hooks on parameters: training differentiates functional calls on
    other tensors, so a hook that scales or clips a parameter's gradient never runs (training
    differed from torch's with it, without a word)."""
    from .errors import HypergradWarning

    hooked = [k for k, p in params.items() if p.requires_grad and (
        p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None))]
    if hooked:
        warnings.warn(HypergradWarning(
            f"InnerProblem: parameters {hooked[:4]}{' ...' if len(hooked) > 4 else ''} have "
            f"gradient hooks (register_hook, register_post_accumulate_grad_hook), which never "
            f"run here: every method trains through functional calls on other tensors. A hook "
            f"that changes the gradient (scaling, clipping) does not apply; do it in train_loss "
            f"or the inner optimizer (e.g. clip_grad_norm=1.0). Hooks that only log are "
            f"harmless."), stacklevel=4)


def _refuse_unsupported(module: nn.Module) -> None:
    """Modules that change the weights in forward in a way no method can differentiate,
    refused by name before anything runs."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    for name, m in module.named_modules():
        where = f"module {name!r}" if name else "the model"
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None:
            raise ValueError(
                f"InnerProblem: {where} is {type(m).__name__}(max_norm={m.max_norm}), which "
                f"renormalises the rows it looks up in place during forward: a change of the "
                f"weights outside the optimizer's update, which no method can differentiate "
                f"(finite differences disagree). Use max_norm=None and constrain the rows out "
                f"of place instead, e.g. a parametrization: torch.nn.utils.parametrize."
                f"register_parametrization(emb, 'weight', RowNorm({m.max_norm})) with "
                f"RowNorm.forward(w) = w * (max_norm / w.norm(dim=1, keepdim=True))"
                f".clamp(max=1) (docs/troubleshooting_engine.md), or a penalty in train_loss."
            )
        trains = isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.weight.requires_grad
        if trains and isinstance(m, nn.EmbeddingBag):
            raise ValueError(
                f"InnerProblem: {where} is nn.EmbeddingBag, whose backward "
                f"(_embedding_bag_backward) has no derivative in torch {torch.__version__}, and "
                f"every hypergradient method differentiates the training gradient. Use "
                f"nn.Embedding and reduce its output: for 2-D input x, emb(x).sum(1) "
                f"(mode='sum'), emb(x).mean(1) (mode='mean') or emb(x).amax(1) (mode='max'); "
                f"or freeze it: emb.weight.requires_grad_(False)."
            )
        if trains and m.scale_grad_by_freq:
            raise ValueError(
                f"InnerProblem: {where} is {type(m).__name__}(scale_grad_by_freq=True), whose "
                f"gradient divides each row's by how often the mini-batch looks it up: not the "
                f"loss's gradient (its Jacobian is not symmetric), so every method differs from "
                f"finite differences (0.4 % on a small model, measured). Use "
                f"scale_grad_by_freq=False (to weigh rare tokens more, weigh them in "
                f"train_loss)."
            )
        if m._backward_hooks or m._backward_pre_hooks:
            raise ValueError(
                f"InnerProblem: {where} ({type(m).__name__}) has a module backward hook "
                f"(register_full_backward_hook / register_full_backward_pre_hook / "
                f"register_backward_hook), which torch.func's transforms cannot run and which "
                f"would change the gradient training differentiates. Remove it while tuning; "
                f"a change of the gradient belongs in train_loss or the inner optimizer.")
        for hook in m._forward_pre_hooks.values():
            if isinstance(hook, (SpectralNorm, WeightNorm)):
                kind = "spectral_norm" if isinstance(hook, SpectralNorm) else "weight_norm"
                raise ValueError(
                    f"InnerProblem: {where} ({type(m).__name__}) uses the hook-based "
                    f"torch.nn.utils.{kind}, which stores the weight it computes on the module "
                    f"(and, for spectral_norm, updates its vectors under torch.no_grad()), out "
                    f"of reach of a functional call. Use torch.nn.utils.parametrizations."
                    f"{kind}(module) instead: hypergrad differentiates it exactly."
                )


@contextlib.contextmanager
def _mode(named: list[tuple[str, nn.Module]], modes: dict[str, bool] | None
          ) -> Iterator[None]:
    """Each submodule (``named``: the module's ``named_modules()``, listed once) in its mode of
    ``modes`` (name -> training), or all in eval mode for ``None``; the modes before are
    restored afterwards."""
    saved = [m.training for _, m in named]
    for name, m in named:
        m.training = False if modes is None else modes.get(name, True)
    try:
        yield
    finally:
        for (_, m), t in zip(named, saved):
            m.training = t
