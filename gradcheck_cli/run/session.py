"""A whole run: spec items -> tasks -> results in order, isolated in worker processes or in-process.

No torch here: with isolation (the default) only the workers import it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Callable, Optional, Union

from ..results import CaseResult, Report, Status
from ..spec import Case, SpecError
from . import plan
from .plan import RunOptions, Task


def timeout_seconds(text: str) -> Optional[float]:
    """A timeout option's value: seconds, or None for no limit (0 or inf); ValueError for anything else."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"expected a number of seconds >= 0 (0 or inf: no limit), got {text!r}")
    return None if seconds in (0, math.inf) else seconds


class Terminated(BaseException):
    """SIGTERM, raised where the process was (as SIGINT raises KeyboardInterrupt); the front end installs it."""


@dataclass(frozen=True)
class BatchOptions:
    jobs: int = 1
    timeout: Optional[float] = None
    maxfail: int = 0  # start no new case after this many failures or errors (0: no limit; 1 is -x)
    isolate: bool = True


def execute(
    items: list[Union[Case, SpecError]],
    opts: RunOptions,
    batch: BatchOptions,
    on_result: Optional[Callable[[CaseResult], None]] = None,
) -> Report:
    """Check every item; the report lists results in item order whatever the number of workers.

    An interrupt (KeyboardInterrupt, ``Terminated``) stops the run: the workers and what they started
    end, and the report holds what finished, the count not run and which signal stopped it."""
    start = time.perf_counter()
    planned = plan.expand(items, opts)
    results: list[Optional[CaseResult]] = [
        plan.spec_error_result(p) if isinstance(p, SpecError) else None for p in planned
    ]
    for r in results:
        if r is not None and on_result:
            on_result(r)
    errors = sum(r is not None for r in results)  # spec errors count towards --maxfail
    left = batch.maxfail - errors if batch.maxfail else 0  # 0: no limit
    tasks = [(i, p) for i, p in enumerate(planned) if isinstance(p, Task)]
    interrupted = None
    if tasks and not (batch.maxfail and left <= 0):
        finished = _run([t for _, t in tasks], batch, left)

        def file(k: int, result: CaseResult) -> None:
            results[tasks[k][0]] = result
            if on_result:
                on_result(result)

        try:
            for k, result in finished:
                file(k, result)
        except (KeyboardInterrupt, Terminated) as exc:
            interrupted = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
            for k, result in _reached(finished, exc):
                file(k, result)
        finally:
            finished.close()  # ends the workers at once when interrupted
    done = [r for r in results if r is not None]
    return Report(done, time.perf_counter() - start, not_run=len(results) - len(done), interrupted=interrupted)


def _reached(
    finished: Generator[tuple[int, CaseResult], None, None], exc: BaseException
) -> Iterator[tuple[int, CaseResult]]:
    """What ``finished`` had reached when the interrupt ``exc`` stopped its consumer (between two of its
    results): ``exc`` is raised in it, and it yields those results before it raises ``exc`` again. Where the
    interrupt came inside ``finished``, it yielded them already and has ended: nothing more comes."""
    try:
        item = finished.throw(exc)
        while True:
            yield item
            item = next(finished)
    except (KeyboardInterrupt, Terminated, StopIteration):
        return


def _run(tasks: list[Task], batch: BatchOptions, maxfail: int) -> Generator[tuple[int, CaseResult], None, None]:
    """``tasks`` checked; after ``maxfail`` failures or errors (0: no limit) no new one starts."""
    if batch.isolate:
        from . import pool

        return pool.run(tasks, batch.jobs, batch.timeout, maxfail)
    return _in_process(tasks, maxfail)


def _in_process(tasks: list[Task], maxfail: int) -> Generator[tuple[int, CaseResult], None, None]:
    from ..sandbox.state_guard import GUARD
    from .pool import keep_freed_memory
    from .runner import run_task, verdict_of, warm_up

    keep_freed_memory()  # this process is ours: it checks the cases itself
    warm_up()  # the process's one-time costs, not the first case's
    failures = 0
    with GUARD.consecutive():  # between two cases only the front end runs (its progress display)
        for k, task in enumerate(tasks):
            try:
                with _stdout_to_stderr():  # what user code prints, even to fd 1, must not corrupt the report
                    result = run_task(task)
            except (KeyboardInterrupt, Terminated) as exc:  # stopped while shrinking: its verdict still counts
                reached = verdict_of(exc)
                if reached is not None:
                    yield k, reached
                raise
            yield k, result
            failures += result.status in (Status.FAIL, Status.ERROR)
            if 0 < maxfail <= failures:
                return


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1 (closed)
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        if saved is not None:
            with contextlib.suppress(OSError):  # user code closed our copy (os.closerange): fd 1 stays stderr
                os.dup2(saved, 1)
                os.close(saved)
