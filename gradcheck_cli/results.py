"""Result data model: the one contract between the checking core and the reporters.

Everything here is plain data (numbers stay numbers); reporters only format it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional


class ExitCode(enum.IntEnum):
    """The process exit codes of the contract, used by the CLI, the pytest plugin's entry and ``Report``."""

    OK = 0  # every check that ran passed (skips allowed)
    FAILED = 1  # a check failed: a gradient is wrong, or backward broke its contract
    USAGE = 2  # bad options, a missing file, nothing to check
    NOT_CHECKED = 3  # a spec could not be checked (invalid spec, import failed, forward raised); wins over 1
    INTERNAL = 4  # a bug of gradcheck-cli itself
    INTERRUPTED = 130  # SIGINT
    TERMINATED = 143  # SIGTERM


class ErrorKind(str, enum.Enum):
    """Why a case could not be checked: ``ErrorInfo.kind``, as the JSON report writes it."""

    SPEC = "spec"  # an invalid spec, or arguments that do not fit the signature
    IMPORT = "import"  # the target cannot be imported, or is not checkable
    INIT = "init"  # an nn.Module's constructor raised
    FORWARD = "forward"  # the user's forward raised
    BACKWARD = "backward"  # the user's backward raised
    JVP = "jvp"  # the user's jvp raised
    DEVICE = "device"  # a required device is not available (--require-device)
    CUDA = "cuda"  # a CUDA error (the worker's context is replaced)
    OUT_OF_MEMORY = "out_of_memory"
    TOO_LARGE = "too_large"  # an element-by-element check that would not finish in reasonable time, not started
    CRASH = "crash"  # the worker process died (a segfault, os._exit)
    TIMEOUT = "timeout"  # --timeout stopped the case
    INTERNAL = "internal"  # a bug of gradcheck-cli (exit 4)

    def __str__(self) -> str:
        return self.value


class Pattern(str, enum.Enum):
    """What the numbers of a mismatching (or suspicious) argument show: ``InputReport.pattern``."""

    NONFINITE = "nonfinite"  # NaN or infinite Jacobian entries
    ZERO_ANALYTICAL = "zero_analytical"  # analytical all zeros, numerical not (a missing return?)
    ZERO_NUMERICAL = "zero_numerical"  # the outputs do not depend on it, backward says they do
    SIGN_FLIP = "sign_flip"  # analytical = -numerical
    CONSTANT_RATIO = "constant_ratio"  # analytical = ratio x numerical
    TRANSPOSED = "transposed"  # the last two dims swapped
    CONJUGATE = "conjugate"  # complex: the conjugate convention
    SOME_ELEMENTS = "some_elements"  # a few elements wrong, the others right
    NO_PATTERN = "no_pattern"  # wrong everywhere, no constant ratio or sign flip
    SYSTEMATIC = "systematic"  # within tolerance, but a constant factor off 1 (``ratio``)
    KINK = "kink"  # mismatches at kinks, ties or domain edges (explained, or wrong there too)

    def __str__(self) -> str:
        return self.value


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
    """Why a case could not be checked."""

    kind: ErrorKind
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
    pattern: Optional[Pattern] = None  # the pattern as data
    ratio: Optional[float] = None  # analytical / numerical, where the pattern is a constant ratio (or a sign flip)
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
        count = dict.fromkeys(Status, 0)
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

    def exit_code(self) -> ExitCode:
        """Exit code of the contract: internal beats could not check beats failed beats passed."""
        if any(r.error is not None and r.error.kind == ErrorKind.INTERNAL for r in self.results):
            return ExitCode.INTERNAL
        if any(r.status is Status.ERROR for r in self.results):
            return ExitCode.NOT_CHECKED
        if any(r.status is Status.FAIL for r in self.results):
            return ExitCode.FAILED
        return ExitCode.OK


def to_dict(obj: Any) -> Any:
    """Dataclass -> JSON-ready dict, with statuses as their string values."""
    return _jsonable(asdict(obj))


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    return value
