"""A case that declares the gradient it intends (`reference_backward:`) or documents its mismatch with finite
differences (`expect:`) is not judged by finite differences under `all` (`checks: all`, `--check all`) unless
its spec's `checks:` names backward: the backward check skips, saying so and how to run it. A surrogate that
differs from the gradient it declares still fails (the reference check judges it). `expect:` beside
`reference_backward:` needs no `checks:`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradcheck_cli.examples import kernels
from gradcheck_cli.results import CaseResult, CheckResult, Status
from gradcheck_cli.run import plan
from gradcheck_cli.run.runner import run_task
from gradcheck_cli.spec import load_file

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "specs" / "kernels.yaml"
CLIPPED = ROOT / "broken-specs" / "kernels_ste_clipped.yaml"
SKIPPED = "not judged by finite differences under `all`: the spec "
HOW = "; to judge backward by finite differences, name it in the spec's `checks:` (e.g. `checks: ["

REVERSE = """\
function: gradcheck_cli.examples.kernels:GradReverse
inputs:
  - {{name: x, shape: [4, 8]}}
  - {{name: lambd, value: 0.5}}
{extra}"""
INTENDED = "reference_backward: gradcheck_cli.examples.kernels:grad_reverse_intended\n"
EXPECT = "expect:\n  reason: gradient reversal, by design\n  x: {ratio: -0.5}\n"


def run(path: Path, checks: tuple[str, ...] = (), label: str | None = None) -> list[CaseResult]:
    """Every case of ``path`` (or the one labelled ``label``) as the command line runs it with ``--check``,
    but the GELU kernels (large bfloat16 cases about something else)."""
    opts = plan.run_options(checks=checks)
    cases = [c for c in load_file(path) if (label is None or c.label == label) and "GELU" not in c.function]
    return [run_task(t) for t in plan.expand(list(cases), opts) if isinstance(t, plan.Task)]


def only(result: CaseResult, name: str) -> CheckResult:
    (check,) = [c for c in result.checks if c.check == name]
    return check


def test_the_shipped_surrogates_are_right_by_the_gradient_they_declare() -> None:
    x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(8, 16, dtype=torch.float64)
    (got,) = torch.autograd.grad(kernels.RoundSTE.apply(x), x, g)
    assert torch.equal(got, kernels.round_ste_intended((x,), (g,))[0])
    assert not torch.autograd.gradcheck(kernels.RoundSTE.apply, (x,), raise_exception=False)  # not the derivative


def test_under_check_all_backward_skips_saying_why_and_how_to_run_it() -> None:
    results = {r.case: r for r in run(KERNELS, ("all",))}
    for label in ("default", "intended_gradient"):  # RoundSTE, GradReverse with reference_backward
        backward = only(results[label], "backward")
        assert backward.status is Status.SKIP, backward.message
        assert backward.message.startswith(
            SKIPPED + "declares the gradient backward intends (`reference_backward: gradcheck_cli.examples.kernels:"
        ), backward.message
        assert "not the derivative on purpose, and the reference check compares backward with it" in backward.message
        assert backward.message.endswith(HOW + "reference, backward]`)")
        assert all(row.status is not Status.FAIL for row in backward.inputs)
        assert only(results[label], "reference").status is Status.PASS
        assert results[label].status is Status.PASS, [(c.check, c.message) for c in results[label].checks]
    # the case whose spec names backward (with the mismatch it documents) is still judged by finite differences
    assert only(results["finite_differences"], "backward").status is Status.XFAIL
    assert results["finite_differences"].status is Status.XFAIL


def test_named_on_the_command_line_backward_runs_and_fails_the_surrogate() -> None:
    (result,) = run(KERNELS, ("backward",), label="intended_gradient")
    assert only(result, "backward").status is Status.FAIL
    assert "-0.50x numerical" in only(result, "backward").message


@pytest.mark.parametrize("checks", ["checks: all\n", ""], ids=["spec_all", "command_line_all"])
def test_checks_all_in_the_spec_skips_it_too(write_spec, checks: str) -> None:
    path = write_spec(REVERSE.format(extra=INTENDED + checks))
    (result,) = run(path, () if checks else ("all",))
    assert only(result, "backward").status is Status.SKIP
    assert only(result, "backward").message.startswith(SKIPPED)
    assert result.status is Status.PASS


def test_a_spec_that_names_backward_keeps_it_under_all(write_spec) -> None:
    path = write_spec(REVERSE.format(extra=INTENDED + "checks: [reference, backward]\n"))
    (result,) = run(path, ("all",))
    assert only(result, "backward").status is Status.FAIL
    assert only(result, "reference").status is Status.PASS
    assert result.status is Status.FAIL


def test_a_surrogate_that_is_not_the_one_declared_still_fails_under_all() -> None:
    (result,) = run(CLIPPED, ("all",))
    assert only(result, "backward").status is Status.SKIP
    assert only(result, "reference").status is Status.FAIL
    assert result.status is Status.FAIL


def test_expect_alone_skips_backward_under_all_with_its_reason(write_spec) -> None:
    path = write_spec(REVERSE.format(extra=EXPECT))
    (result,) = run(path, ("all",))
    backward = only(result, "backward")
    assert backward.status is Status.SKIP
    assert backward.message == (
        SKIPPED + "documents backward's mismatch with finite differences as intended "
        "(`expect:` at line 5: gradient reversal, by design)" + HOW + "backward]`)"
    )
    (default,) = run(path)  # by default (backward) the documented mismatch is an xfail, as before
    assert default.status is Status.XFAIL


def test_expect_beside_reference_backward_needs_no_checks(write_spec) -> None:
    path = write_spec(REVERSE.format(extra=INTENDED + EXPECT))
    (default,) = run(path)
    assert default.error is None, default.error
    assert [c.check for c in default.checks] == ["reference"] and default.status is Status.PASS
    (named,) = run(path, ("backward",))
    assert named.error is None and named.status is Status.XFAIL
    (every,) = run(path, ("all",))
    assert every.error is None and every.status is Status.PASS
    assert "declares the gradient backward intends" in only(every, "backward").message
    assert "documents backward's mismatch with finite differences" in only(every, "backward").message


def test_an_expectation_on_a_check_the_spec_leaves_out_is_still_a_spec_error(write_spec) -> None:
    for extra in (INTENDED + EXPECT + "checks: [double_backward]\n", INTENDED + EXPECT + "  checks: [backward]\n"):
        (result,) = run(write_spec(REVERSE.format(extra=extra)))
        assert result.error is not None and result.error.kind == "spec"
        assert "expect.checks: backward is not among the case's checks" in result.error.message
