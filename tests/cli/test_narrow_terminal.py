"""80 and 100 columns: no number cut short (the table folds into blocks), no command broken by a newline."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from gradcheck_cli.reporters import table
from gradcheck_cli.results import CaseResult, CheckResult, InputReport, Report, Status, cells

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
REPLAY = (
    "gradcheck specs/a/rather/deep/folder/of/specs/linear_double_bias.yaml "
    "-k specs/a/rather/deep/folder/of/specs/linear_double_bias.yaml::default --seed 12345678901234567"
)


def rows() -> list[InputReport]:
    return [
        InputReport(
            0,
            "input",
            [5, 4],
            "float64",
            Status.PASS,
            numel=20,
            mismatched=0,
            max_abs_err=1.4623e-10,
            max_rel_err=9.9512e-09,
            worst_index=[2, 2],
            analytical=-0.0075412,
            numerical=-0.0075412,
            atol=1e-5,
            rtol=1e-3,
        ),
        InputReport(
            2,
            "bias",
            [3],
            "float64",
            Status.FAIL,
            numel=3,
            mismatched=3,
            max_abs_err=1.0,
            max_rel_err=1.0,
            worst_index=[2],
            worst_output="output 0 [0, 2]",
            analytical=-2.3456e-05,
            numerical=-1.1728e-05,
            atol=1e-5,
            rtol=1e-3,
            diagnosis="analytical is 2.00x numerical",
        ),
    ]


def failing() -> CaseResult:
    check = CheckResult(
        "backward", Status.FAIL, "gradient of 'bias': analytical is 2.00x numerical", "elementwise", rows()
    )
    return CaseResult(
        id="specs/linear_double_bias.yaml::default[cpu]",
        spec="specs/linear_double_bias.yaml",
        case="default",
        function="gradcheck_cli.examples.broken:LinearDoubleBias",
        device="cpu",
        seed=12345678901234567,
        status=Status.FAIL,
        duration_s=0.02,
        checks=[check],
        replay=REPLAY,
    )


def shown(width: int) -> str:
    out = io.StringIO()
    table.render_case(failing(), Console(file=out, width=width, force_terminal=True, highlight=False, soft_wrap=False))
    return ANSI.sub("", out.getvalue())


def assert_whole(text: str) -> None:
    assert "…" not in text
    for row in rows():
        for cell in cells(row)[4:]:  # every number, each worst index and tolerance, in one piece
            assert cell in text, cell
    assert f"  replay: {REPLAY}\n" in text  # one line, however long


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_a_narrow_terminal_gets_every_number_whole_and_the_command_on_one_line(width):
    text = shown(width)
    assert_whole(text)
    assert "┃" not in text  # folded: one block per argument
    assert "  2: bias  [3]  float64  fail" in text
    for line in text.splitlines():
        assert len(line) <= width or line.startswith("  replay: "), line


def test_a_wide_terminal_keeps_the_table():
    text = shown(200)
    assert_whole(text)
    assert "argument" in text and "┃" in text


def test_columns_80_folds_the_coloured_report(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    table.render(Report([failing()]), out, color=True)  # colour is forced: ANSI codes, even into a StringIO
    assert "\x1b[" in out.getvalue()
    assert_whole(ANSI.sub("", out.getvalue()))
    assert "┃" not in out.getvalue()


def test_the_command_line_on_80_columns(monkeypatch, invoke):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("COLUMNS", "80")
    result = invoke("broken-specs/linear_double_bias.yaml", "--color", "--no-isolate")
    assert result.exit_code == 1
    text = ANSI.sub("", result.stdout)
    assert "…" not in text and "9.95e-09" in text and "┃" not in text
    assert (
        "  replay: gradcheck broken-specs/linear_double_bias.yaml -k broken-specs/linear_double_bias.yaml::default\n"
    ) in text
