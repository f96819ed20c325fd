"""The ``noncontiguous`` check: backward with the same values laid out otherwise in memory must give the
same gradients. Every tensor argument reaches forward, and every grad_output reaches backward,
non-contiguous: transposed where it has two dimensions or more (``t.mT.contiguous().mT``), every other
element of a buffer twice as long where it has one (``stack([t, 0], -1)[..., 0]``); the layouts are
differentiable identities inside the call. For a few random grad_outputs, the gradients with the
arguments non-contiguous, with the grad_outputs non-contiguous, and with both, are compared with those
of contiguous tensors, within the limits of two computations of the same values. A backward that is
right only for contiguous tensors (``grad.view(...)`` on a transposed grad_output, a kernel that reads
the storage as if it were contiguous) fails, and the message says which layout broke it.

It compares backward with itself, not with finite differences: whether backward is right is the
backward check's question; this one asks whether the layout changes its answer (a few calls, at any
size)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from ..errors import UserCodeError, guarded
from ..numerics import as_tuple, is_float_tensor, vjp
from ..results import CheckResult, ErrorKind, Status
from ..target import Target
from ..tolerance import same
from . import backward
from .base import CheckContext, graph_forward, probe_like
from .rows import agreement, fill, zeros_if_none
from .verdict import begin, conclude, label, skip

STREAM = 23  # the random stream of the noncontiguous check's grad_outputs (a seed replays it)
PROBES = 3  # random grad_outputs, each compared
SIDES = {"arguments": (True, False), "grad_outputs": (False, True), "arguments and grad_outputs": (True, True)}

WHAT = "transposed, or strided where 1-D"
# torch's notes that an op copies a non-contiguous tensor first ("torch.searchsorted(): input value tensor is
# non-contiguous, this will lower the performance ..."): about speed, never about the gradient
LAYOUT_NOTES = r".*non-contiguous, this will lower the performance"


@contextmanager
def layout_notes_quiet(quiet: bool = True) -> Iterator[None]:
    """Inside (where ``quiet``), torch does not print its performance notes about non-contiguous tensors to
    stderr: the tensors are non-contiguous because gradcheck laid them out so (this check, or `contiguous:
    false`), a layout the user's code need not be fast for; nothing in them is for the user to fix."""
    if not quiet:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LAYOUT_NOTES, category=UserWarning)
        yield


def relaid(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values, non-contiguous, as a differentiable identity (a 0-D or sparse tensor is returned as
    it is: a sparse tensor has no strides)."""
    if t.layout is not torch.strided:
        return t
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
    (``is_function`` False), so that every forward of that check, the finite differences' too, goes
    through ``call`` (a Function's own ``forward`` would see contiguous tensors)."""

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


def _gradients(ctx: CheckContext, target: Any, checked: list[int], gen_state: torch.Tensor) -> list[torch.Tensor]:
    """Backward of ``target`` for PROBES random grad_outputs (the same for every layout: drawn from the
    generator state ``gen_state``), stacked per checked argument: ``[PROBES, *shape]``."""
    gen = ctx.streams.generator(STREAM)
    gen.set_state(gen_state)
    leaves, outputs, positions = graph_forward(target, ctx.bound)
    live = [outputs[p] for p in positions]
    inputs = [leaves[i] for i in checked]
    got: list[list[torch.Tensor]] = [[] for _ in checked]
    for _ in range(PROBES):
        probes = [probe_like(o, gen) for o in live]
        grads = zeros_if_none(guarded(ErrorKind.BACKWARD, "backward", vjp, live, inputs, probes), inputs)
        for k, g in enumerate(grads):
            got[k].append(g)
    return [torch.stack(g) for g in got]


def run(ctx: CheckContext) -> CheckResult:
    """``noncontiguous``: backward with non-contiguous arguments and grad_outputs against contiguous ones."""
    with layout_notes_quiet():
        return _run(ctx)


def _run(ctx: CheckContext) -> CheckResult:
    start, rows, checked, result = begin(ctx.bound, "noncontiguous", WHAT)
    if ctx.bound.clone_inputs:
        return skip(result, "forward changes an argument in place (mark_dirty): it is called on copies", start)
    if not checked:
        return skip(result, "no argument requires grad: nothing to check", start)
    state = ctx.streams.generator(STREAM).get_state()
    want = _gradients(ctx, ctx.target, checked, state)
    raised: dict[str, str] = {}  # side -> the error its layout made the Function raise
    compared = False
    for side, (inputs, outputs) in SIDES.items():
        try:
            got = _gradients(ctx, Relaid(ctx.target, inputs, outputs), checked, state)
        except UserCodeError as exc:
            raised[side] = str(exc).rstrip(".")
            continue
        compared = True
        for k, i in enumerate(checked):
            if rows[i].status is Status.FAIL:
                continue  # a layout tried before (one side alone) broke it already
            limits = same(ctx.bound.values[i].dtype, ctx.tolerance.nondet_tol)
            fill(rows[i], agreement(got[k], want[k], limits), ctx.bound.values[i], lambda r: f"grad_output {r}")
            if rows[i].status is Status.FAIL:
                rows[i].reason = rows[i].diagnosis = f"changes when the {side} are non-contiguous"
    if not compared:
        for i in checked:
            rows[i].status, rows[i].reason = Status.SKIP, "backward raised (see the message)"
    changed = next((r.reason for r in rows if r.status is Status.FAIL), None)
    if changed and not raised:
        side = changed.removeprefix("changes when the ").removesuffix(" are non-contiguous")
        return _judged_in_that_layout(ctx, side, start)
    alone = [side for side in raised if side != "arguments and grad_outputs"] or list(raised)
    problems = [
        f"with non-contiguous {side} ({WHAT}), {raised[side]}; with contiguous ones it does not: the Function "
        "assumes a layout (.reshape instead of .view, or .contiguous() before code that needs it)"
        for side in alone
    ]
    return conclude(
        result,
        start,
        problems,
        lambda row: f"the gradient of {label(row)} {row.reason}" if row.reason else None,
        lambda right: (
            f"{PROBES} random grad_outputs: the gradients of {_names(right)} are the same with "
            f"non-contiguous arguments and grad_outputs ({WHAT})"
        ),
    )


def _judged_in_that_layout(ctx: CheckContext, side: str, start: float) -> CheckResult:
    """The gradients changed with non-contiguous ``side``: the Function in that layout judged by the
    backward check against its own finite differences. A forward may itself compute otherwise in
    another layout and be right (``rand_like`` gives out its random numbers in memory order): then
    the change is not a fault of backward."""
    inputs, outputs = SIDES[side]
    try:
        laid: Any = Relaid(ctx.target, inputs, outputs)  # a Target to the check, by its attributes
        found = backward.run(replace(ctx, target=laid))
    except UserCodeError as exc:
        _, _, _, result = begin(ctx.bound, "noncontiguous", WHAT)
        return skip(result, f"with non-contiguous {side} ({WHAT}), {str(exc).rstrip('.')}", start, Status.FAIL)
    found.check, found.mode, found.duration_s = "noncontiguous", WHAT, time.perf_counter() - start
    if found.status is Status.FAIL:
        found.message = (
            f"backward is wrong when the {side} are non-contiguous ({WHAT}) and right when they are "
            f"contiguous: {found.message}"
        )
    elif found.status is Status.PASS:
        found.message = (
            f"the gradients change when the {side} are non-contiguous ({WHAT}), and so does the function: "
            f"against its own finite differences in that layout, {found.message} (a forward that draws random "
            "numbers gives them out in memory order)"
        )
    else:
        found.message = (
            f"the gradients change when the {side} are non-contiguous ({WHAT}), and finite differences "
            f"cannot judge the Function in that layout: {found.message}"
        )
    return found


def _names(rows: Sequence[Any]) -> str:
    return ", ".join(label(r) for r in rows)
