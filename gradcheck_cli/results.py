"""Result data model: the one contract between the checking core and the reporters.

Everything here is plain data (numbers stay numbers); reporters only format it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

CHECKS = ("backward", "double_backward", "forward_ad", "batched", "undefined_grad", "device_consistency")


class Status(str, enum.Enum):
    """Outcome of a check, of one argument in a check, or of a whole case."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ErrorInfo:
    """Why a case could not be checked. ``kind`` is a short machine-readable tag."""

    kind: str
    message: str
    where: Optional[str] = None  # "path/to/user_file.py:42" when the user's code raised


@dataclass
class InputReport:
    """One argument of the checked callable, as seen by one check."""

    index: int  # position among the callable's arguments, as the user wrote them
    name: str
    shape: list[int]
    dtype: str
    status: Status
    reason: Optional[str] = None  # why it was not checked (status skip) or what is wrong
    numel: int = 0
    mismatched: Optional[int] = None  # elements with at least one entry out of tolerance
    max_abs_err: Optional[float] = None
    max_rel_err: Optional[float] = None
    worst_index: Optional[list[int]] = None  # multi-index into this argument's shape
    worst_output: Optional[str] = None  # which output, and where, the worst entry belongs to
    analytical: Optional[float] = None  # at the worst entry
    numerical: Optional[float] = None
    atol: Optional[float] = None
    rtol: Optional[float] = None
    diagnosis: Optional[str] = None  # the pattern in words, e.g. "analytical is 2.00x numerical"
    at_kinks: int = 0  # elements whose mismatch a kink, tie or domain edge explains (not counted as wrong)
    line: Optional[int] = None  # line of the argument's entry in the spec file, where known


@dataclass
class CheckResult:
    """One check (e.g. ``backward``) run on one case."""

    check: str
    status: Status
    message: str = ""
    mode: Optional[str] = None
    inputs: list[InputReport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0


@dataclass
class CaseResult:
    """One (spec, case, device): the unit that reporters show and exit codes count."""

    id: str
    spec: Optional[str]
    case: Optional[str]
    function: str
    device: str
    seed: int
    status: Status
    duration_s: float = 0.0
    error: Optional[ErrorInfo] = None
    checks: list[CheckResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    replay: Optional[str] = None  # a command that reruns just this case
    line: Optional[int] = None  # line of the case in the spec file, where known


def overall(statuses: list[Status]) -> Status:
    """Combine statuses: error beats fail beats pass beats skip (all skipped -> skip)."""
    for status in (Status.ERROR, Status.FAIL, Status.PASS):
        if status in statuses:
            return status
    return Status.SKIP


@dataclass
class Report:
    """A finished run: every case result in a deterministic order."""

    results: list[CaseResult]
    duration_s: float = 0.0
    not_run: int = 0  # tasks never started (--fail-fast stopped the run)

    def summary(self) -> dict[str, Any]:
        count = {s: 0 for s in Status}
        for result in self.results:
            count[result.status] += 1
        return {
            "total": len(self.results),
            "passed": count[Status.PASS],
            "failed": count[Status.FAIL],
            "errors": count[Status.ERROR],
            "skipped": count[Status.SKIP],
            "not_run": self.not_run,
            "duration_s": round(self.duration_s, 3),
        }

    def exit_code(self) -> int:
        """Exit code of the contract: 4 internal, 3 could not check, 1 failed, 0 passed."""
        if any(r.error is not None and r.error.kind == "internal" for r in self.results):
            return 4
        if any(r.status is Status.ERROR for r in self.results):
            return 3
        if any(r.status is Status.FAIL for r in self.results):
            return 1
        return 0


def to_dict(obj: Any) -> Any:
    """Dataclass -> JSON-ready dict, with statuses as their string values."""
    return _jsonable(asdict(obj))


def _jsonable(value: Any) -> Any:
    if isinstance(value, Status):
        return value.value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    return value
