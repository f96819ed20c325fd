"""Backward's contract under ``distributed:`` (issue 44, item 5): every rank inspects it as one process does
(``checks.contract.inspect``), in lockstep, and says what it found in one process's words; and the
metamorphic relation: the same Function in one process and under ``distributed: {world_size: 1}`` gives the
same verdict in the same words, and under world size 2 with replicated inputs (the Function rank-independent)
the same status, over a labelled set of correct and broken Functions."""

from __future__ import annotations

import dataclasses
import re

import pytest

from gradcheck_cli.results import CaseResult, ErrorKind, Status
from gradcheck_cli.run import runner
from gradcheck_cli.spec import Case, Distributed, load_file

TRUTH = """
    import torch
    import torch.distributed as dist


    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g


    class Product(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, g * x


    class SquareDoubled(Square):  # a wrong gradient: 4 x g
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 4 * x * g


    class ProductDoublesW(Product):  # one argument wrong, the other right
        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, 2 * g * x


    class SquareChangesSavedInput(Square):  # x.mul_(2) then x g: the right value, x changed in place
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            x.mul_(2)
            return x * g


    class SquareZeroesGradOutput(Square):  # the right gradient, grad_output zeroed in place after
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            out = 2 * x * g
            g.zero_()
            return out


    class SquareFloat32Gradient(Square):  # the right value in the wrong dtype
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return (2 * x * g).float()


    class SquareNotLinear(Square):  # 2 x g + 0.1: right at no grad_output, not linear in it
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g + 0.1


    class SquareUndefinedGradIsOnes(torch.autograd.Function):  # an undefined grad_output taken as ones
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * (torch.ones_like(x) if g is None else g)


    class SquareBackwardRaises(Square):  # backward raises on valid inputs: the backward check's fail
        @staticmethod
        def backward(ctx, g):
            raise ValueError("not on these inputs")


    class SquareBackwardExits(Square):  # SystemExit from backward, as any other exception
        @staticmethod
        def backward(ctx, g):
            raise SystemExit(0)


    class SquareForwardInterrupts(Square):  # KeyboardInterrupt from the code under test (no Ctrl-C reaches a rank)
        @staticmethod
        def forward(ctx, x):
            raise KeyboardInterrupt


    class CopyAllReducesClone(torch.autograd.Function):  # Megatron's copy: identity, backward all-reduces
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            out = g.clone()
            dist.all_reduce(out)
            return out


    class CopyAllReducesGradOutput(CopyAllReducesClone):  # the right values, summed into grad_output itself
        @staticmethod
        def backward(ctx, g):
            dist.all_reduce(g)
            return g


    class CopyAllReducesPlusConstant(CopyAllReducesClone):  # the all-reduce right, plus 0.1: not linear
        @staticmethod
        def backward(ctx, g):
            out = g.clone()
            dist.all_reduce(out)
            return out + 0.1


    class ChangesSavedInputOnRank1(torch.autograd.Function):
        # y = x per rank (per_rank), backward all-reduces a copy: right, but rank 1 also changes the saved x
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            if dist.get_rank() == 1:
                x.add_(1)
            out = g.clone()
            dist.all_reduce(out)
            return out


    class WrongShapeOnRank1(ChangesSavedInputOnRank1):
        # a gradient autograd would refuse on rank 1 only; rank 0's backward goes on to its repeated calls
        @staticmethod
        def backward(ctx, g):
            out = g.clone()
            dist.all_reduce(out)
            return out[:1] if dist.get_rank() == 1 else out
"""

X = "[{name: x, shape: [3]}]"
XW = "[{name: x, shape: [3]}, {name: w, shape: [3]}]"
SAVED = "backward modified input 'x' in place: work on a copy"
GRAD_OUTPUT = "backward modified grad_output in place: clone it before changing it"
NOT_LINEAR = "backward is not linear in grad_output: for a one-hot grad_output (output 0 at "
UNDEFINED = "with every output's gradient undefined, backward returned a nonzero gradient for 'x'"
# the labelled set: (Function, its inputs, the one-process status, words of the one-process message)
LABELLED = [
    ("Square", X, Status.PASS, "1 argument checked, all within tolerance"),
    ("Product", XW, Status.PASS, "2 arguments checked, all within tolerance"),
    ("SquareDoubled", X, Status.FAIL, "gradient of 'x': analytical is 2.00x numerical"),
    ("ProductDoublesW", XW, Status.FAIL, "gradient of 'w': analytical is 2.00x numerical; 'x' is right"),
    ("SquareChangesSavedInput", X, Status.FAIL, SAVED),
    ("SquareZeroesGradOutput", X, Status.FAIL, GRAD_OUTPUT),
    ("SquareFloat32Gradient", X, Status.FAIL, "backward returned a float32 gradient for float64 'x'"),
    ("SquareUndefinedGradIsOnes", X, Status.FAIL, UNDEFINED),
]  # (a backward that raises: test_what_the_code_under_test_raises_..., below: which ranks report it is timing)


@pytest.fixture
def truth(user_module) -> str:
    return user_module(TRUTH, name="truthmod")


def case_of(write_spec, function: str, inputs: str, size: int = 0, extra: str = "") -> Case:
    """The one case of a spec for ``truthmod:function`` (under ``distributed`` with ``size`` ranks, if any)."""
    text = f"function: truthmod:{function}\ninputs: {inputs}\n" + extra
    if size:
        text += f"distributed: {{world_size: {size}}}\n"
    (case,) = load_file(write_spec(text, f"{function}-{size}.yaml"))
    assert isinstance(case, Case), str(case)
    return case


def verdict(result: CaseResult) -> tuple[Status, str]:
    """A case's status and its backward check's message."""
    (check,) = result.checks
    return result.status, check.message


def test_a_backward_that_changes_its_saved_input_fails_at_world_size_1_as_in_one_process(write_spec, truth):
    """It passed under `distributed:` (it returns the right value) and failed in one process."""
    alone = runner.run_case(case_of(write_spec, "SquareChangesSavedInput", X), "cpu")
    world = runner.run_case(case_of(write_spec, "SquareChangesSavedInput", X, 1), "cpu")
    assert verdict(alone)[0] is Status.FAIL and SAVED in verdict(alone)[1], str(alone)
    assert verdict(world) == verdict(alone), str(world)
    (check,) = world.checks
    assert [(row.name, row.status, row.reason) for row in check.inputs] == [
        ("x@rank0", Status.FAIL, "backward's contract is broken (see below)")
    ]


@pytest.mark.slow
@pytest.mark.relations
@pytest.mark.parametrize("function, inputs, status, words", LABELLED, ids=[f for f, *_ in LABELLED])
def test_one_process_and_world_size_1_give_the_same_verdict_in_the_same_words(
    write_spec, truth, function, inputs, status, words
):
    alone = runner.run_case(case_of(write_spec, function, inputs), "cpu")
    assert alone.status is status and words in verdict(alone)[1], str(alone)  # the label holds
    world = runner.run_case(case_of(write_spec, function, inputs, 1), "cpu")
    assert verdict(world) == verdict(alone), str(world)
    (one,), (rows,) = alone.checks, world.checks
    assert [(r.name + "@rank0", r.status) for r in one.inputs] == [(r.name, r.status) for r in rows.inputs]


@pytest.mark.slow
@pytest.mark.relations
@pytest.mark.parametrize("function, inputs, status, words", LABELLED, ids=[f for f, *_ in LABELLED])
def test_world_size_2_with_replicated_inputs_gives_the_one_process_status(
    write_spec, truth, function, inputs, status, words
):
    """A rank-independent Function on replicated inputs: every rank's gradient is the one-process gradient,
    and what breaks the contract does so on every rank, said once, in one process's words, for ranks 0, 1."""
    world = runner.run_case(case_of(write_spec, function, inputs, 2), "cpu")
    assert world.status is status, str(world)
    if status is Status.FAIL and not words.startswith("gradient of"):
        assert f"ranks 0, 1: {words}" in verdict(world)[1], str(world)
    (check,) = world.checks
    names = [r.name for r in check.inputs]
    assert names == [f"{n}@rank{r}" for n in ("x", "w")[: len(names) // 2] for r in (0, 1)], names


@pytest.mark.parametrize("size", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_an_all_reduce_into_grad_output_breaks_the_contract_at_every_world_size(write_spec, truth, size):
    """Summed into grad_output itself, the right gradient: a contract fail (it was a pass, or at world size 2
    "the outputs do not depend on it"), also over one rank, where the sum leaves the values as they were; the
    same all-reduce on a copy passes."""
    broken = runner.run_case(case_of(write_spec, "CopyAllReducesGradOutput", X, size, "outputs: [per_rank]\n"), "cpu")
    assert broken.status is Status.FAIL, str(broken)
    (check,) = broken.checks
    assert check.message.startswith(("ranks 0, 1: " if size > 1 else "") + GRAD_OUTPUT), check.message
    assert [(r.name, r.status) for r in check.inputs] == [(f"x@rank{r}", Status.PASS) for r in range(size)]
    right = runner.run_case(case_of(write_spec, "CopyAllReducesClone", X, size, "outputs: [per_rank]\n"), "cpu")
    assert right.status is Status.PASS, str(right)


@pytest.mark.slow
@pytest.mark.parametrize(
    "function, words, failing",
    [
        ("ChangesSavedInputOnRank1", f"rank 1: {SAVED}", {"x@rank1"}),
        ("WrongShapeOnRank1", "rank 1: backward returned shape [1] for 'x' of shape [3]", {"x@rank1"}),
    ],
)
def test_a_contract_broken_on_one_rank_fails_naming_it_and_every_rank_stops_there(
    write_spec, truth, function, words, failing
):
    """Rank 0's contract holds and its backward calls a collective again: the ranks agree to stop where rank
    1's is broken, so the case fails at once (no timeout), naming rank 1 and its row only."""
    case = case_of(write_spec, function, X, 2, "outputs: [per_rank]\n")
    case = dataclasses.replace(case, distributed=Distributed(2, None, 30.0))
    result = runner.run_case(case, "cpu")
    assert result.status is Status.FAIL and result.error is None, str(result)
    (check,) = result.checks
    assert check.message.startswith(words), check.message
    assert {r.name for r in check.inputs if r.status is Status.FAIL} == failing


@pytest.mark.parametrize(
    "function, extra, sizes",
    [
        ("SquareNotLinear", "", [1, 2]),
        ("CopyAllReducesPlusConstant", "outputs: [per_rank]\n", [1, 2]),  # its collective inside backward's calls
        ("SquareUndefinedGradIsOnes", "", [2]),  # world size 1: the labelled set's relation above
    ],
)
def test_backward_as_autograd_uses_it_is_checked_on_every_rank(write_spec, truth, function, extra, sizes):
    """Linear in grad_output, and an undefined grad_output taken as zeros (``contract.in_use``): one process
    checked them and a world did not (a non-linear backward got the words of a wrong element instead). Now
    every rank does, in lockstep, in one process's words, after the ranks that found it."""
    words = UNDEFINED if "Undefined" in function else NOT_LINEAR
    alone = runner.run_case(case_of(write_spec, function, X, 0, extra), "cpu") if not extra else None
    if alone is not None:
        assert alone.status is Status.FAIL and verdict(alone)[1].startswith(words), str(alone)
    for size in sizes:
        world = runner.run_case(case_of(write_spec, function, X, size, extra), "cpu")
        assert world.status is Status.FAIL and world.error is None, str(world)
        prefix = "ranks 0, 1: " if size > 1 else ""
        assert verdict(world)[1].startswith(prefix + words), verdict(world)[1]
    right = runner.run_case(case_of(write_spec, "CopyAllReducesClone", X, 2, "outputs: [per_rank]\n"), "cpu")
    assert right.status is Status.PASS, str(right)


@pytest.mark.parametrize("size", [1, 2])
def test_what_the_code_under_test_raises_on_a_rank_is_judged_as_in_one_process(write_spec, truth, size):
    """A backward that raises (SystemExit too) fails the backward check, as in one process (it was an error,
    exit 3); KeyboardInterrupt raised by forward is the case's forward error (it was an internal error, exit 4)."""
    # every rank raises; the first error ends the world, so which others had reported by then is timing
    prefix = r"(rank [01]|ranks 0, 1): " if size > 1 else ""
    for function, name in (("SquareBackwardRaises", "ValueError"), ("SquareBackwardExits", "SystemExit")):
        alone = runner.run_case(case_of(write_spec, function, X), "cpu")
        world = runner.run_case(case_of(write_spec, function, X, size), "cpu")
        assert alone.status is world.status is Status.FAIL and world.error is None, str(world)
        assert re.match(f"{prefix}backward raised {name}", verdict(world)[1]), verdict(world)[1]
        if size == 1:
            assert verdict(world) == verdict(alone)
    interrupted = runner.run_case(case_of(write_spec, "SquareForwardInterrupts", X, size), "cpu")
    assert interrupted.status is Status.ERROR and interrupted.error is not None, str(interrupted)
    assert interrupted.error.kind is ErrorKind.FORWARD, interrupted.error
    assert re.fullmatch(r"rank [01]: the code under test raised KeyboardInterrupt", interrupted.error.message)
