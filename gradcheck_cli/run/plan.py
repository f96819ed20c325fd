"""What a run will check: (case, device) tasks, shards, and results made without running anything.

No torch here, so the parent process of an isolated batch never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

from ..core.options import default
from ..results import CaseResult, ErrorInfo, ErrorKind, Status
from ..spec import Case, SpecError, tensor_layout


@dataclass(frozen=True)
class RunOptions:
    """Run-wide settings that the command line controls: a field per row of ``core.options`` that reaches the
    run (``Option.run``; a test holds them equal), with its default; and --shape, --values (a replay's)."""

    max_memory_mb: int = default("max-memory")  # --max-memory: the Jacobian held at once, in MB
    seed: Optional[int] = None  # overrides every case's seed
    trials: int = default("trials")  # seeds tried per case: seed, seed + 1, ...
    devices: Optional[tuple[str, ...]] = None  # overrides every case's devices
    require_device: bool = False  # an unavailable device is an error, not a skip
    probes: int = default("probes")  # > 0: the fast decision with this many random probes
    checks: Optional[tuple[str, ...]] = None  # overrides every case's checks (--check)
    all_checks: bool = False  # --check all: every applicable check
    strict: bool = False  # --strict: as `strict: true` in every case
    reference: Optional[str] = None  # --reference: as `reference:` in every case
    imports: tuple[str, ...] = ()  # --import: modules imported before every case's `import` and `function`
    compress: bool = True  # --no-compress: every numerical column on its own
    shrink: float = 0.0  # seconds per failing case to look for a smaller failing shape (0: none; --no-shrink)
    timeout: Optional[float] = None  # the case's --timeout, which shrinking stays well within
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # --shape NAME=DIMS: an argument's shape overridden
    values: tuple[tuple[str, str], ...] = ()  # --values NAME=KIND: an argument's values simpler (zeros, ...)


def run_options(
    *,
    max_memory_mb: Optional[int] = None,
    seed: Optional[int] = None,
    trials: int = default("trials"),
    devices: tuple[str, ...] = (),
    checks: tuple[str, ...] = (),
    probes: int = default("probes"),
    strict: bool = False,
    reference: Optional[str] = None,
    require_device: bool = False,
    imports: tuple[str, ...] = (),
    compress: bool = True,
    shrink: float = 0.0,
    timeout: Optional[float] = None,
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
    values: tuple[tuple[str, str], ...] = (),
) -> RunOptions:
    """The RunOptions of the front ends' options (the command line's, the pytest plugin's): repeated devices
    checks and imports once each, ``"all"`` among the checks for every check, nothing given for the specs' own; keywords
    only (two ints or two bools swapped would still type-check). ``max_memory_mb`` None: its default."""
    from ..checks import NAMES  # names only: no torch

    all_checks = "all" in checks
    return RunOptions(
        max_memory_mb=max_memory_mb or default("max-memory"),
        seed=seed,
        trials=trials,
        devices=tuple(dict.fromkeys(devices)) or None,
        require_device=require_device,
        probes=probes,
        checks=(NAMES if all_checks else tuple(dict.fromkeys(checks))) or None,
        all_checks=all_checks,
        strict=strict,
        reference=reference,
        imports=tuple(dict.fromkeys(imports)),
        compress=compress,
        shrink=shrink,
        timeout=timeout,
        shapes=tuple(shapes),
        values=tuple(values),
    )


@dataclass(frozen=True)
class Task:
    """One (case, device) to check: the unit a worker process runs."""

    case: Case
    device: str
    opts: RunOptions = RunOptions()

    @property
    def seed(self) -> int:
        return self.case.seed if self.opts.seed is None else self.opts.seed


def expand(items: list[Union[Case, SpecError]], opts: RunOptions) -> list[Union[Task, SpecError]]:
    """One task per device of each case; spec errors stay in place."""
    out: list[Union[Task, SpecError]] = []
    for item in items:
        if isinstance(item, SpecError):
            out.append(item)
            continue
        case = item if opts.devices is None else replace(item, devices=opts.devices)
        case = case if opts.checks is None else replace(case, checks=opts.checks, all_checks=opts.all_checks)
        case = replace(case, tolerance=replace(case.tolerance, strict=True)) if opts.strict else case
        if opts.reference:  # as the key in the spec: without `checks` (or --check), the reference check
            case = replace(
                case,
                reference=opts.reference,
                checks=case.checks if case.checks_given or opts.checks else ("reference",),
            )
        out += [Task(case, d, opts) for d in case.devices]
    return out


def declined(case: Case) -> dict[str, str]:
    """The checks of ``case`` that are not run, each with the reason its result (a skip) gives: under `all`
    (`checks: all`, `--check all`), a case that declares the gradient its backward intends
    (`reference_backward:`) or documents its mismatch with finite differences (`expect:` on backward's rows)
    is not judged by finite differences unless its spec's `checks:` names backward; nor the checks that
    cannot take a sparse input (``spec.layout.declined``), however they are chosen."""
    sparse = tensor_layout.declined(case)
    if not case.all_checks or "backward" not in case.checks or "backward" in case.spec_checks:
        return sparse
    said = []
    if case.reference_backward:
        said.append(
            f"the spec declares the gradient backward intends (`reference_backward: "
            f"{case.reference_backward}`), not the derivative on purpose, and the reference check compares "
            "backward with it"
        )
    if case.expect is not None and "backward" in case.expect.checks:
        at = f" at line {case.expect.line}" if case.expect.line else ""
        said.append(
            f"the spec documents backward's mismatch with finite differences as intended (`expect:`{at}: "
            f"{case.expect.reason})"
        )
    if not said:
        return sparse
    also = "reference, backward" if case.reference_backward else "backward"
    return {
        **sparse,
        "backward": f"not judged by finite differences under `all`: {'; '.join(said)}; to judge backward by "
        f"finite differences, name it in the spec's `checks:` (e.g. `checks: [{also}]`)",
    }


def shard(items: list[Union[Case, SpecError]], index: int, count: int) -> list[Union[Case, SpecError]]:
    """The items of shard ``index`` (1-based) of ``count``, in their order: the ``count`` shards partition
    the items (a case with all its devices, a spec error) and their sizes differ by one at most.

    The items are sorted by where they are (the file resolved, so ``specs``, ``./specs`` and an absolute
    path sort alike, relative to the working directory inside it: a checkout at another place sorts the
    same), then dealt round-robin. Every machine that reads the same files agrees on the shards. A spec
    file added or removed moves the cases sorted after it to other shards, never out of all of them."""
    cwd = Path.cwd().resolve()
    keys = [_place(i, cwd) for i in items]
    ranks = sorted(range(len(items)), key=keys.__getitem__)
    mine = set(ranks[index - 1 :: count])
    return [item for n, item in enumerate(items) if n in mine]


def _place(item: Union[Case, SpecError], cwd: Path) -> tuple[tuple[str, ...], int, int, str]:
    """Where an item is, the same however its file was named: (path parts, document, line, case)."""
    resolved = Path(item.path).resolve()
    parts = resolved.relative_to(cwd).parts if resolved.is_relative_to(cwd) else resolved.parts
    if isinstance(item, Case):
        return parts, item.doc, item.line or 0, item.label
    return parts, 0, item.line or 0, ""


def task_id(task: Task) -> str:
    """The id of a task's result: ``path::case[device]``."""
    return f"{task.case.name}[{task.device}]"


def new_result(task: Task) -> CaseResult:
    """An empty (passing) result for ``task``, to be filled by the checks."""
    case = task.case
    return CaseResult(
        id=task_id(task),
        spec=case.path,
        case=case.label,
        function=case.function,
        device=task.device,
        seed=task.seed,
        status=Status.PASS,
        line=case.line,
    )


def failed_result(task: Task, kind: ErrorKind, message: str) -> CaseResult:
    """An error result for a task that could not finish (a crash or a timeout of its worker)."""
    result = new_result(task)
    result.status, result.error = Status.ERROR, ErrorInfo(kind, message)
    return result


def spec_error_result(exc: SpecError) -> CaseResult:
    """An unusable spec document as an error result of its own."""
    return CaseResult(
        id=f"{exc.path}:{exc.line}" if exc.line else exc.path,
        spec=exc.path,
        case=None,
        function="",
        device="",
        seed=0,
        status=Status.ERROR,
        error=ErrorInfo(ErrorKind.SPEC, str(exc)),
        line=exc.line,
    )


def interrupted(task: Task, verdict: Optional[CaseResult]) -> CaseResult:
    """The result of ``task`` whose code under test raised KeyboardInterrupt in a worker: the case's ``verdict``
    where it came while shrinking its failure (the search is information only, and was cut short), else an
    error."""
    why = "the code under test raised KeyboardInterrupt"
    if verdict is None:
        return failed_result(task, ErrorKind.FORWARD, why)
    verdict.warnings.append(f"the search for a smaller failing case (--shrink) was cut short: {why}")
    return verdict
