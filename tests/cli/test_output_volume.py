"""-q / default / -v: how much of a run the table shows; the other formats show everything."""

from __future__ import annotations

import json

import pytest

from gradcheck_cli.reporters import table
from gradcheck_cli.reporters.table import Verbosity
from gradcheck_cli.results import CaseResult, CheckResult, InputReport, Report, Status

FUNCTIONS = """
    import torch

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * g * x

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * g * x
"""
PASS_ID = "specs/a_square.yaml::default[cpu]"
FAIL_ID = "specs/b_wrong.yaml::default[cpu]"
TABLE_HEAD = "max abs err"  # a column title: present only where a table is printed


@pytest.fixture
def project(user_module, write_spec):
    user_module(FUNCTIONS)
    write_spec("function: usermod:Square\ninputs: [{shape: [3]}]\n", "specs/a_square.yaml")
    write_spec("function: usermod:Wrong\ninputs: [{shape: [3]}]\n", "specs/b_wrong.yaml")


def run(invoke, *args: str):
    result = invoke("specs/", "--no-isolate", "--no-color", *args)
    assert result.exit_code == 1, result.output
    return result.stdout


def block(out: str, case_id: str) -> str:
    """The lines of ``out`` from the result line of ``case_id`` to the next blank line or result line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if case_id in line)
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].strip() or lines[i].startswith(("PASS", "FAIL"))),
        len(lines),
    )
    return "\n".join(lines[start:end])


def test_default_is_one_line_for_a_pass_and_the_full_table_for_a_failure(project, invoke):
    out = run(invoke)
    assert block(out, PASS_ID).splitlines() == [block(out, PASS_ID).splitlines()[0]]  # one line
    assert block(out, PASS_ID).startswith(f"PASS  {PASS_ID}  usermod:Square  seed 0")
    failure = block(out, FAIL_ID)
    assert TABLE_HEAD in failure and "1.50x numerical" in failure and "replay: gradcheck specs/b_wrong.yaml" in failure
    assert out.count(TABLE_HEAD) == 1
    assert out.rstrip().splitlines()[-1].startswith("2 results: 1 passed, 1 failed")


def test_quiet_shows_failures_and_the_summary_only(project, invoke):
    for flag in ("-q", "--quiet"):
        out = run(invoke, flag)
        assert PASS_ID not in out and "Square" not in out
        assert TABLE_HEAD in block(out, FAIL_ID) and "replay:" in out
        assert out.rstrip().splitlines()[-1].startswith("2 results: 1 passed, 1 failed")


def test_verbose_shows_every_case_in_full(project, invoke):
    for flag in ("-v", "--verbose"):
        out = run(invoke, flag)
        assert TABLE_HEAD in block(out, PASS_ID) and "all within tolerance" in block(out, PASS_ID)
        assert out.count(TABLE_HEAD) == 2


def test_the_last_of_q_and_v_wins_and_the_command_line_wins_over_the_file(project, invoke, tmp_path):
    assert run(invoke, "-q", "-v").count(TABLE_HEAD) == 2
    assert PASS_ID not in run(invoke, "-v", "-q")
    (tmp_path / "pyproject.toml").write_text('[tool.gradcheck]\nverbosity = "quiet"\n', encoding="utf-8")
    assert PASS_ID not in run(invoke)
    assert run(invoke, "-v").count(TABLE_HEAD) == 2


def test_quiet_leaves_json_and_github_complete(project, invoke):
    for fmt in ("json", "github"):
        full, quiet = run(invoke, "--format", fmt, "-v"), run(invoke, "--format", fmt, "-q")
        if fmt == "json":
            full, quiet = (json.loads(s)["results"] for s in (full, quiet))
            assert [r["id"] for r in quiet] == [r["id"] for r in full] == [PASS_ID, FAIL_ID]
        else:
            assert TABLE_HEAD in block(quiet, f"PASS  {PASS_ID}")  # the log's table is in full (not its ::group:: line)
            assert quiet.count(TABLE_HEAD) == full.count(TABLE_HEAD)


# ---------------------------------------------------- one-line results that still say what needs reading


def _result(status: Status, checks: list[CheckResult], **kw) -> CaseResult:
    return CaseResult(
        id=f"specs/x.yaml::{status.value}[cpu]",
        spec="specs/x.yaml",
        case=status.value,
        function="pkg.mod:X",
        device="cpu",
        seed=0,
        status=status,
        duration_s=0.1,
        checks=checks,
        **kw,
    )


def _render(verbosity: Verbosity, *results: CaseResult) -> str:
    import io

    out = io.StringIO()
    table.render(Report(list(results)), out, color=False, verbosity=verbosity)
    return out.getvalue()


def test_a_one_line_result_keeps_its_warnings_skip_reasons_and_expect_reason():
    row = InputReport(0, "x", [3], "float64", Status.PASS, numel=3, mismatched=0, max_abs_err=1e-10)
    xrow = InputReport(
        0,
        "x",
        [3],
        "float64",
        Status.XFAIL,
        reason="gradient reversal (documented)",
        numel=3,
        mismatched=3,
        max_abs_err=2.0,
    )
    results = [
        _result(
            Status.PASS,
            [
                CheckResult(
                    "backward",
                    Status.PASS,
                    "ok",
                    "elementwise",
                    [row],
                    ["'x' is float32: finite differences are unreliable"],
                )
            ],
        ),
        _result(Status.SKIP, [CheckResult("backward", Status.SKIP, "CUDA is not available on this machine")]),
        _result(Status.XFAIL, [CheckResult("backward", Status.XFAIL, "expected", "elementwise", [xrow])]),
    ]
    out = _render(Verbosity.NORMAL, *results)
    assert TABLE_HEAD not in out
    assert "  warning: 'x' is float32: finite differences are unreliable" in out
    assert "  backward: CUDA is not available on this machine" in out
    assert "  expected: gradient reversal (documented)" in out
    assert len([line for line in out.splitlines() if line.strip()]) == 3 + 3 + 1  # 3 results, 3 reasons, the summary
    quiet = _render(Verbosity.QUIET, *results)
    assert quiet.strip().splitlines() == [quiet.strip().splitlines()[-1]]  # the summary alone
    assert _render(Verbosity.VERBOSE, *results).count(TABLE_HEAD) == 2  # the pass and the xfail tables


def test_table_render_is_in_full_unless_told_otherwise():
    """The GitHub format's log and other callers of table.render keep every case in full."""
    row = InputReport(0, "x", [3], "float64", Status.PASS, numel=3, mismatched=0, max_abs_err=1e-10)
    assert TABLE_HEAD in _render(
        Verbosity.VERBOSE, _result(Status.PASS, [CheckResult("backward", Status.PASS, "ok", None, [row])])
    )
    import io

    out = io.StringIO()
    table.render(
        Report([_result(Status.PASS, [CheckResult("backward", Status.PASS, "ok", None, [row])])]), out, color=False
    )
    assert TABLE_HEAD in out.getvalue()
