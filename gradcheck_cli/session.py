"""A whole run: spec items -> tasks -> results in order, isolated in worker processes or in-process.

No torch here: with isolation (the default) only the workers import it.
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

from . import plan
from .plan import RunOptions, Task
from .results import CaseResult, Report, Status
from .spec import Case, SpecError


@dataclass(frozen=True)
class BatchOptions:
    jobs: int = 1
    timeout: Optional[float] = None
    fail_fast: bool = False
    isolate: bool = True


def execute(items: list[Union[Case, SpecError]], opts: RunOptions, batch: BatchOptions,
            on_result: Optional[Callable[[CaseResult], None]] = None) -> Report:
    """Check every item; the report lists results in item order whatever the number of workers."""
    start = time.perf_counter()
    planned = plan.expand(items, opts)
    results: list[Optional[CaseResult]] = [
        plan.spec_error_result(p) if isinstance(p, SpecError) else None for p in planned]
    for r in results:
        if r is not None and on_result:
            on_result(r)
    stop = batch.fail_fast and any(r is not None for r in results)
    tasks = [(i, p) for i, p in enumerate(planned) if isinstance(p, Task)]
    if tasks and not stop:
        done = _run(tasks, batch, on_result)
        for (i, _), r in zip(tasks, done):
            results[i] = r
    finished = [r for r in results if r is not None]
    return Report(finished, time.perf_counter() - start, not_run=len(results) - len(finished))


def _run(tasks: list[tuple[int, Task]], batch: BatchOptions,
         on_result: Optional[Callable[[CaseResult], None]]) -> list[Optional[CaseResult]]:
    if batch.isolate:
        from . import pool

        return pool.run([t for _, t in tasks], batch.jobs, batch.timeout, batch.fail_fast, on_result)
    from .pool import keep_freed_memory
    from .runner import run_task

    keep_freed_memory()  # this process is ours: it checks the cases itself
    out: list[Optional[CaseResult]] = []
    for _, task in tasks:
        with contextlib.redirect_stdout(sys.stderr):  # user prints must not corrupt the report on stdout
            result = run_task(task)
        out.append(result)
        if on_result:
            on_result(result)
        if batch.fail_fast and result.status in (Status.FAIL, Status.ERROR):
            break
    return out + [None] * (len(tasks) - len(out))
