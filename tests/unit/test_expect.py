"""``expect:``: a documented, intended mismatch (gradient reversal, a straight-through estimator) is
XFAIL (exit 0), and a FAIL once the mismatch goes away or changes; the status in every format."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import xmlschema

from gradcheck_cli import schemas
from gradcheck_cli.reporters import github, json_, junit, table
from gradcheck_cli.results import CaseResult, CheckResult, InputReport, Report, Status, overall
from gradcheck_cli.run import expectations
from gradcheck_cli.run.runner import run_case
from gradcheck_cli.spec import Expect, Expected, load_file

DATA = Path(__file__).resolve().parents[1] / "data"

SOURCE = '''
import torch
from torch.autograd import Function


class GradReverse(Function):
    """Gradient reversal (DANN): identity forward, backward -lambd * grad by design."""

    @staticmethod
    def forward(ctx, x, lambd):
        ctx.lambd = lambd
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return -ctx.lambd * g, None


class Fixed(GradReverse):
    """The same Function with forward's true derivative: the intended mismatch went away."""

    @staticmethod
    def backward(ctx, g):
        return g, None


class Noisy(GradReverse):
    """Reverses as intended, but is not deterministic: that is no part of the expectation."""

    @staticmethod
    def backward(ctx, g):
        return -ctx.lambd * g + 1e-9 * torch.rand_like(g), None


class Pair(Function):
    """x * y with the gradient of y reversed (intended) and the one of x doubled (a bug)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return 2 * y * g, -x * g
'''

REVERSE = """\
function: usermod:{function}
inputs:
  - {{name: x, shape: [4, 3]}}
  - {{name: lambd, value: {lambd}}}
expect:
  reason: gradient reversal layer (DANN), backward returns -lambd * grad by design
  x: {expected}
"""
REASON = "gradient reversal layer (DANN), backward returns -lambd * grad by design"


@pytest.fixture
def check(user_module, write_spec):
    """``check(function="GradReverse", lambd=0.5, expected="{ratio: -0.5}", text=None) -> CaseResult``
    of the one case of a spec (``text``: the whole spec instead)."""
    user_module(SOURCE)

    def run(
        function: str = "GradReverse", lambd: float = 0.5, expected: str = "{ratio: -0.5}", text: str | None = None
    ) -> CaseResult:
        path = write_spec(text or REVERSE.format(function=function, lambd=lambd, expected=expected))
        (case,) = load_file(path)
        return run_case(case, "cpu")

    return run


def _backward(result: CaseResult) -> CheckResult:
    (c,) = [c for c in result.checks if c.check == "backward"]
    return c


def _row(result: CaseResult, name: str) -> InputReport:
    (row,) = [r for r in _backward(result).inputs if r.name == name]
    return row


# ------------------------------------------------------------------------ the verdicts


def test_the_expected_ratio_is_xfail_and_passes_as_a_verdict(check):
    result = check()
    assert result.status is Status.XFAIL and result.error is None, result
    assert _backward(result).status is Status.XFAIL
    assert (_row(result, "x").status, _row(result, "x").reason) == (Status.XFAIL, REASON)
    assert _row(result, "lambd").status is Status.SKIP  # not compared: nothing to expect
    assert f"expected mismatch ({REASON})" in _backward(result).message
    assert "'x': analytical is -0.50x numerical" in _backward(result).message
    assert bool(result) and Report([result]).exit_code() == 0
    assert str(result).startswith("XFAIL ")


def test_without_expect_the_same_function_fails(check):
    assert (
        check(text=REVERSE.format(function="GradReverse", lambd=0.5, expected="fail").split("expect:")[0]).status
        is Status.FAIL
    )


def test_the_mismatch_went_away_is_a_failure_that_names_the_spec_line(check):
    result = check("Fixed")
    assert result.status is Status.FAIL and not result
    row = _row(result, "x")
    assert row.status is Status.FAIL
    message = _backward(result).message
    assert "expected constant_ratio with ratio -0.5" in message and REASON in message
    assert "but it passes now: the mismatch went away; remove it from `expect` (spec line 7)" in message
    assert row.diagnosis is not None and "the mismatch went away" in row.diagnosis


def test_another_factor_stays_a_failure_that_says_what_was_expected_and_found(check):
    result = check(lambd=2.0)
    assert result.status is Status.FAIL
    assert _row(result, "x").status is Status.FAIL
    message = _backward(result).message
    assert "gradient of 'x': analytical is -2.00x numerical" in message  # the check's own words stay
    assert f"expected constant_ratio with ratio -0.5 ({REASON}), found constant_ratio with ratio -2" in message
    assert "found constant_ratio with ratio -2" in (_row(result, "x").diagnosis or "")


@pytest.mark.parametrize(
    "lambd, expected",
    [
        (0.5, "fail"),  # any mismatch
        (3.0, "fail"),
        (1.0, "sign_flip"),
        (1.0, "{ratio: -1}"),  # constant_ratio -1: a sign flip
        (1.0, "{pattern: sign_flip, ratio: -1}"),
        (0.5, "constant_ratio"),  # any constant ratio
        (0.5, "{pattern: constant_ratio, ratio: -0.5}"),
        (0.5, "{ratio: -0.502}"),  # within 1 %
    ],
)
def test_expectations_that_match(check, lambd, expected):
    assert check(lambd=lambd, expected=expected).status is Status.XFAIL


@pytest.mark.parametrize(
    "lambd, expected, found",
    [
        (0.5, "sign_flip", "found constant_ratio with ratio -0.5"),
        (1.0, "{ratio: -0.5}", "found sign_flip with ratio -1"),
        (0.5, "{ratio: -0.52}", "found constant_ratio with ratio -0.5"),  # 4 % off
        (0.5, "zero_analytical", "found constant_ratio with ratio -0.5"),
    ],
)
def test_expectations_that_do_not_match(check, lambd, expected, found):
    result = check(lambd=lambd, expected=expected)
    assert result.status is Status.FAIL
    assert found in _backward(result).message


@pytest.mark.parametrize(
    "lambd, expected, differs",
    [
        (
            0.5,
            "sign_flip",
            "found constant_ratio with ratio -0.5: the pattern does not match (-0.5 is not -1 within 1%)",
        ),
        (1.0, "{ratio: -0.5}", "found sign_flip with ratio -1: the ratio does not match (-1 is not -0.5 within 1%)"),
        (
            -0.5,
            "{pattern: constant_ratio, ratio: -0.5}",
            "found constant_ratio with ratio 0.5: the ratio does not match (0.5 is not -0.5 within 1%)",
        ),
        (0.5, "zero_analytical", "found constant_ratio with ratio -0.5: the pattern does not match"),
        (
            -0.5,
            "{pattern: sign_flip, ratio: -1}",
            "found constant_ratio with ratio 0.5: the pattern does not match (0.5 is not -1 within 1%)",
        ),
    ],
)
def test_a_mismatch_that_differs_says_which_field_did_not_match(check, lambd, expected, differs):
    """Issue 27, item 7: every field given counts, and the failure names the one that did not match."""
    result = check(lambd=lambd, expected=expected)
    assert result.status is Status.FAIL and _row(result, "x").status is Status.FAIL
    assert differs in _backward(result).message, _backward(result).message


def test_a_sign_flip_with_another_ratio_is_a_spec_error_naming_the_key(user_module, write_spec, invoke):
    """Issue 27, item 7: `{pattern: sign_flip, ratio: 0.5}` gave XFAIL for a 0.5x backward that is not
    sign-flipped (the pattern was ignored); the pair contradicts itself (a sign flip is the ratio -1)."""
    user_module(SOURCE)
    write_spec(
        REVERSE.format(function="GradReverse", lambd=-0.5, expected="{pattern: sign_flip, ratio: 0.5}"), "specs/x.yaml"
    )
    said = (
        "specs/x.yaml:7: expect.x: pattern sign_flip means ratio -1, got ratio 0.5: give the pattern or the "
        "ratio (`{ratio: 0.5}` for a constant ratio)"
    )
    result = invoke("specs/x.yaml", "--no-color")
    assert result.exit_code == 3, result.output
    assert said in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    result = invoke("specs/x.yaml", "--format", "json")
    assert result.exit_code == 3, result.output
    (entry,) = json.loads(result.stdout)["results"]
    assert entry["status"] == "error" and entry["error"]["kind"] == "spec" and said in entry["error"]["message"]


def test_a_contradictory_expectation_built_in_code_is_a_spec_error_too(check):
    user_case = check(lambd=-0.5, expected="{ratio: 0.5}")  # the same Function: a constant ratio 0.5
    assert user_case.status is Status.XFAIL
    names = ["x", "lambd"]
    expect = Expect("reversal", (Expected("x", "sign_flip", 0.5, "expect.x"),))
    with pytest.raises(Exception, match=r"pattern sign_flip means ratio -1, got ratio 0\.5") as caught:
        expectations.validate(expect, names, ["backward"])
    assert type(caught.value).__name__ == "BindError" and caught.value.key == "expect.x"


def test_a_ratio_given_in_code_without_a_pattern_counts_too(user_module, write_spec):
    user_module(SOURCE)
    (case,) = load_file(write_spec(REVERSE.format(function="GradReverse", lambd=0.5, expected="fail")))
    result = run_case(replace(case, expect=Expect(REASON, (Expected("x", None, 2.0, "expect.x"),))), "cpu")
    assert result.status is Status.FAIL  # the ratio is -0.5, not 2 (it was ignored: XFAIL)
    assert "the ratio does not match (-0.5 is not 2 within 1%)" in _backward(result).message
    result = run_case(replace(case, expect=Expect(REASON, (Expected("x", "zero_analytical", 2.0, "expect.x"),))), "cpu")
    assert result.status is Status.ERROR and result.error is not None
    assert (
        "expect.x: a ratio belongs to pattern constant_ratio or sign_flip, not zero_analytical" in result.error.message
    )


def test_a_failure_besides_the_expected_rows_keeps_the_check_failing(check):
    result = check("Noisy")  # the reversal is as expected, the nondeterminism is not
    assert _row(result, "x").status is Status.XFAIL
    assert result.status is Status.FAIL and _backward(result).status is Status.FAIL
    assert "backward returned different values for 'x'" in _backward(result).message
    assert _backward(result).problems and f"'x' mismatches as expected ({REASON})" in _backward(result).message


def test_an_unexpected_row_keeps_the_check_failing_beside_an_expected_one(check):
    result = check(
        text="""\
        function: usermod:Pair
        inputs: [{name: x, shape: [3]}, {name: y, shape: [3]}]
        expect: {reason: reversed on purpose, y: sign_flip}
    """
    )
    assert (_row(result, "x").status, _row(result, "y").status) == (Status.FAIL, Status.XFAIL)
    assert result.status is Status.FAIL
    assert "'y' mismatches as expected (reversed on purpose)" in _backward(result).message


def test_a_row_that_was_not_compared_is_left_alone(check):
    result = check(
        text=REVERSE.format(function="GradReverse", lambd=0.5, expected="fail").replace("  x: fail", "  lambd: fail")
    )
    assert result.status is Status.FAIL  # x's mismatch is not the expected one
    assert _row(result, "lambd").status is Status.SKIP


# ------------------------------------------------------------------------ spec errors and scope


def test_an_unknown_argument_is_a_spec_error_naming_the_key(check):
    result = check(
        text=REVERSE.format(function="GradReverse", lambd=0.5, expected="fail").replace("  x: fail", "  y: fail")
    )
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.kind == "spec"
    assert "expect.y: no argument named 'y'; the arguments are x, lambd" in result.error.message
    assert result.checks == []  # found before any check ran
    assert Report([result]).exit_code() == 3


def test_a_check_the_case_does_not_run_is_a_spec_error(check):
    result = check(text=REVERSE.format(function="GradReverse", lambd=0.5, expected="fail") + "  checks: [forward_ad]\n")
    assert result.status is Status.ERROR and result.error is not None
    assert "expect.checks: forward_ad is not among the case's checks (backward)" in result.error.message


def test_a_case_expect_replaces_the_document_one_and_null_removes_it(user_module, write_spec):
    user_module(SOURCE)
    path = write_spec(
        REVERSE.format(function="GradReverse", lambd=2.0, expected="{ratio: -0.5}")
        + """\
cases:
  - name: document
  - name: own
    expect: {reason: a stronger reversal, x: {ratio: -2}}
  - name: removed
    expect: null
"""
    )
    results = {case.label: run_case(case, "cpu") for case in load_file(path)}
    assert results["document"].status is Status.FAIL  # the document expects -0.5
    assert results["own"].status is Status.XFAIL
    assert _row(results["own"], "x").reason == "a stronger reversal"
    assert results["removed"].status is Status.FAIL
    assert "expected" not in _backward(results["removed"]).message


def test_a_check_that_could_not_compare_is_left_as_it_is():
    rows = [InputReport(0, "x", [3], "float64", Status.SKIP, reason="does not require grad")]
    result = CaseResult(
        "id",
        None,
        None,
        "f",
        "cpu",
        0,
        Status.SKIP,
        checks=[CheckResult("backward", Status.SKIP, "nothing to compare", inputs=rows)],
    )
    expectations.apply(result, Expect("why", (Expected("x"),)), ["x"])
    assert (result.checks[0].status, result.checks[0].message, rows[0].status) == (
        Status.SKIP,
        "nothing to compare",
        Status.SKIP,
    )


# ------------------------------------------------------------------------ the status in the data model


def _xfail_result() -> CaseResult:
    row = InputReport(
        0,
        "x",
        [4, 3],
        "float64",
        Status.XFAIL,
        reason=REASON,
        numel=12,
        mismatched=12,
        max_abs_err=1.5,
        max_rel_err=1.5,
        diagnosis="analytical is -0.50x numerical",
    )
    check = CheckResult("backward", Status.XFAIL, f"expected mismatch ({REASON}): 'x': ...", "elementwise", [row])
    return CaseResult(
        "specs/grl.yaml::default[cpu]",
        "specs/grl.yaml",
        "default",
        "m:GradReverse",
        "cpu",
        0,
        Status.XFAIL,
        checks=[check],
        line=1,
    )


@pytest.mark.parametrize(
    "statuses, expected",
    [
        ([Status.XFAIL, Status.PASS, Status.SKIP], Status.XFAIL),
        ([Status.XFAIL, Status.FAIL], Status.FAIL),
        ([Status.XFAIL, Status.ERROR], Status.ERROR),
    ],
)
def test_overall_puts_xfail_between_fail_and_pass(statuses, expected):
    assert overall(statuses) is expected


def test_summary_and_exit_code_count_xfail_as_passed():
    report = Report([_xfail_result()])
    assert report.summary()["xfailed"] == 1 and report.summary()["failed"] == 0
    assert report.exit_code() == 0


# ------------------------------------------------------------------------ reporters


def test_table_labels_xfail_and_counts_it_in_the_summary():
    out = io.StringIO()
    table.render(Report([_xfail_result()], duration_s=1.0), out, color=False)
    text = out.getvalue()
    assert text.startswith("XFAIL specs/grl.yaml::default[cpu]")
    assert "1 result: 0 passed, 0 failed, 0 errors, 0 skipped, 1 xfailed in 1.00s" in text
    assert "replay" not in text


def test_json_has_the_status_and_the_count_and_follows_the_schema():
    data = json_.as_dict(Report([_xfail_result()]), "2.0")
    jsonschema.Draft202012Validator(schemas.load("report")).validate(data)
    assert data["summary"]["xfailed"] == 1
    assert data["results"][0]["status"] == data["results"][0]["checks"][0]["status"] == "xfail"


def test_junit_writes_an_xfail_as_pytest_does_and_stays_valid(tmp_path):
    path = tmp_path / "junit.xml"
    junit.write(Report([_xfail_result()]), path)
    xmlschema.XMLSchema(str(DATA / "junit-10.xsd")).validate(str(path))
    suite = junit.build(Report([_xfail_result()])).find("testsuite")
    assert suite is not None and suite.get("skipped") == "1" and suite.get("failures") == "0"
    skipped = suite.find("testcase/skipped")
    assert skipped is not None and skipped.get("type") == "xfail"
    assert skipped.get("message") == f"expected failure: {REASON}"


def test_github_notes_an_xfail_without_an_error():
    (line,) = github.commands(Report([_xfail_result()]))
    assert line.startswith("::notice file=specs/grl.yaml,line=1,")
    assert line.endswith(f"::expected failure: {REASON}")


# ------------------------------------------------------------------------ front ends


def test_cli_exit_0_with_the_count_in_the_table_and_json(user_module, write_spec, invoke):
    user_module(SOURCE)
    write_spec(REVERSE.format(function="GradReverse", lambd=0.5, expected="{ratio: -0.5}"), "specs/grl.yaml")
    write_spec(REVERSE.format(function="Fixed", lambd=0.5, expected="{ratio: -0.5}"), "specs/fixed.yaml")
    result = invoke("specs/grl.yaml", "--no-color")
    assert result.exit_code == 0, result.output
    assert "XFAIL specs/grl.yaml::default[cpu]" in result.stdout and "1 xfailed" in result.stdout
    result = invoke("specs/grl.yaml", "specs/fixed.yaml", "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert (report["summary"]["xfailed"], report["summary"]["failed"]) == (1, 1)
    assert {r["spec"]: r["status"] for r in report["results"]} == {
        "specs/grl.yaml": "xfail",
        "specs/fixed.yaml": "fail",
    }


def test_pytest_plugin_shows_an_expected_failure_as_xfailed(tmp_path):
    (tmp_path / "usermod.py").write_text(SOURCE, encoding="utf-8")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "grl.yaml").write_text(
        REVERSE.format(function="GradReverse", lambd=0.5, expected="{ratio: -0.5}"), encoding="utf-8"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONHASHSEED"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--gradcheck",
            "specs",
            "--gradcheck-no-isolate",
            "-rx",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 xfailed" in proc.stdout
    assert REASON in proc.stdout
