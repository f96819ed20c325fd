"""The step of finite differences against the values it moves (issue 44, item 9): an eps that does not move
the inputs (x + eps == x), that swallows them (x + eps == eps) or that leaves the dtype's range is a spec
error naming `tolerance.eps` (or the Python API's `eps`), not a FAIL "the outputs do not depend on it"; so
is a step the spec set that leaves the function's domain at every element (log at eps 1 on [0.5, 1])."""

from __future__ import annotations

import pytest
import torch

import gradcheck_cli
from gradcheck_cli import spec
from gradcheck_cli.checks.parts.step import _problem
from gradcheck_cli.results import ErrorKind, Status
from gradcheck_cli.run import runner

SIN = "function: torch.sin\ntolerance: {{eps: {eps}}}\nchecks: {checks}\ninputs: [{{name: input, {arg}}}]\n"
NEAR_ONE = "shape: [3, 4], dist: uniform, low: 0.5, high: 1.0"


def outcome(write_spec, eps, checks="[backward]", arg="shape: [3, 4]", function="torch.sin"):
    text = SIN.format(eps=eps, checks=checks, arg=arg).replace("torch.sin", function)
    (case,) = spec.load_file(write_spec(text))
    assert not isinstance(case, spec.SpecError), case
    return runner.run_case(case, "cpu")


@pytest.mark.parametrize(
    "eps,words",
    [
        ("1.0e-320", "1e-320 does not move any element of 'input' (x + eps == x in float64"),
        ("1.0e-17", "1e-17 does not move"),
        ("1.0e+300", "1e+300 swallows 'input' (x + eps == eps and x - eps == -eps in float64"),
    ],
)
@pytest.mark.parametrize("checks", ["[backward]", "[forward_ad]", "[double_backward]", "all"])
def test_a_step_that_cannot_move_the_inputs_is_a_spec_error_naming_tolerance_eps(write_spec, eps, words, checks):
    # torch.sin is right: before, every one of these FAILED "the outputs do not depend on it"
    result = outcome(write_spec, eps, checks)
    assert result.status is Status.ERROR and result.error is not None, [(c.check, c.message) for c in result.checks]
    assert result.error.kind is ErrorKind.SPEC
    assert "spec.yaml:1: tolerance.eps: " + words in result.error.message, result.error.message
    assert result.error.message.endswith("use a value near 1e-06"), result.error.message


def test_the_cli_exits_3_with_the_message(write_spec, invoke):
    path = write_spec(SIN.format(eps="1.0e-320", checks="[backward]", arg="shape: [3, 4]"))
    run = invoke(str(path))
    assert run.exit_code == 3, run.output
    assert "tolerance.eps: 1e-320 does not move any element of 'input'" in " ".join(run.output.split())


@pytest.mark.parametrize("eps", ["1.0e-6", "1.0e-4"])
def test_a_usable_step_still_checks(write_spec, eps):
    assert outcome(write_spec, eps).status is Status.PASS


def test_a_wrong_backward_still_fails_at_a_usable_step(write_spec):
    body = "function: gradcheck_cli.examples.broken:MulConstantSignFlip\ntolerance: {eps: 1.0e-4}\n"
    (case,) = spec.load_file(write_spec(body + "inputs: [{name: x, shape: [3]}, {name: c, value: 2.0}]\n"))
    assert runner.run_case(case, "cpu").status is Status.FAIL


def test_some_elements_that_the_step_does_not_move_are_named_with_the_step_advised(write_spec):
    # at 1e6, float64's spacing is 1.2e-10: a step of 1e-12 moves only the element at 2.0
    result = outcome(write_spec, "1.0e-12", arg="data: [1.0e+6, 2.0, 3.0e+5]")
    assert result.status is Status.ERROR and result.error is not None
    message = result.error.message
    assert "does not move 2 of 3 elements of 'input' (x + eps == x in float64, e.g. at 1e+06" in message, message
    assert message.endswith("use a value near 1e-06 times the largest |input| (1)"), message


@pytest.mark.parametrize(
    "arg,eps",
    [
        ("data: [0.0, 0.0]", "1.0e-320"),  # 0 + eps moves (to a subnormal): sin'(0) = 1 is measured exactly
        ("data: [1.0e-20, 1.0]", "1.0e-3"),  # 1e-20 is swallowed, 1.0 is not: the step's scale is 1
        ("data: [1.0e+6, 2.0]", "1.0e-6"),  # every element moves
    ],
)
def test_a_step_that_moves_every_element_and_keeps_them_apart_is_not_refused(write_spec, arg, eps):
    result = outcome(write_spec, eps, arg=arg)
    assert result.error is None, result.error
    assert result.status is Status.PASS, [(c.check, c.message) for c in result.checks]


def test_the_python_api_names_its_eps_argument():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, [x], eps=1e-320)
    assert result.status is Status.ERROR and result.error is not None and result.error.kind is ErrorKind.SPEC
    assert result.error.message.startswith("eps: 1e-320 does not move any element of 'arg0'"), result.error.message
    assert gradcheck_cli.check(torch.sin, [x], eps=1e-6).status is Status.PASS


@pytest.mark.parametrize(
    "x,eps,words",
    [
        (torch.ones(3, dtype=torch.float32), 1e300, "out of {dtype}'s range"),  # float32 moved in float32
        (torch.ones(3, dtype=torch.float32), 1e-8, "does not move any element"),  # below float32's spacing at 1
        (torch.full((2,), 1 + 1j, dtype=torch.complex128), 1e-320, "does not move any element"),  # re and im parts
        (torch.ones(2, dtype=torch.float64).to_sparse(), 1e-320, "does not move any element"),  # stored values
    ],
)
def test_the_rule_reads_the_values_in_the_dtype_they_are_moved_in(x, eps, words):
    problem = _problem(x, eps)
    assert problem is not None and words in problem


@pytest.mark.parametrize("x", [torch.zeros(0), torch.arange(3), torch.tensor([float("inf"), 1.0], dtype=torch.float64)])
def test_what_finite_differences_do_not_move_is_not_judged(x):
    assert _problem(x, 1e-6) is None


@pytest.mark.parametrize(
    "checks", ["[backward]", "[forward_ad]", "all"]
)  # not double_backward: g / x is finite at x - 1
def test_a_step_that_leaves_the_domain_at_every_element_is_a_spec_error_naming_tolerance_eps(write_spec, checks):
    # log at x - 1 <= 0 for every x in [0.5, 1]: before, a PASS with a warning to keep x away from domain edges
    result = outcome(write_spec, "1.0", checks, NEAR_ONE, "torch.log")
    assert result.status is Status.ERROR and result.error is not None, [(c.check, c.message) for c in result.checks]
    assert result.error.kind is ErrorKind.SPEC
    words = "spec.yaml:1: tolerance.eps: 1 leaves the function's domain at every element of 'input'"
    assert words in result.error.message, result.error.message
    assert result.error.message.endswith("(the default for float64 is 1e-06)"), result.error.message


@pytest.mark.parametrize(
    "function,eps,arg",
    [
        ("torch.log", "1.0e-3", NEAR_ONE),  # a step inside the domain everywhere
        ("torch.log", "0.6", "data: [0.5, 0.7, 2.0, 3.0]"),  # the edge at two elements of four: the inputs' business
        ("torch.sqrt", "0.1", "shape: [3, 4], dist: uniform, low: 0.01, high: 1.0"),  # some elements near 0
    ],
)
def test_a_step_that_leaves_the_domain_at_some_elements_only_still_checks(write_spec, function, eps, arg):
    result = outcome(write_spec, eps, arg=arg, function=function)
    assert result.error is None, result.error
    assert result.status is Status.PASS, [(c.check, c.message) for c in result.checks]


def test_the_default_step_at_the_domain_edge_is_the_inputs_business_not_a_spec_error():
    # every element within 1e-6 of log's edge at 0, eps not set: a pass with the warning to keep x away
    x = (torch.rand(3, 4, dtype=torch.float64) * 1e-7 + 1e-9).requires_grad_()
    result = gradcheck_cli.check(torch.log, [x])
    assert result.status is Status.PASS, result
    (row,) = result.checks[0].inputs
    assert "at the edge of the domain" in (row.reason or ""), row.reason


def test_the_python_api_names_its_eps_argument_at_a_domain_edge():
    x = (torch.rand(3, 4, dtype=torch.float64) * 0.5 + 0.5).requires_grad_()
    result = gradcheck_cli.check(torch.log, [x], eps=1.0)
    assert result.status is Status.ERROR and result.error is not None and result.error.kind is ErrorKind.SPEC
    assert result.error.message.startswith("eps: 1 leaves the function's domain at every element of 'arg0'")
