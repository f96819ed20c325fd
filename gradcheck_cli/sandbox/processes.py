"""Processes that the code under test started: found, and ended with their case.

Read from /proc (Linux); where there is none (macOS, Windows), from psutil (a dependency there), and where
neither can be read, nothing is found and nothing is ended. No torch here:
the pool's parent uses ``end_group`` too. What is Linux's alone (PR_SET_PDEATHSIG, a subreaper) is asked for
on Linux only, and Windows, which has no SIGKILL, ends a process with ``KILL`` (TerminateProcess there).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Optional

PROC = Path("/proc")
KILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # os.kill(pid, SIGTERM) is TerminateProcess on Windows


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process this one can see."""
    table = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return _psutil_table()
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = _read(f"{PROC}/{name}/stat")
            fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (command) ": state, ppid, pgrp, ...
            if fields[0] != b"Z":  # a zombie runs no more: it only waits to be reaped
                table[int(name)] = (int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):  # it ended meanwhile (an empty or cut read)
            continue
    return table


def _psutil_table() -> dict[int, tuple[int, int]]:
    """``_table`` from psutil, where there is no /proc; the group is the process's own pid where the system
    has no process groups (Windows: ``started`` never asks for one there)."""
    try:
        import psutil
    except ImportError:
        return {}
    table = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["ppid"] is None:
            continue
        try:
            group = os.getpgid(proc.pid) if hasattr(os, "getpgid") else proc.pid
        except OSError:  # it ended meanwhile
            continue
        table[proc.pid] = (int(proc.info["ppid"]), group)
    return table


_subreaper = False  # this process adopts the orphans of its descendants (lead_group made it one)


def _has_children() -> bool:
    """Whether this process has a child, running or ended (a system call, no scan of /proc; no child is reaped)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):  # no waitid here: assume there may be
        return True
    return True


def _read(path: str) -> bytes:
    """A small file's bytes (the system calls alone: this runs for every process, several times a case)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def started() -> frozenset[int]:
    """The processes this one is responsible for: its descendants and, when it leads its process group
    (a pool worker does), the other members of its group (a daemon that forked twice is still in it)."""
    me = os.getpid()
    leader = hasattr(os, "getpgrp") and os.getpgrp() == me
    if (not leader or _subreaper) and not _has_children():  # a subreaper adopts what its group's members leave
        return frozenset()
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(children.get(me, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    if leader:
        found |= {pid for pid, (_, group) in table.items() if group == me and pid != me}
    return frozenset(found)


def end(pids: frozenset[int]) -> None:
    """Kill ``pids`` and reap those that are this process's children."""
    for pid in pids:
        try:
            os.kill(pid, KILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except OSError:  # not our child: init reaps it
            pass


def lead_group() -> None:
    """Make this process the leader of a new process group (POSIX), so that ``end_group`` from its parent
    ends it with everything it started, and a Ctrl-C at the terminal reaches the parent alone; on Linux
    it also dies with its parent."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    libc = die_with_parent()  # Linux: even when the parent is killed (SIGKILL) and cannot stop its workers;
    if libc is not None:  # and adopt the orphans of what user code starts (a daemon that forked twice)
        global _subreaper
        _subreaper = libc.prctl(36, 1) == 0  # PR_SET_CHILD_SUBREAPER


def die_with_parent() -> Optional[ctypes.CDLL]:
    """Linux: this process is killed when its parent dies, however it dies (PR_SET_PDEATHSIG), and the C
    library is returned; elsewhere (macOS, Windows: ``ctypes.CDLL(None)`` raises TypeError there) nothing is
    set and None is returned: those platforms end a worker by the pool's pipe watch and process group."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, KILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def reap() -> None:
    """Collect every child of this process that has ended (a worker's adopted orphans)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except (ChildProcessError, OSError):
        pass


def end_group(pid: int, ended: bool = False) -> None:
    """Kill the process group that ``pid`` leads, if it leads one (else the process alone); where no process
    has ``pid`` any more (a worker that crashed, reaped already), what is left of the group it led.
    ``ended``: the caller knows that its process ``pid`` has ended and been reaped, so a process that has
    the number now is another one, left alone."""
    if not hasattr(os, "killpg"):
        if not ended:
            with contextlib.suppress(OSError):
                os.kill(pid, KILL)
        return
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        # no process has this pid: the group it led outlives it while a member lives, and while one does the
        # system gives the number to no new process (nor group), so the group is still the one it led
        with contextlib.suppress(OSError):
            os.killpg(pid, KILL)
        return
    except OSError:
        group = None
    if ended:  # the number is another process's now: the group it led had no member left to hold it
        return
    with contextlib.suppress(OSError):
        if group == pid:
            os.killpg(pid, KILL)
        else:
            os.kill(pid, KILL)
