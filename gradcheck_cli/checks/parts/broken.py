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

from ...numerics.streams import Stream
from ...results import CheckResult, ErrorKind, Status
from ...sandbox.errors import UserCodeError
from . import contract
from .base import CheckContext, EightBitOutput
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
    backward check's words where its contract is broken, else backward raising on valid inputs; where forward
    returned 8-bit floats, a skip as ``eight_bit`` says; None for other errors (the case's error: forward
    raising, a reference, the device)."""
    if isinstance(exc, EightBitOutput):
        return eight_bit(ctx, name, exc)
    if exc.kind is not ErrorKind.BACKWARD:
        return None
    start, _, _, result = begin(ctx.bound, name, None)
    return contract_failure(ctx, result, start) or raised(result, exc, start)


def eight_bit(ctx: CheckContext, name: str, exc: EightBitOutput) -> Optional[CheckResult]:
    """Check ``name`` differentiates through forward's 8-bit float output, which no finite difference can
    judge: a skip where the reference check judges the Function (it compares gradients, no step through
    forward) or under `checks: all`, as for a Function that runs in half precision only; named with no
    reference, None (the case's forward error, which says what to do)."""
    if ctx.oracle is None and ctx.named:
        return None
    start, _, _, result = begin(ctx.bound, name, None)
    why = f"{exc.why}; the reference check judges it" if ctx.oracle is not None else str(exc)
    return skip(result, why, start, row_reason="8-bit float output")
