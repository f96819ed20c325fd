"""``expect:``: mismatches a spec documents as intended (gradient reversal, straight-through estimators).

After the checks of a case, each expected argument's row of each named check is judged: the expected
mismatch becomes XFAIL (exit 0), a mismatch that went away or changed its pattern becomes a FAIL that
says so. Rows that were not compared (skip) and checks that could not run are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from ..checks.parts.verdict import status_of
from ..results import CaseResult, CheckResult, InputReport, Pattern, Status
from ..sandbox.errors import BindError
from ..spec import Expect, Expected, contradicts

RATIO_RTOL = 0.01  # an expected ratio matches the measured one within 1 % (relative)
RATIO_PATTERNS = ("sign_flip", "constant_ratio")  # a sign flip is the constant ratio -1


def apply(result: CaseResult, expect: Optional[Expect], names: list[str], chosen: bool = True) -> None:
    """Judge the rows of ``result`` that ``expect`` names (``names``: the target's arguments), then
    the status and message of each check it covers. A key that names no argument or no check of the
    case raises BindError (``chosen`` as for ``validate``)."""
    if expect is None:
        return
    validate(expect, names, [c.check for c in result.checks], chosen)
    for check in result.checks:
        if check.check in expect.checks and check.status in (Status.PASS, Status.FAIL):
            sentences = [s for exp in expect.args for row in _rows(check, exp.arg) if (s := _judge(row, exp, expect))]
            _conclude(check, sentences, expect.reason)


def validate(expect: Optional[Expect], names: list[str], checks: Sequence[str], chosen: bool = True) -> None:
    """BindError for a key of ``expect`` that names no argument (of ``names``) or no check (of ``checks``)
    of the case: called before the checks run too, so a spec error costs no check. ``chosen``: the case's
    checks are the ones its spec's `checks:` lists; where they are a default (the reference check, for a spec
    with `reference_backward:`) or the command line's, an `expect` without `checks` covers backward's rows
    where backward runs, and nothing where it does not."""
    if expect is None:
        return
    for exp in expect.args:
        if exp.arg not in names:
            raise BindError(exp.key, f"no argument named '{exp.arg}'; the arguments are {', '.join(names)}")
        contradiction = contradicts(exp.pattern, exp.ratio)
        if contradiction:
            raise BindError(exp.key or f"{expect.key}.{exp.arg}", contradiction)
    for name in expect.checks:
        if name not in checks and (expect.checks_given or chosen):
            raise BindError(
                f"{expect.key}.checks",
                f"{name} is not among the case's checks ({', '.join(checks)}): "
                f"add it to `checks:`, or name the checks whose rows the "
                f"expectation covers in `{expect.key}.checks`",
            )


def _rows(check: CheckResult, arg: str) -> list[InputReport]:
    return [row for row in check.inputs if row.name == arg and row.role == "argument"]


def _judge(row: InputReport, exp: Expected, expect: Expect) -> Optional[str]:
    """Turn one expected row into XFAIL or FAIL; the sentence the check's message gains (None: untouched)."""
    what = f"expected {exp} ({expect.reason})"
    if row.status is Status.PASS:
        row.status = Status.FAIL
        row.reason = row.diagnosis = (
            f"{what}, but it passes now: the mismatch went away; remove it from "
            f"`expect` (spec line {exp.line or expect.line or '?'})"
        )
        return f"'{row.name}': {row.reason}"
    if row.status is not Status.FAIL or not row.mismatched:  # not compared, or backward's contract is broken
        return None
    differs = _differs(row, exp)
    if differs is None:
        row.status, row.reason = Status.XFAIL, expect.reason
        return f"'{row.name}' mismatches as expected ({expect.reason})"
    row.diagnosis = f"{row.diagnosis or 'mismatch'}; {what}, found {_found(row)}: {differs}"
    return f"'{row.name}': {what}, found {_found(row)}: {differs}"


def _differs(row: InputReport, exp: Expected) -> Optional[str]:
    """Which given field of ``exp`` the failing ``row`` does not match, in words (None: every one matches)."""
    pattern = exp.pattern or ("constant_ratio" if exp.ratio is not None else None)  # (a ratio alone, in code)
    if pattern is None:  # `fail`: any mismatch
        return None
    if pattern not in RATIO_PATTERNS:
        same = row.pattern is not None and row.pattern.value == pattern
        return None if same else "the pattern does not match"
    if row.pattern not in (Pattern.SIGN_FLIP, Pattern.CONSTANT_RATIO) or row.ratio is None:
        return "the pattern does not match (no constant ratio)"
    # a sign flip is the constant ratio -1: the pattern sign_flip holds the ratio to -1 (spec.contradicts)
    want = -1.0 if pattern == "sign_flip" else exp.ratio
    if want is None or abs(row.ratio - want) <= RATIO_RTOL * abs(want):
        return None
    field = "pattern" if pattern == "sign_flip" else "ratio"
    return f"the {field} does not match ({row.ratio:.3g} is not {want:g} within {RATIO_RTOL:.0%})"


def _found(row: InputReport) -> str:
    if row.pattern is None:
        return "a mismatch with no pattern"
    return f"{row.pattern}" + (f" with ratio {row.ratio:.3g}" if row.ratio is not None else "")


def _conclude(check: CheckResult, sentences: list[str], reason: str) -> None:
    """The check's status and message once its expected rows are judged: XFAIL when its only failures
    are expected ones, else FAIL with the sentences added."""
    if not sentences:
        return
    was = check.status
    check.status = status_of(check)
    if check.status is Status.XFAIL:
        found = [f"'{row.name}': {row.diagnosis or 'mismatch'}" for row in check.inputs if row.status is Status.XFAIL]
        check.message = f"expected mismatch ({reason}): {'; '.join(found)}"
        return
    before = [check.message] if was is Status.FAIL and check.message else []
    check.message = "; ".join(before + sentences)
