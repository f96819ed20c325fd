"""Result data model: the one contract between the checking core and the reporters.

Everything here is plain data (numbers stay numbers); reporters only format it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .core.printable import printable

# how the reporters draw a result: kind ("rich", "html") -> fn(results, report or None); they register
# themselves (``shown_as``) when imported, so this module, the contract, imports none of them
_SHOWN: dict[str, Any] = {}


def shown_as(kind: str, draw: Any) -> None:
    """Register ``draw(results, report)`` as how results show themselves as ``kind``: ``rich`` (a renderable,
    ``__rich__``) or ``html`` (a notebook's display, ``_repr_html_``). Called by the reporters."""
    _SHOWN[kind] = draw


def _shown(kind: str, results: list[Any], report: Any = None) -> Any:
    """``results`` drawn as ``kind`` by the reporter registered for it; plain text (``str``) where none is
    (``gradcheck_cli.reporters.display`` registers them; the library API imports it)."""
    draw = _SHOWN.get(kind)
    if draw is not None:
        return draw(results, report)
    text = "\n".join([str(r) for r in results] + [repr(report)] * (report is not None))
    return text if kind == "rich" else f"<pre>{text.replace('&', '&amp;').replace('<', '&lt;')}</pre>"


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
    REFERENCE = "reference"  # the reference implementation raised, or returned what cannot be compared
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
    PRECISION = "precision"  # forward's outputs change in steps too coarse for the finite differences' eps

    def __str__(self) -> str:
        return self.value


EXPECTABLE = tuple(p.value for p in Pattern if p not in (Pattern.SYSTEMATIC, Pattern.KINK))  # patterns `expect:` names


class Status(str, enum.Enum):
    """Outcome of a check, of one argument in a check, or of a whole case."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"
    XFAIL = "xfail"  # a mismatch the spec's `expect:` documents as intended (exit 0, as a pass)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ErrorInfo:
    """Why a case could not be checked."""

    kind: ErrorKind
    message: str
    where: Optional[str] = None  # "path/to/user_file.py:42" when the user's code raised
    traceback: list[str] = field(default_factory=list)  # the user's frames, outermost first (--tb)


@dataclass
class ErrorMap:
    """Where one argument's error is, as a picture: |analytical - numerical| per element (a complex element:
    the larger of its two parts' errors; inf where one side is not finite) over the argument's 2-D view, its
    last dim across and the others flattened down. A larger argument is downsampled: each cell is then the
    max over a ``block`` of elements. Small real arguments keep both sides too, one value per element."""

    rows: int  # of the 2-D view: the product of the leading dims (1 for a 0-d or 1-d argument)
    cols: int  # the last dim
    block: list[int]  # [height, width] of the elements one cell stands for ([1, 1]: not downsampled)
    error: list[float]  # row-major, ceil(rows / height) x ceil(cols / width) cells
    analytical: Optional[list[float]] = None  # per element, row-major, where kept (reference check: the target's)
    numerical: Optional[list[float]] = None  # (reference check: the reference's)
    sides: str = ""  # what the two sides are, e.g. "gradients for one random grad_output"

    @property
    def height(self) -> int:
        return -(-self.rows // self.block[0])

    @property
    def width(self) -> int:
        return -(-self.cols // self.block[1])

    def __repr__(self) -> str:
        down = f", cells of {self.block[0]}x{self.block[1]}" if self.block != [1, 1] else ""
        return f"<ErrorMap {self.rows}x{self.cols}{down}, max {num(max(self.error, default=None))}>"


@dataclass
class InputReport:
    """One argument of the checked callable, as seen by one check."""

    index: int  # position among the callable's arguments, as the user wrote them
    name: str
    shape: list[int]
    dtype: str
    status: Status
    reason: Optional[str] = None  # why it was not checked (skip), what is wrong (fail) or why it is intended (xfail)
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
    unreliable: int = 0  # elements where finite differences lose to cancellation and backward agrees with the
    # estimate at the steps where they settle (not counted as wrong)
    line: Optional[int] = None  # line of the argument's entry in the spec file, where known
    role: str = "argument"  # "output": a forward output's row (the reference check); "test": an opcheck test's
    baseline_err: Optional[float] = None  # reference check: the reference's own max abs error in the target's dtype
    factor: Optional[float] = None  # reference check, rule relative: max_abs_err may be factor x baseline_err + atol
    mismatched_indices: Optional[list[list[int]]] = None  # the first mismatching elements' multi-indices, in order
    mismatched_indices_cap: Optional[int] = None  # at most this many listed; ``mismatched`` is the true count
    error_map: Optional[ErrorMap] = field(default=None, repr=False, metadata={"json": False})  # for pictures (--html)
    via: Optional[str] = None  # perturbed through this map: `sym` (along the symmetric matrices) or a `param:` path

    def __repr__(self) -> str:
        """Short: ``<InputReport 1: weight [30, 20] FAIL 600/600 mismatched, max abs err 0.31>``."""
        where = self.name if self.role in ("output", "test") else f"{self.index}: {self.name}"
        text = f"<InputReport {where} {self.shape} {self.status.name}"
        if self.mismatched is not None:
            text += f" {self.mismatched}/{self.numel} mismatched, max abs err {num(self.max_abs_err)}"
        elif self.reason:
            text += f": {_clip(' '.join(self.reason.split()), 60)}"
        return printable(text + ">", terminal=True)


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
    problems: list[str] = field(default_factory=list)  # what failed besides the rows (in the message too)

    def __repr__(self) -> str:
        """Short: ``<CheckResult backward FAIL: gradient of 'weight' is 2x the numerical one>``."""
        why = " ".join(self.message.split())
        return printable(
            f"<CheckResult {self.check} {self.status.name}{': ' if why else ''}{_clip(why, 100)}>", terminal=True
        )


@dataclass
class Shrunk:
    """A smaller case that still fails as the case did: the same check, argument and pattern (information
    only: it changes no status). Found within a time budget after the failure (``--shrink``)."""

    check: str
    argument: Optional[str]  # the failing argument's name (None: the check failed with no failing row)
    pattern: Optional[Pattern]  # its pattern, the same as in the case's own failure
    shapes: dict[str, list[int]]  # argument -> its shape in the smaller case, for those that shrank
    values: dict[str, str] = field(default_factory=dict)  # argument -> zeros | ones | integers, where simpler
    seed: int = 0  # the seed that draws the smaller case's values
    attempts: int = 0  # smaller cases tried
    duration_s: float = 0.0
    replay: Optional[str] = None  # a command that checks the smaller case (the edge makes it)

    def words(self) -> str:
        """``backward still fails for 'x' (constant_ratio) at shape [2, 3] with ones for x, w``."""
        who = f" for '{self.argument}'" if self.argument else ""
        how = f" ({self.pattern})" if self.pattern else ""
        if not self.shapes:
            at = " at its shapes"
        elif len(self.shapes) == 1 and self.argument in self.shapes:
            at = f" at shape {self.shapes[self.argument]}"
        else:
            at = " at shapes " + ", ".join(f"{name} {shape}" for name, shape in self.shapes.items())
        kinds = {kind: [n for n, k in self.values.items() if k == kind] for kind in self.values.values()}
        values = "; ".join(f"{kind} for {', '.join(names)}" for kind, names in kinds.items())
        return f"{self.check} still fails{who}{how}{at}" + (f" with {values}" if values else "")

    def line(self) -> str:
        """The one line the reports show: ``shrunk: WORDS; replay: COMMAND``."""
        return f"shrunk: {self.words()}" + (f"; replay: {self.replay}" if self.replay else "")


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
    shrunk: Optional[Shrunk] = field(default=None, metadata={"optional": True})  # a smaller case that fails alike
    # (a failure, with --shrink); an optional JSON field: absent where None

    def __bool__(self) -> bool:
        """The verdict: true when it passed (``assert check(MyFunction, args)``), or when its only
        mismatches are the ones the spec's ``expect:`` documents as intended (XFAIL). A skip proves
        nothing, so it is false; warnings (a systematic error within tolerance) do not change it."""
        return self.status in (Status.PASS, Status.XFAIL)

    def __repr__(self) -> str:
        """Short: the status, the id and why, e.g. ``<CaseResult FAIL mod.F: backward: gradient of 'x' ...>``."""
        failing = next((c for c in self.checks if c.status is self.status and c.message), None)
        why = (
            f"{self.error.kind} error: {self.error.message}"
            if self.error is not None
            else f"{failing.check}: {failing.message}"
            if failing is not None
            else ", ".join(f"{c.check} {c.status}" for c in self.checks)
        )
        why = " ".join(why.split())
        return printable(
            f"<CaseResult {self.status.name} {self.id}{': ' if why else ''}{_clip(why, 100)}>", terminal=True
        )

    def __rich__(self) -> Any:
        """The case as the table report shows it (rich, e.g. ``rich.print(result)`` or IPython with rich)."""
        return _shown("rich", [self])

    def _repr_html_(self) -> str:
        """The case as the HTML report shows it (a Jupyter notebook's display): per-argument tables and
        error maps."""
        return str(_shown("html", [self]))

    def __str__(self) -> str:
        """The report of this case in plain text, as the table format shows it: one table per check,
        one row per argument."""
        head = f"{self.status.name:5} {self.id}"
        head += f"  {self.function}" if self.function and self.function != self.id else ""
        lines = [head + f"  seed {self.seed}  {self.duration_s:.2f}s"]
        if self.error:
            lines.append(f"  {self.error.kind} error: {self.error.message}")
            lines += [f"  at {self.error.where}"] if self.error.where else []
        for check in self.checks:
            if check.inputs:
                lines.append(f"  {check.check} ({check.mode})" if check.mode else f"  {check.check}")
                lines += ["    " + row for row in _aligned([titles(check)] + [cells(r) for r in check.inputs])]
            lines += [f"  {check.check}: {check.message}"] if check.message else []
            lines += [f"  warning: {w}" for w in check.warnings]
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  replay: {self.replay}"] if self.replay and self.status in (Status.FAIL, Status.ERROR) else []
        lines += [f"  {self.shrunk.line()}"] if self.shrunk is not None else []
        return printable("\n".join(lines), terminal=True)


COLUMNS = {
    "argument": "<",
    "shape": "<",
    "dtype": "<",
    "status": "<",
    "max abs err": ">",
    "max rel err": ">",
    "worst at": "<",
    "mismatched": ">",
    "analytical / numerical": ">",
    "tolerance": "<",
}  # title: alignment


def titles(check: CheckResult) -> list[str]:
    """The column titles of a check's table: the reference check compares the target with the reference;
    opcheck's rows are torch.library.opcheck's tests."""
    names = list(COLUMNS)
    if check.check == "reference":
        return [t.replace("analytical / numerical", "target / reference") for t in names]
    return ["test", *names[1:]] if check.check == "opcheck" else names


def cells(row: InputReport) -> list[str]:
    """One argument's row of the per-argument table, as text under ``COLUMNS``."""
    compared = row.mismatched is not None
    if row.status is Status.SKIP:
        status = f"not checked: {row.reason}"
    elif row.status is Status.FAIL and not compared:
        status = f"fail: {row.reason}" if row.reason else "fail"
    else:
        status = row.status.value
    worst = str(row.worst_index) if row.worst_index is not None else "-"
    if row.worst_output and row.status in (Status.FAIL, Status.XFAIL):
        worst += f" ({row.worst_output})"
    via = f" (via {row.via})" if row.via else ""
    return [
        row.name if row.role in ("output", "test") else f"{row.index}: {row.name}{via}",
        "-" if row.role == "test" else str(row.shape),
        row.dtype,
        status,
        num(row.max_abs_err),
        num(row.max_rel_err),
        worst,
        f"{row.mismatched} / {row.numel}" if compared else "-",
        f"{num(row.analytical)} / {num(row.numerical)}" if row.analytical is not None else "-",
        _tolerance(row) if compared else "-",
    ]


def _tolerance(row: InputReport) -> str:
    """The tolerance cell: atol and rtol, or the relative rule's bound (``2x 0.0039 + 0``)."""
    if row.factor is not None and row.baseline_err is not None:
        return f"{row.factor:g}x ref. error {row.baseline_err:.3g} + {row.atol or 0:g}"
    return f"atol {row.atol:g}, rtol {row.rtol:g}" if row.atol is not None and row.rtol is not None else "-"


def expected_reason(result: CaseResult) -> str:
    """Why the mismatches of a result are intended (the ``reason`` of ``expect:``), from its xfail rows."""
    reasons = [
        row.reason for check in result.checks for row in check.inputs if row.status is Status.XFAIL and row.reason
    ]
    return "; ".join(dict.fromkeys(reasons))


def num(value: Optional[float]) -> str:
    """A number as the reports write it (3 significant digits), ``-`` for none."""
    return "-" if value is None else f"{value:.3g}"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    align = list(COLUMNS.values())
    return ["  ".join(f"{c:{a}{w}}" for c, a, w in zip(r, align, widths)).rstrip() for r in rows]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def overall(statuses: list[Status]) -> Status:
    """Combine statuses: error beats fail beats xfail beats pass beats skip (all skipped -> skip)."""
    for status in (Status.ERROR, Status.FAIL, Status.XFAIL, Status.PASS):
        if status in statuses:
            return status
    return Status.SKIP


@dataclass
class Report:
    """A finished run: every case result in a deterministic order."""

    results: list[CaseResult]
    duration_s: float = 0.0
    not_run: int = 0  # tasks never started or never finished (--fail-fast, an interrupt)
    interrupted: Optional[str] = None  # "SIGINT" or "SIGTERM": the signal that stopped the run

    def __repr__(self) -> str:
        """Short: ``<Report 28 results: 27 passed, 1 failed, 0 errors, 0 skipped in 1.90s>``."""
        s = self.summary()
        counts = ", ".join(
            f"{s[k]} {k}" for k in ("passed", "failed", "errors", "skipped", "xfailed") if s[k] or k != "xfailed"
        )
        rest = f"; {s['not_run']} not run" if s["not_run"] else ""
        return f"<Report {s['total']} result{'s' * (s['total'] != 1)}: {counts}{rest} in {s['duration_s']:.2f}s>"

    def __rich__(self) -> Any:
        """Every case and the summary line, as the table report shows them."""
        return _shown("rich", self.results, self)

    def _repr_html_(self) -> str:
        """Every case as the HTML report shows it, and the summary (a Jupyter notebook's display)."""
        return str(_shown("html", self.results, self))

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
            "xfailed": count[Status.XFAIL],
            "not_run": self.not_run,
            "interrupted": self.interrupted,
            "duration_s": round(self.duration_s, 3),
        }

    def exit_code(self) -> ExitCode:
        """Exit code of the contract: an interrupt beats internal beats could not check beats failed beats passed
        (an interrupted run is incomplete, whatever finished); an expected failure (xfail) counts as passed."""
        if self.interrupted:
            return ExitCode.TERMINATED if self.interrupted == "SIGTERM" else ExitCode.INTERRUPTED
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
