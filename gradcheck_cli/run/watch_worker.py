"""The one long-lived process that checks the rounds of ``gradcheck --watch``: torch and the user's
modules stay loaded between rounds, and the modules of changed files are imported afresh.

A module that cannot be imported twice in one process (a compiled extension, a module that
registers custom ops with torch.library) is named ``unsafe``: when it changes, the watch starts a
fresh worker instead. The parent side (``Worker``) never imports torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import re
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Optional

from ..results import CaseResult, ErrorKind
from ..sandbox import processes
from . import depends
from .plan import Task, failed_result, interrupted

# a module that registers ops, or builds and loads C++ code, cannot simply run again in the same process
UNSAFE_SOURCE = re.compile(
    rb"torch\.library|from torch import[^\n]*\blibrary\b|cpp_extension|load_inline|"
    rb"TORCH_LIBRARY|load_library"
)
WAIT_STEP = 60.0  # the longest single wait for a result (no timeout: waited for in steps)


@dataclass
class Outcome:
    """A checked task, with what the worker knows now: the project files this task loaded for the first
    time, every project file loaded (file -> why it is unsafe to import again, or None), and whether
    the worker must be replaced (state it could not put back, or it died)."""

    result: CaseResult
    new: frozenset[str] = frozenset()
    loaded: dict[str, Optional[str]] = field(default_factory=dict)
    retire: bool = False


class Modules:
    """The project's modules loaded in this process (worker side)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # module name -> its project file
        self.unsafe: dict[str, Optional[str]] = {}  # project file -> why it cannot be imported again, or None
        self.seen: set[str] = set()  # module names looked at

    def scan(self) -> frozenset[str]:
        """The project files loaded since the last scan."""
        new = set()
        for name, module in list(sys.modules.items()):
            if name in self.seen:
                continue
            self.seen.add(name)
            file = getattr(module, "__file__", None)
            if not isinstance(file, str) or not depends.is_project_file(file):
                continue
            file = str(Path(file).resolve())
            self.names[name] = file
            self.unsafe[file] = unsafe_reason(module, file)
            new.add(file)
        return frozenset(new)

    def forget(self, files: frozenset[str]) -> None:
        """Drop the modules of ``files`` from sys.modules: the next case that needs them imports them afresh
        from their source (a cached .pyc checks the second of the change only: a quick save could be missed)."""
        for name, file in list(self.names.items()):
            if file in files:
                sys.modules.pop(name, None)
                del self.names[name]
                self.seen.discard(name)
                self.unsafe.pop(file, None)
        for file in files:
            with contextlib.suppress(OSError, ValueError, NotImplementedError):
                os.remove(importlib.util.cache_from_source(file))
        importlib.invalidate_caches()  # new files are found at once


def unsafe_reason(module: Any, file: str) -> Optional[str]:
    """Why a loaded module cannot be imported a second time in this process, or None."""
    import torch

    if not file.endswith(".py"):
        return f"{os.path.relpath(file)} is a compiled extension, which cannot be loaded twice in one process"
    registers = any(
        isinstance(v, torch.library.Library) or type(v).__name__ == "CustomOpDef" for v in list(vars(module).values())
    )
    try:
        registers = registers or bool(UNSAFE_SOURCE.search(Path(file).read_bytes()))
    except OSError:
        pass
    if registers:
        return (
            f"{os.path.relpath(file)} registers custom ops or loads C++ code (torch.library, cpp_extension), "
            "which cannot be done twice in one process"
        )
    return None


def _serve(conn: Connection, threads: int) -> None:
    """Worker main loop: ("forget", files) drops modules; ("check", task) checks it and answers
    ("started",) then ("done", Outcome); None stops."""
    from .pool import keep_freed_memory

    processes.lead_group()  # a Ctrl-C at the terminal reaches the watch alone
    multiprocessing.current_process().daemon = False  # user code may start processes of its own
    os.dup2(2, 1)  # what user code prints goes to stderr, so stdout stays the report
    keep_freed_memory()
    sys.dont_write_bytecode = True  # the user's modules change between rounds: always from their source
    import torch

    from ..sandbox.state_guard import GUARD
    from .runner import run_task, verdict_of, warm_up

    torch.set_num_threads(threads)
    warm_up()
    modules = Modules()
    modules.scan()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        if message[0] == "forget":
            modules.forget(message[1])
            continue
        task: Task = message[1]
        conn.send(("started",))
        try:  # this process is replaced where the task leaves it tainted (``Outcome.retire``): disposable
            result = run_task(task, disposable=True)
        except KeyboardInterrupt as exc:  # no Ctrl-C reaches this process: the code under test raised it,
            result = interrupted(task, verdict_of(exc))  # in the case or in its shrinking
        processes.end(processes.started())  # what the case started ends with it
        processes.reap()
        new = modules.scan()
        conn.send(("done", Outcome(result, new, dict(modules.unsafe), bool(GUARD.tainted()))))


class Worker:
    """The parent's handle on one worker process (spawned at once; it warms up while the parent waits)."""

    def __init__(self, threads: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, threads), daemon=True)
        self.proc.start()
        child.close()
        self.loaded: dict[str, Optional[str]] = {}  # what the last answer said was loaded
        self.dead = False

    def forget(self, files: frozenset[str]) -> None:
        if files and not self.dead:
            self.conn.send(("forget", files))
            self.loaded = {f: why for f, why in self.loaded.items() if f not in files}

    def check(self, task: Task, timeout: Optional[float], option: str = "--timeout") -> Outcome:
        """Check ``task``; a crash or a timeout is an error result for it, and the worker is then dead."""
        self.conn.send(("check", task))
        started: Optional[float] = None
        while True:
            left = WAIT_STEP if timeout is None or started is None else max(0.0, started + timeout - time.monotonic())
            ready = wait([self.conn, self.proc.sentinel], timeout=min(left, WAIT_STEP))
            if self.conn in ready:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    return self._died(task, self._death())
                if message[0] == "started":
                    started = time.monotonic()
                    continue
                outcome: Outcome = message[1]
                self.loaded = outcome.loaded
                return outcome
            if self.proc.sentinel in ready:
                return self._died(task, self._death())
            if timeout is not None and started is not None and time.monotonic() >= started + timeout:
                return self._died(
                    task,
                    f"timed out after {timeout:g} s ({option}; 0 for none): stopped; an endless "
                    "loop in forward or backward, or a limit too small for this check?",
                    ErrorKind.TIMEOUT,
                )

    def _death(self) -> str:
        self.proc.join(timeout=2)
        code = self.proc.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return (
            f"the worker process checking this case {how} before reporting (a crash in native code, "
            "os._exit, or out of memory); a fresh worker checks the next case"
        )

    def _died(self, task: Task, message: str, kind: ErrorKind = ErrorKind.CRASH) -> Outcome:
        self.stop(force=True)
        return Outcome(failed_result(task, kind, message), retire=True)

    def stop(self, force: bool = False) -> None:
        """End the worker; ``force``: at once, with every process the code under test started."""
        if not force and not self.dead:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(timeout=5)
        if self.proc.pid is not None:  # a worker that crashed is reaped already: its group is ended all the same
            processes.end_group(self.proc.pid, ended=not self.proc.is_alive())
        self.proc.join()
        self.conn.close()
        self.dead = True
