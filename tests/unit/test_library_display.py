"""Results in a REPL or a notebook: short reprs, rich and HTML displays, and check_spec from Python."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import gradcheck_cli
from gradcheck_cli import check, check_spec
from gradcheck_cli.examples.broken import LinearDoubleBias
from gradcheck_cli.reporters.table import case_text
from gradcheck_cli.results import Report, Status

BROKEN = "broken-specs/linear_double_bias.yaml"


def _failing():
    args = [
        torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
        torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
        torch.randn(3, dtype=torch.float64, requires_grad=True),
    ]
    return check(LinearDoubleBias, args)


def test_every_result_object_has_a_short_one_line_repr():
    result = _failing()
    report = Report([result], duration_s=1.25)
    check_result, row = result.checks[0], result.checks[0].inputs[2]
    texts = [
        repr(result),
        repr(check_result),
        repr(row),
        repr(row.error_map),
        repr(report),
        repr(result.checks),
        repr(report.results),
    ]
    for text in texts:
        assert "\n" not in text and len(text) < 400, text
    assert repr(check_result) == (
        "<CheckResult backward FAIL: gradient of 'bias': analytical is 2.00x numerical; 'input', 'weight' are right>"
    )
    assert repr(row) == "<InputReport 2: bias [3] FAIL 3/3 mismatched, max abs err 1>"
    assert repr(report) == "<Report 1 result: 0 passed, 1 failed, 0 errors, 0 skipped in 1.25s>"
    assert repr(row.error_map) == "<ErrorMap 1x3, max 1>"


def test_rich_renders_a_result_as_the_table_report_does():
    result = _failing()
    buffer = io.StringIO()
    Console(file=buffer, width=1000, color_system=None, soft_wrap=False).print(result)
    shown = "\n".join(line.rstrip() for line in buffer.getvalue().strip("\n").splitlines())
    assert shown + "\n" == case_text(result)
    buffer = io.StringIO()
    Console(file=buffer, width=1000, color_system=None).print(Report([result, result], 1.0))
    assert buffer.getvalue().count("backward (elementwise)") == 2
    assert "2 results: 0 passed, 2 failed, 0 errors, 0 skipped in 1.00s" in buffer.getvalue()


def test_jupyter_shows_a_result_as_html_with_its_table_and_error_map():
    html = _failing()._repr_html_()
    assert html.startswith('<div class="gradcheck-report">') and "<table>" in html
    assert html.count('<section class="argument">') == 1 and "<svg" in html
    assert "<h1>" in Report([_failing()])._repr_html_()  # a report adds its summary


def test_check_spec_runs_spec_files_in_this_process_with_the_command_lines_options():
    report = check_spec(BROKEN)
    assert isinstance(report, Report) and report.exit_code() == 1
    [result] = report.results
    assert result.status is Status.FAIL and result.id == f"{BROKEN}::default[cpu]"
    assert result.replay == f"gradcheck {BROKEN} -k {BROKEN}::default"
    again = check_spec([BROKEN], seed=7, checks=["backward", "forward_ad"], fast=True)
    assert again.results[0].seed == 7 and [c.check for c in again.results[0].checks] == ["backward", "forward_ad"]
    assert "--seed 7" in again.results[0].replay
    folder = check_spec("broken-specs", select="double_bias")
    assert [r.id for r in folder.results] == [result.id]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_spec("no/such/dir/"), "'no/such/dir/': no such file or directory"),
        (lambda: check_spec(BROKEN, checks=["bogus"]), "checks: unknown check 'bogus'"),
        (lambda: check_spec(BROKEN, devices=["gpu"]), "devices: expected cpu, cuda or cuda:N, got 'gpu'"),
        (lambda: check_spec(BROKEN, select="nothing-like-it"), "select='nothing-like-it': it selects no case"),
    ],
)
def test_check_spec_says_which_option_or_path_is_wrong(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        call()


def test_check_spec_is_public():
    assert "check_spec" in gradcheck_cli.__all__


def test_a_result_made_without_the_library_api_shows_itself_as_plain_text():
    """The result model imports no reporter: until ``reporters.display`` registers their drawings (the
    library API imports it), a result shows its plain text (in a fresh process: registration is global)."""
    import subprocess
    import sys

    code = (
        "from gradcheck_cli.results import CaseResult, Report, Status\n"
        "r = CaseResult(id='m.F', spec=None, case=None, function='m.F', device='cpu', seed=0, status=Status.PASS)\n"
        "assert r.__rich__() == str(r) and r._repr_html_().startswith('<pre>PASS  m.F'), r._repr_html_()\n"
        "assert Report([r], 1.0).__rich__().endswith('in 1.00s>')\n"
        "import gradcheck_cli.reporters.display\n"
        "assert r._repr_html_().startswith('<div class=\"gradcheck-report\">')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
