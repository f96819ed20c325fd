"""The ``double_backward`` check: backward differentiated, against finite differences of backward.

Like ``torch.autograd.gradgradcheck``: the function G(x..., v...) = (dL/dx for each checked
argument x, with L = sum over the differentiable outputs y of <v, y>) is itself checked entry by
entry with ``numerics.compare``, so its analytical Jacobian is backward differentiated
(``create_graph=True``) and its numerical one is central differences of backward. The
grad_outputs v are random (seeded from the spec's seed) and are arguments of G too, as in torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Union

import torch

from ..core.tolerance import Tolerance
from ..numerics import ArgumentComparison, as_tuple, compare, engine, kinks, vjp
from ..numerics.realify import Vjp, strided
from ..numerics.streams import Streams
from ..results import CheckResult, ErrorKind, InputReport, Pattern, Status
from ..sandbox.errors import UserCodeError, guarded
from .parts.argument_rows import blank, fill_jacobian, take
from .parts.base import (
    CheckContext,
    Graph,
    call_forward,
    fresh_leaves,
    graph_forward,
    half_precision,
    probe_like,
    refuse_if_too_big,
    work_limit,
)
from .parts.second_look import EXPLAINED, NONFINITE, PRECISION, WRONG, Look, inside, look_again
from .parts.step import refuse_unusable
from .parts.tower import (
    Settings as Settings,  # the spec's keys this check owns (order:); forward_over_reverse reads it too
)
from .parts.tower import Tower, build, every_order, ordinal, times
from .parts.upcast import by_tolerance, reference
from .parts.verdict import begin, conclude, label, labels, reword, skip, unsupported

STREAM = 10  # the random stream of double_backward's grad_outputs (a seed replays it)

FULL_BITS = 0.7853981633974483  # pi / 4: 53 significant bits
ONCE = "trying to differentiate twice a function that was marked with @once_differentiable"
ONCE_SKIP = (
    "backward is marked @once_differentiable: it cannot be differentiated, so there is no second "
    "derivative to check; to support double backward, remove the decorator and write backward "
    "with differentiable torch ops"
)
ONCE_FIX = (
    "if double backward is not wanted, mark backward @once_differentiable (that one decorator is the fix: "
    "double backward then raises instead of giving wrong values)"
)
UNDIFFERENTIABLE = (
    "write backward with differentiable torch operations (no .numpy(), .item(), out=, or in-place "
    "writes into tensors that require grad), or, if double backward is not wanted, mark it "
    "@once_differentiable (that one decorator is the fix)"
)
ONCE_ROW = "backward is marked @once_differentiable"
DETACHED = (
    "a value backward uses was taken outside autograd (a tensor computed in forward and saved, "
    "as forward runs without autograd; or .detach(), .data, numpy, torch.no_grad()): compute what "
    "backward needs inside backward, with differentiable torch ops on the saved inputs and outputs"
)


def backward_graph(
    ctx: CheckContext, result: CheckResult, start: float, checked: list[int], order: str, purpose: str
) -> Union[CheckResult, Graph]:
    """The graph of forward whose backward a check of backward's derivative differentiates (``purpose``:
    "differentiate", "push forward"), or that check's skip: no argument requires grad, a half-precision
    argument (``order``: what finite differences cannot judge there), or no differentiable output."""
    if not checked:
        return skip(result, f"no argument requires grad: there is no backward to {purpose}", start)
    half = half_precision(ctx.bound, checked, order)
    if half:
        return skip(result, half, start, row_reason="half precision")
    graph = graph_forward(ctx.target, ctx.bound)
    refuse_if_too_big(ctx, graph.outputs)
    if not graph.positions:
        return skip(
            result,
            "no output is differentiable (none is a floating-point tensor that requires "
            f"grad): there is no backward to {purpose}",
            start,
        )
    return graph


def run(ctx: CheckContext) -> CheckResult:
    """Check the second derivative of ``ctx.target`` (and each order up to the spec's ``order:``): backward
    against finite differences of backward."""
    return every_order(ctx, lambda order: _run(ctx, order))


def _run(ctx: CheckContext, order: int) -> CheckResult:
    """The check of order ``order``: backward differentiated ``order - 1`` times against finite differences
    of backward differentiated ``order - 2`` times."""
    target, bound, opts, tol = ctx.target, ctx.bound, ctx.options, ctx.tolerance
    start, reports, checked, result = begin(bound, "double_backward", "elementwise")
    graph = backward_graph(ctx, result, start, checked, "the second derivative", "differentiate")
    if isinstance(graph, CheckResult):
        return graph
    leaves, outputs, live = graph
    gen = ctx.streams.generator(STREAM)
    # probes with every bit of their dtype: where backward scales them by 0 or 1 (relu), values of 17 bits
    # would look like a coarse grid to the second look (numerics.precision)
    vs = [probe_like(outputs[p], gen) * FULL_BITS for p in live]
    n = len(bound.values)
    first_rows = grad_output_rows(outputs, live, n)
    tower = build(list(bound.values) + vs, list(bound.names) + [r.name for r in first_rows], checked, n, order, gen)
    first = backward_of(ctx, checked, live)
    grad_of = tower.over(first)
    vs += tower.probes
    v_leaves = [v.clone().requires_grad_(True) for v in vs]
    try:
        grads = grad_of(leaves + v_leaves, create_graph=True)
    except UserCodeError as exc:
        if exc.kind is not ErrorKind.BACKWARD:
            raise
        if ONCE in str(exc):  # order 3 and up: a once_differentiable backward's gradients differentiated
            return unsupported(result, ONCE_SKIP, start, ctx.named, row_reason=ONCE_ROW)
        first(leaves + [v.detach() for v in v_leaves[: len(live)]])  # backward itself raising: the runner's fail
        return _raises(ctx, result, start, exc, f"recording its graph{times(order)} (create_graph=True)")
    if any(marked_once_differentiable(g) for g in grads):
        return unsupported(result, ONCE_SKIP, start, ctx.named, row_reason="backward is marked @once_differentiable")
    copies = fresh_leaves(bound.values, grad=False) + [v.clone() for v in vs]
    rows = [reports[i] for i in checked] + first_rows + probe_rows(tower, n + len(live))
    result.inputs = reports + rows[len(checked) :]
    moved = tower.moved  # what finite differences move: arguments, grad_outputs of every level
    plain, tols, notes = reference(
        grad_of,
        copies,
        list(bound.names) + [r.name for r in rows[len(checked) :]],
        moved,
        tol,
        "the second derivative",
        "the numerical second derivative comes from forward and backward",
    )
    assert plain is not None  # half precision skipped above
    refuse_unusable(plain, moved, list(bound.names) + [r.name for r in rows[len(checked) :]], tols)
    result.warnings += notes
    second = lambda *args: guarded(ErrorKind.BACKWARD, "backward, differentiated,", vjp, *args)  # noqa: E731
    analytic = [leaves[i] for i in checked] + v_leaves
    positions = list(range(len(grads)))
    layouts: list[Any] = [None] * len(rows)
    entries: list[Any] = [None] * len(rows)
    budget = work_limit(ctx, "double_backward", checked, outputs, live)
    try:
        for group in by_tolerance(range(len(rows)), tols):
            t = tols[group[0]]
            layout, found = compare(
                grad_of,
                grads,
                positions,
                [analytic[k] for k in group],
                plain,
                [plain[moved[k]] for k in group],
                eps=t.eps,
                atol=t.atol,
                rtol=t.rtol,
                memory_bytes=opts.memory_bytes,
                grad=second,
                streams=ctx.streams,
                budget=budget,
                compress=opts.compress,
            )
            for k, entry in zip(group, found):
                layouts[k], entries[k] = layout, entry
    except UserCodeError as exc:
        if ONCE in str(exc):  # a once_differentiable Function called inside a plain callable
            return unsupported(result, ONCE_SKIP, start, ctx.named)
        if exc.kind is not ErrorKind.BACKWARD:
            raise
        # backward's graph recorded, but differentiating it raised (an in-place write into a tensor its graph
        # saved): double backward raises in real use too; backward itself raising is the runner's fail
        first(leaves + [v.detach() for v in v_leaves[: len(live)]])
        return _raises(ctx, result, start, exc, f"differentiating its graph{times(order)}")
    every = list(bound.names) + [r.name for r in rows[len(checked) :]]
    names = [every[j] for j in tower.of]  # what G's outputs are the gradients of
    zeros = "backward's result does not depend on {} through autograd"
    looks: dict[str, Look] = {}
    low: Optional[str] = None  # the float format forward computes in inside, found when a row fails
    for k, (row, entry, value) in enumerate(zip(rows, entries, analytic)):
        fill_jacobian(row, entry, layouts[k], value, grads)
        _name_worst_output(row, entry, layouts[k], names)
        reword(entry, row, zeros.format(label(row)), "differentiating backward")
        if row.status is Status.FAIL and row.mismatched:
            if low is None:
                low = inside(lambda vals: call_forward(target, bound, vals), plain[:n], plain[moved[0]], live, tol.eps)
            judge = _Judge(grad_of, grads, plain, plain[moved[k]], value, second, opts, tols[k], ctx.streams)
            looks[row.name] = judge.look(row, entry, low)
    notes, omit = _detached(rows, entries, layouts[0], grads, names)
    return _verdict(ctx, result, rows, looks, notes, omit, start, order)


class _Judge:
    """The second look at a failing row (``second_look``): G's kinks, domain edges and rounding; where the
    Function computes in low precision inside, the row judged again at a larger step."""

    def __init__(
        self,
        grad_of: Callable[..., tuple[Any, ...]],
        grads: tuple[Any, ...],
        plain: list[Any],
        x: torch.Tensor,
        leaf: torch.Tensor,
        second: Vjp,
        opts: Any,
        tol: Tolerance,
        streams: Streams,
    ) -> None:
        self.grad_of, self.grads, self.plain, self.x, self.leaf = grad_of, grads, plain, x, leaf
        self.second, self.opts, self.tol, self.streams = second, opts, tol, streams
        self.positions = list(range(len(grads)))

    def column(self, col: int) -> torch.Tensor:
        """The analytical column of real element ``col``."""
        return next(
            iter(
                kinks.analytical_columns(
                    self.second, self.grads, self.positions, self.leaf, [col], {}, self.opts.memory_bytes
                )
            )
        )[1]

    def compare(self, t: Tolerance) -> tuple[Any, ArgumentComparison]:
        """The row compared again, element by element, at tolerance ``t``."""
        layout, (entry,) = compare(
            self.grad_of,
            self.grads,
            self.positions,
            [self.leaf],
            self.plain,
            [self.x],
            eps=t.eps,
            atol=t.atol,
            rtol=t.rtol,
            memory_bytes=self.opts.memory_bytes,
            grad=self.second,
            streams=self.streams,
            compress=self.opts.compress,
        )
        return layout, entry

    def look(self, row: InputReport, entry: ArgumentComparison, low: str) -> Look:
        """``row``'s mismatches looked at again; the row rewritten where they are explained."""
        look = look_again(
            row,
            entry,
            self.grad_of,
            self.plain,
            self.x,
            self.positions,
            self.tol,
            self.column,
            "backward, differentiated,",
            low,
        )
        if look.kind == EXPLAINED:
            row.status, row.mismatched, row.diagnosis, row.ratio = Status.PASS, 0, None, None
            row.pattern, row.at_kinks, row.reason = Pattern.KINK, look.count, look.text
        elif look.kind == PRECISION and look.eps:
            return self._again(row, look, low)
        elif look.kind in (PRECISION, NONFINITE):
            row.pattern, row.ratio, row.diagnosis = Pattern(look.kind), None, look.text
        elif look.text:
            row.diagnosis = "; ".join(d for d in [row.diagnosis, look.text] if d)
        return look

    def _again(self, row: InputReport, look: Look, low: str) -> Look:
        """The row judged again at ``look.eps`` with float32's tolerances: a pass with a warning, or a fail
        with those numbers."""
        t = replace(self.tol.at_least(torch.float32), eps=look.eps)
        layout, entry = self.compare(t)
        fresh = blank(row)
        fill_jacobian(fresh, entry, layout, self.leaf, self.grads)
        take(row, fresh)
        what = (
            f"the Function computes in {low or 'float32'} or lower precision inside, so finite differences at "
            f"eps={self.tol.eps:g} measure rounding: judged at eps {t.eps:g} with float32 tolerances (atol "
            f"{t.atol:g}, rtol {t.rtol:g})"
        )
        if row.status is Status.PASS:
            row.pattern, row.ratio = Pattern.PRECISION, None
            row.reason = f"{what}; a relative error below about {t.rtol:g} cannot be seen this way"
            return Look(EXPLAINED, row.reason)
        row.diagnosis = f"{what}: {row.diagnosis or f'{row.mismatched} of {row.numel} elements out of tolerance'}"
        return Look(WRONG, row.diagnosis)


def _raises(ctx: CheckContext, result: CheckResult, start: float, exc: UserCodeError, doing: str) -> CheckResult:
    """Double backward raises where backward's value is right (``doing``: recording or differentiating its
    graph): it raises in real use too, as a Function marked @once_differentiable does, so the check cannot run:
    a skip with the reason and a warning under `checks: all`, a fail when named (``unsupported``)."""
    at = f" at {exc.where}" if exc.where else ""
    hazard = f"backward cannot be differentiated: {doing}, {exc}{at}; {UNDIFFERENTIABLE}"
    if not ctx.named:
        result.warnings.append(hazard)
    return unsupported(result, hazard, start, ctx.named, row_reason="backward could not be differentiated")


def _verdict(
    ctx: CheckContext,
    result: CheckResult,
    rows: list[InputReport],
    looks: dict[str, Look],
    notes: list[str],
    omit: set[str],
    start: float,
    order: int = 2,
) -> CheckResult:
    """The check's status from its rows, the same named or under `checks: all`: a wrong second derivative
    fails, and so does a silently wrong one (a backward that is not differentiable: its derivatives come out
    zero in double backward, Hessian-vector products and gradient penalties). What finite differences cannot
    judge is no verdict (a skip under `checks: all`, a fail when named: ``unsupported``): where they measure
    rounding, or where autograd makes backward's derivative NaN at a domain edge while backward's values are
    finite (NaN shows itself in use; a correct Function such as entmax is so off its support), said as a
    warning too."""
    for r in rows:
        if r.status is Status.PASS and (r.at_kinks or r.pattern is Pattern.PRECISION):
            result.warnings.append(f"{label(r)}: {r.reason}")
    failing = [r for r in rows if r.status is Status.FAIL]

    def kind(r: InputReport) -> str:
        look = looks.get(r.name)
        if look is not None and look.kind in (PRECISION, NONFINITE):
            return look.kind
        return "zeros" if r.pattern is Pattern.ZERO_ANALYTICAL or r.name in omit else WRONG

    if failing and all(kind(r) in (PRECISION, NONFINITE) for r in failing):
        nan = [r.diagnosis for r in failing if kind(r) == NONFINITE and r.diagnosis][:1]
        told = nan + [f"{label(r)}: {r.diagnosis}" for r in failing if kind(r) == PRECISION]
        if not ctx.named:
            result.warnings += nan
        for r in failing:
            r.status, r.reason = (
                Status.SKIP,
                "not judged: finite differences measure rounding"
                if kind(r) == PRECISION
                else "NaN or infinite second derivative",
            )
        return unsupported(result, "; ".join(told), start, ctx.named)
    hazard = _not_differentiable([r for r in failing if kind(r) == "zeros"])
    problems = ([hazard] if hazard else []) + notes

    def wrong(r: InputReport) -> Optional[str]:
        if r.name in omit or kind(r) == "zeros":
            return None
        if kind(r) in (PRECISION, NONFINITE):
            return f"{label(r)}: {r.diagnosis}"
        what = f"the {_derivative(order)} with respect to {label(r)} is wrong"
        return f"{what}: {r.diagnosis}" if r.diagnosis else what

    return conclude(
        result,
        start,
        problems,
        wrong,
        lambda right: f"backward differentiated{times(order)} with respect to {labels(right)}: all within tolerance",
        advice=DETACHED,
    )


def _derivative(order: int) -> str:
    """What a row of the check of order ``order`` compares."""
    if order == 2:
        return "derivative of backward"
    return f"{ordinal(order)} derivative (backward differentiated {order - 1} times)"


def probe_rows(tower: Tower, first_index: int) -> list[InputReport]:
    """One row per grad_output of levels 2 and up, numbered after the first level's."""
    return [
        InputReport(first_index + k, name, list(w.shape), str(w.dtype)[6:], Status.PASS, numel=w.numel())
        for k, (name, w) in enumerate(zip(tower.names, tower.probes))
    ]


def _detached(
    rows: list[InputReport], entries: list[ArgumentComparison], layout: Any, grads: tuple[Any, ...], names: list[str]
) -> tuple[list[str], set[str]]:
    """A note when mismatches lie in a gradient that backward computed outside autograd altogether,
    and the rows it explains (all-zero rows whose worst entry is in such a gradient): the message
    says it once instead of once per row (the table still shows each row's diagnosis)."""
    where = {r.name: layout.row_location(e.worst_row)[2] for r, e in zip(rows, entries) if r.mismatched}
    detached = sorted(k for k in set(where.values()) if not grads[k].requires_grad)
    if not detached:
        return [], set()
    omit = {r.name for r, e in zip(rows, entries) if r.name in where and where[r.name] in detached and e.sum_aa == 0}
    return [
        f"backward is not differentiable: the gradient it returns for "
        f"{', '.join(repr(names[k]) for k in detached)} does not require grad, so all its derivatives come "
        "out zero (numerically they are not)"
    ], omit


def _not_differentiable(failing: list[InputReport]) -> Optional[str]:
    """The hazard of a backward that is not differentiable with respect to ``failing`` (rows whose analytical
    side is all zeros: backward's result does not depend on them through autograd, as a correct first-order
    backward that uses a value computed outside autograd does); None when there are none."""
    if not failing:
        return None
    return (
        f"backward is not differentiable with respect to {labels(failing)} and not marked @once_differentiable: "
        "second derivatives through it (double backward, Hessian-vector products, gradient penalties) come out "
        f"silently zero or partial; {ONCE_FIX}, or compute what backward uses inside backward with differentiable "
        "torch ops"
    )


def backward_of(ctx: CheckContext, checked: list[int], live: list[int]) -> Callable[..., tuple[Any, ...]]:
    """G: (argument values..., grad_outputs...) -> the gradients of the checked arguments.

    Tensors among the checked arguments that do not require grad (the detached copies that
    ``numerics`` perturbs) are made leaves here; grad mode is switched on because the numerical
    side calls G under ``torch.no_grad()``. Gradients backward leaves out (None) are zeros.
    """
    target, bound = ctx.target, ctx.bound
    n = len(bound.values)

    def call(values: list[Any], create_graph: bool = False) -> tuple[Any, ...]:
        args = list(values[:n])
        for i in checked:
            if not args[i].requires_grad:
                leaf = args[i].detach().requires_grad_(True)
                args = [leaf if a is values[i] else a for a in args]  # keep aliases (same_as) aliased
        with torch.enable_grad():
            outs = as_tuple(call_forward(target, bound, args))
            grads = guarded(
                ErrorKind.BACKWARD,
                "backward",
                engine.grad,
                [outs[p] for p in live],
                [args[i] for i in checked],
                list(values[n:]),
                create_graph=create_graph,
                allow_unused=True,
            )
        return tuple(strided(g) if g is not None else torch.zeros_like(args[i]) for g, i in zip(grads, checked))

    return call


def marked_once_differentiable(grad: torch.Tensor) -> bool:
    """Whether ``grad`` came out of a backward marked @once_differentiable (its node is a DelayedError)."""
    return grad.grad_fn is not None and type(grad.grad_fn).__name__ == "Error"


def grad_output_rows(outputs: tuple[Any, ...], live: list[int], first_index: int) -> list[InputReport]:
    """One row per random grad_output, numbered after the arguments (it has no line in the spec)."""
    return [
        InputReport(
            first_index + k,
            f"grad_output {p}",
            list(outputs[p].shape),
            str(outputs[p].dtype)[6:],
            Status.PASS,
            numel=outputs[p].numel(),
        )
        for k, p in enumerate(live)
    ]


def _name_worst_output(row: InputReport, entry: ArgumentComparison, layout: Any, names: list[str]) -> None:
    """'output 1 [2, 0]' of G is the gradient of the second checked argument: say so."""
    if row.worst_output and layout.n_rows:
        pos = layout.row_location(entry.worst_row)[2]
        prefix = f"output {pos}"
        if row.worst_output.startswith(prefix):
            row.worst_output = f"gradient of '{names[pos]}'" + row.worst_output[len(prefix) :]
