"""A forward that computes in float32 (or is quantised) inside a float64 check (issue 14, item 7).

Its outputs change in steps of one float32 ulp, so central differences with eps=1e-6 measure
rounding: the check sees that, never tells a kink story, and judges the argument again at eps 1e-3
or 1e-2 with float32 tolerances (issue 34): a correct Function passes with a warning, a wrong one
fails with the factor. Under --strict that stays a fail, with the eps that works (never the one
already used: issue 27 item 11); at that eps a correct Function passes and a wrong one still fails.
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


FLOAT32 = ("cast", "round_trip")  # float32 values; "quantised" has steps of 2**-16, coarser than eps 1e-2 resolves


@pytest.mark.parametrize("kind", FLOAT32)
def test_a_correct_float32_forward_is_judged_again_at_float32_level_and_passes_with_a_warning(kind, x):
    """Issue 34: at eps=1e-6 finite differences measure rounding; judged at eps 1e-2 with float32 tolerances."""
    result = check(make(kind), (x,))
    (row,) = result.checks[0].inputs
    assert result.status is Status.PASS, result.checks[0].message
    assert row.pattern is Pattern.PRECISION and row.at_kinks == 0
    assert (row.atol, row.rtol) == (1e-4, 1e-3)
    (warning,) = result.checks[0].warnings
    assert warning == (
        "'x': forward computes in float32 or lower precision inside, so finite differences at "
        "eps=1e-06 measure rounding: judged at eps 0.01 with float32 tolerances (atol 0.0001, "
        "rtol 0.001); eps 0.01 is the step whose error bound (from steps 0.01 and 0.005, and rounding: "
        "forward's own curvature) takes the least of the tolerance, and every element is within the "
        "tolerance less that bound; a relative error below about 0.001 cannot be seen this way; give "
        "`reference: pkg.mod:fn` for a tighter check"
    )


@pytest.mark.parametrize("factor", [1.01, 1.1, 1.5])
@pytest.mark.parametrize("kind", FLOAT32)
def test_a_wrong_gradient_behind_float32_fails_at_float32_level_with_its_factor(kind, factor, x):
    result = check(make(kind, factor), (x,))
    (row,) = result.checks[0].inputs
    assert result.status is Status.FAIL
    assert row.pattern is Pattern.CONSTANT_RATIO and row.ratio == pytest.approx(factor, rel=1e-3), row.diagnosis
    assert row.diagnosis.startswith(
        "forward computes in float32 or lower precision inside, so finite differences "
        "at eps=1e-06 measure rounding: judged at eps 0.01 with float32 tolerances "
        "(atol 0.0001, rtol 0.001): analytical is "
    ), row.diagnosis


def test_a_quantised_forward_coarser_than_eps_1e2_resolves_stays_a_precision_fail_with_an_atol_that_works(x):
    """Steps of 2**-16: at eps 1e-2 still +-8e-4 of rounding, beyond float32's atol: no verdict, and the advice
    names the atol that is missing (with the eps it was judged at), never that eps alone."""
    result = check(make("quantised"), (x,))
    (row,) = result.checks[0].inputs
    assert result.status is Status.FAIL and row.pattern is Pattern.PRECISION
    assert "judged at eps 0.01" in row.diagnosis and "cannot check it at eps=0.01" in row.diagnosis
    tolerance = advised(row.diagnosis)
    assert tolerance == {"eps": 1e-2, "atol": 1e-3}
    assert check(make("quantised"), (x,), **tolerance).status is Status.PASS  # the advice works
    assert check(make("quantised", 1.1), (x,), **tolerance).status is Status.FAIL


@pytest.mark.parametrize("kind", FLOAT32)
def test_strict_does_not_count_the_second_judgement_as_a_pass_and_says_how_to_choose_it(kind, x):
    result = check(make(kind), (x,), strict=True)
    (row,) = result.checks[0].inputs
    assert result.status is Status.FAIL and row.status is Status.FAIL  # a precision-limited check is not a pass
    assert row.pattern is Pattern.PRECISION and row.at_kinks == 0
    message = result.checks[0].message
    assert "kink" not in message and "tie" not in message, message
    assert (
        "judged at eps 0.01 with float32 tolerances (atol 0.0001, rtol 0.001), it agrees; --strict does not "
        "count a check limited by forward's precision as a pass"
    ) in message, message
    tolerance = advised(row.diagnosis)
    assert tolerance == {"eps": 1e-2, "atol": 1e-4}

    assert check(make(kind), (x,), strict=True, **tolerance).status is Status.PASS  # the advice works
    wrong = check(make(kind, 1.1), (x,), strict=True, **tolerance)  # and still catches a wrong gradient
    assert wrong.status is Status.FAIL
    assert wrong.checks[0].inputs[0].pattern is Pattern.CONSTANT_RATIO, wrong.checks[0].message


@pytest.mark.parametrize("factor", [1.01, 1.1])
def test_strict_fails_a_wrong_gradient_with_its_factor_at_float32_level(factor, x):
    row = check(make("cast", factor), (x,), strict=True).checks[0].inputs[0]
    assert row.status is Status.FAIL and row.pattern is Pattern.CONSTANT_RATIO
    assert "judged at eps 0.01 with float32 tolerances (atol 0.0001, rtol 0.001): analytical is " in row.diagnosis


@pytest.mark.parametrize("strict", [False, True])
def test_the_advice_never_names_the_step_already_used(x, strict):
    """Issue 27 item 11: checked at eps 1e-3 and still limited by rounding, it was told `{eps: 0.001}`.
    Now it is judged at 1e-2 (or, under --strict, told to use 1e-2), which passes."""
    flat = one_input("Flat", lambda x: (1 + x.float() / 100).double(), lambda x, g: g / 100)  # outputs ~1, J 0.01
    result = check(flat, (x,), eps=1e-3, strict=strict)
    (row,) = result.checks[0].inputs
    if strict:
        assert result.status is Status.FAIL and row.pattern is Pattern.PRECISION
        assert "at eps=0.001 measure rounding: judged at eps 0.01" in row.diagnosis
        assert advised(row.diagnosis) == {"eps": 1e-2, "atol": 1e-4}
        assert check(flat, (x,), eps=1e-2, atol=1e-4, strict=True).status is Status.PASS
    else:
        assert result.status is Status.PASS, result.checks[0].message
        (warning,) = result.checks[0].warnings
        assert "finite differences at eps=0.001 measure rounding: judged at eps 0.01" in warning
    assert "eps: 0.001" not in row.diagnosis


def test_a_tolerance_the_user_set_is_kept_in_the_second_judgement(x):
    """atol and rtol given: the second judgement uses them, not float32's (eps 1e-2, rtol 1e-4 fails the
    1.0005x gradient that float32's rtol 1e-3 lets through)."""
    loose = check(make("cast", 1.0005), (x,))
    assert loose.status is Status.PASS, loose.checks[0].message
    tight = check(make("cast", 1.0005), (x,), atol=1e-4, rtol=1e-4)
    (row,) = tight.checks[0].inputs
    assert tight.status is Status.FAIL, tight.checks[0].message
    assert (row.atol, row.rtol) == (1e-4, 1e-4)
    assert "judged at eps 0.01 with the spec's tolerances (atol 0.0001, rtol 0.0001)" in row.diagnosis


@pytest.mark.parametrize("kind", FORWARDS)
def test_a_wrong_gradient_behind_float32_is_wrong_not_a_kink(kind, x):
    for strict in (False, True):
        result = check(make(kind, 1.5), (x,), strict=strict)
        assert result.status is Status.FAIL
        message = result.checks[0].message
        assert "kink" not in message and "one-sided" not in message, message
        assert result.checks[0].inputs[0].pattern is not Pattern.KINK


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


def test_advice_never_names_the_step_already_used():
    assert precision.advice(2.0**-24, 1e-3, 1e-5) == (1e-2, None)  # was (1e-3, None): the step that failed
    assert precision.advice(2.0**-24, 1e-3, 1e-4) == (1e-2, None)
    assert precision.advice(2.0**-16, 1e-2, 1e-4) == (1e-2, 1e-3)  # no larger step: a larger atol
    assert precision.advice(2.0**-24, 1e-2, 1e-3) is None  # nothing a step can do: `reference:`
    for step in (2.0**-30, 2.0**-24, 2.0**-20, 2.0**-16, 2.0**-10):
        for eps in (1e-6, 1e-4, 1e-3, 1e-2):
            for atol in (1e-5, 1e-4, 1e-3):
                found = precision.advice(step, eps, atol)
                assert found is None or found[0] > eps or found[1] is not None, (step, eps, atol, found)
                assert found is None or found[0] <= precision.MAX_EPS


def test_rejudge_eps_is_the_smallest_step_that_puts_the_rounding_well_below_atol():
    assert precision.rejudge_eps(2.0**-26, 1e-6, 1e-4) == 1e-3  # 7.5e-6 <= 1e-5
    assert precision.rejudge_eps(2.0**-24, 1e-6, 1e-4) == 1e-2  # 3e-5 at 1e-3: not well below 1e-4
    assert precision.rejudge_eps(2.0**-16, 1e-6, 1e-4) == 1e-2  # none well below: the largest
    assert precision.rejudge_eps(2.0**-26, 1e-3, 1e-4) == 1e-2  # never the step already used, nor a smaller one
    assert precision.rejudge_eps(2.0**-26, 1e-2, 1e-4) is None


def bounded(x: torch.Tensor, factor: float = 1.0):
    """cast, but forward raises just above x's largest value (it checks its domain): no step above 1e-3 can be taken."""
    bound = float(x.detach().max()) + 5e-4

    def checked(t):
        if float(t.max()) > bound:
            raise ValueError(f"input above {bound}")
        return cast(t)

    return one_input("Bounded", checked, lambda t, g: factor * g * torch.cos(t))


@pytest.mark.parametrize("strict", [False, True])
def test_a_forward_that_raises_at_the_larger_step_keeps_the_precision_fail_with_the_eps_that_works(x, strict):
    """Judged again at eps 1e-2 forward raises: the verdict stays the precision fail at eps=1e-6, not an error."""
    result = check(bounded(x), (x,), strict=strict)
    assert result.error is None, result.error
    (row,) = result.checks[0].inputs
    assert result.status is Status.FAIL and row.pattern is Pattern.PRECISION
    assert "cannot check it at eps=1e-06" in row.diagnosis and "judged at eps" not in row.diagnosis
    assert "measure those steps, not the derivative" in row.diagnosis and "no verdict on backward" in row.diagnosis
    assert advised(row.diagnosis) == {"eps": 1e-3, "atol": 1e-4}  # float32 values near 1


def test_a_wrong_gradient_beyond_the_rounding_says_so(x):
    """1.5x is further off than the rounding of a float32 forward at eps=1e-6 (+-0.03): wrong, not precision."""
    row = check(bounded(x, 1.5), (x,)).checks[0].inputs[0]
    assert row.status is Status.FAIL and row.pattern is not Pattern.PRECISION
    assert "further off than that" in row.diagnosis and "eps: 0.001" in row.diagnosis
