"""Terminal control sequences in user text (case names, exception messages, warnings) are shown as
escapes where the text meets a terminal: the table, the GitHub log (also a terminal's text), a
result's repr and str. The JSON report keeps the text itself (JSON escapes it). Issue 31 item 3."""

from __future__ import annotations

import io
import json

import pytest

from gradcheck_cli.reporters import github, json_, table
from gradcheck_cli.results import CaseResult, CheckResult, ErrorInfo, Report, Status

CLEAR, TITLE, BACK = "\x1b[2J", "\x1b]0;pwned\x07", "\rOK  "
NASTY = f"boom{CLEAR}{TITLE}{BACK}\x9b1m end"


def nasty_report() -> Report:
    failing = CaseResult(
        f"specs/x.yaml::case{CLEAR}[cpu]",
        "specs/x.yaml",
        f"case{CLEAR}",
        "pkg.mod:F",
        "cpu",
        0,
        Status.FAIL,
        0.1,
        None,
        [CheckResult("backward", Status.FAIL, NASTY, warnings=[NASTY])],
        replay=f"gradcheck specs/x.yaml -k 'case{CLEAR}'",
    )
    erroring = CaseResult(
        "specs/y.yaml::default[cpu]",
        "specs/y.yaml",
        "default",
        "pkg.mod:G",
        "cpu",
        0,
        Status.ERROR,
        0.1,
        ErrorInfo("forward", NASTY, "pkg/mod.py:3"),
    )
    return Report([failing, erroring], 0.2)


def rendered(render, report: Report, **kw) -> str:
    stream = io.StringIO()
    render(report, stream, **kw)
    return stream.getvalue()


@pytest.mark.parametrize("render, kw", [(table.render, {"color": False}), (github.render, {})], ids=["table", "github"])
def test_a_terminal_report_shows_control_characters_as_escapes(render, kw):
    out = rendered(render, nasty_report(), **kw)
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x9b" not in out, repr(out)
    assert "boom\\x1b[2J\\x1b]0;pwned\\x07\\x0dOK  \\x9b1m end" in out


def test_a_coloured_table_has_only_its_own_escape_sequences():
    out = rendered(table.render, nasty_report(), color=True)
    assert "\x1b[2J" not in out and "\x1b]0;" not in out and "\x07" not in out and "\r" not in out
    assert "boom\\x1b[2J" in out


def test_the_json_report_keeps_the_text_itself():
    data = json.loads(rendered(json_.render, nasty_report()))
    assert data["results"][0]["checks"][0]["message"] == NASTY
    assert data["results"][1]["error"]["message"] == NASTY


def test_repr_and_str_of_a_result_show_escapes():
    failing, erroring = nasty_report().results
    for text in (repr(failing), str(failing), repr(failing.checks[0]), repr(erroring), str(erroring)):
        assert "\x1b" not in text and "\r" not in text, repr(text)
    assert "\\x1b[2J" in str(failing)
    assert "\n" in str(failing)  # newlines stay


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def wide_report() -> Report:
    from gradcheck_cli.results import InputReport

    rows = [
        InputReport(
            0,
            "an_argument_with_a_long_name",
            [64, 128],
            "float64",
            Status.FAIL,
            numel=8192,
            mismatched=8192,
            max_abs_err=1.5,
            max_rel_err=1.0,
            worst_index=[3, 7],
            worst_output="output 0 [3, 7]",
            analytical=2.0,
            numerical=1.0,
            atol=1e-5,
            rtol=1e-3,
            diagnosis="analytical is 2.00x numerical everywhere",
        )
    ]
    check = CheckResult(
        "backward", Status.FAIL, "gradient of 'an_argument_with_a_long_name' is wrong", "elementwise", rows
    )
    return Report(
        [
            CaseResult(
                "specs/w.yaml::default[cpu]",
                "specs/w.yaml",
                "default",
                "pkg.mod:W",
                "cpu",
                0,
                Status.FAIL,
                0.1,
                None,
                [check],
            )
        ],
        0.1,
    )


@pytest.mark.parametrize("color", [False, True], ids=["no colour", "colour"])
def test_on_a_terminal_the_table_is_as_wide_as_the_terminal_coloured_or_not(color, monkeypatch):
    """Issue 31 item 2: with NO_COLOR at 80 columns rows were about 197 columns wide (width 1000 without colour)."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    stream = Terminal()
    table.render(wide_report(), stream, color=color)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue()).splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)


def test_in_a_pipe_the_table_is_never_wrapped_and_has_no_trailing_padding(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    lines = rendered(table.render, wide_report(), color=False).splitlines()
    assert max(len(line) for line in lines) > 80  # one line per argument, greppable
    assert all(line == line.rstrip() for line in lines), [line for line in lines if line != line.rstrip()]
    assert any(line.startswith("0: an_argument_with_a_long_name") for line in lines)


def test_a_column_empty_in_every_row_is_left_out_and_opcheck_rows_are_tests():
    """issue 31 item 6: opcheck tables carried 8 empty gradient columns"""
    from gradcheck_cli.results import InputReport

    tests = [InputReport(0, name, [], "-", Status.PASS, role="test") for name in ("test_schema", "test_faketensor")]
    check = CheckResult("opcheck", Status.PASS, "all pass", "torch.library.opcheck", tests)
    out = rendered(
        table.render,
        Report(
            [
                CaseResult(
                    "specs/o.yaml::default[cpu]",
                    "specs/o.yaml",
                    "default",
                    "torch.ops.ns.op",
                    "cpu",
                    0,
                    Status.PASS,
                    0.1,
                    None,
                    [check],
                )
            ],
            0.1,
        ),
        color=False,
        verbosity=table.Verbosity.VERBOSE,
    )
    header = next(line for line in out.splitlines() if line.startswith("test "))
    assert header.split() == ["test", "┃", "status"], header
    assert "max abs err" not in out and "tolerance" not in out
    full = rendered(table.render, wide_report(), color=False, verbosity=table.Verbosity.VERBOSE)
    assert all(t in full for t in ("max abs err", "worst at", "tolerance"))  # a table with numbers keeps them
