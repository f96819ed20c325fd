"""Batch cost: a directory of small generated specs, checked by gradcheck-cli with -j 1, -j 2 and
in-process, against a plain Python loop calling torch.autograd.gradcheck on the same Functions and
the same inputs. Each runs as its own process, timed from start to exit (torch's import included
for all). Not a test: run it by hand,

    python benchmarks/bench_batch.py [N_SPECS]
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = [
    ("gradcheck_cli.examples.linear:LinearFunction",
     "inputs: [{{shape: [{a}, {b}]}}, {{shape: [{c}, {b}]}}, {{shape: [{c}]}}]"),
    ("gradcheck_cli.examples.mul_constant:MulConstant", "inputs: [{{shape: [{a}, {b}]}}, {{value: 1.5}}]"),
    ("gradcheck_cli.examples.relu:ReLU", "inputs: [{{shape: [{a}, {b}], avoid: [[-0.01, 0.01]]}}]"),
    ("gradcheck_cli.examples.styles:SumDim", "inputs: [{{shape: [{a}, {b}, 3]}}]\nkwargs: {{dim: {{value: 1}}}}"),
    ("gradcheck_cli.examples.styles:ScaleRows", "inputs: [{{shape: [{a}, {b}]}}, {{shape: [{a}]}}]"),
]

TORCH_LOOP = """
import sys, time
from pathlib import Path
import torch
from gradcheck_cli import inputs, loader, spec
from gradcheck_cli.binding import bind
start = time.perf_counter()
verdicts = []
for path in sorted(Path(sys.argv[1]).glob("*.yaml")):
    (case,) = spec.load_file(str(path))
    target = loader.load(case.function)
    positional, keywords = inputs.build(case, "cpu", [p.name for p in target.parameters()])
    bound = bind(target, positional, keywords)
    verdicts.append(torch.autograd.gradcheck(target.obj.apply, tuple(bound.values), raise_exception=False))
print(f"{sum(verdicts)}/{len(verdicts)} passed; loop {time.perf_counter() - start:.2f}s")
"""


def generate(folder: Path, n: int) -> None:
    for i in range(n):
        function, inputs = KINDS[i % len(KINDS)]
        a, b, c = 2 + i % 5, 3 + i % 4, 2 + i % 3
        text = f"function: {function}\nseed: {i}\n" + inputs.format(a=a, b=b, c=c) + "\n"
        (folder / f"spec_{i:03d}.yaml").write_text(text)


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return wall, f"exit {proc.returncode}: {last[:90]}"


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        generate(folder, n)
        gradcheck = [sys.executable, "-m", "gradcheck_cli", str(folder), "--no-color"]
        runs = {
            "torch.autograd.gradcheck loop": [sys.executable, "-c", TORCH_LOOP, str(folder)],
            "gradcheck -j 1": gradcheck + ["-j", "1"],
            "gradcheck -j 2": gradcheck + ["-j", "2"],
            "gradcheck --no-isolate": gradcheck + ["--no-isolate"],
        }
        times = {}
        print(f"{n} specs")
        print(f"{'run':32} {'wall s':>8} {'vs torch loop':>14}  outcome")
        for name, command in runs.items():
            times[name], outcome = timed(command)
            ratio = times[name] / times["torch.autograd.gradcheck loop"]
            print(f"{name:32} {times[name]:8.2f} {ratio:13.2f}x  {outcome}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
