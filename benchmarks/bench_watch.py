"""Watch re-check time: ``gradcheck --watch`` on a small spec in a temporary project; the backward of
its Function is saved wrong, then right, then wrong, ... and each re-check is timed from the file's
modification time to the moment the round's report (its summary line) reaches this process. The
first round (worker start-up, torch import) is reported apart. Not a test: run it by hand,

    python benchmarks/bench_watch.py [EDITS]
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

MODULE = """import torch


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x * {factor}
"""
SPEC = "function: square_mod:Square\ninputs:\n  - shape: [4, 5]\n"


def summary_line(stream: IO[str]) -> str:
    """Read the report until its summary line (``1 result: ...``)."""
    while True:
        line = stream.readline()
        if not line:
            raise SystemExit("the watch ended early; run it by hand to see why")
        if line.startswith("1 result"):
            return line.strip()


def main() -> None:
    edits = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "specs").mkdir()
        (project / "specs" / "square.yaml").write_text(SPEC)
        module = project / "square_mod.py"
        module.write_text(MODULE.format(factor=3))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        start = time.time()
        # Ctrl-C reaches the watch even where this benchmark was started in the background (a shell
        # starts those with SIGINT ignored, and the watch, as any program, keeps what it inherits)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gradcheck_cli", "--watch", "specs", "-q", "--no-color"],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert proc.stdout is not None
        try:
            first = summary_line(proc.stdout)
            print(f"first round (start-up included): {time.time() - start:.2f} s  [{first}]")
            times = []
            for k in range(edits):
                time.sleep(0.5)  # a person between two saves; the watch is idle
                module.write_text(MODULE.format(factor=2 if k % 2 == 0 else 3))
                saved = os.stat(module).st_mtime_ns / 1e9
                line = summary_line(proc.stdout)
                times.append(time.time() - saved)
                print(f"re-check {k + 1}: {times[-1]:.3f} s  [{line}]")
        finally:
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise SystemExit("the watch did not stop within 30 s of Ctrl-C: stopped it; run it by hand") from None
    print(
        f"re-check after a save: median {statistics.median(times):.3f} s, min {min(times):.3f} s, "
        f"max {max(times):.3f} s over {len(times)} saves (target: under 0.3 s)"
    )


if __name__ == "__main__":
    main()
