"""The library API's verdict: a CaseResult is true only when it passed (``assert check(fn, args)``),
its repr is one short line, its str the per-argument table in plain text, and
``assert_gradients`` raises AssertionError with that table."""

from __future__ import annotations

import pytest
import torch

import gradcheck_cli
from gradcheck_cli import assert_gradients, check
from gradcheck_cli.results import CaseResult, CheckResult, ErrorInfo, ErrorKind, InputReport, Status


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class SquareForgotTwo(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return x * g


class Raises(Square):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("no forward today")


def x3() -> torch.Tensor:
    return torch.linspace(0.5, 1.5, 3, dtype=torch.float64).requires_grad_()


def test_assert_check_fails_for_a_wrong_gradient_and_passes_for_a_right_one():
    # was: the result was always truthy, so `assert check(Bad, (x,))` passed
    wrong = check(SquareForgotTwo, (x3(),))
    assert wrong.status is Status.FAIL and not wrong
    with pytest.raises(AssertionError):
        assert check(SquareForgotTwo, (x3(),))
    right = check(Square, (x3(),))
    assert right.status is Status.PASS and right
    assert check(Square, (x3(),))


def case(status: Status, **kw) -> CaseResult:
    return CaseResult(
        id="specs/sq.yaml::default[cpu]",
        spec="specs/sq.yaml",
        case="default",
        function="m:Sq",
        device="cpu",
        seed=0,
        status=status,
        **kw,
    )


@pytest.mark.parametrize(
    "status, truth", [(Status.PASS, True), (Status.FAIL, False), (Status.ERROR, False), (Status.SKIP, False)]
)
def test_only_a_pass_is_true_a_skip_proves_nothing(status, truth):
    assert bool(case(status)) is truth
    assert bool(case(status, warnings=["analytical is 1.001x numerical everywhere"])) is truth


def test_an_error_in_user_code_is_false():
    result = check(Raises, (x3(),))
    assert result.status is Status.ERROR and not result


ROW = InputReport(
    index=0,
    name="x",
    shape=[3],
    dtype="float64",
    status=Status.FAIL,
    numel=3,
    mismatched=3,
    max_abs_err=1.5,
    max_rel_err=0.5,
    worst_index=[2],
    analytical=1.5,
    numerical=3.0,
    atol=1e-5,
    rtol=1e-3,
)
SKIPPED = InputReport(index=1, name="n", shape=[], dtype="int64", status=Status.SKIP, reason="integer dtype")
FAILED = case(
    Status.FAIL,
    duration_s=0.25,
    replay="gradcheck specs/sq.yaml -k specs/sq.yaml::default",
    checks=[
        CheckResult(
            "backward",
            Status.FAIL,
            "gradient of 'x': analytical is 0.50x numerical",
            mode="elementwise",
            inputs=[ROW, SKIPPED],
            warnings=["a check warning"],
        )
    ],
    warnings=["a case warning"],
)


def test_str_is_the_per_argument_table_in_plain_text():
    assert str(FAILED) == (
        "FAIL  specs/sq.yaml::default[cpu]  m:Sq  seed 0  0.25s\n"
        "  backward (elementwise)\n"
        "    argument  shape  dtype    status                      max abs err  max rel err  worst at  mismatched"
        "  analytical / numerical  tolerance\n"
        "    0: x      [3]    float64  fail                                1.5          0.5  [2]            3 / 3"
        "                 1.5 / 3  atol 1e-05, rtol 0.001\n"
        "    1: n      []     int64    not checked: integer dtype            -            -  -                  -"
        "                       -  -\n"
        "  backward: gradient of 'x': analytical is 0.50x numerical\n"
        "  warning: a check warning\n"
        "  warning: a case warning\n"
        "  replay: gradcheck specs/sq.yaml -k specs/sq.yaml::default"
    )


def test_str_of_an_error_names_it_and_where():
    errored = case(Status.ERROR, error=ErrorInfo(ErrorKind.FORWARD, "ValueError: bad\nsecond line", "usermod.py:3"))
    assert str(errored).splitlines()[1:] == ["  forward error: ValueError: bad", "second line", "  at usermod.py:3"]


def test_str_of_a_real_failure_holds_every_argument_and_no_colour():
    text = str(check(SquareForgotTwo, (x3(),)))
    assert "\x1b" not in text
    assert "max abs err" in text and "0: x" in text and "fail" in text and "0.50x" in text


def test_repr_is_one_short_line_with_the_status_and_why():
    assert repr(FAILED) == (
        "<CaseResult FAIL specs/sq.yaml::default[cpu]: backward: gradient of 'x': analytical is 0.50x numerical>"
    )
    long = case(Status.ERROR, error=ErrorInfo(ErrorKind.IMPORT, "cannot import\n" + "x" * 500))
    text = repr(long)
    assert "\n" not in text and len(text) < 160 and text.startswith("<CaseResult ERROR ") and text.endswith("...>")
    assert "import error: cannot import x" in text
    assert (
        repr(case(Status.PASS, checks=[CheckResult("backward", Status.PASS)]))
        == "<CaseResult PASS specs/sq.yaml::default[cpu]: backward pass>"
    )


def test_assert_gradients_raises_with_the_table_for_a_wrong_gradient():
    with pytest.raises(AssertionError) as info:
        assert_gradients(SquareForgotTwo, (x3(),))
    message = str(info.value)
    assert "fail" in message and "max abs err" in message and "0: x" in message and "0.50x numerical" in message


def test_assert_gradients_raises_for_an_error_and_returns_a_pass():
    with pytest.raises(AssertionError, match="no forward today"):
        assert_gradients(Raises, (x3(),))
    result = assert_gradients(Square, (x3(),), atol=1e-6, checks=["backward"])
    assert result.status is Status.PASS and result.checks[0].inputs[0].atol == 1e-6
    assert "assert_gradients" in gradcheck_cli.__all__


def test_check_speaks_check_specs_vocabulary_for_memory_and_fast():
    """issue 31 item 6: check(memory_bytes=) beside check_spec(max_memory=), and fast= only in check_spec"""
    import gradcheck_cli
    from gradcheck_cli.examples.linear import LinearFunction

    args = [
        torch.randn(4, 3, dtype=torch.float64, requires_grad=True),
        torch.randn(2, 3, dtype=torch.float64, requires_grad=True),
    ]
    fast = gradcheck_cli.check(LinearFunction, args, fast=True)
    assert fast.checks[0].mode == "probe" and fast
    assert gradcheck_cli.check(LinearFunction, args).checks[0].mode == "elementwise"
    assert gradcheck_cli.check(LinearFunction, args, max_memory=1)  # MB, as --max-memory
    with pytest.raises(ValueError, match="max_memory .MB. or memory_bytes, not both"):
        gradcheck_cli.check(LinearFunction, args, max_memory=1, memory_bytes=2**20)
