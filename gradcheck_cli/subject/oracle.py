"""The reference implementations a case names (``reference``, ``reference_backward``): loaded and,
for an nn.Module, built like the target, for the ``reference`` check to compare with.

One job: turn the spec's import paths into callables with the target's calling convention, or
say precisely why they cannot be (a spec error naming the key)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..numerics.streams import Streams
from ..sandbox.errors import BindError, LoadError
from ..spec import Case
from . import loader
from .nn_module import ModuleTarget, init_target
from .target import Target


@dataclass
class Oracle:
    """What the reference check compares with: ``forward`` (in ``dtype``, and ``low`` built for the
    target's own dtype: the same object unless the reference is an nn.Module) and ``backward``,
    ``fn(inputs, grad_outputs) -> gradients``; either may be missing, not both."""

    dtype: torch.dtype
    forward: Optional[Target] = None
    low: Optional[Target] = None
    backward: Optional[Callable[..., Any]] = None
    forward_path: Optional[str] = None
    backward_path: Optional[str] = None


def load(case: Case, target: Target, device: str, streams: Streams) -> Optional[Oracle]:
    """The case's oracle, or None when it names no reference (a module built from ``streams``, as the
    target is). LoadError and BindError name the key."""
    if not (case.reference or case.reference_backward):
        return None
    oracle = Oracle(
        getattr(torch, case.reference_dtype), forward_path=case.reference, backward_path=case.reference_backward
    )
    if case.reference:
        oracle.forward = _forward(case, target, device, case.reference_dtype, streams)
        oracle.low = _forward(case, target, device, case.dtype, streams) if oracle.forward.is_module else oracle.forward
    if case.reference_backward:
        found = _load(case.reference_backward, "reference_backward")
        if found.is_function or found.is_module:
            raise BindError(
                "reference_backward",
                f"'{case.reference_backward}' is a class; name a function "
                "fn(inputs, grad_outputs) that returns the intended gradients, one per argument",
            )
        oracle.backward = found.obj
    return oracle


def _forward(case: Case, target: Target, device: str, dtype: str, streams: Streams) -> Target:
    """The reference named by ``case.reference``, built in ``dtype`` where it is an nn.Module class."""
    assert case.reference is not None
    ref = _load(case.reference, "reference")
    if target.is_module != ref.is_module:
        raise BindError(
            "reference",
            (
                f"'{case.reference}' is {'an nn.Module class' if ref.is_module else 'not an nn.Module class'} but "
                f"'{case.function}' is{'' if target.is_module else ' not'}: "
                + (
                    "the reference of a module is a module class with the same parameters (a plain PyTorch version "
                    "of it), built with the same `init`"
                    if target.is_module
                    else "name a function or an autograd.Function with the target's signature"
                )
            ),
        )
    if isinstance(ref, ModuleTarget) and isinstance(target, ModuleTarget):
        init_target(ref, case.init_args, dict(case.init_kwargs), streams, dtype, device)
        if ref.param_names != target.param_names:
            raise BindError(
                "reference",
                (
                    f"the parameters of '{case.reference}' ({', '.join(ref.param_names) or 'none'}) are not those of "
                    f"'{case.function}' ({', '.join(target.param_names) or 'none'}): the reference is called with the "
                    "target's parameter values, so it needs the same names in the same order"
                ),
            )
    return ref


def _load(path: str, key: str) -> Target:
    try:
        return loader.load(path)
    except LoadError as exc:
        raise LoadError(str(exc), exc.where, key) from exc
