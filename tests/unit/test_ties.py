"""Ties and kinks judged together (``numerics.ties``, through the backward check): a labelled truth set.

At a tie of maxima the derivative does not exist, but the one-sided directional derivatives do:
moving every tied element together by t moves the maximum by t, so backward's gradients over the
tied set must sum to 1 (one of them gets it, or a share each: any convex combination); alone, each
tied element has the one-sided derivatives 0 and 1. Giving the whole gradient to every tied element
(the sum is the number of ties) or to none of them (0) is wrong, and so is max(a, b) giving it to both
at a == b. The inputs are integers (as quantised activations, or `dist: randint`), so ties and zeros
are many. ``torch.autograd.gradcheck`` fails every broken Function here; it fails the correct ones that
give a tied element its whole gradient too (their central difference is 1/2), as the kinks tests say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.numerics import ties
from gradcheck_cli.results import Pattern, Status

F64 = torch.float64
K = 4  # the window of the window maxima


def function(name: str, forward: Callable[..., Any], backward: Callable[..., Any]) -> type:
    """An autograd.Function whose backward is ``backward(inputs, output, g)``."""

    def fwd(ctx: Any, *xs: torch.Tensor) -> torch.Tensor:
        y = forward(*xs)
        ctx.save_for_backward(*xs, y)
        return y

    def bwd(ctx: Any, g: torch.Tensor) -> Any:
        *xs, y = ctx.saved_tensors
        return backward(xs, y, g)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


def windows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, K)


def window_max(x: torch.Tensor) -> torch.Tensor:
    return windows(x).max(dim=1).values


def window_min(x: torch.Tensor) -> torch.Tensor:
    return windows(x).min(dim=1).values


def shared(weights: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A window-extremum backward: each window's gradient over its tied extrema, by ``weights(tied mask)``."""

    def backward(xs: Any, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        (x,) = xs
        tied = (windows(x) == y.reshape(-1, 1)).to(F64)
        return (weights(tied) * g.reshape(-1, 1)).reshape(x.shape)

    return backward


def first(tied: torch.Tensor) -> torch.Tensor:
    return (torch.cumsum(tied, 1) == 1) * tied  # the first tied element: torch's choice


def last(tied: torch.Tensor) -> torch.Tensor:
    return first(tied.flip(1)).flip(1)


def split(tied: torch.Tensor) -> torch.Tensor:
    return tied / tied.sum(1, keepdim=True)


def convex(tied: torch.Tensor) -> torch.Tensor:
    w = tied * torch.cumsum(tied, 1)  # 1, 2, 3, ... over the tied elements, normalised
    return w / w.sum(1, keepdim=True)


def every(tied: torch.Tensor) -> torch.Tensor:
    return tied  # the whole gradient to each tied element: a tie counted as many times as it has elements


def unique_only(tied: torch.Tensor) -> torch.Tensor:
    return tied * (tied.sum(1, keepdim=True) == 1)  # nothing where the extremum is tied: a tie dropped


def summed(backward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The same backward for the sum of the window maxima (a scalar output)."""

    def scalar(xs: Any, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        (x,) = xs
        return backward(xs, window_max(x), g.expand(x.numel() // K))

    return scalar


def maximum(at_tie_a: float, at_tie_b: float) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """max(a, b)'s backward giving ``at_tie_a`` and ``at_tie_b`` of the gradient to a and b at a == b."""

    def backward(xs: Any, y: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = xs
        tie = (a == b).to(F64)
        return g * ((a > b) + at_tie_a * tie), g * ((b > a) + at_tie_b * tie)

    return backward


def unary(at_zero: float, slope: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """An elementwise backward with derivative ``slope`` away from 0 and ``at_zero`` at 0."""

    def backward(xs: Any, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        (x,) = xs
        return g * torch.where(x == 0, at_zero, slope(x))

    return backward


def relu_difference(xs: Any, y: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """relu(a) - relu(b) with relu'(0) = 1 for a and 0 for b: (1, 0) at a = b = 0 is a valid gradient (the one
    at (+delta, -delta) would be (1, 0) too) although relu(a) - relu(b) does not change along (1, 1)."""
    a, b = xs
    return g * (a >= 0), -g * (b > 0)


step = lambda x: (x > 0).to(F64)  # noqa: E731
sign = torch.sign

INTEGERS = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(0)).to(F64)  # values 0, 1, 2
PAIR = [  # a == b at 8 places, a > b at 4, a < b at 4
    torch.tensor([0, 1, 2, 2, 1, 0, 2, 1, 0, 1, 2, 0, 1, 2, 2, 0], dtype=F64),
    torch.tensor([0, 2, 2, 1, 1, 0, 0, 1, 2, 1, 2, 1, 0, 2, 1, 0], dtype=F64),
]

# name, Function, arguments, correct, torch.autograd.gradcheck's verdict
TRUTH: list[tuple[str, type, list[torch.Tensor], bool, bool]] = [
    ("window max, first tied", function("MaxFirst", window_max, shared(first)), [INTEGERS], True, False),
    ("window max, last tied", function("MaxLast", window_max, shared(last)), [INTEGERS], True, False),
    ("window max, equal split", function("MaxSplit", window_max, shared(split)), [INTEGERS], True, False),
    ("window max, convex combination", function("MaxConvex", window_max, shared(convex)), [INTEGERS], True, False),
    ("window min, first tied", function("MinFirst", window_min, shared(first)), [INTEGERS], True, False),
    (
        "sum of window maxima, first tied",
        function("SumMaxFirst", lambda x: window_max(x).sum(), summed(shared(first))),
        [INTEGERS],
        True,
        False,
    ),
    ("max(a, b), a at a tie", function("MaximumA", torch.maximum, maximum(1.0, 0.0)), PAIR, True, False),
    ("max(a, b), b at a tie", function("MaximumB", torch.maximum, maximum(0.0, 1.0)), PAIR, True, False),
    ("max(a, b), half each", function("MaximumHalf", torch.maximum, maximum(0.5, 0.5)), PAIR, True, True),
    ("relu, 0 at 0", function("ReLU0", torch.relu, unary(0.0, step)), [INTEGERS - 1], True, False),
    ("relu, 1 at 0", function("ReLU1", torch.relu, unary(1.0, step)), [INTEGERS - 1], True, False),
    ("abs, 0 at 0", function("Abs0", torch.abs, unary(0.0, sign)), [INTEGERS - 1], True, True),
    ("abs, 1 at 0", function("Abs1", torch.abs, unary(1.0, sign)), [INTEGERS - 1], True, False),
    ("abs, -1 at 0", function("AbsMinus1", torch.abs, unary(-1.0, sign)), [INTEGERS - 1], True, False),
    ("abs, 0.5 at 0", function("AbsHalf", torch.abs, unary(0.5, sign)), [INTEGERS - 1], True, False),
    (
        "relu(a) - relu(b), relu'(0) 1 for a, 0 for b",
        function("ReLUDifference", lambda a, b: torch.relu(a) - torch.relu(b), relu_difference),
        [INTEGERS[:16] - 1, INTEGERS[16:] - 1],
        True,
        False,
    ),
    ("window max, every tie all", function("MaxEvery", window_max, shared(every)), [INTEGERS], False, False),
    ("window max, ties dropped", function("MaxDropped", window_max, shared(unique_only)), [INTEGERS], False, False),
    ("window min, every tie all", function("MinEvery", window_min, shared(every)), [INTEGERS], False, False),
    (
        "sum of window maxima, every tie all",
        function("SumMaxEvery", lambda x: window_max(x).sum(), summed(shared(every))),
        [INTEGERS],
        False,
        False,
    ),
    ("max(a, b), both at a tie", function("MaximumBoth", torch.maximum, maximum(1.0, 1.0)), PAIR, False, False),
    ("max(a, b), neither at a tie", function("MaximumNone", torch.maximum, maximum(0.0, 0.0)), PAIR, False, False),
    ("abs, 2 at 0", function("Abs2", torch.abs, unary(2.0, sign)), [INTEGERS - 1], False, False),
]
NEW = {  # broken Functions that passed with "kink or tie" warnings before ties were judged together
    "window max, every tie all",
    "window max, ties dropped",
    "window min, every tie all",
    "sum of window maxima, every tie all",
    "max(a, b), both at a tie",
    "max(a, b), neither at a tie",
}


def run(f: type, args: list[torch.Tensor]) -> Any:
    return check(f, [a.clone().requires_grad_() for a in args])


def test_the_inputs_have_ties_and_zeros():
    w = windows(INTEGERS)
    tied = (w == w.max(1, keepdim=True).values).sum(1)
    assert int((tied > 1).sum()) >= 3 and int((tied > 2).sum()) >= 1  # pairs and a triple at least
    assert int((PAIR[0] == PAIR[1]).sum()) >= 3
    assert int((INTEGERS == 1).sum()) >= 3  # zeros of INTEGERS - 1


@pytest.mark.parametrize("name, f, args, correct, torch_ok", TRUTH, ids=[c[0] for c in TRUTH])
def test_truth_set(name, f, args, correct, torch_ok):
    result = run(f, args)
    assert result.status is (Status.PASS if correct else Status.FAIL), str(result)
    (backward,) = result.checks
    if not correct and name in NEW:
        failing = [r for r in backward.inputs if r.status is Status.FAIL]
        assert failing and all(r.pattern is Pattern.KINK for r in failing)
        assert "are tied" in backward.message and "than the one-sided derivatives allow" in backward.message
    ok = torch.autograd.gradcheck(f.apply, [a.clone().requires_grad_() for a in args], raise_exception=False)
    assert ok is torch_ok
    assert correct or not ok  # torch fails every broken one: we agree there


class MaximumBoth(torch.autograd.Function):
    # max(a, b) giving the whole gradient to both a and b at a == b
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return torch.maximum(a, b)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return g * (a >= b), g * (b >= a)


def test_a_tie_counted_twice_is_named_with_its_elements_and_the_sum():
    result = run(MaximumBoth, PAIR)
    a, b = result.checks[0].inputs
    m = int((PAIR[0] == PAIR[1]).nonzero()[0])
    assert a.status is b.status is Status.FAIL
    assert a.diagnosis is not None and b.diagnosis is not None
    assert a.diagnosis.startswith(f"a[{m}], b[{m}] (= {PAIR[0][m]:g}) are tied (output 0 [{m}])")
    assert "must sum to 1; they sum to 2, more than" in a.diagnosis and "counted 2 times" in a.diagnosis
    assert "(see 'a')" in b.diagnosis  # said once, in full
    assert a.mismatched == b.mismatched == 1 and a.mismatched_indices == [[m]]


def test_a_dropped_tie_says_so():
    result = run(function("MaxDropped", window_max, shared(unique_only)), [INTEGERS])
    (row,) = result.checks[0].inputs
    assert row.diagnosis is not None and "they sum to 0, less than" in row.diagnosis and "tie dropped" in row.diagnosis


# ------------------------------------------------------------------------ ties.examine itself


def corners_of(f: type, x: torch.Tensor, where: list[int]) -> list[ties.Corner]:
    """Corners at elements ``where`` of x (f of one argument, one output), with f's backward's columns and the
    one-sided derivatives worked out by hand for a maximum: 0 to the left, 1 to the right."""
    leaf = x.clone().requires_grad_()
    y = f.apply(leaf)
    jac = torch.stack([torch.autograd.grad(y.reshape(-1)[m], leaf, retain_graph=True)[0] for m in range(y.numel())])
    out = []
    for j in where:
        col = jac[:, j]
        right = (col != 0).to(F64) if col.any() else torch.zeros_like(col)
        out.append(ties.corner(x, j, f"x[{j}]", col, (torch.zeros_like(col), right)))
    return out


def test_examine_restores_the_arguments_bit_exactly():
    x = torch.tensor([2.0, 2.0, 0.5, 2.0], dtype=F64)
    before = x.clone()
    f = function("MaxEvery1", lambda x: x.max().reshape(1), lambda xs, y, g: g * (xs[0] == y))
    cs = [ties.corner(x, j, f"x[{j}]", torch.ones(1, dtype=F64), (torch.zeros(1, dtype=F64),) * 2) for j in (0, 1, 3)]
    tie = ties.examine(lambda v: f.apply(*v), [x], cs, 1e-6, [0], atol=1e-5, rtol=1e-3)
    assert tie is not None and tie.members == [0, 1, 2]
    assert torch.equal(x.view(torch.int64), before.view(torch.int64))


def test_a_tie_hidden_by_a_separate_kink_in_the_same_entry_is_found_by_its_value():
    # f = max(x0, x1) + relu(x2) at (2, 2, 0), one scalar output: along (1, 1, 1) the derivatives run from 1 to 2,
    # so (1, 1, 0) (the tie counted twice, relu'(0) = 0) sums to 2, inside; the corners of value 2 alone give 1
    x = torch.tensor([2.0, 2.0, 0.0], dtype=F64)

    def forward(v: list[torch.Tensor]) -> torch.Tensor:
        (t,) = v
        return (torch.maximum(t[0], t[1]) + torch.relu(t[2])).reshape(1)

    one, zero = torch.ones(1, dtype=F64), torch.zeros(1, dtype=F64)
    cs = [ties.corner(x, j, f"x[{j}]", a, (zero, one)) for j, a in ((0, one), (1, one), (2, zero))]
    tie = ties.examine(forward, [x], cs, 1e-6, [0], atol=1e-5, rtol=1e-3)
    assert tie is not None and tie.members == [0, 1] and "x[0], x[1] (= 2) are tied" in tie.text
    right = [ties.corner(x, j, f"x[{j}]", a, (zero, one)) for j, a in ((0, one), (1, zero), (2, zero))]
    assert ties.examine(forward, [x], right, 1e-6, [0], atol=1e-5, rtol=1e-3) is None


def test_separate_kinks_with_opposite_signs_are_judged_at_the_points_around_them():
    # relu(a) - relu(b) at a = b = 0: constant along (1, 1), but (1, 0) is the gradient at (delta, -delta)
    x = torch.zeros(2, dtype=F64)

    def forward(v: list[torch.Tensor]) -> torch.Tensor:
        (t,) = v
        return (torch.relu(t[0]) - torch.relu(t[1])).reshape(1)

    one, zero = torch.ones(1, dtype=F64), torch.zeros(1, dtype=F64)
    for ga, gb in ((1.0, 0.0), (0.0, -1.0), (1.0, -1.0), (0.0, 0.0)):
        cs = [ties.corner(x, 0, "x[0]", ga * one, (zero, one)), ties.corner(x, 1, "x[1]", gb * one, (zero, -one))]
        assert ties.examine(forward, [x], cs, 1e-6, [0], atol=1e-5, rtol=1e-3) is None, (ga, gb)
    cs = [ties.corner(x, 0, "x[0]", 2 * one, (zero, one)), ties.corner(x, 1, "x[1]", zero, (zero, -one))]
    assert ties.examine(forward, [x], cs, 1e-6, [0], atol=1e-5, rtol=1e-3) is not None  # 2 is beyond every point


def test_one_corner_is_left_to_its_own_verdict():
    x = torch.tensor([2.0, 2.0], dtype=F64)
    f = function("MaxEvery2", lambda x: x.max().reshape(1), lambda xs, y, g: g * (xs[0] == y))
    assert ties.examine(lambda v: f.apply(*v), [x], corners_of(f, x, [0]), 1e-6, [0], atol=1e-5, rtol=1e-3) is None


def test_the_corners_held_are_bounded_by_memory():
    x = torch.zeros(4, dtype=F64)
    col = torch.zeros(1000, dtype=F64)
    held = ties.Held(memory_bytes=4 * 3 * 8 * 1000 * 5)  # room for five corners of 1000 output entries
    for j in range(4):
        for _ in range(3):
            held.add(ties.corner(x, j, f"x[{j}]", col, (col, col)))
    assert len(held.items) == 5
    held.since(2)
    assert [c.j for c in held.items] == [0, 0]


def maximum_with_jvp(at_tie_a: float, at_tie_b: float) -> type:
    """max(a, b) with a right backward (a takes the tie) and a jvp giving ``at_tie_a`` of a's tangent and
    ``at_tie_b`` of b's at a == b."""

    class MaximumJvp(torch.autograd.Function):
        @staticmethod
        def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.maximum(a, b)

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            ctx.save_for_backward(*inputs)
            ctx.inputs = inputs

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a, b = ctx.saved_tensors
            return g * (a >= b), g * (b > a)

        @staticmethod
        def jvp(ctx: Any, ta: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
            a, b = ctx.inputs
            tie = (a == b).to(F64)
            return ta * ((a > b) + at_tie_a * tie) + tb * ((b > a) + at_tie_b * tie)

    return MaximumJvp


@pytest.mark.parametrize("at_a, at_b, correct", [(1.0, 0.0, True), (0.5, 0.5, True), (1.0, 1.0, False)])
def test_forward_ad_judges_ties_together_too(at_a, at_b, correct):
    f = maximum_with_jvp(at_a, at_b)
    result = check(f, [a.clone().requires_grad_() for a in PAIR], checks=["forward_ad"])
    assert result.status is (Status.PASS if correct else Status.FAIL), str(result)
    if not correct:
        a, b = result.checks[0].inputs
        assert a.pattern is b.pattern is Pattern.KINK and a.diagnosis is not None
        assert "so the derivatives jvp gives over them must sum to 1; they sum to 2" in a.diagnosis
        args = [a.clone().requires_grad_() for a in PAIR]
        ok = torch.autograd.gradcheck(
            f.apply, args, check_forward_ad=True, check_backward_ad=False, raise_exception=False
        )
        assert not ok
