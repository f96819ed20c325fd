"""Start the ranks of a world, wait for each one's answer, and end them all: a rank that raises, dies or
stops making progress ends every rank, and nothing outlives ``run_world``.

Ranks are forked from this process (it has imported torch and the target already). Each rank gets a
pipe for its one answer, a pipe it waits on before it exits (so no rank leaves the group while another
still uses it), and a slot of shared memory where it counts its steps and collective calls: the
coordinator ends the world when no rank has moved for ``timeout`` seconds, and says where each rank was.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import pickle
import select
import shutil
import signal
import struct
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..results import ErrorKind
from ..sandbox import processes
from ..sandbox.errors import user_frame, user_frames

STEPS, COLLECTIVES, IN_COLLECTIVE, PHASE = range(4)  # a rank's slot in the shared memory
SLOT = 4
PHASES = ("starting", "joining the process group", "forward", "backward", "finite differences", "done")
FORWARD, BACKWARD, DIFFERENCES, DONE = 2, 3, 4, 5  # indices in PHASES
COLLECTIVE_NAMES = (
    "",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
    "gather",
    "scatter",
)
AGREEING = len(COLLECTIVE_NAMES)  # in IN_COLLECTIVE: waiting for the other ranks in gradcheck-cli's own agreement
_HEADER = struct.Struct("<Q")


@dataclass
class RankError(Exception):
    """What one rank raised, as it reports it: the error's kind, message, user frames, and the collective
    it was in, where known (an error inside a collective is often another rank's failure seen from here)."""

    kind: ErrorKind
    message: str
    where: Optional[str] = None
    frames: tuple[str, ...] = ()
    collective: str = ""
    broken: Optional[int] = None  # backward broke its contract (autograd rejected what it returned): the gradient's
    # index where autograd names one (-1: the count)


@dataclass
class WorldFailure(Exception):
    """The world did not finish: the rank to blame, the error's kind and the message that names it."""

    kind: ErrorKind
    message: str
    rank: int
    where: Optional[str] = None
    frames: tuple[str, ...] = field(default_factory=tuple)
    error: Optional[RankError] = None  # the rank's own error, where it raised one
    errors: dict[int, RankError] = field(default_factory=dict)  # every rank's error, by rank

    def __str__(self) -> str:
        return self.message


class Progress:
    """A rank's view of its slot in the shared memory (steps, collective calls, the collective it is in,
    its phase)."""

    def __init__(self, shared: Any, rank: int) -> None:
        self.shared, self.base = shared, rank * SLOT

    def phase(self, index: int) -> None:
        """Enter phase ``PHASES[index]``."""
        self.shared[self.base + PHASE] = index
        self.step()

    def step(self) -> None:
        """One more step done (the coordinator's timeout counts from the last step of any rank)."""
        self.shared[self.base + STEPS] += 1

    def enter(self, collective: str) -> None:
        """Entering a collective call."""
        self.shared[self.base + COLLECTIVES] += 1
        self.shared[self.base + IN_COLLECTIVE] = (
            COLLECTIVE_NAMES.index(collective) if collective in COLLECTIVE_NAMES else 0
        )

    def agreeing(self) -> None:
        """Waiting for the other ranks in gradcheck-cli's own agreement (not one of the user's collective calls,
        but a wait that only the other ranks can end, as inside one)."""
        self.shared[self.base + IN_COLLECTIVE] = AGREEING

    def leave(self) -> None:
        """Back from a collective call (or the agreement)."""
        self.shared[self.base + IN_COLLECTIVE] = 0
        self.step()


MEETING = "gradcheck-world-"


@contextmanager
def meeting() -> Iterator[str]:
    """The path of a file no rank has opened yet, where a world's ranks meet (``torch.distributed.FileStore``),
    in a folder of its own that is removed afterwards. A file, not a TCP port picked free in advance: another
    process can take a port between the pick and rank 0's bind. A folder left by a worker that was killed
    (SIGKILL ends a worker on SIGTERM) is removed by the next world on this machine once its process is gone."""
    base = tempfile.gettempdir()
    for name in os.listdir(base) if os.name == "posix" else ():  # worlds are forked: POSIX only
        pid = name[len(MEETING) :].partition("-")[0]
        if name.startswith(MEETING) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{MEETING}{os.getpid()}-") as folder:
        yield os.path.join(folder, "store")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def run_world(size: int, body: Callable[[int, Progress], Any], timeout: float) -> list[Any]:
    """Fork ``size`` ranks, each running ``body(rank, progress)``, and return their answers in rank order.
    WorldFailure when a rank raises (``RankError`` or any exception), dies, or when no rank makes progress
    for ``timeout`` seconds; every rank is ended and reaped before this returns or raises (an interrupt
    of this process included)."""
    shared = multiprocessing.RawArray("q", size * SLOT)
    pids: list[int] = []
    answers: dict[int, Any] = {}
    errors: dict[int, RankError] = {}
    died: dict[int, str] = {}
    readers: dict[int, int] = {}  # fd -> rank
    buffers: dict[int, bytearray] = {}
    releases: list[int] = []
    reaped: set[int] = set()
    try:
        for rank in range(size):
            read_fd, write_fd = os.pipe()
            release_read, release_write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the rank: never returns
                _rank_main(rank, body, Progress(shared, rank), write_fd, release_read, (read_fd, release_write))
            os.close(write_fd)
            os.close(release_read)
            pids.append(pid)
            readers[read_fd] = rank
            buffers[read_fd] = bytearray()
            releases.append(release_write)
        last, seen = time.monotonic(), -1
        while readers:
            steps = sum(shared[r * SLOT + STEPS] for r in range(size))
            if steps != seen:
                last, seen = time.monotonic(), steps
            left = timeout - (time.monotonic() - last)
            if left <= 0:
                raise _timed_out(size, shared, answers, errors, died, timeout)
            try:
                ready, _, _ = select.select(list(readers), [], [], min(left, 0.5))
            except InterruptedError:  # a signal whose handler did not raise
                continue
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                buffers[fd] += chunk
                if chunk and not _whole(buffers[fd]):
                    continue
                # a whole answer is read at once, not at the pipe's end: a process the rank forked (the code
                # under test's) holds the pipe open after the rank wrote its answer
                rank = readers.pop(fd)
                os.close(fd)
                whole = _whole(buffers[fd])
                message = _decode(buffers.pop(fd))
                if message is None and whole:
                    errors[rank] = RankError(ErrorKind.INTERNAL, f"internal error: rank {rank}'s answer cannot be read")
                elif message is None:
                    died[rank] = _death(pids[rank])
                    reaped.add(pids[rank])
                elif "error" in message:
                    errors[rank] = message["error"]
                else:
                    answers[rank] = message["answer"]
            if (died or errors) and not any(
                shared[r * SLOT + IN_COLLECTIVE] == 0 and r not in answers and r not in died and r not in errors
                for r in range(size)
            ):
                break  # every rank that still runs waits in a collective that cannot complete
        if died or errors or len(answers) < size:
            raise _blame(size, shared, answers, errors, died)
        return [answers[r] for r in range(size)]
    finally:
        for fd in releases:
            _close(fd)
        for fd in readers:
            _close(fd)
        _end([pid for pid in pids if pid not in reaped])


def _rank_main(
    rank: int, body: Callable[[int, Progress], Any], progress: Progress, out: int, release: int, ends: tuple[int, ...]
) -> None:
    """A forked rank: run ``body``, write its answer (or error) to ``out``, wait for the release, exit (``ends``:
    the coordinator's ends of this rank's pipes, closed here)."""
    code = 0
    try:
        for fd in ends:
            os.close(fd)
        processes.die_with_parent()  # Linux: die with the coordinator, even when it is killed (SIGKILL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the coordinator ends the ranks
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getppid() == 1:  # the coordinator died before the death signal was set
            os._exit(1)
        try:
            message: dict[str, Any] = {"answer": body(rank, progress)}
        except RankError as exc:
            message = {"error": exc}
        except KeyboardInterrupt:  # SIGINT is ignored here: the code under test raised it, as in one process
            message = {"error": RankError(ErrorKind.FORWARD, "the code under test raised KeyboardInterrupt")}
        except BaseException as exc:  # noqa: BLE001 - a rank's failure is reported, never raised here
            message = {
                "error": RankError(
                    ErrorKind.INTERNAL,
                    f"internal error in gradcheck-cli on rank {rank}: {type(exc).__name__}: {exc}",
                    "".join(traceback.format_exception(exc)[-3:]).strip(),
                )
            }
        try:
            payload = pickle.dumps(message)
        except Exception as exc:  # noqa: BLE001 - an answer that cannot be sent
            payload = pickle.dumps({"error": RankError(ErrorKind.INTERNAL, f"rank {rank}: cannot send: {exc}")})
        view = memoryview(_HEADER.pack(len(payload)) + payload)
        while view:
            view = view[os.write(out, view) :]
        os.close(out)
        try:
            os.read(release, 1)  # EOF when the coordinator releases the world (or dies)
        except OSError:
            pass
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


def user_error(kind: ErrorKind, what: str, exc: BaseException, collective: str = "") -> RankError:
    """``exc``, raised by the user's code (``what``: forward, backward), as a rank reports it."""
    return RankError(kind, f"{what} raised {type(exc).__name__}: {exc}", user_frame(exc), user_frames(exc), collective)


def _whole(data: bytearray) -> bool:
    """Whether ``data`` holds a rank's whole message (its length, then that many bytes)."""
    return len(data) >= _HEADER.size and len(data) >= _HEADER.size + _HEADER.unpack_from(data)[0]


def _decode(data: bytearray) -> Optional[dict[str, Any]]:
    """The one message a rank wrote, or None when it wrote none whole (it died first)."""
    if len(data) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack_from(data)
    if len(data) < _HEADER.size + n:
        return None
    try:
        message: dict[str, Any] = pickle.loads(bytes(data[_HEADER.size : _HEADER.size + n]))
    except Exception:  # noqa: BLE001 - a torn message: the rank died while writing
        return None
    return message


def _death(pid: int) -> str:
    """How a rank that wrote no answer ended (it is reaped here)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return "ended"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by {name}"
    return f"exited with status {os.WEXITSTATUS(status)} (os._exit or a crash)"


def _where(shared: Any, rank: int, answers: dict[int, Any]) -> str:
    """Where rank ``rank`` was: finished, or its phase and the collective it waits in; its collective calls."""
    base = rank * SLOT
    calls = shared[base + COLLECTIVES]
    if rank in answers:
        return f"finished after {calls} collective call{'s' * (calls != 1)}"
    phase = PHASES[shared[base + PHASE]] if 0 <= shared[base + PHASE] < len(PHASES) else "?"
    code = shared[base + IN_COLLECTIVE]
    if 0 < code < len(COLLECTIVE_NAMES):
        return f"{phase}, in {COLLECTIVE_NAMES[code]} (its collective call {calls})"
    if code == AGREEING:
        return f"{phase}, waiting for the other ranks after {calls} collective call{'s' * (calls != 1)}"
    return f"{phase}, {calls} collective call{'s' * (calls != 1)} made"


def _timed_out(
    size: int, shared: Any, answers: dict[int, Any], errors: dict[int, RankError], died: dict[int, str], timeout: float
) -> WorldFailure:
    """No rank moved for ``timeout`` seconds: blame the ranks stuck where the others are not."""
    if died or errors:
        return _blame(size, shared, answers, errors, died)
    running = [r for r in range(size) if r not in answers]
    # a rank waiting for the others in the agreement has done its part, as one that finished has
    stuck = [r for r in running if shared[r * SLOT + IN_COLLECTIVE] != AGREEING] or running
    outside = [r for r in stuck if shared[r * SLOT + IN_COLLECTIVE] == 0]  # the others wait for these
    blamed = outside if outside and len(outside) < len(stuck) else stuck
    states = "; ".join(f"rank {r}: {_where(shared, r, answers)}" for r in range(size))
    counts = {shared[r * SLOT + COLLECTIVES] for r in range(size)}
    why = " (the ranks made different numbers of collective calls: mismatched collectives?)" if len(counts) > 1 else ""
    names = ", ".join(map(str, blamed))
    return WorldFailure(
        ErrorKind.TIMEOUT,
        f"rank{'s' * (len(blamed) != 1)} {names} made no progress for {timeout:g} s (distributed.timeout)"
        + (" outside any collective, while the others waited in one" if blamed is outside else "")
        + f", and every rank was ended{why}: {states}",
        blamed[0] if blamed else 0,
    )


def _blame(
    size: int, shared: Any, answers: dict[int, Any], errors: dict[int, RankError], died: dict[int, str]
) -> WorldFailure:
    """The failure to report: a rank's own error before one met inside a collective (often another rank's
    failure seen from there), a rank that died before either of those."""
    own = [r for r in sorted(errors) if not errors[r].collective]
    if own:
        r = own[0]
        e = errors[r]
        return WorldFailure(e.kind, f"rank {r}: {e.message}", r, e.where, e.frames, e, dict(errors))
    if died:
        r = min(died)
        others = "; ".join(f"rank {o}: {_where(shared, o, answers)}" for o in range(size) if o != r)
        return WorldFailure(
            ErrorKind.CRASH,
            f"rank {r} {died[r]} during {PHASES[shared[r * SLOT + PHASE]]}, and every rank was ended ({others})",
            r,
        )
    if errors:
        r = min(errors)
        e = errors[r]
        return WorldFailure(
            e.kind,
            f"rank {r}: {e.message} (in {e.collective}; "
            + "; ".join(f"rank {o}: {_where(shared, o, answers)}" for o in range(size))
            + ")",
            r,
            e.where,
            e.frames,
        )
    missing = [r for r in range(size) if r not in answers]
    return WorldFailure(ErrorKind.CRASH, f"rank {missing[0]} gave no answer", missing[0])


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _end(pids: list[int]) -> None:
    """Kill the ranks still running and reap every one."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                raise
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
