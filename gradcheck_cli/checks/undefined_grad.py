"""The ``undefined_grad`` check: backward when some outputs' gradients are undefined (None).

Autograd leaves an output's gradient undefined when the loss does not use that output. A
Function's backward then gets zeros in its place (the default) or None (after
``ctx.set_materialize_grads(False)``). With several differentiable outputs, backward is run with
only output k's gradient defined, for each k (and, from three outputs on, with only output k's
undefined, as torch's check does): the gradients must equal those with explicit zero
grad_outputs in place of the undefined ones. With every output's gradient undefined they must
be undefined or zero (``torch.autograd.gradcheck(check_undefined_grad=True)``).

Gradients are made undefined as torch's check makes them (``UndefinedGrad`` on the output), so
the autograd engine calls backward exactly as in training, materialization included: calling
the graph node's ``apply`` directly would hand None even to Functions that get zeros.
A backward that raises on None is a failure with a message that says how to handle it.
The default ``backward`` check runs the same situations (``parts.undefined``), on its own graph.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core.tolerance import same
from ..results import CheckResult, InputReport, Status
from .parts.argument_rows import agreement, fill
from .parts.base import CheckContext, graph_forward
from .parts.undefined import STREAM, differs, make_undefined, scenarios, situations
from .parts.verdict import begin, conclude, skip

__all__ = ["STREAM", "run", "scenarios"]  # its random stream and situations are read from here too (parts/undefined.py)


def run(ctx: CheckContext) -> CheckResult:
    """The ``undefined_grad`` check of ``ctx.target`` on ``ctx.bound``."""
    target, bound, opts = ctx.target, ctx.bound, ctx.options
    start, rows, checked, result = begin(bound, "undefined_grad", "undefined")
    leaves, outputs, positions = graph_forward(target, bound)
    reason = (
        "no argument requires grad: nothing to check"
        if not checked
        else "no output requires grad: backward is never called"
        if not positions
        else None
        if make_undefined()
        else "this version of torch cannot make an undefined gradient"
    )
    seen = (
        None
        if reason
        else situations(
            target, bound.names, leaves, outputs, positions, checked, ctx.streams, opts.tolerance.nondet_tol
        )
    )
    if seen is None:
        return skip(result, reason or "", start)
    for i in seen.nonzero:
        rows[i].status = Status.FAIL
    for i in checked:
        if not seen.got[i]:
            rows[i].status, rows[i].reason = Status.SKIP, "not compared: backward raised (see the message)"
            continue
        limits = same(bound.values[i].dtype, opts.tolerance.nondet_tol)
        fill(
            rows[i],
            agreement(torch.cat(seen.got[i]), torch.cat(seen.want[i]), limits),
            bound.values[i],
            lambda r: seen.labels[r],
        )
        rows[i].reason = rows[i].reason or f"{len(seen.labels)} situation(s) against explicit zero grad_outputs"
    return _finish(result, start, seen.problems, seen.labels)


def _finish(result: CheckResult, start: float, problems: list[str], labels: list[str]) -> CheckResult:
    """Status and message from the rows and the problems."""

    def wrong(r: InputReport) -> Optional[str]:
        return differs(r.name, r.worst_output or "", r.max_abs_err or 0.0) if r.mismatched else None

    def passed(right: list[InputReport]) -> str:
        partial = [label for label in labels if "every" not in label]
        message = "with every output's gradient undefined the gradients are zero"
        if partial:
            message = f"undefined grad_outputs give the gradients of explicit zeros ({'; '.join(partial)}); " + message
        return message

    return conclude(result, start, problems, wrong, passed, name_right=False)
