"""The ``forward_over_reverse`` check: backward differentiated by forward-mode AD, against finite
differences of backward.

Like ``torch.autograd.gradgradcheck(check_fwd_over_rev=True)``: the function that double_backward
checks, G(x..., v...) = (dL/dx for each checked argument x, with L = sum over the differentiable outputs
y of <v, y>), is pushed forward column by column. One call of G on a dual number whose tangent is e_j
(forward on dual numbers, which runs the Function's jvp, then backward with create_graph=True, whose
operations carry the tangents; a Function that backward calls is pushed forward by its own jvp) gives
the column J_G e_j, and two calls of G on perturbed values give its central difference
(``forward_ad.compare_columns``). This is what forward-over-reverse Hessian-vector products compute
(torch.autograd.functional.hessian(..., outer_jacobian_strategy="forward-mode")), and it can be wrong
where double_backward (reverse over reverse) is right: a Function that backward calls may have a right
backward and a wrong jvp.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..numerics import as_tuple, engine
from ..numerics.realify import strided
from ..results import CheckResult, ErrorKind, InputReport, Pattern, Status
from ..sandbox.errors import UserCodeError, guarded
from .double_backward import (
    FULL_BITS,
    ONCE,
    ONCE_FIX,
    ONCE_ROW,
    ONCE_SKIP,
    UNDIFFERENTIABLE,
    backward_graph,
    backward_of,
    grad_output_rows,
    marked_once_differentiable,
    probe_rows,
)
from .forward_ad import Columns, compare_columns, judge_rows, named_mistake, no_jvp
from .parts.base import CheckContext, call_forward, fresh_leaves, probe_like, work_limit
from .parts.step import refuse_unusable
from .parts.tower import build, every_order, leaves, reversed_
from .parts.upcast import reference
from .parts.verdict import begin, conclude, label, labels, skip, unsupported

STREAM = 12  # the random stream of forward_over_reverse's grad_outputs (a seed replays it)

CHECKED = "backward pushed forward (forward-mode AD over backward) compared with finite differences along"
UNDER_ALL = " (a warning under `checks: all`; naming forward_over_reverse makes it a fail)"
NAMED = "; forward_over_reverse was named explicitly, so that fails (`checks: all` makes it a warning)"


def run(ctx: CheckContext) -> CheckResult:
    """Check the forward-mode derivative of ``ctx.target``'s backward against finite differences of backward
    (and of backward differentiated by reverse mode, each order up to the spec's ``order:``)."""
    return every_order(ctx, lambda order: _run(ctx, order))


def _run(ctx: CheckContext, order: int) -> CheckResult:
    """The check of order ``order``: backward differentiated ``order - 2`` times by reverse mode, then pushed
    forward, against its finite differences."""
    target, bound = ctx.target, ctx.bound
    start, reports, checked, result = begin(bound, "forward_over_reverse", "elementwise")
    missing = no_jvp(target)
    if missing:
        why = f"{missing} (forward over reverse runs forward on dual numbers, which needs it)"
        return unsupported(result, why, start, ctx.named)
    graph = backward_graph(ctx, result, start, checked, "the derivative of backward", "push forward")
    if isinstance(graph, CheckResult):
        return graph
    leaves, outputs, live = graph
    gen = ctx.streams.generator(STREAM)
    vs = [probe_like(outputs[p], gen) * FULL_BITS for p in live]  # every bit of the dtype, as double_backward's
    n = len(bound.values)
    first_rows = grad_output_rows(outputs, live, n)
    tower = build(list(bound.values) + vs, list(bound.names) + [r.name for r in first_rows], checked, n, order, gen)
    first = backward_of(ctx, checked, live)
    grad_of = tower.over(first)
    vs += tower.probes
    v_leaves = [v.clone().requires_grad_(True) for v in vs]
    try:  # backward run as forward over reverse runs it: recording its graph
        grads = grad_of(leaves + v_leaves, create_graph=True)
    except UserCodeError as exc:
        if exc.kind is not ErrorKind.BACKWARD:
            raise
        if ONCE in str(exc):  # order 3 and up: a once_differentiable backward's gradients differentiated
            return unsupported(result, ONCE_SKIP, start, ctx.named, row_reason=ONCE_ROW)
        first(leaves + [v.detach() for v in vs[: len(live)]])  # raises as well where backward's contract is broken
        at = f" at {exc.where}" if exc.where else ""
        hazard = f"backward cannot be differentiated: recording its graph (create_graph=True), {exc}{at}; "
        return _hazard(ctx, result, hazard + UNDIFFERENTIABLE, start, "backward could not be differentiated")
    if any(marked_once_differentiable(g) for g in grads):  # torch's forward mode finds no tangent through it
        return unsupported(result, ONCE_SKIP, start, ctx.named, row_reason="backward is marked @once_differentiable")
    plain = fresh_leaves(bound.values, grad=False) + [v.clone() for v in vs]
    rows = [reports[i] for i in checked] + first_rows + probe_rows(tower, n + len(live))
    result.inputs = reports + rows[len(checked) :]
    moved = tower.moved  # what is pushed forward and moved: arguments, grad_outputs of every level
    names = list(bound.names) + [r.name for r in rows[len(checked) :]]
    upcast, tols, notes = reference(
        grad_of,
        plain,
        names,
        moved,
        ctx.tolerance,
        "the forward-mode derivative of backward",
        "the numerical derivative comes from forward and backward",
    )
    assert upcast is not None  # half precision skipped above
    refuse_unusable(upcast, moved, names, tols)
    result.warnings += notes
    budget = work_limit(ctx, "forward_over_reverse", checked, outputs, live)
    positions = list(range(len(grads)))
    dual = tower.over(_dual_backward(ctx, checked, live))
    cols = Columns(dual, grad_of, plain, upcast, moved, grads, positions, budget)
    try:
        layout, entries = compare_columns(ctx, cols, moved, tols)
    except UserCodeError as exc:
        named = named_mistake(exc, target, bound, plain[:n], checked)
        if named is None:
            raise
        status, message = named
        if status is Status.SKIP:  # a Function it calls has no jvp, torch has no formula: unsupported
            why = (
                f"backward cannot be pushed forward: {message}"
                if exc.kind is ErrorKind.BACKWARD
                else f"{message} (forward over reverse runs forward on dual numbers, which needs it)"
            )
            return unsupported(result, why, start, ctx.named, "forward-mode AD failed (see the message)")
        return skip(result, message, start, status, "jvp failed (see the message)")
    imprecise = judge_rows(
        ctx,
        cols,
        rows,
        layout,
        entries,
        tols,
        lambda row: f"no tangent along {label(row)} comes out of backward in forward mode",
        "backward, pushed forward,",
        result.warnings,
    )
    analytic = [leaves[i] for i in checked] + v_leaves
    lost = [r for r, leaf in zip(rows, analytic) if _lost(r, grads, leaf, gen)]
    return _verdict(ctx, result, rows, imprecise, lost, start, order)


def _dual_backward(ctx: CheckContext, checked: list[int], live: list[int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """G on dual numbers: (argument values..., grad_outputs...) -> the gradients of the checked arguments,
    with backward's graph recorded (as torch's check_fwd_over_rev runs it). A dual number keeps its tangent
    as it becomes a leaf of backward's graph (detach() would drop it); what forward raises on dual numbers is
    labelled as jvp's; gradients backward leaves out (None) are zeros, without a tangent."""
    target, bound = ctx.target, ctx.bound
    n = len(bound.values)
    what = "jvp" if target.is_function else "forward-mode AD through the function"

    def call(values: list[Any], create_graph: bool = True) -> tuple[Any, ...]:  # backward's graph: always recorded
        args = leaves(values, checked + list(range(n, len(values))))  # arguments and grad_outputs, as in torch's
        with torch.enable_grad():
            outs = as_tuple(call_forward(target, bound, args[:n], ErrorKind.JVP, what))
            grads = guarded(
                ErrorKind.BACKWARD,
                "backward",
                engine.grad,
                [outs[p] for p in live],
                [args[i] for i in checked],
                args[n:],
                create_graph=True,
                allow_unused=True,
            )
        return tuple(strided(g) if g is not None else torch.zeros_like(args[i]) for g, i in zip(grads, checked))

    return call


def _lost(row: InputReport, grads: tuple[Any, ...], leaf: torch.Tensor, gen: torch.Generator) -> bool:
    """Whether a row whose forward-mode side is all zeros has a zero reverse-mode side too (backward's
    recorded graph gives it no derivative either: backward is not differentiable with respect to it, a
    hazard as double_backward's); where reverse mode finds a derivative, only forward mode lost it: wrong."""
    if row.status is not Status.FAIL or row.pattern is not Pattern.ZERO_ANALYTICAL:
        return False
    live = [g for g in grads if g.requires_grad]
    if not live:
        return True
    probes = [probe_like(g, gen) for g in live]  # random signs: no cancellation by symmetry
    reverse: Any = torch.autograd.grad(live, [leaf], probes, retain_graph=True, allow_unused=True)[0]
    return reverse is None or not bool(reverse.ne(0).any())


def _hazard(ctx: CheckContext, result: CheckResult, hazard: str, start: float, row_reason: str) -> CheckResult:
    """A backward that cannot be differentiated: a fail when the check is named, else a skip and a warning
    (a correct first-order backward may be so)."""
    if ctx.named:
        return skip(result, hazard + NAMED, start, Status.FAIL, row_reason)
    result.warnings.append(hazard)
    return skip(result, hazard + UNDER_ALL, start, row_reason=row_reason)


def _verdict(
    ctx: CheckContext,
    result: CheckResult,
    rows: list[InputReport],
    imprecise: list[str],
    lost: list[InputReport],
    start: float,
    order: int = 2,
) -> CheckResult:
    """The check's status from its rows, the same named or under `checks: all`: a wrong derivative fails, and
    so does a backward that is not differentiable with respect to some rows (no derivative in either mode:
    second derivatives through it come out silently zero); where finite differences measure rounding alone
    there is no verdict (a skip under `checks: all`, a fail when named: ``unsupported``)."""
    failing = [r for r in rows if r.status is Status.FAIL]
    unjudged = [r for r in failing if r.name in imprecise and r not in lost]
    hazard = (
        f"backward is not differentiable with respect to {labels(lost)} (neither forward nor reverse mode "
        "finds a derivative of backward where finite differences do): second derivatives through it come out "
        f"silently zero or partial; {ONCE_FIX}, or compute what backward uses inside backward with "
        "differentiable torch ops"
    )
    wrong = [r for r in failing if r not in lost and r not in unjudged]
    if not wrong and not lost and unjudged:
        told = [f"{label(r)}: {r.diagnosis}" for r in unjudged]
        return unsupported(result, "; ".join(told), start, ctx.named, "not judged: finite differences measure rounding")

    def sentence(r: InputReport) -> str:
        if r in lost:
            return hazard
        if r in unjudged:
            return f"{label(r)}: {r.diagnosis}"
        what = f"the forward-mode derivative of {reversed_(order)} along {label(r)} is wrong"
        if r.pattern is Pattern.ZERO_ANALYTICAL:
            return (
                f"{what}: {r.diagnosis}; reverse mode (double_backward) finds a derivative there, so the tangent "
                "is lost in forward mode only: a Function that backward calls has a jvp that drops it"
            )
        return f"{what}: {r.diagnosis}" if r.diagnosis else what

    said: set[str] = set()

    def once(r: InputReport) -> Optional[str]:  # the hazard is one sentence for all its rows
        text = sentence(r)
        if text in said:
            return None
        said.add(text)
        return text

    checked = CHECKED.replace("over backward", f"over {reversed_(order)}")
    return conclude(result, start, [], once, lambda right: f"{checked} {labels(right)}: all within tolerance")
