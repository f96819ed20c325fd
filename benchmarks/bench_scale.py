"""Large shapes on the CPU (issue 30): each check against `python -c "import torch"`, as ratios of one run.

Every row is a command of its own, run on one thread (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1) in a child
process whose wall time and peak RSS (os.wait4) are its own; the checks run with --no-isolate, so the peak
is the check's. Not a test: run it by hand from a checkout,

    PYTHONPATH=. python benchmarks/bench_scale.py            # every row
    PYTHONPATH=. python benchmarks/bench_scale.py --json     # the same, as JSON lines

Rows and their targets (issue 30): Linear n=256, the default check, at most 20x the import and under 2 GB;
Linear n=512 with --fast under 2x; a too_large refusal (Linear n=512, the default check) under 2x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

LINEAR = "gradcheck_cli.examples.linear:LinearFunction"


def linear(n: int) -> list[str]:
    """The CLI arguments of a Linear layer with x, W: n x n and b: n."""
    return [LINEAR, "-i", f"{n}x{n}", "-i", f"{n}x{n}", "-i", f"{n}"]


CLI = [sys.executable, "-m", "gradcheck_cli", "--no-isolate", "--timeout", "0"]
ROWS: list[tuple[str, list[str], str, float, float]] = [
    # (name, command, expected exit, target ratio to the import, target peak GB)
    ("import torch", [sys.executable, "-c", "import torch"], "0", 1.0, 0.0),
    ("Linear n=256, default check", CLI + linear(256), "0", 20.0, 2.0),
    ("Linear n=512, --fast", CLI + linear(512) + ["--fast"], "0", 2.0, 0.0),
    ("Linear n=512, too_large refusal", CLI + linear(512), "3", 2.0, 0.0),
    ("x**2 1000x1000, --max-memory 64", CLI + ["torch.square", "-i", "1000x1000", "--max-memory", "64"], "0", 0.0, 0.0),
    ("Linear n=128, --max-memory 64", CLI + linear(128) + ["--max-memory", "64"], "0", 0.0, 0.0),
]


def measure(command: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in GB and exit status of ``command`` on one thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    return wall, usage.ru_maxrss / 2**20, os.waitstatus_to_exitcode(status)


def main() -> None:
    as_json = "--json" in sys.argv[1:]
    base = 0.0
    if not as_json:
        print("| row | exit | wall s | x import | target | peak GB |")
        print("|---|---|---|---|---|---|")
    for name, command, expected, target, peak_target in ROWS:
        wall, peak, code = measure(command)
        base = base or wall
        ratio = wall / base
        row = {
            "row": name,
            "exit": code,
            "expected_exit": int(expected),
            "wall_s": round(wall, 2),
            "ratio": round(ratio, 2),
            "target": target or None,
            "peak_gb": round(peak, 2),
            "peak_target_gb": peak_target or None,
        }
        if as_json:
            print(json.dumps(row), flush=True)
        else:
            goal = f"<= {target:g}x" if target and name != "import torch" else ""
            goal += f", < {peak_target:g} GB" if peak_target else ""
            mark = "" if code == int(expected) else f" (expected {expected})"
            print(f"| {name} | {code}{mark} | {wall:.2f} | {ratio:.2f} | {goal} | {peak:.2f} |", flush=True)


if __name__ == "__main__":
    main()
