"""A rank whose code under test forks a process that outlives it: that process holds the rank's answer pipe
open, so the answer was read only at the pipe's end. A world whose ranks had all answered timed out, and a
timeout blamed the ranks that were done."""

from __future__ import annotations

import os
import sys

import pytest

from gradcheck_cli.distributed.launch import FORWARD, WorldFailure, run_world
from gradcheck_cli.results import ErrorKind

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="ranks are forked")


@pytest.fixture
def gate():
    """A pipe's read end that blocks until the test ends (its write end is closed then)."""
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(write_fd)
    os.close(read_fd)


def body(gate: tuple[int, int], hang: set[int]):
    read_fd, write_fd = gate

    def run(rank, progress):
        progress.phase(FORWARD)
        if rank == 0 and os.fork() == 0:  # a helper the code under test forks: it lives until the test ends
            os.close(write_fd)
            os.read(read_fd, 1)
            os._exit(0)
        if rank in hang:
            os.close(write_fd)
            os.read(read_fd, 1)  # no progress: ended by the coordinator
        return f"rank {rank}"

    return run


def test_a_world_whose_rank_forked_returns_when_every_rank_answered(gate):
    assert run_world(2, body(gate, set()), timeout=20.0) == ["rank 0", "rank 1"]


def test_a_timeout_names_only_the_ranks_still_running(gate):
    with pytest.raises(WorldFailure) as info:
        run_world(3, body(gate, {2}), timeout=3.0)
    failure = info.value
    assert failure.kind is ErrorKind.TIMEOUT and failure.rank == 2
    assert str(failure).startswith("rank 2 made no progress for 3 s"), str(failure)
    assert "rank 0: finished" in str(failure) and "rank 1: finished" in str(failure)
