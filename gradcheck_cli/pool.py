"""Isolated worker processes: user code that crashes, exits or hangs costs one result, not the run.

Each worker is a spawned process that checks one task at a time; the parent hands out tasks,
waits on the workers' pipes and process sentinels, and replaces a worker that died or ran past
the timeout. The parent never imports torch.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from .plan import Task, failed_result
from .results import CaseResult, ErrorKind, Status


def keep_freed_memory() -> None:
    """Where the C library is glibc: keep freed memory in this process for reuse, instead of
    handing it back and faulting it in again page by page. A check allocates and frees tens of
    MB per batched stage; without this a third of a Linear n=64 check went to page faults.
    Allocations over 32 MB are still mapped and unmapped on their own; the process keeps at most
    1 GB it does not use."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, Windows, musl): its own allocator's policy stands
        return
    libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD


def _serve(conn: Connection, threads: int) -> None:
    """Worker main loop: receive (index, task), send back the result, until told to stop."""
    os.dup2(2, 1)  # what user code prints goes to stderr, so stdout stays the report
    keep_freed_memory()
    import torch

    from .runner import run_task
    from .state import tainted

    torch.set_num_threads(threads)  # workers x threads <= cores: no oversubscription

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, task = message
        conn.send(("started", index))  # the timeout counts from here, not from the worker's start-up
        result = run_task(task)
        # a CUDA error leaves the context unusable, and some global state cannot be put back: a fresh
        # worker takes the next task
        retire = (result.error is not None and result.error.kind is ErrorKind.CUDA) or bool(tainted())
        conn.send(("retiring" if retire else "done", result))
        if retire:
            return


class _Worker:
    def __init__(self, ctx: Any, threads: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, threads), daemon=True)
        self.proc.start()
        child.close()
        self.index: Optional[int] = None
        self.task: Optional[Task] = None
        self.started: Optional[float] = None  # when the worker began the task
        self.retiring = False  # it said it will exit after this result

    def give(self, index: int, task: Task) -> None:
        self.conn.send((index, task))
        self.index, self.task, self.started = index, task, None

    def take(self) -> tuple[bool, Optional[CaseResult]]:
        """(alive, result): the finished result if one came; alive is False when the pipe broke."""
        try:
            while self.conn.poll():
                kind, payload = self.conn.recv()
                if kind == "started":
                    self.started = time.monotonic()
                else:
                    self.retiring = kind == "retiring"
                    return True, payload
        except (EOFError, OSError):
            return False, None
        return True, None

    def overdue(self, timeout: Optional[float]) -> bool:
        return timeout is not None and self.started is not None and time.monotonic() - self.started >= timeout

    def stop(self, force: bool = False) -> None:
        if force:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _death(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return (f"the worker process checking this case was killed by {name}"
                + (" (a crash in native code)" if name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT") else
                   " (out of memory?)" if name == "SIGKILL" else ""))
    return (f"the worker process checking this case exited with code {exitcode} before reporting: the code "
            "under test ended the process (os._exit, or a fatal error)")


def run(tasks: list[Task], jobs: int, timeout: Optional[float] = None, fail_fast: bool = False,
        on_result: Optional[Callable[[CaseResult], None]] = None) -> list[Optional[CaseResult]]:
    """Check ``tasks`` in up to ``jobs`` worker processes; results in task order (None: not run).

    With ``fail_fast``, no new task starts after a failure or error; tasks already running finish.
    """
    results: list[Optional[CaseResult]] = [None] * len(tasks)
    pending = deque(enumerate(tasks))
    ctx = multiprocessing.get_context("spawn")
    count = max(1, min(jobs, len(tasks)))
    threads = max(1, (os.cpu_count() or 1) // count)
    workers = [_Worker(ctx, threads) for _ in range(count)]
    stopping = False

    def finish(worker: _Worker, result: CaseResult) -> None:
        nonlocal stopping
        assert worker.index is not None
        results[worker.index] = result
        worker.index = worker.task = None
        if on_result:
            on_result(result)
        stopping = stopping or (fail_fast and result.status in (Status.FAIL, Status.ERROR))

    try:
        while True:
            for i, worker in enumerate(workers):
                if worker.task is None and pending and not stopping:
                    if worker.retiring or not worker.proc.is_alive():
                        worker.stop(force=True)
                        workers[i] = worker = _Worker(ctx, threads)
                    worker.give(*pending.popleft())
            busy = [w for w in workers if w.task is not None]
            if not busy:
                break
            clocks = [w.started + timeout for w in busy if timeout is not None and w.started is not None]
            left = max(0.0, min(clocks) - time.monotonic()) if clocks else None
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=left))
            for i, worker in enumerate(workers):
                if worker.task is None:
                    continue
                woke = worker.conn in ready or worker.proc.sentinel in ready
                alive, result = worker.take() if woke else (True, None)
                if result is not None:
                    finish(worker, result)
                    continue
                if not alive or worker.proc.sentinel in ready:
                    worker.proc.join(timeout=5)
                    failure = failed_result(worker.task, ErrorKind.CRASH, _death(worker.proc.exitcode))
                elif worker.overdue(timeout):
                    failure = failed_result(worker.task, ErrorKind.TIMEOUT,
                                            f"timed out after {timeout:g} s (--timeout): stopped; an endless loop in "
                                            "forward or backward, or a limit too small for this check?")
                else:
                    continue
                worker.stop(force=True)
                finish(worker, failure)
                if pending and not stopping:
                    workers[i] = _Worker(ctx, threads)
    finally:
        for worker in workers:
            worker.stop(force=worker.task is not None)
    return results
