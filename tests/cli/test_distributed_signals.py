"""Ctrl-C and SIGTERM while the ranks of a distributed case run (issue 32): the run ends as any run does
(130 / 143), and no rank is left running, whether the case ran in a worker or in the gradcheck process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

HANGS = """
    import os, time
    from pathlib import Path
    import torch
    import torch.distributed as dist

    class HangsOnRank1(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            mark = Path({marks!r}, f"rank{{dist.get_rank()}}.pid")
            Path(str(mark) + ".tmp").write_text(str(os.getpid()))
            Path(str(mark) + ".tmp").replace(mark)  # whole when seen: the test reads it at once
            if dist.get_rank() == 1:
                while True:
                    time.sleep(0.05)
            y = x.clone()
            dist.all_reduce(y)
            return y

        @staticmethod
        def backward(ctx, g):
            return g
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code, mode", [(signal.SIGTERM, 143, []), (signal.SIGINT, 130, ["--no-isolate"])], ids=["term", "int"]
)
def test_an_interrupt_ends_every_rank(user_module, write_spec, tmp_path, gradcheck_argv, signum, code, mode):
    marks = tmp_path / "marks"
    marks.mkdir()
    user_module(HANGS.format(marks=str(marks)), name="hangmod")
    write_spec(
        "function: hangmod:HangsOnRank1\ninputs: [{name: x, shape: [3]}]\ndistributed: {world_size: 2, timeout: 600}\n",
        "specs/hang.yaml",
    )
    proc = subprocess.Popen(
        [*gradcheck_argv, "specs/", "--format", "json", *mode],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
    )
    deadline = time.monotonic() + 300  # a bound for a broken run only: the wait ends on the event
    while len(list(marks.glob("rank*.pid"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in sorted(marks.glob("rank*.pid"))]
    assert len(pids) == 2, proc.communicate(timeout=60)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=300)  # a bound for a hung run only, not a speed
    assert proc.returncode == code, stderr
    deadline = time.monotonic() + 120
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)
    assert "Traceback" not in stderr, stderr
