"""``order: N``: double_backward and forward_over_reverse check every derivative up to the N-th.

Agreement with torch: order 3 of a Function f is judged by torch as ``gradgradcheck(f)`` (order 2) and
``gradgradcheck(G1)`` with G1(x, v) = backward of f for grad_output v (order 3: gradgradcheck of a vjp
checks the vjp's second derivative), in reverse mode (``check_rev_over_rev``) and with forward mode last
(``check_fwd_over_rev``). The corpus: test_higher_order's Functions of double_backward (correct and
broken at order 2) and the tower examples, whose derivatives of every order run hand-written code (one
broken at order 3 only in reverse mode, one in forward mode only).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.examples.higher import SinThirdDerivativeWrong, SinThirdJvpWrong, SinTower
from gradcheck_cli.results import Status

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from test_higher_order import DOUBLE_BACKWARD, Case, _apply, _args
except ImportError:  # pragma: no cover
    from tests.agreement.test_higher_order import DOUBLE_BACKWARD, Case, _apply, _args

DT = torch.float64
REVERSE = {"check_rev_over_rev": True}
FORWARD = {"check_fwd_over_rev": True, "check_rev_over_rev": False, "check_undefined_grad": False}


def _x(g: torch.Generator) -> tuple:
    return (torch.randn(3, 4, generator=g, dtype=DT).requires_grad_(True),)


TOWERS = [
    Case("ok_sin_tower", SinTower, _x, True),
    Case("bad_third_derivative_sign", SinThirdDerivativeWrong, _x, False, ("x",)),
]
FORWARD_TOWERS = [
    Case("ok_sin_tower", SinTower, _x, True),
    Case("bad_third_jvp_sign", SinThirdJvpWrong, _x, False, ("x",)),
]


def _first(fn: Any, args: tuple) -> tuple[Any, tuple]:
    """G1 of ``fn`` at ``args`` as torch would check it: (tensors that require grad..., grad_outputs...) ->
    their gradients with the graph recorded; and its arguments."""
    f = _apply(fn)
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = f(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    live = [k for k, o in enumerate(outs) if o.is_floating_point() and o.requires_grad]
    g = torch.Generator().manual_seed(7)
    vs = [torch.randn(outs[k].shape, generator=g, dtype=DT).requires_grad_(True) for k in live]

    def g1(*values: Any) -> tuple:
        call = list(args)
        for i, v in zip(where, values):
            call[i] = v
        out = f(*call)
        out = out if isinstance(out, tuple) else (out,)
        grads = torch.autograd.grad(
            [out[k] for k in live], values[: len(where)], values[len(where) :], create_graph=True, allow_unused=True
        )
        return tuple(torch.zeros_like(a) if d is None else d for d, a in zip(grads, values))

    return g1, tuple(args[i] for i in where) + tuple(vs)


def _torch_says(fn: Any, args: tuple, mode: dict, order: int = 3) -> bool:
    """Every order from 2 to 3, as torch's gradgradcheck judges each."""
    try:
        if not torch.autograd.gradgradcheck(_apply(fn), args, raise_exception=False, **mode):
            return False
        g1, inputs = _first(fn, args)
        return bool(torch.autograd.gradgradcheck(g1, inputs, raise_exception=False, **mode))
    except Exception:  # torch raised instead of answering: not a pass
        return False


def _check(name: str, case: Case, order: int):
    result = gradcheck_cli.check(case.fn, _args(case), checks=[name], order=order)
    assert result.error is None, result.error
    (check,) = result.checks
    return check


@pytest.mark.parametrize(
    "name,mode,case",
    [("double_backward", REVERSE, c) for c in DOUBLE_BACKWARD + TOWERS]
    + [("forward_over_reverse", FORWARD, c) for c in FORWARD_TOWERS],
    ids=[f"double_backward-{c.name}" for c in DOUBLE_BACKWARD + TOWERS]
    + [f"forward_over_reverse-{c.name}" for c in FORWARD_TOWERS],
)
def test_order_3_agrees_with_torch(name, mode, case):
    assert _torch_says(case.fn, _args(case), mode) is case.correct, "the corpus label disagrees with torch"
    check = _check(name, case, 3)
    assert check.status is (Status.PASS if case.correct else Status.FAIL), check.message
    failed = {r.name for r in check.inputs if r.status is Status.FAIL}
    assert failed >= set(case.wrong_rows), (failed, check.message)


@pytest.mark.parametrize(
    "name,broken", [("double_backward", SinThirdDerivativeWrong), ("forward_over_reverse", SinThirdJvpWrong)]
)
def test_a_third_order_mistake_passes_order_2_and_fails_orders_3_and_4_naming_the_order(name, broken):
    case = Case("broken", broken, _x, False)
    assert _check(name, case, 2).status is Status.PASS  # the mistake is out of order 2's reach
    for order in (3, 4):
        check = _check(name, case, order)
        assert check.status is Status.FAIL, check.message
        assert [r.name for r in check.inputs if r.status is Status.FAIL] == ["x"]
        assert ("3rd derivative" if name == "double_backward" else "differentiated once by reverse mode") in (
            check.message
        )
        assert "(at order 3; order 4 was not checked)" in check.message or order == 3
    assert _check("double_backward" if name == "forward_over_reverse" else name, case, 4).status is (
        Status.PASS if name == "forward_over_reverse" else Status.FAIL
    )  # the other mode has nothing to find in a jvp-only mistake


def test_a_lower_order_mistake_fails_at_its_order_and_says_the_higher_were_not_checked():
    """A backward computed outside autograd has zero derivatives of every order, whose finite differences
    are zero too: only order 2 can see it, so order 4 checks order 2 first."""
    case = next(c for c in DOUBLE_BACKWARD if c.name == "bad_numpy_backward")
    check = _check("double_backward", case, 4)
    assert check.status is Status.FAIL
    assert check.message.endswith("(at order 2; orders 3 to 4 were not checked)")
    assert [r.name for r in check.inputs] == ["x", "grad_output 0"]  # order 2's rows


def test_each_order_adds_a_row_per_grad_output_of_its_backward_each_named_once():
    two = next(c for c in DOUBLE_BACKWARD if c.name == "ok_mul_two_inputs")
    check = _check("double_backward", two, 4)
    assert check.status is Status.PASS, check.message
    assert [r.name for r in check.inputs] == [
        "x",
        "y",
        "grad_output 0",
        "grad_output of backward 2 for x",
        "grad_output of backward 2 for y",
        "grad_output of backward 3 for x",
        "grad_output of backward 3 for y",
        "grad_output of backward 3 for grad_output 0",
    ]
    assert all(r.numel and r.mismatched == 0 for r in check.inputs)
    assert check.message.startswith("backward differentiated 3 times with respect to 'x', 'y', grad_output 0")


def test_order_2_draws_what_it_always_drew():
    """No grad_output is drawn for levels that order 2 does not have: its rows are the default's."""
    case = next(c for c in DOUBLE_BACKWARD if c.name == "bad_tanh_backward_1_01x")
    default = gradcheck_cli.check(case.fn, _args(case), checks=["double_backward"]).checks[0]
    two = _check("double_backward", case, 2)
    assert [(r.name, r.max_abs_err, r.worst_index) for r in default.inputs] == [
        (r.name, r.max_abs_err, r.worst_index) for r in two.inputs
    ]
    assert default.message == two.message


@pytest.mark.parametrize("order", [1, 7, 2.5, True])
def test_the_library_refuses_an_order_out_of_range(order):
    with pytest.raises(ValueError, match="order .* integer from 2 to 6"):
        gradcheck_cli.check(SinTower, _x(torch.Generator()), checks=["double_backward"], order=order)


@pytest.mark.parametrize("value", ["1", "7", "two", "[3]"])
def test_a_spec_order_out_of_range_is_a_spec_error_naming_the_key(tmp_path, invoke, value):
    spec = tmp_path / "o.yaml"
    spec.write_text(
        f"function: gradcheck_cli.examples.higher:SinTower\norder: {value}\ninputs:\n  - {{name: x, shape: [3]}}\n"
    )
    result = invoke(str(spec), "--no-isolate")
    assert result.exit_code == 3, result.output  # not checked: a spec error
    assert "o.yaml:2: order: " in result.output and "expected an integer from 2 to 6" in result.output
    assert "the order of the derivative checked" in result.output
    assert "Traceback" not in result.output


def test_a_case_sets_its_own_order_and_the_json_report_has_every_levels_rows(tmp_path, invoke):
    spec = tmp_path / "o.yaml"
    spec.write_text(
        "function: gradcheck_cli.examples.higher:SinThirdDerivativeWrong\n"
        "checks: [double_backward]\n"
        "inputs:\n  - {name: x, shape: [2, 3]}\n"
        "cases:\n  - name: second\n  - name: third\n    order: 3\n"
    )
    result = invoke(str(spec), "--no-isolate", "--format", "json")
    report = json.loads(result.stdout)
    by_case = {r["case"]: r for r in report["results"]}
    assert by_case["second"]["status"] == "pass" and by_case["third"]["status"] == "fail"
    rows = [i["name"] for i in by_case["third"]["checks"][0]["inputs"]]
    assert rows == ["x", "grad_output 0", "grad_output of backward 2 for x"]
    assert result.exit_code == 1
