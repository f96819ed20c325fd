"""A check whose call of backward raised: the same fail whichever check met it (a case's verdict does not
depend on which checks run). Where backward breaks its contract, the backward check's fail in its words;
where backward raises on valid inputs (those the spec draws, or the layouts, batches and grad_outputs a check
gives it: every one is an input forward accepts and autograd may pass on), a fail of kind backward that says
where it raised. Forward raising stays the case's error: nothing could be checked. The runner asks
``instead_of_error`` for every check that raised, so no check needs to ask itself.

For the next contributor: a check that can run no further when backward raises must not catch the error
itself unless it words it better (``noncontiguous`` names the layout); letting it reach the runner keeps
one status and one message for every check."""

from __future__ import annotations

from typing import Optional

from ..errors import UserCodeError
from ..numerics.streams import Stream
from ..results import CheckResult, ErrorKind, Status
from . import contract
from .base import CheckContext
from .verdict import begin, skip


def contract_failure(ctx: CheckContext, result: CheckResult, start: float) -> Optional[CheckResult]:
    """Where a check's call of backward raised: its contract, inspected as the backward check inspects it. A
    contract that autograd rejects (the count, shape, type or device of the gradients) fails the check too,
    in the backward check's words (``result``'s rows marked as backward marks them); None where it holds
    (backward itself raised: an error)."""
    if not ctx.target.is_function:
        return None
    try:
        found = contract.inspect(
            ctx.target, ctx.bound, ctx.streams.generator(Stream.BACKWARD), ctx.tolerance.nondet_tol, 2
        )
    except UserCodeError:
        return None
    if not found.fatal:
        return None
    for i in found.bad_args:
        result.inputs[i].status, result.inputs[i].reason = Status.FAIL, "backward's contract is broken (see below)"
    result.problems = list(found.failures)
    return skip(result, "; ".join(found.failures), start, Status.FAIL, "backward's contract is broken (see below)")


RAISED_ROW = "backward raised (see the message)"


def raised(result: CheckResult, exc: UserCodeError, start: float) -> CheckResult:
    """The fail of a check whose call of backward raised ``exc`` on valid inputs: the error and where it
    was raised, every row not checked."""
    at = f" at {exc.where}" if exc.where else ""
    reason = (
        f"{exc}{at}: backward raises on inputs that forward accepts, so autograd (loss.backward(), "
        "torch.autograd.grad) raises there too; make backward handle every input forward accepts"
    )
    result.problems = [reason]
    return skip(result, reason, start, Status.FAIL, RAISED_ROW)


def instead_of_error(ctx: CheckContext, name: str, exc: UserCodeError) -> Optional[CheckResult]:
    """Check ``name`` raised ``exc``: where backward raised (``ErrorKind.BACKWARD``), that check's fail: in the
    backward check's words where its contract is broken, else backward raising on valid inputs; None for
    other errors (the case's error: forward raising, a reference, the device)."""
    if exc.kind is not ErrorKind.BACKWARD:
        return None
    start, _, _, result = begin(ctx.bound, name, None)
    return contract_failure(ctx, result, start) or raised(result, exc, start)
