"""The ``noncontiguous`` check: the Function with the same values laid out otherwise in memory must compute
the same function and give the same gradients. Every tensor argument reaches forward, and every grad_output
reaches backward, non-contiguous: transposed where it has two dimensions or more (``t.mT.contiguous().mT``),
every other element of a buffer twice as long where it has one (``stack([t, 0], -1)[..., 0]``); the layouts
are differentiable identities inside the call. Three layouts: the arguments non-contiguous, the grad_outputs,
both; each is judged alone, the sides alone before both, so a message names the side alone that breaks it.

The rule, per layout (every forward starting from the same random state, ``base.call_forward``):

- forward's outputs with non-contiguous arguments against those with contiguous ones, within the limits of
  two computations of the same values. Other values from a forward that does not draw random numbers are
  forward's layout bug (it reads the storage as if it were contiguous): a fail, naming forward and the layout.
  A forward that draws random numbers may draw them in memory order (``rand_like`` follows the strides): it
  computes another function in that layout, so its gradients cannot be held to the contiguous ones; that
  layout is judged as the backward check judges, backward against finite differences of forward in that same
  layout (the same random state for every forward);
- where forward computes the same values, backward for PROBES random grad_outputs against backward with
  contiguous tensors, within the same limits: the same function has the same gradient, so a change is
  backward's layout bug (``grad.view(...)`` on a transposed grad_output, a kernel that reads the storage as
  if it were contiguous), which finite differences in that layout then explain.

Whether backward is right at all is the backward check's question (a backward wrong in every layout passes
here). Cost: 4 forwards and 4 x PROBES backwards at any size, one forward more where forward's values change,
and a backward check in each layout where forward draws random numbers or the gradients change.

For the next contributor: never let a layout's verdict rest on backward compared with itself where forward
computes another function in that layout (a rand_like dropout whose backward misread grad_output's storage
passed so), nor on backward alone where forward's own values move (a forward that read a transposed x as
contiguous passed so).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Optional

import torch

from ..core.tolerance import ReferenceRule, by_dtype, same
from ..numerics import as_tuple, is_float_tensor, vjp
from ..results import CheckResult, ErrorKind, InputReport, Status, num
from ..sandbox.errors import UserCodeError, guarded
from ..subject.target import Target
from . import backward
from .parts.argument_rows import agreement, dtype_name, fill, zeros_if_none
from .parts.base import CheckContext, draws_random, graph_forward, probe_like
from .parts.sides import output_row
from .parts.upcast import REFERENCE
from .parts.verdict import begin, conclude, label, labels, skip

STREAM = 23  # the random stream of the noncontiguous check's grad_outputs (a seed replays it)
PROBES = 3  # random grad_outputs, each compared
BOTH = "arguments and grad_outputs"
SIDES = {"arguments": (True, False), "grad_outputs": (False, True), BOTH: (True, True)}

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


class Laid(NamedTuple):
    """The target in one layout: forward's outputs and backward's gradients (``_called``)."""

    outputs: tuple[Any, ...]  # forward's outputs, detached
    grads: list[torch.Tensor]  # per checked argument, for PROBES grad_outputs: ``[PROBES, *shape]``


def _called(ctx: CheckContext, target: Any, checked: list[int], gen_state: torch.Tensor) -> Laid:
    """Forward of ``target``, and its backward for PROBES random grad_outputs (the same for every layout:
    drawn from the generator state ``gen_state``)."""
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
    detached = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outputs)
    return Laid(detached, [torch.stack(g) for g in got])


def run(ctx: CheckContext) -> CheckResult:
    """``noncontiguous``: forward and backward with non-contiguous arguments and grad_outputs against contiguous
    ones, and backward in a layout where forward draws other random numbers against finite differences there."""
    with layout_notes_quiet():
        return _run(ctx)


def _run(ctx: CheckContext) -> CheckResult:
    start, rows, checked, result = begin(ctx.bound, "noncontiguous", WHAT)
    if ctx.bound.clone_inputs:
        return skip(result, "forward changes an argument in place (mark_dirty): it is called on copies", start)
    if not checked:
        return skip(result, "no argument requires grad: nothing to check", start)
    state = ctx.streams.generator(STREAM).get_state()
    want = _called(ctx, ctx.target, checked, state)
    laid: dict[str, Laid] = {}
    raised: dict[str, str] = {}  # side -> the error its layout made the Function raise
    for side, (inputs, outputs) in SIDES.items():
        try:
            laid[side] = _called(ctx, Relaid(ctx.target, inputs, outputs), checked, state)
        except UserCodeError as exc:
            raised[side] = str(exc).rstrip(".")
    relaid_forward = next((laid[side].outputs for side in laid if SIDES[side][0]), None)
    outs = [] if relaid_forward is None else _forward_rows(want.outputs, relaid_forward, ctx.tolerance.nondet_tol)
    moved = any(r.status is Status.FAIL for r in outs)  # forward computes other values with non-contiguous arguments
    drew = moved and draws_random(ctx.target, ctx.bound, want.outputs)
    judge: list[Moved] = []  # the layouts to judge against finite differences of forward in them
    compared: list[str] = []  # the sides whose gradients were compared with the contiguous ones
    for side, got in laid.items():
        if moved and SIDES[side][0]:  # another function in this layout: its gradients are another's
            kind = "random" if drew else "forward"
            judge.append(_moved_by(ctx, side, kind, got, want, checked, state))
            continue
        compared.append(side)
        if _compare(ctx, rows, checked, got.grads, want.grads, side):
            judge.append(_moved_by(ctx, side, "gradients", got, want, checked, state))
    for r in outs:
        if r.status is Status.FAIL and drew:
            r.status, r.reason = Status.SKIP, "forward draws random numbers (its outputs change with the seed)"
    result.inputs = rows = rows + outs
    if not laid:
        for i in checked:
            rows[i].status, rows[i].reason = Status.SKIP, "backward raised (see the message)"
    alone = [side for side in raised if side != BOTH] or list(raised)
    problems = [
        f"with non-contiguous {side} ({WHAT}), {raised[side]}; with contiguous ones it does not: the Function "
        "assumes a layout (.reshape instead of .view, or .contiguous() before code that needs it)"
        for side in alone
    ]
    notes: list[str] = []
    unjudged: list[str] = []
    agreed: list[str] = []  # the layouts where forward drew other random numbers and backward agreed with them
    rounded: list[Moved] = []  # the layouts whose change is rounding, and where backward agrees with forward
    for change in judge:
        if change.side == BOTH and (problems or any(r.status is Status.FAIL for r in rows)):
            break  # a side alone broke it already
        judged = _in_that_layout(ctx, change)
        _settle(rows, change)
        if judged.found is not None:
            found = judged.found
            found.inputs += outs
            found.problems += problems
            moves = [s for r in outs if r.status is Status.FAIL and (s := _wrong(r))]  # forward's own change first
            found.message = "; ".join([*moves, found.message, *problems])
            found.duration_s = time.perf_counter() - start
            return found
        problems += judged.problems
        notes += judged.notes
        unjudged += judged.unjudged
        agreed += [change.side] * (change.kind == "random" and judged.agreed)
        if judged.agreed and change.kind != "random" and not change.big:
            rounded.append(change)
    notes += _rounding_notes(rounded)
    if agreed:
        notes.append(
            f"with non-contiguous {', and with '.join(agreed)} ({WHAT}), forward draws other random numbers (rand_like "
            "follows the strides), and backward agrees with finite differences of forward in "
            + ("that layout" if len(agreed) == 1 else "each")
        )
    failing = problems or any(r.status is Status.FAIL for r in rows)
    if unjudged and not failing:
        return skip(result, "; ".join(unjudged + notes), start)
    forward_moved = any(r.role == "output" and r.status is Status.FAIL for r in rows)
    return conclude(result, start, problems, _wrong, _passed(compared), name_right=not forward_moved, notes=notes)


def _forward_rows(want: tuple[Any, ...], got: tuple[Any, ...], nondet_tol: float) -> list[InputReport]:
    """A row per forward output: its values with non-contiguous arguments (``got``) against those with
    contiguous ones (``want``), within the limits of two computations of the same values."""
    rows = []
    for p, o in enumerate(want):
        other = got[p] if p < len(got) else None
        if p >= len(got) or (is_float_tensor(o) and not (isinstance(other, torch.Tensor) and other.shape == o.shape)):
            shown = list(other.shape) if isinstance(other, torch.Tensor) else "missing" if p >= len(got) else other
            name = "output" if len(want) == 1 else f"output[{p}]"
            kind = dtype_name(o) if isinstance(o, torch.Tensor) else type(o).__name__
            row = InputReport(p, name, list(getattr(o, "shape", [])), kind, Status.FAIL, role="output")
            row.reason = f"is {shown} with non-contiguous arguments, {row.shape} with contiguous ones"
            rows.append(row)
            continue
        limits = same(o.dtype, nondet_tol) if isinstance(o, torch.Tensor) else same(torch.float64)
        rows.append(output_row(p, got, want, None, ReferenceRule("allclose", atol=limits.atol, rtol=limits.rtol)))
    return rows


class Moved(NamedTuple):
    """What changed in a layout beyond the limits of two computations of the same values (``_moved_by``)."""

    side: str
    kind: str  # "random": forward drew other random numbers; "forward": its values changed; else "gradients"
    big: bool  # by more than a reordering's rounding: the values of another function
    relative: float  # the largest change, ||got - want|| / ||want|| of an output or gradient
    wide: Optional[float] = None  # the same on float64 copies of the low-precision arguments, where measured


def _moved_by(ctx: CheckContext, side: str, kind: str, got: Laid, want: Laid, checked: list[int], state: Any) -> Moved:
    """``side``'s change, and whether it is more than the rounding of another order of operations (a transposed
    operand summed in memory order): the root-mean-square change relative to the values' own above ten times
    their dtype's gradient rtol (1e-2 in float64 and float32). A layout bug reads other elements: a change of
    the size of the values (about 1.4 for a permutation); two orders of summation differ by a few units of
    rounding of the sums, which in float32 may reach a percent of a sum that cancels. So a change in a low
    precision is measured again on float64 copies of the arguments, where rounding is a billion times smaller
    (in the low precision itself where forward fails in float64)."""
    pick = (lambda laid: laid.outputs) if kind != "gradients" else (lambda laid: laid.grads)
    limits = [10 * by_dtype(t.dtype).gradient.rtol if isinstance(t, torch.Tensor) else 0.0 for t in pick(want)]
    changes = _relative(pick(got), pick(want))
    again = _in_float64(ctx, side, checked, state) if kind != "random" else None
    wide = None if again is None else _relative(pick(again[0]), pick(again[1]))
    big = any(c > limit for c, limit in zip(wide or changes, limits))
    return Moved(side, kind, big, max(changes, default=0.0), None if wide is None else max(wide, default=0.0))


def _in_float64(ctx: CheckContext, side: str, checked: list[int], state: Any) -> Optional[tuple[Laid, Laid]]:
    """The target in ``side``'s layout and contiguous, on float64 (complex128) copies of its low-precision
    arguments; None where it has none, or forward or backward fails on them."""
    if not any(isinstance(v, torch.Tensor) and v.dtype in REFERENCE for v in ctx.bound.values):
        return None
    copies: dict[int, Any] = {}
    values = [
        copies.setdefault(id(v), v.detach().to(REFERENCE[v.dtype]).requires_grad_(v.requires_grad))
        if isinstance(v, torch.Tensor) and v.dtype in REFERENCE
        else v
        for v in ctx.bound.values
    ]
    wide = replace(ctx, bound=replace(ctx.bound, values=values, rng=None))
    try:
        return _called(wide, Relaid(ctx.target, *SIDES[side]), checked, state), _called(
            wide, ctx.target, checked, state
        )
    except UserCodeError:
        return None


def _relative(got: Sequence[Any], want: Sequence[Any]) -> list[float]:
    """Per position of ``want``: ``||got - want|| / ||want||`` of floating tensors (equal values, NaN with NaN,
    change nothing; another shape, or none, is infinite; 0 for anything else)."""
    out = [] if len(got) >= len(want) else [math.inf]
    for a, n in zip(got, want):
        if not is_float_tensor(n) or not n.numel():
            out.append(0.0)
            continue
        if not (isinstance(a, torch.Tensor) and a.shape == n.shape):
            out.append(math.inf)  # another shape: another function
            continue
        a64, n64 = (
            (torch.view_as_real(t) if t.is_complex() else t).to(torch.float64) for t in (a.detach(), n.detach())
        )
        same_values = (a64 == n64) | (a64.isnan() & n64.isnan())
        change = float(torch.where(same_values, 0.0, a64 - n64).norm())
        size = float(torch.where(n64.isfinite(), n64, 0.0).norm())
        if not math.isfinite(change):
            out.append(math.inf)
        else:
            out.append(change / size if size else (math.inf if change else 0.0))
    return out


def _moved(row: InputReport) -> str:
    """What a forward output whose values change with the arguments' layout shows."""
    if row.mismatched is None:  # another shape, or no such output (the row's reason says which)
        what = f"it {row.reason.removeprefix('it ')}" if row.reason else "it is another"
    else:
        values = f"{num(row.analytical)}, with contiguous arguments {num(row.numerical)}"
        where = f" (worst {row.name} {row.worst_index}: {values})"
        what = f"{row.mismatched} of {row.numel} elements differ{where if row.worst_index is not None else ''}"
    return (
        f"changes when the arguments are non-contiguous ({WHAT}): {what}, and forward draws no random numbers: it "
        "reads an argument's storage as if it were contiguous (call .contiguous() first, or index by its strides)"
    )


def _compare(
    ctx: CheckContext,
    rows: list[InputReport],
    checked: list[int],
    got: list[torch.Tensor],
    want: list[torch.Tensor],
    side: str,
) -> bool:
    """The checked arguments' rows: backward's gradients in ``side``'s layout against those with contiguous
    tensors (a row failed already keeps its first layout); whether one changed."""
    changed = False
    for k, i in enumerate(checked):
        if rows[i].status is Status.FAIL:
            continue  # a layout tried before (one side alone) broke it already
        limits = same(ctx.bound.values[i].dtype, ctx.tolerance.nondet_tol)
        fill(rows[i], agreement(got[k], want[k], limits), ctx.bound.values[i], lambda r: f"grad_output {r}")
        if rows[i].status is Status.FAIL:
            rows[i].reason = rows[i].diagnosis = _changes(side)
            changed = True
    return changed


@dataclass
class Judged:
    """A layout judged against finite differences of forward in it (``_in_that_layout``)."""

    found: Optional[CheckResult] = None  # the backward check's fail in that layout: the check's result
    problems: list[str] = field(default_factory=list)  # a fail without rows of its own
    notes: list[str] = field(default_factory=list)  # what the layout showed, said either way
    unjudged: list[str] = field(default_factory=list)  # why the layout could not be judged
    agreed: bool = False  # backward agrees with finite differences of forward in that layout


def _in_that_layout(ctx: CheckContext, change: Moved) -> Judged:
    """The Function with non-contiguous ``change.side`` judged by the backward check against finite differences of
    forward in that same layout (every forward from the same random state). A fail there is the check's fail;
    where backward agrees, what changed is a fault only when it is more than rounding (``change.big``): forward
    computing another function in that layout (the values of a forward that draws no random numbers), or the
    gradients of the same function changing (then those with contiguous tensors are the wrong ones)."""
    side = change.side
    inputs, outputs = SIDES[side]
    where = f"with non-contiguous {side} ({WHAT})"
    try:
        laid: Any = Relaid(ctx.target, inputs, outputs)  # a Target to the check, by its attributes
        found = backward.run(replace(ctx, target=laid))
    except UserCodeError as exc:
        if exc.kind in (ErrorKind.FORWARD, ErrorKind.BACKWARD):
            return Judged(problems=[f"{where}, {str(exc).rstrip('.')}"])
        if exc.kind is not ErrorKind.TOO_LARGE:
            raise
        return _unjudged(change, f"finite differences cannot judge it {where}: {str(exc).rstrip('.')}")
    found.check, found.mode = "noncontiguous", WHAT
    if found.status is Status.FAIL:
        if change.kind == "random":
            head = f"{where} forward draws other random numbers (rand_like follows the strides), and against "
            found.message = f"{head}finite differences of forward in that layout backward is wrong: {found.message}"
        elif change.kind == "forward":  # the output rows name forward's change first
            found.message = f"{where} backward disagrees with finite differences of forward: {found.message}"
        else:
            same_forward = ", where forward computes the same values as with contiguous ones" if inputs else ""
            found.message = (
                f"backward is wrong when the {side} are non-contiguous ({WHAT}){same_forward}: {found.message}"
            )
        return Judged(found=found)
    if found.status is Status.PASS:
        if change.kind == "random" or not change.big:
            return Judged(agreed=True)
        if change.kind == "forward":
            return Judged(agreed=True)  # the output rows say it: forward computes another function there
        return Judged(
            problems=[
                f"the gradients change when the {side} are non-contiguous ({WHAT}) and forward's values do not; in "
                f"that layout they agree with finite differences, so those with contiguous {side} are wrong (the "
                "backward check fails them)"
            ]
        )
    return _unjudged(change, f"finite differences cannot judge the Function {where}: {found.message}")


def _unjudged(change: Moved, why: str) -> Judged:
    """A layout finite differences cannot judge: a change beyond rounding stays a fault, a random forward's layout
    and a change within rounding stay unjudged."""
    if change.kind == "random":
        return Judged(unjudged=[f"forward draws other random numbers there (rand_like follows the strides), and {why}"])
    return Judged(notes=[why]) if change.big else Judged(unjudged=[f"{_rounding(change)}, but {why}"])


def _rounding(change: Moved) -> str:
    return _rounding_notes([change])[0]


def _rounding_notes(changes: list[Moved]) -> list[str]:
    """One sentence per kind of change (forward's values, the gradients) that is rounding, naming its layouts."""
    notes = []
    for kind, what in (("forward", "forward's values"), ("gradients", "the gradients")):
        those = [c for c in changes if c.kind == kind]
        if not those:
            continue
        wide = [c.wide for c in those if c.wide is not None]
        again = f", and by {max(wide):.1e} on float64 copies of the arguments" if wide else ""
        notes.append(
            f"with non-contiguous {', and with '.join(c.side for c in those)} ({WHAT}), {what} differ from those with "
            f"contiguous ones by {max(c.relative for c in those):.1e} of their size{again}: rounding of another order "
            "of operations"
        )
    return notes


def _settle(rows: list[InputReport], change: Moved) -> None:
    """The rows a layout's change failed: passing where the change is rounding (``change.big`` false), with what
    changed said; a forward output whose change is a fault keeps failing, with its words."""
    for r in rows:
        if r.status is not Status.FAIL:
            continue
        if r.role == "output" and change.kind == "forward":
            if change.big:
                r.reason = r.diagnosis = _moved(r)
            else:
                r.status, r.reason, r.diagnosis = Status.PASS, None, _rounding(change)
        elif r.role != "output" and change.kind == "gradients" and not change.big and r.reason == _changes(change.side):
            r.status, r.reason, r.diagnosis = Status.PASS, None, _rounding(change)


def _changes(side: str) -> str:
    return f"changes when the {side} are non-contiguous"


def _wrong(row: InputReport) -> Optional[str]:
    if row.role == "output":
        return f"forward's {row.name} {row.reason}"
    return f"the gradient of {label(row)} {row.reason}" if row.reason else None


def _passed(compared: list[str]) -> Callable[[list[InputReport]], str]:
    """The message of a pass: what was the same in which layouts."""
    where = BOTH if len(compared) == len(SIDES) else " and ".join(compared)

    def passed(right: list[InputReport]) -> str:
        grads = [r for r in right if r.role != "output"]
        forward = "forward's outputs and, for " if any(r.role == "output" for r in right) else "for "
        return (
            f"{forward}{PROBES} random grad_outputs, the gradients of {labels(grads)} are the same with "
            f"non-contiguous {where} ({WHAT})"
        )

    return passed
