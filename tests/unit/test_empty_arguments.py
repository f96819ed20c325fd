"""An argument with no elements is never a pass (issue 44, item 3): its row is a skip that says it has no
elements, a check that compared nothing is a skip with that reason (in every check, on the command line,
through ``--shape`` and in ``check()``), an argument with elements beside it is still judged, and the
shrinker never proposes a shape with no elements."""

from __future__ import annotations

import dataclasses
import json

import corpus
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck_cli import check
from gradcheck_cli.checks import NAMES
from gradcheck_cli.results import Status
from gradcheck_cli.run import runner, shrink
from gradcheck_cli.run.plan import RunOptions, Task
from gradcheck_cli.spec import load_file

SOURCE = """
import torch

class Pair(torch.autograd.Function):  # x.sum() + (w * w).sum(); right
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        return x.sum() + (w * w).sum()
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * torch.ones_like(x), 2 * g * w
    @staticmethod
    def jvp(ctx, tx, tw):
        x, w = ctx.saved_tensors
        return tx.sum() + 2 * (w * tw).sum()

class PairWrongW(Pair):  # w's gradient 1.5x the derivative
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * torch.ones_like(x), 3 * g * w

def square(x):
    return x * x

def pair(x, w):
    return x.sum() + (w * w).sum()

def pair_intended(inputs, grads):
    (x, w), (g,) = inputs, grads
    return (g * torch.ones_like(x), 2 * g * w)
"""

WORDS = "'x' has no elements ([0, 3]): nothing to compare; give it a shape with elements"


@pytest.fixture
def mod(user_module):
    user_module(SOURCE, "emptymod")
    import emptymod

    return emptymod


def tensor(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


def spec(write_spec, function: str, *shapes: list[int], extra: str = "") -> str:
    """A spec of ``function`` (``emptymod``'s, or the corpus's ``Square`` and ``SquareForgotTwo``) at ``shapes``."""
    where = "corpus" if function.startswith("Square") else "emptymod"
    inputs = "".join(f"\n  - name: {'xw'[i]}\n    shape: {list(s)}" for i, s in enumerate(shapes))
    return str(write_spec(f"function: {where}:{function}\n{extra}inputs:{inputs}\n", f"{function.lower()}.yaml"))


def only_result(invoke, *args: str) -> tuple[int, dict]:
    got = invoke(*args, "--format", "json")
    (result,) = json.loads(got.stdout)["results"]
    return got.exit_code, result


# ---------------------------------------------------------------------- nothing compared: a skip


def test_a_spec_whose_only_argument_has_no_elements_is_a_skip_not_a_pass(mod, write_spec, invoke):
    code, result = only_result(invoke, spec(write_spec, "SquareForgotTwo", [0, 3]))
    assert (code, result["status"]) == (0, "skip"), result  # before: pass, "1 argument checked", 0 / 0
    (backward,) = result["checks"]
    assert backward["status"] == "skip" and backward["message"] == WORDS
    (x,) = backward["inputs"]
    assert (x["name"], x["shape"], x["status"], x["numel"]) == ("x", [0, 3], "skip", 0)
    assert "no elements" in x["reason"]


def test_a_shape_override_with_no_elements_turns_a_fail_into_a_skip_that_says_why(mod, write_spec, invoke):
    path = spec(write_spec, "SquareForgotTwo", [4, 3])
    assert only_result(invoke, path)[1]["status"] == "fail"
    code, result = only_result(invoke, path, "--shape", "x=0x3")
    assert (code, result["status"]) == (0, "skip"), result  # before: pass, exit 0
    assert result["checks"][0]["message"] == WORDS


@pytest.mark.parametrize("name", NAMES)
def test_every_check_skips_an_argument_with_no_elements(mod, name):
    wrong = check(
        corpus.SquareForgotTwo,
        [tensor(0, 3)],
        checks=[name],
        devices=["cpu:0", "cpu"],
        device="cpu",
        reference=mod.square,
    )
    assert wrong.status is Status.SKIP and not wrong, str(wrong)  # before: pass (truthy), having compared nothing
    (result,) = wrong.checks
    assert result.status is Status.SKIP and result.message == WORDS
    assert [r.status for r in result.inputs] == [Status.SKIP]


def test_every_check_under_all_skips_an_argument_with_no_elements(mod, write_spec, invoke):
    code, result = only_result(invoke, spec(write_spec, "SquareForgotTwo", [0, 3], extra="checks: all\n"))
    assert (code, result["status"]) == (0, "skip"), result
    assert {c["check"] for c in result["checks"]} == set(NAMES)
    assert all(c["status"] == "skip" and c["message"] == WORDS for c in result["checks"]), result["checks"]


# -------------------------------------------------- an argument with elements beside it is still judged


@pytest.mark.parametrize(
    "options",
    [
        {"checks": ["backward"]},
        {"checks": ["reference"], "reference": "pair"},
        {"checks": ["reference"], "reference_backward": "pair_intended"},
    ],
    ids=["backward", "reference", "reference_backward"],
)
@pytest.mark.parametrize("function, status", [("Pair", Status.PASS), ("PairWrongW", Status.FAIL)])
def test_an_argument_with_elements_beside_one_without_is_judged(mod, options, function, status):
    given = {k: getattr(mod, v) if k.startswith("reference") else v for k, v in options.items()}
    result = check(getattr(mod, function), [tensor(0, 3), tensor(4)], **given)
    assert result.status is status, str(result)
    (checked,) = result.checks
    rows = {r.name: r for r in checked.inputs if r.role == "argument"}
    assert rows["x"].status is Status.SKIP and "no elements" in (rows["x"].reason or "")  # before: pass, 0 / 0
    assert rows["w"].status is status and rows["w"].numel == 4
    assert WORDS in checked.message and "'x' is right" not in checked.message


@pytest.mark.parametrize(
    "name", [n for n in NAMES if n not in ("backward", "reference", "device_consistency", "opcheck")]
)
def test_other_checks_judge_the_argument_with_elements_and_skip_the_other(mod, name):
    result = check(mod.Pair, [tensor(0, 3), tensor(4)], checks=[name])
    (checked,) = result.checks
    rows = {r.name: r for r in checked.inputs if r.role == "argument"}
    assert rows["x"].status is Status.SKIP and "no elements" in (rows["x"].reason or ""), checked
    assert checked.status is Status.PASS and rows["w"].status is Status.PASS, checked
    assert WORDS in checked.message


def test_device_consistency_skips_the_row_with_no_elements(mod):
    result = check(mod.Pair, [tensor(0, 3), tensor(4)], checks=["device_consistency"], devices=["cpu:0", "cpu"])
    (checked,) = result.checks
    rows = {r.name: r for r in checked.inputs}
    assert checked.status is Status.PASS and rows["w"].status is Status.PASS
    assert rows["x"].status is Status.SKIP and "no elements" in (rows["x"].reason or "")


def test_a_pass_beside_an_argument_with_no_elements_warns_that_it_was_not_compared(mod, write_spec, invoke):
    got = invoke(spec(write_spec, "Pair", [0, 3], [4]))
    assert got.exit_code == 0 and f"warning: {WORDS}" in got.output, got.output


# ---------------------------------------------------------------------- the shrinker


def _shapes() -> st.SearchStrategy[dict[str, tuple[int, ...]]]:
    shape = st.lists(st.integers(0, 6), max_size=3).map(tuple)
    return st.dictionaries(st.sampled_from(["x", "w", "b"]), shape, min_size=1)


@settings(max_examples=300, deadline=None)
@given(_shapes(), st.sampled_from([(), ("zeros",), ("zeros", "ones", "integers")]))
def test_the_shrinker_never_proposes_a_shape_with_no_elements(shapes, kinds):
    start = shrink.State(shapes)
    for state in shrink.steps(start, dict.fromkeys(shapes, kinds)):
        for name, shape in state.shapes.items():
            if 0 in shapes[name]:
                assert shape == shapes[name], (shapes, state)  # one with no elements stays as it was
                assert name not in state.values  # and has no values to make simpler
            else:
                assert 0 not in shape, (shapes, state)


@pytest.mark.parametrize(
    "function, shapes, argument",
    [("SquareForgotTwo", [[6, 8]], "x"), ("PairWrongW", [[0, 3], [8]], "w"), ("PairWrongW", [[5, 0], [3, 4]], "w")],
)
def test_a_shrunk_failing_case_has_elements_and_fails_alike(mod, write_spec, function, shapes, argument):
    (case,) = load_file(spec(write_spec, function, *shapes))
    task = Task(case, "cpu", RunOptions(shrink=60))
    result = runner.run_task(task)
    assert result.status is Status.FAIL and result.shrunk is not None
    assert result.shrunk.argument == argument
    for shape in result.shrunk.shapes.values():
        assert torch.Size(shape).numel() >= 1, result.shrunk  # before: x [0, 1], "with zeros for x"
    assert set(result.shrunk.values) <= set(result.shrunk.shapes) | {argument}
    for name, shape in zip("xw", shapes):
        if 0 in shape:
            assert name not in result.shrunk.shapes and name not in result.shrunk.values, result.shrunk
    again = runner.run_task(
        dataclasses.replace(
            task,
            opts=RunOptions(
                seed=result.shrunk.seed,
                shapes=tuple((n, tuple(s)) for n, s in result.shrunk.shapes.items()),
                values=tuple(result.shrunk.values.items()),
            ),
        )
    )
    assert again.status is Status.FAIL  # the replay fails as the case did
