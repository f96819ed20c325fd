"""Import path -> the thing to check, and binding of spec arguments to its signature.

One precise message per failure: module not importable (with the user's real error),
no such attribute, not callable, arguments that do not fit the signature.
An ``nn.Module`` class is built from the spec's ``init`` and its parameters become extra
arguments at the end of the bound ones, so every check treats them like inputs (the
module support is in ``modules``; ``RngFork`` and ``init_module`` are re-exported here).
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
import traceback
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .modules import VARIADIC, RngFork, bind_parameters, call_with, device_key, init_module, parameter_slots

__all__ = ["BindError", "Bound", "LoadError", "RngFork", "Target", "bind", "init_module", "load", "user_frame"]


class LoadError(Exception):
    """The target cannot be imported or is not something we can check."""

    def __init__(self, message: str, where: Optional[str] = None) -> None:
        super().__init__(message)
        self.where = where


class BindError(Exception):
    """Spec arguments that do not fit the target's signature. ``key`` is the spec key path."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def user_frame(exc: BaseException) -> Optional[str]:
    """``file:line (code)`` of the innermost traceback frame in the user's code (not torch, not us)."""
    ours = os.path.dirname(os.path.abspath(__file__))
    skip = (os.path.dirname(torch.__file__), ours, "<", os.path.dirname(importlib.__file__))

    def is_user(filename: str) -> bool:
        return not filename.startswith(skip) or filename.startswith(os.path.join(ours, "examples"))

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user(f.filename)]
    if not frames:
        return None
    frame = frames[-1]
    where = f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return f"{where} ({frame.line.strip()})" if frame.line else where


@dataclass
class Target:
    """What a spec's ``function`` names: a Function class, an nn.Module class or a plain callable."""

    path: str
    obj: Any
    is_function: bool
    module: Optional[torch.nn.Module] = None  # an nn.Module class's instance, built by init_module
    param_names: list[str] = field(default_factory=list)  # its named_parameters(), in order
    _copies: dict[str, Any] = field(default_factory=dict, repr=False)  # device -> (module, slots)

    @property
    def is_module(self) -> bool:
        return isinstance(self.obj, type) and issubclass(self.obj, torch.nn.Module)

    @property
    def own_vmap(self) -> bool:
        """A Function with its own ``vmap`` staticmethod."""
        return self.is_function and getattr(self.obj, "vmap", None) is not getattr(torch.autograd.Function, "vmap", None)

    @property
    def declares_vmap(self) -> bool:
        """A Function that supports torch.func.vmap: ``generate_vmap_rule = True`` or its own ``vmap``."""
        return self.is_function and (bool(getattr(self.obj, "generate_vmap_rule", False)) or self.own_vmap)

    @property
    def forward(self) -> Callable:
        return self.obj.forward if self.is_function or self.is_module else self.obj

    def body(self, values: list[Any]) -> Any:
        """A Function's forward called without ``apply`` (an old-style ``forward(ctx, ...)`` gets a
        ``StandInCtx``): what torch.func.vmap can batch when the Function declares no vmap support.
        For finite differences only, whose batched values the caller compares with ``apply``'s."""
        if _has_setup_context(self.obj):
            return self.obj.forward(*values)
        return self.obj.forward(StandInCtx(values), *values)

    def parameters(self) -> Optional[list[inspect.Parameter]]:
        """The user-visible parameters (forward's, without ctx or self), or None when unknown."""
        try:
            params = list(inspect.signature(self.forward).parameters.values())
        except (TypeError, ValueError):
            return None
        if self.is_module or (self.is_function and not _has_setup_context(self.obj)):
            params = params[1:]  # forward(ctx, ...) or forward(self, ...)
        return params

    def call(self, values: list[Any], n_positional: int, kw_names: list[str]) -> Any:
        """Call with ``values``: the first ``n_positional`` positionally, then ``kw_names`` by keyword,
        then (for a module) its parameters in ``param_names`` order."""
        if self.is_function:
            return self.obj.apply(*values)
        split = n_positional + len(kw_names)
        kwargs = dict(zip(kw_names, values[n_positional:split]))
        if not self.is_module:
            return self.obj(*values[:n_positional], **kwargs)
        params = values[split:]
        module, slots = self._on(str(params[0].device) if params else None)
        return call_with(module, slots, values[split:], values[:n_positional], kwargs)

    def _on(self, device: Optional[str]) -> tuple[torch.nn.Module, list[list[tuple[torch.nn.Module, str]]]]:
        """The module on ``device`` (None: where it was built; a copy made once per other device)
        and its parameter slots."""
        if self.module is None:
            raise RuntimeError(f"{self.path} is an nn.Module class that was not built: call loader.init_module")
        key = device or next(iter(self._copies))
        if key not in self._copies:
            key = device_key(key)
        if key not in self._copies:
            copy = deepcopy(self.module).to(key)
            self._copies[key] = (copy, parameter_slots(copy))
        return self._copies[key]


class StandInCtx:
    """The ctx of a forward called without ``apply``: it keeps what forward stores on it and
    refuses what only ``apply`` can do (outputs marked dirty: an in-place forward)."""

    def __init__(self, values: list[Any]) -> None:
        self.needs_input_grad = tuple(isinstance(v, torch.Tensor) and v.requires_grad for v in values)
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        raise RuntimeError("an in-place forward (mark_dirty) runs through apply only")


def _has_setup_context(cls: type) -> bool:
    return getattr(cls, "setup_context", None) is not getattr(torch.autograd.Function, "setup_context", None)


def load(path: str) -> Target:
    """Import ``pkg.mod:Name`` or ``pkg.mod.Name`` (the current directory is importable)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise LoadError(f"'{path}' is not an import path; write it as 'pkg.mod:Name' or 'pkg.mod.Name'")
    module = _import(module_name, path)
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module_name] + attr.split(".")[:i])
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise LoadError(f"'{owner}' has no attribute '{part}'{hint}")
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        if obj.backward is torch.autograd.Function.backward:
            raise LoadError(f"'{path}' is an autograd.Function without a backward(); define "
                            "`@staticmethod def backward(ctx, *grad_outputs)`")
        return Target(path, obj, True)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        if obj.forward is torch.nn.Module.forward:
            raise LoadError(f"'{path}' is an nn.Module class without a forward(); define "
                            "`def forward(self, ...)`")
        return Target(path, obj, False)
    if isinstance(obj, type) or not callable(obj):
        kind = "a class" if isinstance(obj, type) else f"a value of type {type(obj).__name__}"
        raise LoadError(f"'{path}' is {kind}, not an autograd.Function subclass or a callable")
    return Target(path, obj, False)


def _import(module_name: str, path: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name) and module_name[len(exc.name):][:1] in ("", "."):
            raise LoadError(f"cannot import '{module_name}' (for '{path}'): no module named '{exc.name}'; "
                            "check the spelling, run from the project root, or install the package") from exc
        raise LoadError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
    except SyntaxError as exc:
        where = f"{os.path.relpath(exc.filename)}:{exc.lineno}" if exc.filename else None
        raise LoadError(f"importing '{module_name}' failed: SyntaxError: {exc}", where) from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any error in the user's module is reported
        raise LoadError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc


@dataclass
class Bound:
    """Arguments in call order, with the names and positions the user sees.

    For a module, its parameters follow the arguments (named as in named_parameters()).
    ``rng`` forks the global RNG for every forward (made at the first one, from ``seed``).
    """

    values: list[Any]
    names: list[str]
    indices: list[int]
    n_positional: int
    kw_names: list[str]
    rng: Optional[RngFork] = field(default=None, repr=False, compare=False)
    seed: int = 0  # seeds the RNG state every forward starts from


def bind(target: Target, positional: list[tuple[Optional[str], Any]],
         keywords: list[tuple[str, Any]]) -> Bound:
    """Bind (spec name, value) pairs to the target's signature.

    For a Function every argument becomes positional (``apply`` takes no keywords): keyword
    arguments go to their parameter's slot, and skipped parameters before them get their
    defaults. Parameters after the last one given are left to their defaults.
    """
    params = target.parameters()
    names = [p.name for p in params] if params is not None else []
    if params is not None and not any(p.kind is p.VAR_POSITIONAL for p in params):
        n_max = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        if len(positional) > n_max:
            raise BindError("inputs", f"{len(positional)} inputs given, but {target.path} takes {n_max} "
                                      f"({', '.join(names[:n_max])}); remove the extra entries")
    values = [v for _, v in positional]
    labels = [n or (names[i] if i < len(names) else f"arg{i}") for i, (n, _) in enumerate(positional)]
    indices = list(range(len(positional)))
    if not target.is_function:
        for name, value in keywords:
            _check_keyword(target, params, name, len(positional))
            labels.append(name)
            indices.append(names.index(name) if name in names else len(indices))
            values.append(value)
        bound = Bound(values, labels, indices, len(positional), [k for k, _ in keywords])
        if target.is_module:
            bind_parameters(target, bound, len([p for p in params or [] if p.kind not in VARIADIC]))
        return bound
    slots: dict[int, tuple[str, Any]] = {}
    for name, value in keywords:
        pos = _check_keyword(target, params, name, len(positional))
        slots[pos] = (name, value)
    for pos in range(len(positional), max(slots, default=-1) + 1):
        if pos in slots:
            labels.append(slots[pos][0])
            values.append(slots[pos][1])
        else:
            default = params[pos].default if params else inspect.Parameter.empty
            if default is inspect.Parameter.empty:
                raise BindError("inputs", f"'{names[pos]}' (position {pos}) of {target.path} has no default "
                                          "and is not given: add it to `inputs` or `kwargs`")
            labels.append(names[pos])
            values.append(default)
        indices.append(pos)
    return Bound(values, labels, indices, len(values), [])


def _check_keyword(target: Target, params: Optional[list[inspect.Parameter]], name: str, n_pos: int) -> int:
    """Position of keyword ``name`` in the signature (or -1 for **kwargs); raise if it does not fit."""
    key = f"kwargs.{name}"
    if params is None:
        if target.is_function:
            raise BindError(key, f"cannot read the signature of {target.path}.forward to place '{name}'")
        return -1
    names = [p.name for p in params]
    if name not in names:
        if any(p.kind is p.VAR_KEYWORD for p in params) and not target.is_function:
            return -1
        raise BindError(key, f"{target.path} has no parameter '{name}'; its parameters are: {', '.join(names)}")
    pos = names.index(name)
    if params[pos].kind is params[pos].KEYWORD_ONLY and target.is_function:
        raise BindError(key, f"'{name}' is keyword-only in forward(), but Function.apply passes arguments "
                             "by position only: make it a positional parameter")
    if params[pos].kind in (params[pos].POSITIONAL_ONLY, params[pos].POSITIONAL_OR_KEYWORD) and pos < n_pos:
        raise BindError(key, f"'{name}' is given twice: by position (inputs[{pos}]) and in kwargs")
    return pos
