"""The ``noncontiguous`` check: the backward check again, with the same values laid out otherwise in
memory. Every tensor argument reaches forward, and every grad_output reaches backward, non-contiguous:
transposed where it has two dimensions or more (``t.mT.contiguous().mT``), every other element of a
buffer twice as long where it has one (``stack([t, 0], -1)[..., 0]``). A backward that is right only for
contiguous tensors (``grad.view(...)`` on a transposed grad_output, a kernel that reads the storage as
if it were contiguous) fails, and the message says whether the arguments or the grad_outputs broke it.

The layouts are differentiable identities inside the call (the finite differences see the same
function), so the backward check's own comparison judges it, with its own random grad_outputs: the
same ones as the contiguous run. A backward that fails with contiguous tensors too is left to the
backward check (a skip here, so one bug is reported once)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Optional

import torch

from ..errors import UserCodeError
from ..numerics import as_tuple, is_float_tensor
from ..results import CheckResult, Status
from ..target import Target
from . import backward
from .base import CheckContext
from .verdict import begin, skip

WHAT = "transposed, or strided where 1-D"


def relaid(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values, non-contiguous, as a differentiable identity (a 0-D tensor is returned as it is)."""
    if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
        return t.mT.contiguous().mT
    if t.dim() >= 1 and t.numel() > 1:
        return torch.stack([t, torch.zeros_like(t)], dim=-1).select(-1, 0)
    return t


class _GradLayout(torch.autograd.Function):
    """The identity whose backward hands the gradient on ``relaid``: what the target's backward receives."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor) -> torch.Tensor:
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return relaid(grad)


class Relaid:
    """``target`` called with its tensor arguments (``inputs``) and its outputs' gradients (``outputs``)
    non-contiguous; everything else is the target's own. It is a plain callable to the backward check
    (``is_function`` False): that check inspects a Function's contract itself, and every forward of this
    check goes through ``call``, the finite differences' too."""

    is_function = False

    def __init__(self, target: Target, inputs: bool, outputs: bool) -> None:
        self.inner, self.inputs, self.outputs = target, inputs, outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def call(self, values: Sequence[Any], n_positional: int, kw_names: list[str]) -> Any:
        if self.inputs:
            values = [relaid(v) if is_float_tensor(v) else v for v in values]
        out = self.inner.call(values, n_positional, kw_names)
        if not self.outputs:
            return out
        laid = tuple(_GradLayout.apply(o) if is_float_tensor(o) and o.requires_grad else o for o in as_tuple(out))
        return laid[0] if isinstance(out, torch.Tensor) else laid


def _backward(ctx: CheckContext, inputs: bool, outputs: bool) -> tuple[Optional[CheckResult], Optional[str]]:
    """The backward check with these sides non-contiguous: its result, or the error it raised (said)."""
    target: Any = Relaid(ctx.target, inputs, outputs) if inputs or outputs else ctx.target
    try:
        return backward.run(replace(ctx, target=target)), None
    except UserCodeError as exc:
        return None, str(exc)


def _broken(ctx: CheckContext, inputs: bool, outputs: bool) -> bool:
    """Whether backward fails (or raises) with these sides non-contiguous."""
    got, error = _backward(ctx, inputs, outputs)
    return error is not None or (got is not None and got.status is Status.FAIL)


def _sides(ctx: CheckContext) -> str:
    """Which side's layout breaks backward: the arguments', the grad_outputs', or only both together."""
    broken = [
        name for name, i, o in (("the arguments", True, False), ("the grad_outputs", False, True)) if _broken(ctx, i, o)
    ]
    return " and ".join(broken) if broken else "the arguments and grad_outputs together"


def run(ctx: CheckContext) -> CheckResult:
    """``noncontiguous``: backward with non-contiguous arguments and grad_outputs (see the module)."""
    start, _, checked, result = begin(ctx.bound, "noncontiguous", WHAT)
    if ctx.bound.clone_inputs:
        return skip(result, "forward changes an argument in place (mark_dirty): it is called on copies", start)
    if not checked:
        return skip(result, "no argument requires grad: nothing to check", start)
    got, error = _backward(ctx, True, True)
    if got is not None and got.status is not Status.FAIL:
        got.check, got.mode = "noncontiguous", WHAT
        got.message = f"with {WHAT} arguments and grad_outputs: {got.message}"
        got.duration_s = time.perf_counter() - start
        return got
    if _broken(ctx, False, False):
        return skip(
            result,
            "backward fails with contiguous tensors too (see the backward check): the layout is not what breaks it",
            start,
        )
    sides = _sides(ctx)
    if error is not None:
        return skip(
            result,
            f"with {sides} non-contiguous ({WHAT}): {error.rstrip('.')}; with contiguous ones it does not: "
            "the Function assumes a layout (.reshape instead of .view, or .contiguous() before code that needs it)",
            start,
            status=Status.FAIL,
        )
    assert got is not None
    got.check, got.mode = "noncontiguous", WHAT
    got.message = (
        f"backward is wrong when {sides} are non-contiguous ({WHAT}) and right when they are contiguous: {got.message}"
    )
    got.duration_s = time.perf_counter() - start
    return got
