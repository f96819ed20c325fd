"""A check's verdict: its start, a skip, and the one builder of its status and message from its rows.

The verdict of a case is built in four stages, each in one place, each on a named type:
1. a row (``InputReport``, one per argument or output) from its comparison: ``rows.fill``;
2. a check (``CheckResult``) from its rows and problems: ``conclude`` here (``status_of``);
3. the rows the spec's ``expect:`` names, judged again (XFAIL, or FAIL where the expected mismatch went
   away or changed), and their check's status from its rows again (``status_of``): ``expectations.apply``;
4. the case (``CaseResult``) from its checks: ``results.overall``, or its error, in ``runner.guard``.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple, Optional

import torch

from ...numerics import ArgumentComparison
from ...results import CheckResult, InputReport, Pattern, Status
from ...subject.binding import Bound
from .argument_rows import NO_ELEMENTS, checked_positions, no_elements, skeleton


class Begun(NamedTuple):
    """A check's start (``begin``)."""

    start: float  # time.perf_counter() then
    rows: list[InputReport]  # a row per argument
    checked: list[int]  # the positions whose gradient the check compares (the other rows say why not)
    result: CheckResult  # passing, holding the rows


def begin(bound: Bound, check: str, mode: Optional[str]) -> Begun:
    """A check's start: the clock, a row per argument, the positions whose gradient it compares
    (the others' rows say why not), and a passing result holding the rows."""
    start = time.perf_counter()
    rows = skeleton(bound)
    checked = checked_positions(bound, rows)
    return Begun(start, rows, checked, CheckResult(check, Status.PASS, mode=mode, inputs=rows))


def label(row: InputReport) -> str:
    """How a message names a row: 'x' for an argument, grad_output 0 as it is."""
    return row.name if row.name.startswith("grad_output") else f"'{row.name}'"


def labels(rows: list[InputReport]) -> str:
    """'x', 'w' for these rows."""
    return ", ".join(label(r) for r in rows)


def skip(
    result: CheckResult, reason: str, start: float, status: Status = Status.SKIP, row_reason: str = "see the message"
) -> CheckResult:
    """The check does not apply (SKIP), or failed before any comparison (FAIL): the reason is the
    message, and rows not yet marked say they were not checked (never a silent pass)."""
    for row in result.inputs:
        if row.status is Status.PASS:
            row.status, row.reason = Status.SKIP, row_reason
    result.status, result.message = status, reason
    result.duration_s = time.perf_counter() - start
    return result


# the one difference between a check named and reached through `all` (``unsupported``): contract section 4
NAMED_FAILS = "; this check was named explicitly, so that fails (`checks: all` skips it)"


def unsupported(
    result: CheckResult, reason: str, start: float, named: bool, row_reason: str = "see the message"
) -> CheckResult:
    """The Function cannot support this check (no jvp, @once_differentiable, a double backward that raises
    in use) or finite differences cannot judge it: a FAIL when the check was named explicitly, so CI never
    goes green on a property that was asked for, and a SKIP under ``checks: all`` (every applicable check),
    with the same reason and rows. Never for what is wrong: a wrong or silently wrong value fails named or
    under `all` alike (the case's verdict is the worst of its checks, so `all` is never laxer)."""
    if named:
        reason += NAMED_FAILS
    return skip(result, reason, start, Status.FAIL if named else Status.SKIP, row_reason)


def emptied(rows: list[InputReport]) -> list[str]:
    """A sentence per argument row not checked for having no elements (``rows.NO_ELEMENTS``)."""
    return [no_elements(label(r), r.shape) for r in rows if r.status is Status.SKIP and r.reason == NO_ELEMENTS]


def nothing_to_compare(bound: Bound, check: str) -> Optional[CheckResult]:
    """Check ``check``'s result where every tensor argument that requires grad has no elements: a skip that
    says so, before anything is called (nothing compared is never a pass); else None (the check runs)."""
    wanted = [v for v in bound.values if isinstance(v, torch.Tensor) and v.requires_grad]
    if not wanted or any(v.numel() for v in wanted):
        return None
    start, rows, _, result = begin(bound, check, None)
    return skip(result, "; ".join(emptied(rows)), start)


def status_of(result: CheckResult) -> Status:
    """A check's status from its rows and problems: FAIL where a problem was found or a row fails, XFAIL
    where its only mismatches are expected ones, else PASS (``conclude`` makes a check that compared
    nothing a SKIP)."""
    if result.problems or any(r.status is Status.FAIL for r in result.inputs):
        return Status.FAIL
    return Status.XFAIL if any(r.status is Status.XFAIL for r in result.inputs) else Status.PASS


def conclude(
    result: CheckResult,
    start: float,
    problems: list[str],
    wrong: Callable[[InputReport], Optional[str]],
    passed: Callable[[list[InputReport]], str],
    *,
    name_right: bool = True,
    advice: str = "",
    nothing: Optional[str] = None,
    notes: Optional[list[str]] = None,
) -> CheckResult:
    """Status and one-line message of a check from its rows: the ``problems`` found besides the
    rows, a sentence per failing row (``wrong(row)``, None to say nothing more), which rows are
    right (``name_right``), and ``advice`` once when an analytical side is all zeros; when nothing
    failed, ``passed(right rows)``, or, when no row was compared, SKIP (never a pass) that says why: the
    arguments with no elements (``emptied``), else ``nothing``. Those arguments, then ``notes``, end the
    message either way."""
    failing = [r for r in result.inputs if r.status is Status.FAIL]
    right = [r for r in result.inputs if r.status is Status.PASS]
    parts = list(problems) + [s for s in map(wrong, failing) if s]
    result.problems = list(problems)
    empty = emptied(result.inputs)
    if status_of(result) is Status.FAIL:
        result.status = Status.FAIL
        if name_right and right and failing:
            parts.append(f"{labels(right)} {'is' if len(right) == 1 else 'are'} right")
        if advice and any(r.pattern is Pattern.ZERO_ANALYTICAL for r in failing):
            parts.append(advice)
    elif not right:
        result.status = Status.SKIP
        parts += [] if empty else [nothing or "nothing was compared (see the rows)"]
    else:
        parts.append(passed(right))
        result.warnings += empty  # a pass shows its warnings: what it did not compare is one
    result.message = "; ".join(parts + empty + (notes or []))
    result.duration_s = time.perf_counter() - start
    return result


def reword(entry: ArgumentComparison, row: InputReport, all_zeros: str, derivative: str) -> None:
    """Say the two patterns whose generic words blame ``backward`` for this check instead:
    ``all_zeros`` says why the analytical side may be all zeros, ``derivative`` what gives one."""
    if not row.mismatched or entry.nonfinite:
        return
    if entry.sum_aa == 0 and entry.sum_nn > 0:
        row.diagnosis = f"analytical is all zeros, numerical is not: {all_zeros}"
        row.pattern = Pattern.ZERO_ANALYTICAL
    elif entry.sum_nn == 0 and entry.sum_aa > 0:
        row.diagnosis = (
            f"numerical is zero (the values do not change with {label(row)}), but {derivative} "
            "gives a non-zero derivative"
        )
        row.pattern = Pattern.ZERO_NUMERICAL
