"""The thing checked: an autograd.Function class or a plain callable, and how to call it.

An ``nn.Module`` class is a ``ModuleTarget`` (nn_module.py): a Target that supplies its own call
and extra arguments (its parameters).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


@dataclass
class Target:
    """What a spec's ``function`` names: a Function class or a plain callable."""

    path: str
    obj: Any
    is_function: bool

    @property
    def is_module(self) -> bool:
        """Whether this is an nn.Module class (a ``ModuleTarget``)."""
        return False

    @property
    def own_vmap(self) -> bool:
        """A Function with its own ``vmap`` staticmethod."""
        base = getattr(torch.autograd.Function, "vmap", None)
        return self.is_function and getattr(self.obj, "vmap", None) is not base

    @property
    def declares_vmap(self) -> bool:
        """A Function that supports torch.func.vmap: ``generate_vmap_rule = True`` or its own ``vmap``."""
        return self.is_function and (bool(getattr(self.obj, "generate_vmap_rule", False)) or self.own_vmap)

    @property
    def forward(self) -> Callable[..., Any]:
        """The callable whose signature the spec's arguments bind to."""
        return self.obj.forward if self.is_function else self.obj

    def body(self, values: Sequence[Any]) -> Any:
        """A Function's forward called without ``apply`` (an old-style ``forward(ctx, ...)`` gets a
        ``StandInCtx``): what torch.func.vmap can batch when the Function declares no vmap support.
        For finite differences only, whose batched values the caller compares with ``apply``'s."""
        if has_setup_context(self.obj):
            return self.obj.forward(*values)
        return self.obj.forward(StandInCtx(values), *values)

    def parameters(self) -> Optional[list[inspect.Parameter]]:
        """The user-visible parameters (forward's, without ctx), or None when unknown."""
        try:
            params = list(signature(self.forward).parameters.values())
        except (TypeError, ValueError):
            return None
        if self.is_function and not has_setup_context(self.obj):
            params = params[1:]  # forward(ctx, ...)
        return params

    def call(self, values: Sequence[Any], n_positional: int, kw_names: list[str]) -> Any:
        """Call with ``values``: the first ``n_positional`` positionally, then ``kw_names`` by keyword."""
        if self.is_function:
            return self.obj.apply(*values)
        kwargs = dict(zip(kw_names, values[n_positional : n_positional + len(kw_names)]))
        return self.obj(*values[:n_positional], **kwargs)

    def extra_arguments(self, device: Optional[str]) -> list[tuple[str, torch.Tensor]]:
        """Arguments the target adds after the spec's, as (name, fresh leaf) on ``device``: none here."""
        return []

    def notes(self) -> list[str]:
        """Warnings about what calling the target showed (a module's forward that changes its buffers): none here."""
        return []


class StandInCtx:
    """The ctx of a forward called without ``apply``: it keeps what forward stores on it and
    refuses what only ``apply`` can do (outputs marked dirty: an in-place forward)."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.needs_input_grad = tuple(isinstance(v, torch.Tensor) and v.requires_grad for v in values)
        self.saved_tensors: tuple[Any, ...] = ()

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


_SIGNATURES: weakref.WeakKeyDictionary[Any, inspect.Signature] = weakref.WeakKeyDictionary()


def signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(fn)``, kept while ``fn`` lives: every check of a Function binds to it again."""
    try:
        return _SIGNATURES[fn]
    except (KeyError, TypeError):  # TypeError: no weak reference to it (a builtin): not kept
        pass
    found = inspect.signature(fn)
    try:
        _SIGNATURES[fn] = found
    except TypeError:
        pass
    return found


def has_setup_context(cls: type) -> bool:
    """Whether a Function class has its own ``setup_context`` (a forward without ctx)."""
    return getattr(cls, "setup_context", None) is not getattr(torch.autograd.Function, "setup_context", None)
