"""Isolated worker processes: user code that crashes, exits or hangs costs one result, not the run.

Each worker is a process that checks one task at a time; the parent hands out tasks, waits on the
workers' pipes and process sentinels, and replaces a worker that died or ran past the timeout. The
parent never imports torch. Where the system can fork (Linux, macOS), workers are forked from one
server process that imported torch and the checks once (multiprocessing's forkserver): a worker,
and a replacement for one that crashed, starts in milliseconds, and two workers do not import
torch at the same time. The server never runs a tensor operation, so no thread pool, CUDA context
or autograd thread exists in it when it forks. Elsewhere each worker is spawned and imports torch.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Generator
from multiprocessing.connection import Connection, wait
from typing import Any, Optional

from ..checks import REGISTRY
from ..results import CaseResult, ErrorKind, Status
from ..sandbox import processes
from .plan import Task, failed_result, interrupted


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


# what the fork server imports before it forks workers: torch, the checks, and what torch itself imports on
# the first vmap (numerics.engine's backward calls do without torch.autograd.grad's sympy)
PRELOAD = [
    "gradcheck_cli.run.runner",
    *(f"gradcheck_cli.checks.{module}" for module in REGISTRY.values()),
    "torch._functorch.vmap",
]


def start_method() -> str:
    """How workers start: forked from the fork server where the system has one, else spawned."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def prepare() -> None:
    """Start importing torch for the workers now (in the fork server), while this process goes on
    reading specs; a no-op where workers are spawned. Call it as early as a run knows it will check."""
    if start_method() == "forkserver":
        from multiprocessing import forkserver

        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
        if not _ending:
            _ending.append(True)
            atexit.register(_end_server)


_ending: list[bool] = []  # _end_server is registered to run at exit
_server: list[int] = []  # the fork server's pid, as a forked worker says it (its parent)


def _end_server() -> None:
    """At this process's exit: end the fork server at once. Left alone it exits after this process, and its
    shutdown (that of a process that imported torch: about half a second) holds this process's stdout and
    stderr open, which whoever reads them (a CI step, a pipe, subprocess.run) waits for. Its pid is the one a
    worker gave as its parent's, ended only while it is still this process's child (never another process
    that a worker was reparented to)."""
    for pid in _server[-1:]:
        try:
            os.waitpid(pid, os.WNOHANG)  # raises unless pid is a child of this process
        except ChildProcessError:
            return
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _serve(conn: Connection, threads: int, environ: dict[str, str], parent_alive: Connection, cold: bool) -> None:
    """Worker main loop: receive (index, task), send back the result, until told to stop. A ``cold`` worker
    does not warm up: it has not run backward when its first task starts (``forks_ranks``).

    Every message carries this process's pid and the task's index, so the parent files a result
    under its task and knows a message from a process the code under test forked. ``parent_alive``: the
    read end of a pipe whose write end only the parent holds (see ``_die_with_parent``)."""
    processes.lead_group()
    _die_with_parent(parent_alive)
    multiprocessing.current_process().daemon = False  # user code may start processes of its own (a Pool)
    if os.environ != environ:  # a fork server started earlier: the parent's environment as it is now
        os.environ.clear()
        os.environ.update(environ)
    os.dup2(2, 1)  # what user code prints goes to stderr, so stdout stays the report
    keep_freed_memory()
    import torch

    from ..sandbox.state_guard import GUARD
    from .runner import warm_up

    torch.set_num_threads(threads)  # workers x threads <= cores: no oversubscription
    if not cold:
        warm_up()  # before the first task: its duration and its timeout count from "started"
    conn.send(("ready", os.getpid(), None, os.getppid()))  # the parent may wait for this (Pool.warm)
    with GUARD.consecutive():  # nothing but this loop runs between two cases
        _tasks(conn)


def _die_with_parent(parent_alive: Connection) -> None:
    """End this worker, with what the code under test started, when the parent dies, however it dies
    (SIGKILL included): a forked worker's parent process is the fork server, so PR_SET_PDEATHSIG cannot
    tell it, and the fork server (and multiprocessing's resource tracker) live as long as a worker holds
    their pipes. A thread waits for the end of ``parent_alive`` (the parent's death closes its write end);
    it waits in the kernel, so a case in a loop does not keep it from running."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                parent_alive.recv_bytes()
        processes.end(processes.started())
        if hasattr(os, "killpg"):
            os.killpg(os.getpgrp(), signal.SIGKILL)  # this worker and what is still in its group
        os._exit(1)

    threading.Thread(target=watch, name="gradcheck-parent-watch", daemon=True).start()


def _tasks(conn: Connection) -> None:
    """Check the tasks that come, one at a time, until told to stop."""
    from ..sandbox.state_guard import GUARD
    from .runner import run_task, verdict_of

    me = os.getpid()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, task = message
        conn.send(("started", me, index, None))  # the timeout counts from here, not from the worker's start-up

        # an interrupt may end this worker while it shrinks a failure: the verdict goes to the parent first
        def reached(verdict: CaseResult, index: int = index) -> None:
            conn.send(("verdict", me, index, verdict))

        try:
            # a process forked by the code under test never comes back from it
            result = run_task(task, reached, disposable=True)
        except KeyboardInterrupt as exc:  # no Ctrl-C reaches a worker (its own process group): the code under test
            result = interrupted(task, verdict_of(exc))  # raised it, in the case or in its shrinking
        processes.end(processes.started())  # what the case started ends with it (state_guard.py named it)
        processes.reap()
        _flush()  # what user code printed is out before the result: an idle worker may be ended at once
        # a CUDA error leaves the context unusable, and some global state cannot be put back (``run_task``
        # taints this process for either): a fresh worker takes the next task
        retire = bool(GUARD.tainted())
        conn.send(("retiring" if retire else "done", me, index, result))
        if retire:
            return


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # user code closed or replaced it
            pass


class _Worker:
    def __init__(self, ctx: Any, threads: int, parent_alive: Connection, cold: bool = False) -> None:
        self.conn, child = ctx.Pipe()
        args = (child, threads, dict(os.environ), parent_alive, cold)
        self.proc = ctx.Process(target=_serve, args=args, daemon=True)
        self.clean = cold  # it has not run backward: it may take a task that forks ranks
        self.proc.start()
        child.close()
        self.index: Optional[int] = None
        self.task: Optional[Task] = None
        self.given = 0.0  # when the task was handed over
        self.started: Optional[float] = None  # when the worker began the task
        self.verdict: Optional[CaseResult] = None  # the task's result, sent before shrinking its failure
        self.retiring = False  # it said it will exit after this result
        self.ready = False  # it said it has imported and warmed up
        self.stray: Optional[int] = None  # a process that wrote to this worker's pipe but is not the worker

    def give(self, index: int, task: Task) -> None:
        self.conn.send((index, task))
        self.clean = False
        self.index, self.task, self.given, self.started, self.verdict = index, task, time.monotonic(), None, None

    def take(self) -> tuple[bool, Optional[CaseResult]]:
        """(alive, result): the finished result if one came; alive is False when the pipe broke or a
        message came from another process or for another task."""
        try:
            while self.conn.poll():
                kind, pid, index, payload = self.conn.recv()
                if kind == "ready" and pid == self.proc.pid:
                    self.ready = True
                    if start_method() == "forkserver" and payload != os.getpid():  # forked by the server
                        _server[:] = [payload]
                    continue
                if pid != self.proc.pid or index != self.index:
                    self.stray = pid
                    return False, None
                if kind == "started":
                    self.started = time.monotonic()
                elif kind == "verdict":
                    self.verdict = payload
                else:
                    self.retiring = kind == "retiring"
                    return True, payload
        except (EOFError, OSError, ValueError, TypeError):  # a broken pipe, or bytes that are no message of ours
            return False, None
        return True, None

    def wait_ready(self) -> None:
        """Wait until the worker has started up (or died: the next task then finds it dead)."""
        while not self.ready and self.proc.is_alive():
            wait([self.conn, self.proc.sentinel], timeout=WAIT_MAX)
            alive, _ = self.take()
            if not alive:
                return

    def spent(self) -> float:
        return time.monotonic() - (self.started if self.started is not None else self.given)

    def overdue(self, timeout: Optional[float]) -> bool:
        return timeout is not None and self.started is not None and self.spent() >= timeout

    def end(self) -> None:
        """Kill the worker's process group, without waiting (whoever started the process reaps it)."""
        if self.proc.pid is not None:
            processes.end_group(self.proc.pid)
        self.conn.close()

    def stop(self) -> None:
        """End the worker at once, with every process it or the code under test started, and reap it. A worker
        that crashed (or was killed, or ended itself) is reaped already once it is known dead (by the fork
        server, or by is_alive here): what the code under test started in its group is ended all the same,
        and a process that has its number now is left alone."""
        if self.proc.pid is not None:
            processes.end_group(self.proc.pid, ended=not self.proc.is_alive())
        self.proc.join()
        self.conn.close()


def forks_ranks(task: Task) -> bool:
    """Whether ``task`` forks processes that run backward (the ranks of a ``distributed`` case): where a GPU is
    visible, torch refuses backward in a process forked after its parent ran backward (autograd's device
    threads), so such a task takes a fresh worker that has not (``_Worker.clean``), on every machine alike."""
    return task.case.distributed is not None


def _death(worker: _Worker) -> str:
    if worker.stray is not None:
        return (
            f"a process the code under test started (pid {worker.stray}) came back into the worker checking "
            "this case: code that forks must end its child with os._exit() (the child's checks were ignored)"
        )
    exitcode = worker.proc.exitcode
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the worker process checking this case was killed by {name}" + (
            " (a crash in native code)"
            if name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
            else " (out of memory?)"
            if name == "SIGKILL"
            else ""
        )
    return (
        f"the worker process checking this case exited with code {exitcode} before reporting: the code "
        "under test ended the process (os._exit, or a fatal error)"
    )


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers_for(jobs: int, tasks: int) -> int:
    """How many workers ``-j jobs`` starts for ``tasks`` tasks: at most one per task and one per usable
    core (a worker is a torch process of about 300 MB that computes flat out: more only compete)."""
    return max(1, min(jobs, tasks, usable_cores()))


WAIT_MAX = 60.0  # the longest single wait: a huge --timeout (1e10) is waited for in steps


class Pool:
    """Worker processes kept between runs (the pytest plugin checks one item at a time in them)."""

    def __init__(
        self,
        workers: int,
        timeout: Optional[float] = None,
        threads: Optional[int] = None,
        timeout_option: str = "--timeout",
    ) -> None:
        self.size, self.timeout, self.timeout_option = max(1, workers), timeout, timeout_option
        self.threads = threads or max(1, usable_cores() // self.size)
        prepare()
        self.ctx = multiprocessing.get_context(start_method())
        self.workers: list[_Worker] = []
        # its write end stays in this process alone: the workers see its end when this process dies
        self.parent_alive, self._alive = self.ctx.Pipe(duplex=False)

    def _fresh(self, cold: bool = False) -> _Worker:
        return _Worker(self.ctx, self.threads, self.parent_alive, cold)

    def warm(self) -> float:
        """Start the workers and wait until each has started up; the seconds it took (a first task's time
        then counts the task alone)."""
        start = time.monotonic()
        while len(self.workers) < self.size:
            self.workers.append(self._fresh())
        for worker in self.workers:
            worker.wait_ready()
        return time.monotonic() - start

    def run(self, tasks: list[Task], maxfail: int = 0) -> Generator[tuple[int, CaseResult], None, None]:
        """Check ``tasks``; yield (index into tasks, result) as each finishes. Closing the generator early
        ends the busy workers and what they started. An interrupt (KeyboardInterrupt, or any other exception
        raised here or thrown in) first yields what the busy workers had reached (a result not yet read, the
        verdict of a failure being shrunk), then ends them and raises it again.

        After ``maxfail`` failures or errors (0: no limit), no new task starts; tasks already running finish.
        """
        failures = 0
        pending = deque(enumerate(tasks))
        while len(self.workers) < min(self.size, len(tasks)):
            self.workers.append(self._fresh())
        workers, timeout, stopping = self.workers, self.timeout, False
        try:
            while True:
                for i, worker in enumerate(workers):
                    if worker.task is None and pending and not stopping:
                        cold = forks_ranks(pending[0][1])
                        if worker.retiring or not worker.proc.is_alive() or (cold and not worker.clean):
                            worker.stop()
                            workers[i] = worker = self._fresh(cold)
                        worker.give(*pending.popleft())
                busy = [w for w in workers if w.task is not None]
                if not busy:
                    break
                clocks = [w.started + timeout for w in busy if timeout is not None and w.started is not None]
                left = min(WAIT_MAX, max(0.0, min(clocks) - time.monotonic())) if clocks else WAIT_MAX
                ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=left))
                for i, worker in enumerate(workers):
                    if worker.task is None or worker.index is None:
                        continue
                    woke = worker.conn in ready or worker.proc.sentinel in ready
                    alive, result = worker.take() if woke else (True, None)
                    index = worker.index
                    if result is not None:
                        worker.index = worker.task = None
                        failures += result.status in (Status.FAIL, Status.ERROR)
                        stopping = stopping or 0 < maxfail <= failures
                        yield index, result
                        continue
                    if not alive or worker.proc.sentinel in ready:
                        if worker.stray is None:
                            worker.proc.join(timeout=2)  # its own exit code, not the SIGKILL of stop()
                        worker.stop()
                        failure = _lost(worker, worker.task, ErrorKind.CRASH, _death(worker))
                    elif worker.overdue(timeout):
                        worker.stop()
                        failure = _lost(
                            worker,
                            worker.task,
                            ErrorKind.TIMEOUT,
                            f"timed out after {timeout:g} s ({self.timeout_option}; 0 for none): "
                            "stopped; an endless loop in forward or backward, or a limit too "
                            "small for this check?",
                        )
                    else:
                        continue
                    worker.index = worker.task = None
                    failures += 1
                    stopping = stopping or 0 < maxfail <= failures
                    if pending and not stopping:
                        workers[i] = self._fresh()  # warm up the replacement while the others work
                    yield index, failure
        except GeneratorExit:
            raise
        except BaseException:
            yield from _reached(workers)
            raise
        finally:
            for worker in workers:
                if worker.task is not None:  # closed early: an interrupt, or the consumer stopped
                    worker.stop()
            self.workers = [w for w in workers if w.task is None and w.proc.is_alive()]

    def close(self) -> None:
        """End every worker at once, with what it started, without waiting for any to exit: an idle worker
        has sent its last result and flushed its output, and the shutdown of a process that imported torch
        takes half a second that the report need not wait for."""
        for worker in self.workers:
            worker.end()
        self.workers = []


def _lost(worker: _Worker, task: Task, kind: ErrorKind, why: str) -> CaseResult:
    """The result of ``task`` when its worker died or ran out of time (``why``): the verdict the worker sent
    before shrinking a failure, where it had sent one (the search, information only, was cut short), else an
    error of ``kind``."""
    if worker.verdict is not None:
        worker.verdict.warnings.append(f"the search for a smaller failing case (--shrink) was cut short: {why}")
        return worker.verdict
    failure = failed_result(task, kind, why)
    failure.duration_s = worker.spent()
    return failure


def _reached(workers: list[_Worker]) -> Generator[tuple[int, CaseResult], None, None]:
    """What the busy ``workers`` had reached when an interrupt came: a finished result still in the pipe, or the
    verdict a worker sent before shrinking its failure (that worker stays busy: the caller ends it)."""
    for worker in workers:
        if worker.task is None or worker.index is None:
            continue
        _, result = worker.take()
        index = worker.index
        if result is not None:
            worker.index = worker.task = None
            yield index, result
        elif worker.verdict is not None:
            yield index, worker.verdict


def run(
    tasks: list[Task], jobs: int, timeout: Optional[float] = None, maxfail: int = 0
) -> Generator[tuple[int, CaseResult], None, None]:
    """Check ``tasks`` in up to ``jobs`` fresh worker processes (``Pool.run``), and end them after."""
    pool = Pool(workers_for(jobs, len(tasks)), timeout)
    try:
        yield from pool.run(tasks, maxfail)
    finally:
        pool.close()
