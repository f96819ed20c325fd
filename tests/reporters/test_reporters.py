"""Reporters on hand-built results (exact strings), exit codes and ``results.overall``."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

import gradcheck_cli
from gradcheck_cli import reporters
from gradcheck_cli.results import CaseResult, CheckResult, ErrorInfo, InputReport, Report, Status, overall

# ------------------------------------------------------------------------ builders


def row_pass(index=0, name="input", shape=(20, 20)) -> InputReport:
    numel = math.prod(shape)
    return InputReport(
        index,
        name,
        list(shape),
        "float64",
        Status.PASS,
        numel=numel,
        mismatched=0,
        max_abs_err=1.5e-10,
        max_rel_err=2.5e-9,
        worst_index=[1, 2],
        worst_output="output 0 [1, 2]",
        analytical=0.5,
        numerical=0.5,
        atol=1e-5,
        rtol=1e-3,
    )


def row_fail() -> InputReport:
    return InputReport(
        1,
        "weight",
        [30, 20],
        "float64",
        Status.FAIL,
        numel=600,
        mismatched=600,
        max_abs_err=0.31,
        max_rel_err=1.0,
        worst_index=[3, 7],
        worst_output="output 0 [3, 7]",
        analytical=0.62,
        numerical=0.31,
        atol=1e-5,
        rtol=1e-3,
        diagnosis="analytical is 2.00x numerical",
    )


def row_skip() -> InputReport:
    return InputReport(2, "bias", [30], "float64", Status.SKIP, reason="requires_grad is false", numel=30)


def check_pass() -> CheckResult:
    return CheckResult(
        "backward", Status.PASS, "1 argument checked, all within tolerance", "elementwise", [row_pass()], [], 0.123456
    )


def check_fail() -> CheckResult:
    return CheckResult(
        "backward",
        Status.FAIL,
        "gradient of 'weight': analytical is 2.00x numerical",
        "elementwise",
        [row_pass(), row_fail(), row_skip()],
        ["'weight' is not float64: finite differences in low precision are unreliable"],
        0.4,
    )


def case(name: str, status: Status, checks=(), error=None, **kw) -> CaseResult:
    return CaseResult(
        id=f"specs/{name}.yaml::default[cpu]",
        spec=f"specs/{name}.yaml",
        case="default",
        function=f"pkg.mod:{name.title()}",
        device="cpu",
        seed=7,
        status=status,
        duration_s=0.25,
        error=error,
        checks=list(checks),
        **kw,
    )


def passed(name="ok") -> CaseResult:
    return case(name, Status.PASS, [check_pass()])


def failed(name="linear") -> CaseResult:
    return case(name, Status.FAIL, [check_fail()], replay="gradcheck specs/linear.yaml --seed 7")


def errored(name="broken", kind="forward") -> CaseResult:
    return case(
        name,
        Status.ERROR,
        error=ErrorInfo(kind, "forward raised ValueError: boom", "user/mod.py:12 (raise ValueError('boom'))"),
        replay="gradcheck specs/broken.yaml",
    )


def skipped(name="cuda_only") -> CaseResult:
    return case(name, Status.SKIP, [CheckResult("backward", Status.SKIP, "CUDA is not available on this machine")])


def render(fmt: str, report: Report) -> str:
    stream = io.StringIO()
    reporters.get(fmt)(report, stream, False)
    return stream.getvalue()


def _no_constants(name):
    raise ValueError(f"not valid JSON: {name}")


def as_json(report: Report) -> dict:
    return json.loads(render("json", report), parse_constant=_no_constants)


# ------------------------------------------------------------------------ JSON


def test_json_top_level():
    data = as_json(Report([passed(), failed(), errored()], duration_s=1.23456))
    assert data["schema_version"] == 1
    assert data["tool"] == {
        "name": "gradcheck-cli",
        "version": gradcheck_cli.__version__,
        "torch": torch.__version__.split("+")[0],
    }
    assert data["summary"] == {
        "total": 3,
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 0,
        "xfailed": 0,
        "not_run": 0,
        "interrupted": None,
        "duration_s": pytest.approx(1.235, abs=1e-3),
    }
    assert [r["status"] for r in data["results"]] == ["pass", "fail", "error"]


def test_json_summary_counts_skips():
    data = as_json(Report([passed(), skipped(), skipped("other")]))
    s = data["summary"]
    assert (s["total"], s["passed"], s["failed"], s["errors"], s["skipped"]) == (3, 1, 0, 0, 2)


def test_json_result_fields_and_types():
    data = as_json(Report([failed()]))
    (r,) = data["results"]
    assert r["id"] == "specs/linear.yaml::default[cpu]"
    assert (r["spec"], r["case"], r["function"], r["device"], r["seed"]) == (
        "specs/linear.yaml",
        "default",
        "pkg.mod:Linear",
        "cpu",
        7,
    )
    assert r["status"] == "fail" and r["error"] is None
    assert isinstance(r["duration_s"], (int, float)) and r["duration_s"] == pytest.approx(0.25)
    (c,) = r["checks"]
    assert (c["check"], c["status"], c["mode"]) == ("backward", "fail", "elementwise")
    assert c["message"] == "gradient of 'weight': analytical is 2.00x numerical"
    assert c["warnings"] == ["'weight' is not float64: finite differences in low precision are unreliable"]
    assert [i["index"] for i in c["inputs"]] == [0, 1, 2]
    assert [i["name"] for i in c["inputs"]] == ["input", "weight", "bias"]
    assert [i["shape"] for i in c["inputs"]] == [[20, 20], [30, 20], [30]]
    assert [i["status"] for i in c["inputs"]] == ["pass", "fail", "skip"]


def test_json_numbers_are_numbers():
    data = as_json(Report([failed()]))
    weight = data["results"][0]["checks"][0]["inputs"][1]
    assert weight["max_abs_err"] == 0.31 and isinstance(weight["max_abs_err"], float)
    assert weight["max_rel_err"] == 1.0 and isinstance(weight["max_rel_err"], float)
    assert weight["mismatched"] == 600 and isinstance(weight["mismatched"], int)
    assert weight["numel"] == 600 and isinstance(weight["numel"], int)
    assert weight["worst_index"] == [3, 7]
    assert weight["analytical"] == 0.62 and weight["numerical"] == 0.31
    assert weight["atol"] == 1e-5 and weight["rtol"] == 1e-3
    assert weight["diagnosis"] == "analytical is 2.00x numerical"
    bias = data["results"][0]["checks"][0]["inputs"][2]
    assert bias["reason"] == "requires_grad is false"
    assert bias["max_abs_err"] is None and bias["mismatched"] is None and bias["worst_index"] is None


def test_json_error_object():
    data = as_json(Report([errored(), passed()]))
    err = data["results"][0]["error"]
    assert err["kind"] == "forward"
    assert err["message"] == "forward raised ValueError: boom"
    assert err["where"] == "user/mod.py:12 (raise ValueError('boom'))"
    assert data["results"][0]["checks"] == []
    assert data["results"][1]["error"] is None


def test_json_statuses_are_plain_strings():
    text = render("json", Report([passed(), failed(), errored(), skipped()]))
    assert "Status." not in text
    data = json.loads(text)
    statuses = {r["status"] for r in data["results"]}
    statuses |= {c["status"] for r in data["results"] for c in r["checks"]}
    statuses |= {i["status"] for r in data["results"] for c in r["checks"] for i in c["inputs"]}
    assert statuses == {"pass", "fail", "error", "skip"}


def test_json_is_one_document_without_colour():
    text = render("json", Report([failed()]))
    assert "\x1b" not in text
    assert text.endswith("\n")
    json.loads(text)  # the whole output, nothing before or after


def test_json_empty_report():
    data = as_json(Report([]))
    assert data["results"] == []
    assert data["summary"]["total"] == 0


def test_json_non_finite_numbers_still_give_valid_json():
    # e.g. a user tolerance of atol=inf (accepted by the library API) ends up in every row
    weird = row_fail()
    weird.atol = math.inf
    weird.max_rel_err = math.nan
    r = case("weird", Status.FAIL, [CheckResult("backward", Status.FAIL, "m", "elementwise", [weird])])
    data = as_json(Report([r]))  # must not raise, and must be strict JSON
    inp = data["results"][0]["checks"][0]["inputs"][0]
    assert inp["name"] == "weight" and inp["mismatched"] == 600


def test_json_of_a_real_check():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 6

    x = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(2, 3).requires_grad_()
    data = as_json(Report([gradcheck_cli.check(Twice, [x])]))
    (r,) = data["results"]
    assert r["status"] == "fail" and r["error"] is None
    (inp,) = r["checks"][0]["inputs"]
    assert (inp["index"], inp["name"], inp["shape"], inp["status"]) == (0, "x", [2, 3], "fail")
    assert inp["mismatched"] == 6 and inp["numel"] == 6
    assert isinstance(inp["max_rel_err"], float) and inp["max_rel_err"] == pytest.approx(1.0, rel=1e-4)
    assert len(inp["worst_index"]) == 2 and all(isinstance(i, int) for i in inp["worst_index"])


# ------------------------------------------------------------------------ table


def table(*results: CaseResult, duration: float = 0.0) -> str:
    return render("table", Report(list(results), duration))


def line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert len(lines) == 1, f"{needle!r} on {len(lines)} lines of:\n{text}"
    return lines[0]


def test_table_summary_line():
    out = table(passed("a"), passed("b"), failed(), duration=1.5)
    assert "3 results: 2 passed, 1 failed, 0 errors, 0 skipped in 1.50s" in out
    assert out.rstrip().splitlines()[-1].startswith("3 results: ")


def test_table_summary_line_singular_and_errors():
    assert "1 result: 0 passed, 0 failed, 1 error, 0 skipped" in table(errored())
    out = table(errored("x"), errored("y"), skipped(), passed())
    assert "4 results: 1 passed, 0 failed, 2 errors, 1 skipped" in out


def test_table_case_header():
    out = table(failed())
    head = line_with(out, "specs/linear.yaml::default[cpu]")
    assert head.startswith("FAIL ")
    assert "pkg.mod:Linear" in head and "seed 7" in head and "0.25s" in head
    assert line_with(table(passed()), "specs/ok.yaml").startswith("PASS ")
    assert line_with(table(errored()), "specs/broken.yaml::").startswith("ERROR")
    assert line_with(table(skipped()), "specs/cuda_only.yaml").startswith("SKIP ")


def test_table_argument_rows():
    out = table(failed())
    assert "backward (elementwise)" in out
    first = line_with(out, "0: input")
    for cell in ("[20, 20]", "float64", "pass", "1.5e-10", "2.5e-09", "0 / 400", "atol 1e-05, rtol 0.001"):
        assert cell in first, (cell, first)
    second = line_with(out, "1: weight")
    for cell in (
        "[30, 20]",
        "fail",
        "0.31",
        "[3, 7] (output 0 [3, 7])",
        "600 / 600",
        "0.62 / 0.31",
        "atol 1e-05, rtol 0.001",
    ):
        assert cell in second, (cell, second)
    # the columns come in the documented order
    assert second.index("1: weight") < second.index("[30, 20]") < second.index("fail") < second.index("600 / 600")
    third = line_with(out, "2: bias")
    assert "not checked: requires_grad is false" in third


def test_table_check_message_warnings_and_replay():
    out = table(failed())
    assert "  backward: gradient of 'weight': analytical is 2.00x numerical" in out
    assert "  warning: 'weight' is not float64: finite differences in low precision are unreliable" in out
    assert "  replay: gradcheck specs/linear.yaml --seed 7" in out


def test_table_case_warnings():
    r = passed()
    r.warnings = ["device cuda:1 does not exist"]
    assert "  warning: device cuda:1 does not exist" in table(r)


def test_table_replay_only_for_failures():
    r = passed()
    r.replay = "gradcheck specs/ok.yaml"
    assert "replay:" not in table(r)


def test_table_error_lines():
    out = table(errored())
    assert "  forward error: forward raised ValueError: boom" in out
    assert "  at user/mod.py:12 (raise ValueError('boom'))" in out
    assert "  replay: gradcheck specs/broken.yaml" in out


def test_table_error_without_where():
    r = case("bad", Status.ERROR, error=ErrorInfo("spec", "specs/bad.yaml: inputs[1].shape: expected a list"))
    out = table(r)
    assert "  spec error: specs/bad.yaml: inputs[1].shape: expected a list" in out
    assert "  at " not in out


def test_table_has_no_colour_codes_without_color():
    assert "\x1b" not in table(passed(), failed(), errored(), skipped())


def test_table_fail_row_without_numbers_shows_the_reason():
    bad = InputReport(0, "k", [], "int", Status.FAIL, reason="backward returned a gradient for a non-tensor")
    r = case("k", Status.FAIL, [CheckResult("backward", Status.FAIL, "contract broken", "elementwise", [bad])])
    assert "fail: backward returned a gradient for a non-tensor" in line_with(table(r), "0: k")


def test_table_long_rows_stay_on_one_line_each():
    # realistic names and texts from a complex Function with an aliased argument
    bad = InputReport(
        1,
        "weight_matrix",
        [300, 200],
        "complex128",
        Status.FAIL,
        numel=60000,
        mismatched=60000,
        max_abs_err=0.312,
        max_rel_err=1.0,
        worst_index=[123, 177],
        worst_output="output 0 [123, 177] (imaginary part), input imaginary part",
        analytical=-0.623,
        numerical=0.312,
        atol=1e-5,
        rtol=1e-3,
    )
    alias = InputReport(
        2,
        "another_weight_matrix",
        [300, 200],
        "complex128",
        Status.SKIP,
        numel=60000,
        reason="same tensor as 'weight_matrix' (checked there)",
    )
    r = case("cplx", Status.FAIL, [CheckResult("backward", Status.FAIL, "m", "elementwise", [bad, alias])])
    out = table(r)
    assert "not checked: same tensor as 'weight_matrix' (checked there)" in line_with(out, "2: another_weight_matrix")
    assert "output 0 [123, 177] (imaginary part), input imaginary part" in line_with(out, "1: weight_matrix")


# ------------------------------------------------------------------------ exit codes, overall


@pytest.mark.parametrize(
    "results, code",
    [
        ([], 0),
        (["pass"], 0),
        (["pass", "pass"], 0),
        (["pass", "skip"], 0),
        (["skip", "skip"], 0),
        (["pass", "fail"], 1),
        (["fail"], 1),
        (["pass", "error"], 3),
        (["error"], 3),
        (["fail", "error"], 3),
        (["error", "fail", "pass", "skip"], 3),
        (["internal"], 4),
        (["internal", "fail"], 4),
        (["error", "internal", "fail"], 4),
    ],
)
def test_exit_code(results, code):
    make = {
        "pass": passed,
        "fail": failed,
        "error": errored,
        "skip": skipped,
        "internal": lambda: errored("oops", kind="internal"),
    }
    assert Report([make[k]() for k in results]).exit_code() == code


def test_exit_code_counts_statuses_not_check_contents():
    # a result marked pass counts as pass even though it carries a skipped check
    r = passed()
    r.checks.append(CheckResult("forward_ad", Status.SKIP, "no jvp"))
    assert Report([r]).exit_code() == 0


@pytest.mark.parametrize(
    "statuses, expected",
    [
        ([], Status.SKIP),
        ([Status.SKIP], Status.SKIP),
        ([Status.SKIP, Status.SKIP], Status.SKIP),
        ([Status.PASS], Status.PASS),
        ([Status.SKIP, Status.PASS], Status.PASS),
        ([Status.PASS, Status.FAIL], Status.FAIL),
        ([Status.FAIL, Status.SKIP], Status.FAIL),
        ([Status.FAIL, Status.ERROR], Status.ERROR),
        ([Status.ERROR, Status.PASS, Status.SKIP], Status.ERROR),
    ],
)
def test_overall(statuses, expected):
    assert overall(statuses) is expected


def test_status_strings():
    assert [str(s) for s in Status] == ["pass", "fail", "error", "skip", "xfail"]
    assert Status("fail") is Status.FAIL
    assert f"{Status.ERROR}" == "error"


def test_summary_dict():
    s = Report([passed(), failed(), failed("b"), errored(), skipped()], duration_s=2.00049).summary()
    assert s == {
        "total": 5,
        "passed": 1,
        "failed": 2,
        "errors": 1,
        "skipped": 1,
        "xfailed": 0,
        "not_run": 0,
        "interrupted": None,
        "duration_s": 2.0,
    }
