"""One seed path: the runner makes one ``Streams`` per attempt at a case (a trial, a resampled draw) and
hands it down; every random draw of the case comes from it, seeded exactly as the reports have always been."""

from __future__ import annotations

import ast
import importlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gradcheck_cli import checks
from gradcheck_cli.core.rng import SEEDS, seed_plus
from gradcheck_cli.numerics.streams import Stream, Streams, signed_uniform
from gradcheck_cli.run import runner
from gradcheck_cli.run.plan import RunOptions
from gradcheck_cli.spec import load_file
from gradcheck_cli.subject import inputs

LAST = SEEDS - 1
# every stream's number: the numerics' and backward's (Stream), and each check's own (STREAM in its module)
DECLARED = {
    f"checks.{name}": importlib.import_module(f"gradcheck_cli.checks.{module}").STREAM
    for name, module in checks.REGISTRY.items()
    if hasattr(importlib.import_module(f"gradcheck_cli.checks.{module}"), "STREAM")
}
NUMBERS = {**{stream.name: int(stream) for stream in Stream}, **DECLARED}


def _draws_its_own_stream(module: str) -> bool:
    """Whether check ``module`` draws from a stream of its own: it calls ``.generator(STREAM)``, or the part
    it takes ``STREAM`` from does (``checks/parts/undefined.py`` draws for ``undefined_grad``)."""
    path = Path(importlib.import_module(f"gradcheck_cli.checks.{module}").__file__ or "")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if "generator(STREAM)" in path.read_text(encoding="utf-8"):
        return True
    parts = [
        path.parent / Path(*(node.module or "").split(".")).with_suffix(".py")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and any(a.name == "STREAM" for a in node.names)
    ]
    return any("generator(STREAM)" in part.read_text(encoding="utf-8") for part in parts)


def test_every_stream_has_a_number_of_its_own_and_the_checks_that_draw_declare_theirs() -> None:
    assert len(set(NUMBERS.values())) == len(NUMBERS), NUMBERS
    drawing = {f"checks.{name}" for name, module in checks.REGISTRY.items() if _draws_its_own_stream(module)}
    assert drawing and set(DECLARED) == drawing


@pytest.mark.parametrize("seed", [0, 1, 7, 2**63, LAST])
@pytest.mark.parametrize("stream", sorted(NUMBERS.values()))
def test_each_stream_is_seeded_by_the_formula_the_reports_were_made_with(seed: int, stream: int) -> None:
    gen = Streams(seed).generator(stream)
    assert gen.initial_seed() == (seed * 1_000_003 + 7919 * (int(stream) + 1)) % 2**63
    again = Streams(seed).generator(stream)  # a new generator each time, from the start of its stream
    assert torch.equal(
        torch.rand(5, generator=gen, dtype=torch.float64), torch.rand(5, generator=again, dtype=torch.float64)
    )


def test_drawn_numbers_are_the_ones_released_versions_drew() -> None:
    """Values drawn before the streams were one object (a seed replays a run: these must never move)."""
    assert signed_uniform((4,), Streams(0).generator(Stream.PROBES)).tolist() == [
        0.2060699462890625,
        -0.0508880615234375,
        -0.4489288330078125,
        0.9119110107421875,
    ]
    assert signed_uniform((3,), Streams(LAST).generator(DECLARED["checks.compile"])).tolist() == [
        0.2036590576171875,
        -0.1574554443359375,
        0.0364227294921875,
    ]
    assert Streams(LAST).generator(Stream.MODULE_INIT).initial_seed() == 9223372036854575624
    assert Streams(LAST).inputs().initial_seed() == LAST


SPEC = """
function: gradcheck_cli.examples.linear:LinearFunction
seed: {seed}
checks: [backward, double_backward]
inputs:
  - {{name: input, shape: [3, 2]}}
  - {{name: weight, shape: [2, 2]}}
  - {{name: bias, shape: [2]}}
"""


def test_the_runner_makes_one_streams_per_attempt_and_every_check_reads_it(write_spec, monkeypatch) -> None:
    """--trials 3 from seed 2**64 - 1: three attempts, seeds LAST, 0, 1, each drawing its inputs and handing
    its checks (and the arguments drawn again for another device, ``ctx.rebind``) the same streams; the
    case stays as read, not copied with another seed."""
    (case,) = load_file(write_spec(SPEC.format(seed=LAST)))
    seen: list[tuple[str, int, list[torch.Tensor]]] = []
    cases: list[object] = []
    check = runner.run_check
    bind_case = runner.bind_case

    def spy(name, ctx):
        seen.append((name, ctx.streams.seed, [v.detach().clone() for v in ctx.bound.values]))
        again = ctx.rebind("cpu")
        assert again.streams is ctx.streams and all(torch.equal(a, b) for a, b in zip(again.values, ctx.bound.values))
        return check(name, ctx)

    def binding(target, case_seen, device, streams):
        cases.append(case_seen)
        bound = bind_case(target, case_seen, device, streams)
        assert bound.streams is streams
        return bound

    monkeypatch.setattr(runner, "run_check", spy)
    monkeypatch.setattr(runner, "bind_case", binding)
    result = runner.run_task(runner.Task(case, "cpu", RunOptions(trials=3)))
    assert result.status.value == "pass" and result.seed == 1
    seeds = [LAST, seed_plus(LAST, 1), seed_plus(LAST, 2)]
    assert [(name, seed) for name, seed, _ in seen] == [(n, s) for s in seeds for n in ("backward", "double_backward")]
    for _, seed, values in seen:
        drawn = [v for _, v in inputs.build(replace(case, seed=seed), "cpu")[0]]
        assert all(torch.equal(a, b) for a, b in zip(values, drawn))
    assert len(cases) == 3 * 3 and all(c is case for c in cases)  # an attempt's binding, then one per check
