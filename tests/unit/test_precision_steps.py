"""A forward that computes in float32 (or is quantised) inside a float64 check (issue 14, item 7).

Its outputs change in steps of one float32 ulp, so central differences with eps=1e-6 measure
rounding: the verdict says so, with the eps that works, and never tells a kink story. At that
eps a correct Function passes and a wrong one still fails.
"""
from __future__ import annotations

import re

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.numerics import precision
from gradcheck_cli.results import Pattern, Status


def one_input(name, forward, backward):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return backward(x, g)

    F.__name__ = F.__qualname__ = name
    return F


def cast(x):  # a float32 kernel called from float64 code
    return torch.sin(x.to(torch.float32)).to(x.dtype)


def round_trip(x):  # the `.float()` round trip
    return (x.float() * 3).double()


def quantised(x):  # float64 throughout, rounded to steps of 2**-16
    return torch.round(torch.sin(x) * 2**16) / 2**16


FORWARDS = {  # forward, its derivative
    "cast": (cast, torch.cos),
    "round_trip": (round_trip, lambda x: torch.full_like(x, 3.0)),
    "quantised": (quantised, torch.cos),
}


def make(kind: str, factor: float = 1.0):
    forward, derivative = FORWARDS[kind]
    return one_input(f"{kind}_{factor}", forward, lambda x, g: factor * g * derivative(x))


@pytest.fixture
def x():
    return torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)


def advised(diagnosis: str) -> dict[str, float]:
    """The tolerance the diagnosis advises: {'eps': ..., 'atol': ...}."""
    found = re.search(r"`tolerance: \{(eps: [^,}]+)(?:, (atol: [^}]+))?\}`", diagnosis)
    assert found, diagnosis
    return {k: float(v) for k, v in (part.split(": ") for part in found.groups() if part)}


@pytest.mark.parametrize("kind", FORWARDS)
def test_a_correct_float32_forward_is_a_precision_fail_with_the_eps_that_works(kind, x):
    result = check(make(kind), (x,))
    (row,) = result.checks[0].inputs
    assert result.status is Status.FAIL  # nothing was verified at this eps (torch's gradcheck fails too)
    assert row.pattern is Pattern.PRECISION and row.at_kinks == 0
    message = result.checks[0].message
    assert "kink" not in message and "tie" not in message, message
    assert "cannot check it at eps=1e-06" in message and "measure rounding" in message, message
    assert "no verdict on backward" in message
    tolerance = advised(row.diagnosis)
    assert tolerance["eps"] > 1e-6

    assert check(make(kind), (x,), **tolerance).status is Status.PASS  # the advice works
    wrong = check(make(kind, 1.1), (x,), **tolerance)  # and still catches a wrong gradient
    assert wrong.status is Status.FAIL
    assert wrong.checks[0].inputs[0].pattern is Pattern.CONSTANT_RATIO, wrong.checks[0].message


def test_float32_values_advise_the_float32_settings(x):
    row = check(make("cast"), (x,)).checks[0].inputs[0]
    assert advised(row.diagnosis) == {"eps": 1e-3, "atol": 1e-4}
    assert "computes in float32" in row.diagnosis


@pytest.mark.parametrize("kind", FORWARDS)
def test_a_wrong_gradient_behind_float32_is_wrong_not_a_kink(kind, x):
    result = check(make(kind, 1.5), (x,))
    assert result.status is Status.FAIL
    message = result.checks[0].message
    assert "kink" not in message and "one-sided" not in message, message
    assert result.checks[0].inputs[0].pattern is not Pattern.KINK


def test_a_wrong_gradient_beyond_the_rounding_says_so(x):
    """1.5x is further off than the rounding of a float32 forward at eps=1e-6 (+-0.03): wrong, not precision."""
    row = check(make("cast", 1.5), (x,)).checks[0].inputs[0]
    assert row.pattern is not Pattern.PRECISION
    assert "further off than that" in row.diagnosis and "eps: 0.001" in row.diagnosis


def test_outputs_that_do_not_move_across_eps_are_precision_not_independence():
    """Large float32 outputs (ulp 0.06) do not change at all across +-1e-6: not 'zero numerical'."""
    big = one_input("Big", lambda x: (x.float() * 1e6).double(), lambda x, g: 1e6 * g)
    x = torch.linspace(1.0, 2.0, 5, dtype=torch.float64, requires_grad=True)
    row = check(big, (x,)).checks[0].inputs[0]
    assert row.pattern is Pattern.PRECISION, row.diagnosis


def test_resolution_sees_float_grids_and_not_float64():
    x = torch.randn(50, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    offsets = torch.tensor([0.0, *precision.OFFSETS], dtype=torch.float64)
    for eps in (1e-6, 1e-3, 1e-1):
        points = x + eps * offsets[:, None]
        for f in (torch.sin, torch.exp, lambda t: 3 * t, lambda t: t**3 / 7):
            step, bits = precision.resolution(f(points))
            assert not bool((step > 0).any()) and not bool((bits > 0).any())  # float64: no grid
        step, bits = precision.resolution(torch.sin(points.float()).double())
        y = torch.sin(x.float())
        ulp = (torch.nextafter(y.abs(), torch.tensor(float("inf"))) - y.abs()).double()
        assert bool((bits <= 24).all()) and bool((step >= ulp).all()) and bool((step <= 8 * ulp).all())
    step, bits = precision.resolution(torch.tensor([[1.0, 3.0], [2.0, 37.0]], dtype=torch.float64))
    assert step.tolist() == [0.0, 0.0]  # integers and other short values tell no float format


def test_advice_balances_rounding_and_truncation():
    assert precision.advice(2.0**-24, 1e-6, 1e-5) == (1e-3, 1e-4)  # float32 outputs near 1
    assert precision.advice(2.0**-16, 1e-6, 1e-5) == (1e-2, 1e-3)
    assert precision.advice(2.0**-24, 1e-2, 1e-3) == (1e-2, None)  # never a smaller eps; atol already enough
