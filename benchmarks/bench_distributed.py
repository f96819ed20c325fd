"""Distributed Functions end to end: one small mapping (CopyToParallelRegion, world size 2, x [4, 6]) and the
whole of specs/distributed.yaml, each checked by `gradcheck` as its own process (the default, and
--no-isolate), against `python -c "import torch"`. Each runs as its own process, timed from start to exit;
the variants take turns in every round, medians over the rounds, then the ratios. Not a test: run it by
hand from the project root,

    python benchmarks/bench_distributed.py [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL = """function: gradcheck_cli.examples.distributed:CopyToParallelRegion
distributed: {world_size: 2}
inputs:
  - {name: x, shape: [4, 6], placement: replicate}
outputs: [per_rank]
"""


def timed(argv: list[str]) -> float:
    """Seconds from start to exit of ``argv`` (its output discarded); it must exit 0."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as folder:
        small = Path(folder) / "copy.yaml"
        small.write_text(SMALL)
        gradcheck = [sys.executable, "-m", "gradcheck_cli"]
        variants = {
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "copy mapping, world size 2, [4, 6]": [*gradcheck, str(small)],
            "copy mapping, --no-isolate": [*gradcheck, str(small), "--no-isolate"],
            "specs/distributed.yaml (10 cases)": [*gradcheck, "specs/distributed.yaml"],
            "specs/distributed.yaml, --no-isolate": [*gradcheck, "specs/distributed.yaml", "--no-isolate"],
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, argv in variants.items():
                times[name].append(timed(argv))
    base = statistics.median(times['python -c "import torch"'])
    print(f"{'variant':40} {'median s':>9} {'vs import torch':>16}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:40} {median:9.2f} {median / base:15.2f}x")


if __name__ == "__main__":
    main()
