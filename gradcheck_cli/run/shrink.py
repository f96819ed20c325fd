"""A failing case made smaller: smaller shapes tried while the same argument keeps failing in the same check
with the same pattern, within a time budget (information only: the case's result is not changed).

The attempts run in a child process forked for them: whatever the code under test does there (raise, hang,
crash, print, change global state) ends with the child, and the child is ended at the budget's end. What it
found until then is sent back after every attempt. Where a forked child could not run backward (torch refuses
it once autograd has started its device threads: a machine with a GPU), or the system cannot fork, they run
in this process, the budget checked between attempts. No torch here: the caller's ``attempt`` runs the case.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from ..results import CaseResult, CheckResult, InputReport, Pattern, Shrunk, Status
from ..sandbox import processes

Shapes = dict[str, tuple[int, ...]]  # argument name -> shape
Values = dict[str, str]  # argument name -> the simpler values drawn for it (zeros, ones, integers)
KINDS = ("zeros", "ones", "integers")  # the simplest first (overrides.KINDS)


@dataclass(frozen=True)
class State:
    """A case to try: every tensor argument's shape, and the arguments whose values are simpler."""

    shapes: Shapes
    values: Values = field(default_factory=dict)

    def key(self) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[tuple[str, str], ...]]:
        return tuple(sorted(self.shapes.items())), tuple(sorted(self.values.items()))


Attempt = Callable[[State], CaseResult]  # the case checked at this state (the seed of the failure)
MAX_ATTEMPTS = 300  # smaller cases tried at most, however fast they are
_HEADER = struct.Struct("!I")
_STOPS = {signal.SIGINT, signal.SIGTERM}  # the signals that stop a run


@dataclass(frozen=True)
class Failure:
    """How a case failed: the first failing check, its first failing argument and that argument's pattern."""

    check: str
    argument: Optional[str] = None  # None: the check failed without a failing argument row (a contract problem)
    pattern: Optional[Pattern] = None


def failure(result: CaseResult) -> Optional[Failure]:
    """How ``result`` failed, or None when it did not fail (error, xfail, pass, skip)."""
    if result.status is not Status.FAIL:
        return None
    for check in result.checks:
        if check.status is Status.FAIL:
            rows = _failing_arguments(check)
            return Failure(check.check, rows[0].name, rows[0].pattern) if rows else Failure(check.check)
    return None


def _failing_arguments(check: CheckResult) -> list[InputReport]:
    """The argument rows of ``check`` that failed, in order."""
    return [row for row in check.inputs if row.status is Status.FAIL and row.role == "argument"]


def fails_alike(result: CaseResult, how: Failure) -> bool:
    """Whether ``result`` fails as ``how`` says: the same check fails, for the same argument with the same
    pattern (or, where ``how`` names no argument, with no failing argument row either)."""
    if result.status is not Status.FAIL:
        return False
    for check in result.checks:
        if check.check != how.check or check.status is not Status.FAIL:
            continue
        rows = _failing_arguments(check)
        if how.argument is None:
            return not rows
        return any(row.name == how.argument and row.pattern == how.pattern for row in rows)
    return False


def as_asked(result: CaseResult, state: State) -> bool:
    """Whether every argument row of ``result`` has the shape ``state`` asked for (a draw at another shape would
    report one that the replay's --shape does not say; --shape refuses the shapes a matrix dist cannot draw,
    and this keeps any other such draw from counting)."""
    return all(
        list(row.shape) == list(state.shapes[row.name])
        for check in result.checks
        for row in check.inputs
        if row.role == "argument" and row.name in state.shapes
    )


def candidates(size: int) -> list[int]:
    """The smaller sizes tried for a dimension of ``size``, smallest first: 1, 2, half of it, one less."""
    return sorted({to for to in (1, 2, size // 2, size - 1) if 1 <= to < size})


def empty(shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` has no elements (a dimension of 0)."""
    return 0 in shape


def moves(shapes: Shapes) -> Iterator[Shapes]:
    """Smaller shapes to try from ``shapes``, in order: every dimension of one size at once (the dimensions a
    spec ties together have one size: a matmul's inner dimensions, a bias broadcast over rows, a square
    matrix), the largest size first; then each dimension alone. A dimension of 0 or 1 stays, and so does the
    shape of an argument with no elements: no move makes a shape with no elements (``candidates`` are at
    least 1), nor changes one (a case that compares nothing proves nothing)."""
    sizes = sorted({d for shape in shapes.values() if not empty(shape) for d in shape if d > 1}, reverse=True)
    for size in sizes:
        for to in candidates(size):
            yield {
                name: shape if empty(shape) else tuple(to if d == size else d for d in shape)
                for name, shape in shapes.items()
            }
    for name, shape in shapes.items():
        for i, d in enumerate(shape):
            for to in candidates(d) if not empty(shape) else ():
                yield {**shapes, name: shape[:i] + (to,) + shape[i + 1 :]}


def steps(state: State, allowed: dict[str, tuple[str, ...]]) -> Iterator[State]:
    """The states to try from ``state``: smaller shapes (``moves``), then simpler values for one argument
    with elements (of the kinds ``allowed`` for it, simplest first), values kept or shapes kept."""
    for shapes in moves(state.shapes):
        yield State(shapes, state.values)
    for name, kinds in allowed.items():
        if empty(state.shapes.get(name, (1,))):  # no values to make simpler
            continue
        now = KINDS.index(state.values[name]) if name in state.values else len(KINDS)
        for kind in kinds:
            if KINDS.index(kind) < now:
                yield State(state.shapes, {**state.values, name: kind})


def search(
    start: State,
    allowed: dict[str, tuple[str, ...]],
    how: Failure,
    attempt: Attempt,
    out_of_time: Callable[[], bool],
    found: Callable[[int, Optional[tuple[State, int]]], None],
) -> None:
    """Greedy: from ``start``, take the first step whose case fails alike, and go on from there until no step
    does, time is out or MAX_ATTEMPTS were tried. ``found(attempts, best)`` after every attempt, with the
    smallest failing state so far and its result's seed (None until one)."""
    me = os.getpid()
    current, tried, attempts = start, {start.key()}, 0
    best: Optional[tuple[State, int]] = None
    while True:
        for smaller in steps(current, allowed):
            if smaller.key() in tried:
                continue
            if out_of_time() or attempts >= MAX_ATTEMPTS:
                return
            tried.add(smaller.key())
            attempts += 1
            seed, alike = 0, False
            try:
                result = attempt(smaller)
                seed, alike = result.seed, fails_alike(result, how) and as_asked(result, smaller)
            except Exception:  # noqa: BLE001 - an attempt that raises does not count
                pass
            if os.getpid() != me:  # a process the code under test forked, back from it: it reports nothing
                os._exit(0)
            if alike:
                current, best = smaller, (smaller, seed)
            found(attempts, best)
            if alike:
                break
        else:
            return


def shrunk(
    result: CaseResult,
    start: State,
    allowed: dict[str, tuple[str, ...]],
    attempt: Attempt,
    budget: float,
    setup: Callable[[], None] = lambda: None,
    fork: Callable[[], bool] = lambda: True,
    stop: Callable[[], bool] = lambda: False,
) -> Optional[Shrunk]:
    """A smaller or simpler case than ``start`` (every tensor argument's shape; ``allowed``: the simpler values
    each argument's spec allows) that fails as ``result`` does, searched for ``budget`` seconds at most in a
    child process, which calls ``setup`` first; None when the result did not fail or no such case failed alike
    in time. Where the system cannot fork, or ``fork()`` says no (a forked child could not run backward; asked
    only when there is a search to run), it runs in this process instead, the budget checked between attempts
    (``_here``), and so is ``stop()``: true ends the search there (an attempt left the process unusable)."""
    how = failure(result)
    if how is None or budget <= 0 or not (_any_step(start, allowed)):
        return None
    began = time.perf_counter()
    deadline = began + budget
    if hasattr(os, "fork") and fork():
        last = _forked(start, allowed, how, attempt, deadline, setup)
    else:
        last = _here(start, allowed, how, attempt, deadline, stop)
    if last is None or last[1] is None:
        return None
    attempts, (state, seed) = last[0], last[1]
    return Shrunk(
        check=how.check,
        argument=how.argument,
        pattern=how.pattern,
        shapes={name: list(shape) for name, shape in state.shapes.items() if shape != start.shapes[name]},
        values={name: kind for name, kind in state.values.items() if kind != start.values.get(name)},
        seed=seed,
        attempts=attempts,
        duration_s=time.perf_counter() - began,
    )


Found = Optional[tuple[int, Optional[tuple[State, int]]]]  # the last (attempts, best) the search reported


def _here(
    start: State,
    allowed: dict[str, tuple[str, ...]],
    how: Failure,
    attempt: Attempt,
    deadline: float,
    stop: Callable[[], bool] = lambda: False,
) -> Found:
    """The search in this process: what the code under test prints meanwhile goes nowhere (it is not the
    case's), an attempt that runs past the deadline is waited for (the run's --timeout bounds it), and the
    search ends where ``stop()`` says so."""
    last: Found = None

    def found(attempts: int, best: Optional[tuple[State, int]]) -> None:
        nonlocal last
        last = (attempts, best)

    with _quiet():
        search(start, allowed, how, attempt, lambda: time.perf_counter() >= deadline or stop(), found)
    return last


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Standard output and error, the file descriptors and Python's, to the null device for a while."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    quiet = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(quiet)


def _forked(
    start: State,
    allowed: dict[str, tuple[str, ...]],
    how: Failure,
    attempt: Attempt,
    deadline: float,
    setup: Callable[[], None],
) -> Found:
    """The search in a child process forked for it, ended at the deadline."""
    read, write = os.pipe()
    # Ctrl-C or SIGTERM waits until the child exists and can be ended: neither may stop this process between
    # the fork and the try below (a child left searching), nor reach the child before it ignores Ctrl-C
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    parent = os.getpid()
    with warnings.catch_warnings():  # a multi-threaded process: the child only checks, then ends
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        _die_with(parent)
        _child(
            write,
            lambda found: search(start, allowed, how, attempt, lambda: time.perf_counter() >= deadline, found),
            setup,
            blocked,
        )
    try:
        os.close(write)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        last = _listen(read, deadline)
    finally:
        os.close(read)
        _end(pid)
    return last


def _any_step(start: State, allowed: dict[str, tuple[str, ...]]) -> bool:
    return next(steps(start, allowed), None) is not None


def _die_with(parent: int) -> None:
    """Linux: this child is killed when its parent dies, however it dies (a worker killed for memory while it
    shrinks): a search left running would hold the pipes of the parent's own parent (the run waits for them)."""
    if processes.die_with_parent() is None:  # not Linux: the parent's process group ends it
        return
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(0)


def _child(
    write: int,
    run: Callable[[Callable[[int, Optional[tuple[State, int]]], None]], None],
    setup: Callable[[], None],
    mask: set[Union[int, signal.Signals]],
) -> None:
    """``run(found)``, sending what was found after every attempt; then end this process (no cleanup of the
    parent's: its handlers, buffers and atexit functions are not this process's). Ctrl-C, which a terminal
    sends to the whole process group, is the parent's to handle: it ends this child; SIGTERM ends it."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's handlers would report as the parent
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # what the code under test prints here is not the case's
        os.dup2(quiet, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        setup()

        def found(attempts: int, best: Optional[tuple[State, int]]) -> None:
            data = pickle.dumps((attempts, best))
            os.write(write, _HEADER.pack(len(data)) + data)

        run(found)
    finally:
        os._exit(0)


def _listen(read: int, deadline: float) -> Found:
    """The child's last whole message, read until it ends (closes its end) or the deadline passes."""
    buffer, last = b"", None
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return last
        ready, _, _ = select.select([read], [], [], left)
        if not ready:
            return last
        chunk = os.read(read, 1 << 16)
        if not chunk:
            return last
        buffer += chunk
        while len(buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buffer)
            if len(buffer) < _HEADER.size + size:
                break
            last = pickle.loads(buffer[_HEADER.size : _HEADER.size + size])
            buffer = buffer[_HEADER.size + size :]


def _end(pid: int) -> None:
    """End the child (started here, by its pid) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
