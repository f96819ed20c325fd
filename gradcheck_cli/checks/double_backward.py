"""The ``double_backward`` check: backward differentiated, against finite differences of backward.

Like ``torch.autograd.gradgradcheck``: the function G(x..., v...) = (dL/dx for each checked
argument x, with L = sum over the differentiable outputs y of <v, y>) is itself checked entry by
entry with ``numerics.compare``, so its analytical Jacobian is backward differentiated
(``create_graph=True``) and its numerical one is central differences of backward. The
grad_outputs v are random (seeded from the spec's seed) and are arguments of G too, as in torch.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..errors import UserCodeError, guarded
from ..numerics import Entry, as_tuple, compare, engine, vjp
from ..numerics.realify import strided
from ..results import CheckResult, ErrorKind, InputReport, Pattern, Status
from ..rng import Stream, generator
from .base import (
    CheckContext,
    call_forward,
    fresh_leaves,
    graph_forward,
    half_precision,
    probe_like,
    refuse_if_too_big,
    work_limit,
)
from .rows import fill_jacobian
from .verdict import begin, conclude, label, labels, reword, skip, unsupported

ONCE = "trying to differentiate twice a function that was marked with @once_differentiable"
ONCE_SKIP = ("backward is marked @once_differentiable: it cannot be differentiated, so there is no second "
             "derivative to check; to support double backward, remove the decorator and write backward "
             "with differentiable torch ops")
UNDIFFERENTIABLE = ("write backward with differentiable torch operations (no .numpy(), .item(), out=, or in-place "
                    "writes into tensors that require grad), or mark it @once_differentiable if it has no second "
                    "derivative")
DETACHED = ("a value backward uses was taken outside autograd (a tensor computed in forward and saved, "
            "as forward runs without autograd; or .detach(), .data, numpy, torch.no_grad()): compute what "
            "backward needs inside backward, with differentiable torch ops on the saved inputs and outputs")


def run(ctx: CheckContext) -> CheckResult:
    """Check the second derivative of ``ctx.target``: backward against finite differences of backward."""
    target, bound, opts, tol = ctx.target, ctx.bound, ctx.options, ctx.tolerance
    start, reports, checked, result = begin(bound, "double_backward", "elementwise")
    if not checked:
        return skip(result, "no argument requires grad: there is no backward to differentiate", start)
    half = half_precision(bound, checked, "the second derivative")
    if half:
        return skip(result, half, start, row_reason="half precision")
    leaves, outputs, live = graph_forward(target, bound)
    refuse_if_too_big(ctx, outputs)
    if not live:
        return skip(result, "no output is differentiable (none is a floating-point tensor that requires "
                            "grad): there is no backward to differentiate", start)
    gen = generator(opts.seed, Stream.DOUBLE_BACKWARD)
    vs = [probe_like(outputs[p], gen) for p in live]
    n = len(bound.values)
    grad_of = _backward_of(ctx, checked, live)
    v_leaves = [v.clone().requires_grad_(True) for v in vs]
    try:
        grads = grad_of(leaves + v_leaves, create_graph=True)
    except UserCodeError as exc:
        if exc.kind is not ErrorKind.BACKWARD:
            raise
        grad_of(leaves + [v.detach() for v in v_leaves])  # raises as well: backward itself is broken, an error
        at = f" at {exc.where}" if exc.where else ""
        return skip(result, f"backward cannot be differentiated: recording its graph (create_graph=True), {exc}{at}; "
                            f"{UNDIFFERENTIABLE}", start, Status.FAIL, "backward could not be differentiated")
    if any(_once_differentiable(g) for g in grads):
        return unsupported(result, ONCE_SKIP, start, ctx.named, row_reason="backward is marked @once_differentiable")
    plain = fresh_leaves(bound.values, grad=False) + [v.clone() for v in vs]
    rows = [reports[i] for i in checked] + _grad_output_rows(outputs, live, len(bound.values))
    result.inputs = reports + rows[len(checked):]
    second = lambda *args: guarded(ErrorKind.BACKWARD, "backward, differentiated,", vjp, *args)  # noqa: E731
    try:
        layout, entries = compare(grad_of, grads, list(range(len(grads))), [leaves[i] for i in checked] + v_leaves,
                                  plain, [plain[i] for i in checked] + plain[n:], eps=tol.eps, atol=tol.atol,
                                  rtol=tol.rtol, memory_bytes=opts.memory_bytes, grad=second, seed=opts.seed,
                                  budget=work_limit(ctx, "double_backward", checked, outputs, live),
                                  compress=opts.compress)
    except UserCodeError as exc:
        if ONCE in str(exc):  # a once_differentiable Function called inside a plain callable
            return unsupported(result, ONCE_SKIP, start, ctx.named)
        raise
    names = [bound.names[i] for i in checked]
    zeros = "backward's result does not depend on {} through autograd"
    for row, entry, value in zip(rows, entries, [leaves[i] for i in checked] + vs):
        fill_jacobian(row, entry, layout, value, grads)
        _name_worst_output(row, entry, layout, names)
        reword(entry, row, zeros.format(label(row)), "differentiating backward")
    notes, omit = _detached(rows, entries, layout, grads, names)
    hazard = _not_differentiable(rows, omit)
    if hazard and not ctx.named:  # under `all`: a warning; named, the rows fail as they are
        result.warnings.append(hazard)
        for r in rows:
            if r.status is Status.FAIL:
                r.status, r.reason = Status.SKIP, "backward is not differentiable with respect to it"
        return skip(result, f"{hazard} (a warning under `checks: all`; naming double_backward makes it a fail)",
                    start)

    def wrong(r: InputReport) -> Optional[str]:
        if r.name in omit:
            return None
        what = f"the derivative of backward with respect to {label(r)} is wrong"
        return f"{what}: {r.diagnosis}" if r.diagnosis else what

    return conclude(result, start, notes, wrong,
                    lambda right: f"backward differentiated with respect to {labels(right)}: all within tolerance",
                    advice=DETACHED)


def _detached(rows: list[InputReport], entries: list[Entry], layout: Any, grads: tuple[Any, ...],
              names: list[str]) -> tuple[list[str], set[str]]:
    """A note when mismatches lie in a gradient that backward computed outside autograd altogether,
    and the rows it explains (all-zero rows whose worst entry is in such a gradient): the message
    says it once instead of once per row (the table still shows each row's diagnosis)."""
    where = {r.name: layout.row_location(e.worst_row)[2] for r, e in zip(rows, entries) if r.mismatched}
    detached = sorted(k for k in set(where.values()) if not grads[k].requires_grad)
    if not detached:
        return [], set()
    omit = {r.name for r, e in zip(rows, entries) if r.name in where and where[r.name] in detached and e.sum_aa == 0}
    return [f"backward is not differentiable: the gradient it returns for "
            f"{', '.join(repr(names[k]) for k in detached)} does not require grad, so all its derivatives come "
            "out zero (numerically they are not)"], omit


def _not_differentiable(rows: list[InputReport], omit: set[str]) -> Optional[str]:
    """The hazard, when every failing row's analytical side is all zeros (backward's result does not
    depend on that argument through autograd: a value it uses was computed outside autograd, as a
    correct first-order backward may do) and no row is wrong otherwise; else None."""
    failing = [r for r in rows if r.status is Status.FAIL]
    if not failing or not all(r.pattern is Pattern.ZERO_ANALYTICAL or r.name in omit for r in failing):
        return None
    return (f"backward is not differentiable with respect to {labels(failing)} and not marked @once_differentiable: "
            "second derivatives through it (double backward, Hessian-vector products, gradient penalties) come out "
            "silently zero or partial; mark it @once_differentiable, or compute what backward uses inside backward "
            "with differentiable torch ops")


def _backward_of(ctx: CheckContext, checked: list[int], live: list[int]) -> Callable[..., tuple[Any, ...]]:
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
            grads = guarded(ErrorKind.BACKWARD, "backward", engine.grad, [outs[p] for p in live],
                            [args[i] for i in checked], list(values[n:]), create_graph=create_graph,
                            allow_unused=True)
        return tuple(strided(g) if g is not None else torch.zeros_like(args[i]) for g, i in zip(grads, checked))

    return call


def _once_differentiable(grad: torch.Tensor) -> bool:
    """Whether ``grad`` came out of a backward marked @once_differentiable (its node is a DelayedError)."""
    return grad.grad_fn is not None and type(grad.grad_fn).__name__ == "Error"


def _grad_output_rows(outputs: tuple[Any, ...], live: list[int], first_index: int) -> list[InputReport]:
    """One row per random grad_output, numbered after the arguments (it has no line in the spec)."""
    return [InputReport(first_index + k, f"grad_output {p}", list(outputs[p].shape), str(outputs[p].dtype)[6:],
                        Status.PASS, numel=outputs[p].numel()) for k, p in enumerate(live)]


def _name_worst_output(row: InputReport, entry: Entry, layout: Any, names: list[str]) -> None:
    """'output 1 [2, 0]' of G is the gradient of the second checked argument: say so."""
    if row.worst_output and layout.n_rows:
        pos = layout.row_location(entry.worst_row)[2]
        prefix = f"output {pos}"
        if row.worst_output.startswith(prefix):
            row.worst_output = f"gradient of '{names[pos]}'" + row.worst_output[len(prefix):]
