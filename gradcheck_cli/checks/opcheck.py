"""The ``opcheck`` check: ``torch.library.opcheck`` on the case's drawn inputs, one row per test.

opcheck tests what a custom op registers besides its gradient values: the schema (the mutations
and aliases it declares), the autograd registration, the fake kernel against the real one, and AOT
dispatch with dynamic shapes (what torch.compile runs). It never compares gradient values, which the
backward check does: the two complement. Each test runs on its own (``test_utils=``), on fresh copies
of the arguments, so one failing test hides no other.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from ..results import CheckResult, ErrorKind, InputReport, Status
from ..sandbox.errors import guarded
from ..subject.custom_op import OpTarget
from .parts.base import CheckContext, fresh_leaves
from .parts.verdict import conclude, unsupported

# each test of torch.library.opcheck, and what to do when it fails
TESTS = {
    "test_schema": "declare every argument the op mutates (`mutates_args=(...)` of @torch.library.custom_op) "
    "and return no alias of an input",
    "test_autograd_registration": "register the op's gradient with register_autograd (the op's autograd "
    "kernel), not by calling an autograd.Function inside the op",
    "test_faketensor": "make the fake kernel (register_fake) return what the real kernel returns: same shape, "
    "dtype, device and strides, computed from the inputs' metadata only",
    "test_aot_dispatch_dynamic": "the op must trace under torch.compile's AOT dispatch with dynamic shapes: a "
    "right fake kernel, and a backward made of torch ops on what setup_context saved",
}
MESSAGE_CHARS = 300  # of a failing test's error, in its row


def run(ctx: CheckContext) -> CheckResult:
    """Run each opcheck test on ``ctx.bound``'s values; a target that is not an op cannot be checked."""
    start = time.perf_counter()
    result = CheckResult("opcheck", Status.PASS, mode="torch.library.opcheck")
    target, bound = ctx.target, ctx.bound
    if not isinstance(target, OpTarget):
        return unsupported(
            result,
            f"{target.path} is not a custom op: opcheck tests torch.library ops "
            "(torch.ops.ns.op, an overload of it, or what @torch.library.custom_op returns)",
            start,
            ctx.named,
        )
    for k, test in enumerate(TESTS):
        values = bound.arguments(fresh_leaves(bound.values))
        args = values[: bound.n_positional]
        kwargs = dict(zip(bound.kw_names, values[bound.n_positional : bound.n_positional + len(bound.kw_names)]))
        with warnings.catch_warnings():  # anomaly mode's "Error detected in ..." of a failing test
            warnings.simplefilter("ignore")
            outcome = guarded(
                ErrorKind.FORWARD,
                f"torch.library.opcheck ({test})",
                torch.library.opcheck,
                target.obj,
                tuple(args),
                kwargs,
                test_utils=(test,),
                raise_exception=False,
            )
        result.inputs.append(_row(k, test, outcome.get(test, "SUCCESS")))

    def wrong(row: InputReport) -> str:
        return f"{row.name} failed: {row.reason}; {TESTS[row.name]}"

    def passed(right: list[InputReport]) -> str:
        return (
            f"{target.name}: {', '.join(r.name for r in right)} pass (opcheck does not compare gradient values: "
            "the backward check does)"
        )

    return conclude(result, start, [], wrong, passed, name_right=False)


def _row(k: int, test: str, outcome: Any) -> InputReport:
    """A test's row: pass, or fail with the first line of its error."""
    row = InputReport(k, test, [], "-", Status.PASS, role="test")
    if outcome != "SUCCESS":
        text = str(outcome).strip().splitlines()[0] if str(outcome).strip() else ""
        text = f"{type(outcome).__name__}: {text}" if isinstance(outcome, BaseException) else text
        row.status = Status.FAIL
        row.reason = text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
    return row
