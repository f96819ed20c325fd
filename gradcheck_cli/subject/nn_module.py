"""An ``nn.Module`` class as a target: built from the spec's ``init``, called with its parameters
replaced, its parameters checked like arguments.

The module is built once per case, deterministically from the spec's seed, and its parameters
become extra arguments at the end of the bound ones, so every check treats them like inputs.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..numerics.streams import Stream, Streams
from ..results import ErrorKind
from ..sandbox.errors import BindError, guarded
from .binding import VARIADIC
from .target import Target

Slots = list[list[tuple[torch.nn.Module, str]]]  # per parameter, every (submodule, name) holding it


@dataclass
class ModuleTarget(Target):
    """An nn.Module class: its instance (built by ``build``) and a copy per other device."""

    module: Optional[torch.nn.Module] = None
    param_names: list[str] = field(default_factory=list)  # its named_parameters(), in order
    copies: dict[str, tuple[torch.nn.Module, Slots]] = field(default_factory=dict, repr=False)  # device -> copy
    buffers: dict[int, list[Buffer]] = field(default_factory=dict, repr=False)  # id(module) -> its buffers as built
    mutated: list[str] = field(default_factory=list)  # buffers a forward changed (put back after it)

    @property
    def is_module(self) -> bool:
        return True

    @property
    def forward(self) -> Callable[..., Any]:
        return self.obj.forward

    def parameters(self) -> Optional[list[inspect.Parameter]]:
        """forward's parameters without ``self``, or None when unknown."""
        try:
            return list(inspect.signature(self.forward).parameters.values())[1:]
        except (TypeError, ValueError):
            return None

    def call(self, values: Sequence[Any], n_positional: int, kw_names: list[str]) -> Any:
        """The module called with the arguments, its parameters replaced by the values after them
        (in ``param_names`` order)."""
        split = n_positional + len(kw_names)
        kwargs = dict(zip(kw_names, values[n_positional:split]))
        params = values[split:]
        module, slots = self.on(str(params[0].device) if params else None)
        buffers = self.buffers.get(id(module))
        if buffers is None:
            buffers = self.buffers[id(module)] = snapshot_buffers(module)
        try:
            return call_with(module, slots, list(params), list(values[:n_positional]), kwargs)
        finally:
            for name in restore_buffers(buffers):
                if name not in self.mutated:
                    self.mutated.append(name)

    def notes(self) -> list[str]:
        """A warning naming the buffers a forward changed (running statistics), once."""
        if not self.mutated:
            return []
        names = ", ".join(f"'{n}'" for n in self.mutated)
        return [
            f"forward mutates buffer{'s' * (len(self.mutated) != 1)} {names} (running statistics?): "
            "it was put back after every call, so each call saw the buffers as the module was built and "
            "the gradients are those of one call; `init: {mode: eval}` checks the module as used in inference"
        ]

    def extra_arguments(self, device: Optional[str]) -> list[tuple[str, torch.Tensor]]:
        """The module's parameters on ``device`` as fresh leaves, named as in named_parameters()."""
        module = self.on(device)[0]
        return [(name, p.detach().clone().requires_grad_(p.requires_grad)) for name, p in module.named_parameters()]

    def on(self, device: Optional[str]) -> tuple[torch.nn.Module, Slots]:
        """The module on ``device`` (None: where it was built; a copy made once per other device)
        and its parameter slots."""
        if self.module is None:
            raise RuntimeError(f"{self.path} is an nn.Module class that was not built: call build()")
        key = device or next(iter(self.copies))
        if key not in self.copies:
            key = device_key(key)
        if key not in self.copies:
            copy = deepcopy(self.module).to(key)
            self.copies[key] = (copy, parameter_slots(copy))
        return self.copies[key]

    def build(
        self,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        streams: Streams,
        dtype: str,
        device: str,
        mode: Optional[str] = None,
    ) -> None:
        """Build the module from the spec's ``init``: deterministic from ``streams`` (the global RNG is
        forked, not disturbed), in ``dtype`` (floating parameters and buffers), on ``device``.

        Arguments that do not fit ``__init__`` raise BindError naming the ``init`` key; the
        constructor's own errors are UserCodeErrors of kind INIT.
        """
        _check_init(self, args, kwargs)
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):
            init_seed = streams.generator(Stream.MODULE_INIT).initial_seed()  # its own stream, not the inputs'
            torch.default_generator.manual_seed(init_seed)
            for d in cuda:
                torch.cuda.default_generators[d].manual_seed(init_seed)
            module = guarded(ErrorKind.INIT, f"init: {self.obj.__name__}({shown})", self.obj, *args, **kwargs)
        if not isinstance(module, torch.nn.Module):  # a __new__ that returns something else
            raise BindError("init", f"{self.obj.__name__}(...) returned a {type(module).__name__}, not a module")
        wanted = getattr(torch, dtype)
        if wanted.is_floating_point or wanted.is_complex:
            module = module.to(wanted)
        if mode is not None:
            module.train(mode == "train")
        self.module = module.to(device)
        self.param_names = [n for n, _ in module.named_parameters()]
        self.copies = {device_key(device): (self.module, parameter_slots(self.module))}


@dataclass
class Buffer:
    """A module's buffer as built: where it is held, the tensor, a copy of its values, its version."""

    name: str  # qualified, as in named_buffers()
    owner: torch.nn.Module
    attr: str
    tensor: torch.Tensor
    values: torch.Tensor
    version: int


def snapshot_buffers(module: torch.nn.Module) -> list[Buffer]:
    """Every buffer of ``module`` (and its submodules) as it is now."""
    out = []
    for name, b in module.named_buffers():
        owner_name, _, attr = name.rpartition(".")
        out.append(Buffer(name, module.get_submodule(owner_name), attr, b, b.detach().clone(), b._version))
    return out


def restore_buffers(buffers: list[Buffer]) -> list[str]:
    """Put back each buffer that a call replaced or changed in place (seen by its version counter, so
    an unchanged one costs nothing); the names of those put back. A changed buffer is replaced by a
    fresh copy of its values as built, not written over: the graph of the call may have saved it."""
    changed = []
    for b in buffers:
        if b.owner._buffers.get(b.attr) is not b.tensor or b.tensor._version != b.version:
            b.tensor = b.values.clone()
            b.owner._buffers[b.attr] = b.tensor
            b.version = b.tensor._version
            changed.append(b.name)
    return changed


def device_key(device: Any) -> str:
    """``device`` as tensors name theirs ('cuda' -> 'cuda:0')."""
    return str(torch.empty(0, device=device).device)


def parameter_slots(module: torch.nn.Module) -> Slots:
    """For each parameter of named_parameters() (tied ones once), every (submodule, name) that holds it."""
    by_id: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for qualified, p in module.named_parameters(remove_duplicate=False):
        owner, _, attr = qualified.rpartition(".")
        by_id.setdefault(id(p), []).append((module.get_submodule(owner), attr))
    return list(by_id.values())


def call_with(module: torch.nn.Module, slots: Slots, params: list[Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``module(*args, **kwargs)`` with its parameters replaced by ``params`` for this call.

    What ``torch.func.functional_call`` does (tied parameters share one value), at a fraction
    of its cost per call: this runs for every finite-difference forward.
    """
    saved = [[(m, a, m._parameters[a]) for m, a in holders] for holders in slots]
    try:
        for holders, value in zip(slots, params):
            for m, a in holders:
                m._parameters[a] = value
        return module(*args, **kwargs)
    finally:
        for held in saved:
            for m, a, old in held:
                m._parameters[a] = old


def _check_init(target: ModuleTarget, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """BindError naming the ``init`` key when the arguments do not fit the constructor's signature."""
    name = target.obj.__name__
    try:
        sig = inspect.signature(target.obj)
    except (TypeError, ValueError):
        return
    names = [p.name for p in sig.parameters.values() if p.kind not in VARIADIC]
    listed = f"{name}({', '.join(_shown(p) for p in sig.parameters.values())})"
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        for k in kwargs:
            if k not in names:
                close = difflib.get_close_matches(k, names, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise BindError(
                    f"init.kwargs.{k}", f"{name} has no constructor parameter '{k}'{hint} (the constructor is {listed})"
                )
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        key = "init.args" if "positional" in str(exc) else "init"
        raise BindError(
            key, f"the arguments do not fit {listed}: {exc}; give them in `init: {{args: [...], kwargs: {{...}}}}`"
        ) from exc


def _shown(p: inspect.Parameter) -> str:
    """A parameter as written, without its annotation: ``bias=True``, ``*args``."""
    star = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
    return f"{star}{p.name}" + (f"={p.default!r}" if p.default is not p.empty else "")


def init_target(
    target: Target,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    streams: Streams,
    dtype: str,
    device: str,
    mode: Optional[str] = None,
) -> None:
    """Build a module target from the spec's ``init`` (in ``mode`` train or eval, if given); for any
    other target, ``init`` is an error."""
    if isinstance(target, ModuleTarget):
        target.build(args, kwargs, streams, dtype, device, mode)
    elif mode is not None:
        raise BindError(
            "init.mode",
            f"{target.path} is not an nn.Module class: `init.mode` (train or eval) applies to modules only; remove it",
        )
    elif args or kwargs:
        raise BindError(
            "init",
            f"{target.path} is not an nn.Module class: `init` (constructor "
            "arguments) applies to modules only; remove it",
        )
