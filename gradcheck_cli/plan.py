"""What a run will check: (case, device) tasks, shards, and results made without running anything.

No torch here, so the parent process of an isolated batch never imports it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Optional, Union

from .results import CaseResult, ErrorInfo, ErrorKind, Status
from .spec import Case, SpecError


@dataclass(frozen=True)
class RunOptions:
    """Run-wide settings that the command line controls."""

    memory_bytes: Optional[int] = None  # Jacobian bytes held at once; None: the checks' default
    seed: Optional[int] = None  # overrides every case's seed
    trials: int = 1  # seeds tried per case: seed, seed + 1, ...
    devices: Optional[tuple[str, ...]] = None  # overrides every case's devices
    require_device: bool = False  # an unavailable device is an error, not a skip
    probes: int = 0  # > 0: the fast decision with this many random probes
    checks: Optional[tuple[str, ...]] = None  # overrides every case's checks (--check)
    all_checks: bool = False  # --check all: every applicable check
    strict: bool = False  # --strict: as `strict: true` in every case


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
        out += [Task(case, d, opts) for d in case.devices]
    return out


def in_shard(name: str, index: int, count: int) -> bool:
    """Whether ``name`` belongs to shard ``index`` (1-based) of ``count``: stable across machines."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count == index - 1


def shard(items: list[Union[Case, SpecError]], index: int, count: int) -> list[Union[Case, SpecError]]:
    """The items of one shard; the ``count`` shards partition the items (a case with all its devices)."""
    return [i for i in items if in_shard(i.name if isinstance(i, Case) else f"{i.path}:{i.line}", index, count)]


def task_id(task: Task) -> str:
    """The id of a task's result: ``path::case[device]``."""
    return f"{task.case.name}[{task.device}]"


def new_result(task: Task, seed: Optional[int] = None) -> CaseResult:
    """An empty (passing) result for ``task``, to be filled by the checks."""
    case, seed = task.case, task.seed if seed is None else seed
    return CaseResult(id=task_id(task), spec=case.path, case=case.label, function=case.function,
                      device=task.device, seed=seed, status=Status.PASS, line=case.line)


def failed_result(task: Task, kind: ErrorKind, message: str) -> CaseResult:
    """An error result for a task that could not finish (a crash or a timeout of its worker)."""
    result = new_result(task)
    result.status, result.error = Status.ERROR, ErrorInfo(kind, message)
    return result


def spec_error_result(exc: SpecError) -> CaseResult:
    """An unusable spec document as an error result of its own."""
    return CaseResult(id=f"{exc.path}:{exc.line}" if exc.line else exc.path, spec=exc.path, case=None, function="",
                      device="", seed=0, status=Status.ERROR, error=ErrorInfo(ErrorKind.SPEC, str(exc)), line=exc.line)
