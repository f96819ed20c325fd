"""Batch cost and cold start: a directory of small generated specs, checked by gradcheck-cli with -j 1,
-j 2, the default (-j = the usable cores) and in-process, against a plain Python loop calling
torch.autograd.gradcheck on the same Functions and the same inputs; a batch of heavier specs (Linear
layers of 96-112 features) with -j 1 and -j 2; and one small spec end to end against
`python -c "import torch"`. Each runs as its own process, timed from start to exit (torch's
import included for all). The variants take turns in every round, so a machine whose speed drifts
(other work on it) moves them alike; medians over the rounds, then the ratios. Not a test: run it
by hand,

    python benchmarks/bench_batch.py [N_SPECS] [--rounds R]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = [
    (
        "gradcheck_cli.examples.linear:LinearFunction",
        "inputs: [{{shape: [{a}, {b}]}}, {{shape: [{c}, {b}]}}, {{shape: [{c}]}}]",
    ),
    ("gradcheck_cli.examples.mul_constant:MulConstant", "inputs: [{{shape: [{a}, {b}]}}, {{value: 1.5}}]"),
    ("gradcheck_cli.examples.relu:ReLU", "inputs: [{{shape: [{a}, {b}], avoid: [[-0.01, 0.01]]}}]"),
    ("gradcheck_cli.examples.styles:SumDim", "inputs: [{{shape: [{a}, {b}, 3]}}]\nkwargs: {{dim: {{value: 1}}}}"),
    ("gradcheck_cli.examples.styles:ScaleRows", "inputs: [{{shape: [{a}, {b}]}}, {{shape: [{a}]}}]"),
]

TORCH_LOOP = """
import sys, time
from pathlib import Path
import torch
from gradcheck_cli import spec
from gradcheck_cli.subject import inputs, loader
from gradcheck_cli.subject.binding import bind
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


def generate_heavy(folder: Path, n: int) -> None:
    """Specs whose checks take a few tenths of a second each (Linear layers of 96 to 112 features):
    the work, not the start-up, is most of a batch of them."""
    function, inputs = KINDS[0]
    for i in range(n):
        a = 96 + 8 * (i % 3)
        text = f"function: {function}\nseed: {i}\n" + inputs.format(a=a, b=a, c=a) + "\n"
        (folder / f"heavy_{i:03d}.yaml").write_text(text)


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return wall, f"exit {proc.returncode}: {last[:90]}"


HEAVY = 24  # specs in the batch of heavier specs
RATIOS = [  # (what, numerator, denominator, target)
    ("-j 2 vs -j 1", "gradcheck -j 2", "gradcheck -j 1", 0.6),
    (f"-j 2 vs -j 1, {HEAVY} heavier specs", "heavier specs -j 2", "heavier specs -j 1", 0.6),
    ("default vs torch loop", "gradcheck (default -j)", "torch.autograd.gradcheck loop", 0.8),
    ("one spec vs import torch", "one spec end to end", 'python -c "import torch"', 1.15),
]


def main(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder, heavy = Path(tmp) / "small", Path(tmp) / "heavy"
        folder.mkdir()
        heavy.mkdir()
        generate(folder, n)
        generate_heavy(heavy, HEAVY)
        gradcheck = [sys.executable, "-m", "gradcheck_cli", "--no-color"]
        one = str(Path(__file__).resolve().parents[1] / "specs" / "relu.yaml")
        runs = {
            "torch.autograd.gradcheck loop": [sys.executable, "-c", TORCH_LOOP, str(folder)],
            "gradcheck -j 1": gradcheck + [str(folder), "-j", "1"],
            "gradcheck -j 2": gradcheck + [str(folder), "-j", "2"],
            "gradcheck (default -j)": gradcheck + [str(folder)],
            "gradcheck --no-isolate": gradcheck + [str(folder), "--no-isolate"],
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "one spec end to end": gradcheck + [one],
            "one spec --no-isolate": gradcheck + [one, "--no-isolate"],
            "heavier specs -j 1": gradcheck + [str(heavy), "-j", "1"],
            "heavier specs -j 2": gradcheck + [str(heavy), "-j", "2"],
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        outcomes = {}
        for r in range(rounds):
            for name, command in runs.items():
                wall, outcomes[name] = timed(command)
                times[name].append(wall)
            print(f"round {r + 1}: " + ", ".join(f"{name} {t[-1]:.2f}" for name, t in times.items()), flush=True)
        median = {name: statistics.median(t) for name, t in times.items()}
        print(f"\n{n} specs, medians of {rounds} rounds")
        print(f"{'run':32} {'median s':>9} {'min-max s':>12}  outcome")
        for name in runs:
            print(f"{name:32} {median[name]:9.2f} {min(times[name]):5.2f}-{max(times[name]):<5.2f}  {outcomes[name]}")
        print(f"\n{'ratio':28} {'of medians':>10} {'per round':>22} {'target':>7}")
        for what, top, bottom, target in RATIOS:
            per_round = [a / b for a, b in zip(times[top], times[bottom])]
            spread = f"{min(per_round):.2f}-{max(per_round):.2f}"
            print(f"{what:28} {median[top] / median[bottom]:9.2f}x {spread:>22} {target:6.2f}x")
        start = 'python -c "import torch"'  # every worker imports torch: the part of each run past that
        for what, top, bottom in (
            ("-j 2 vs -j 1 past import torch", "gradcheck -j 2", "gradcheck -j 1"),
            ("heavier, past import torch", "heavier specs -j 2", "heavier specs -j 1"),
        ):
            per_round = [(a - t) / (b - t) for a, b, t in zip(times[top], times[bottom], times[start])]
            past = (median[top] - median[start]) / (median[bottom] - median[start])
            print(f"{what:28} {past:9.2f}x {min(per_round):.2f}-{max(per_round):.2f}".rstrip())


if __name__ == "__main__":
    args = sys.argv[1:]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 3
    numbers = [a for a in args if a.isdigit() and (not args.index(a) or args[args.index(a) - 1] != "--rounds")]
    main(int(numbers[0]) if numbers else 100, rounds)
