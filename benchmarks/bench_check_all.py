"""The cost of ``--check all`` against the default checks, on ~150 small specs (issue 28's target: at
most 4x).

Writes the specs into a temporary folder (the project's example Functions and modules, small shapes
that vary from spec to spec), then times, in this order and in the same run,

    gradcheck DIR -j J --format json                 # the default checks
    gradcheck DIR -j J --format json --check all

and prints both wall times, their ratio, and each check's share of the ``--check all`` run (the sum of
the JSON report's per-check ``duration_s`` over all cases; the workers run in parallel, so the shares
are of the summed check time, not of the wall time). Not a test: run it by hand,

    python benchmarks/bench_check_all.py              # 150 specs, -j 2
    python benchmarks/bench_check_all.py -n 30 -j 1   # fewer specs, one worker
    python benchmarks/bench_check_all.py --keep DIR   # write the specs into DIR and keep them
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# (function, init or None, input entries with {n} and {m} as the varied sizes)
TEMPLATES: list[tuple[str, str, str]] = [
    (
        "gradcheck_cli.examples.linear:LinearFunction",
        "",
        "[{{name: input, shape: [{n}, {m}]}}, {{name: weight, shape: [3, {m}]}}, {{name: bias, shape: [3]}}]",
    ),
    (
        "gradcheck_cli.examples.mul_constant:MulConstant",
        "",
        "[{{name: tensor, shape: [{n}, {m}]}}, {{name: constant, value: 2.5}}]",
    ),
    ("gradcheck_cli.examples.relu:ReLU", "", "[{{name: x, shape: [{n}, {m}], avoid: [[-0.01, 0.01]]}}]"),
    ("gradcheck_cli.examples.higher:Sin", "", "[{{name: x, shape: [{n}, {m}]}}]"),
    ("gradcheck_cli.examples.higher:LogSumExp", "", "[{{name: x, shape: [{n}, {m}]}}, {{name: dim, value: -1}}]"),
    ("gradcheck_cli.examples.compiled:ScaledTanh", "", "[{{name: x, shape: [{n}, {m}]}}, {{name: a, value: 2.0}}]"),
    ("gradcheck_cli.examples.inplace:ExpInPlace", "", "[{{name: x, shape: [{n}, {m}]}}]"),
    ("gradcheck_cli.examples.modules:LinearModule", "init: {{args: [{m}, 3]}}", "[{{name: input, shape: [{n}, {m}]}}]"),
    (
        "gradcheck_cli.examples.modules:MLP",
        "init: {{kwargs: {{sizes: [{m}, 4, 2]}}}}",
        "[{{name: input, shape: [{n}, {m}]}}]",
    ),
    (
        "gradcheck_cli.examples.stateful:RunningNorm1d",
        "init: {{args: [{m}], mode: eval}}",
        "[{{name: x, shape: [{n}, {m}]}}]",
    ),
]


def write_specs(folder: Path, count: int) -> None:
    """``count`` spec files, the templates in turn, each with its own small shape and seed."""
    for k in range(count):
        function, init, inputs = TEMPLATES[k % len(TEMPLATES)]
        n, m = 2 + k % 5, 2 + (k // len(TEMPLATES)) % 4
        text = f"function: {function}\nseed: {k}\n"
        if init:
            text += init.format(n=n, m=m) + "\n"
        text += f"inputs: {inputs.format(n=n, m=m)}\n"
        (folder / f"s{k:03d}.yaml").write_text(text)


def timed(folder: Path, jobs: int, extra: list[str]) -> tuple[float, dict]:
    """Wall time of one ``gradcheck`` run and its JSON report."""
    cmd = [sys.executable, "-m", "gradcheck_cli", str(folder), "-j", str(jobs), "--format", "json", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode} without a JSON report:\n{done.stderr[-2000:]}")
    return wall, report


def shares(report: dict) -> dict[str, float]:
    """Seconds per check, summed over the report's cases."""
    out: dict[str, float] = defaultdict(float)
    for r in report["results"]:
        for c in r.get("checks", []):
            out[c["check"]] += float(c.get("duration_s") or 0.0)
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=150, help="how many specs (default 150)")
    parser.add_argument("-j", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--keep", type=Path, help="write the specs into this folder and keep them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        write_specs(folder, args.n)
        default_wall, default_report = timed(folder, args.j, [])
        all_wall, all_report = timed(folder, args.j, ["--check", "all"])
    for name, report in (("default", default_report), ("--check all", all_report)):
        s = report["summary"]
        print(
            f"{name:12s} {s['total']} results: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, "
            f"{s['skipped']} skipped"
        )
    print(f"default checks : {default_wall:7.1f} s wall (-j {args.j}, {args.n} specs)")
    print(f"--check all    : {all_wall:7.1f} s wall")
    print(f"ratio          : {all_wall / default_wall:7.2f}x")
    per = shares(all_report)
    total = sum(per.values()) or 1.0
    for check, secs in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {check:20s} {secs:7.1f} s  {100 * secs / total:5.1f}% of the summed check time")


if __name__ == "__main__":
    main()
