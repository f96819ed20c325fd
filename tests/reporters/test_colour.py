"""Colour: the --color/--no-color flag, then NO_COLOR, then FORCE_COLOR, then whether stdout is a
terminal; machine formats never colour. The decision is ours: rich must not override it from the
environment."""

from __future__ import annotations

import io
import json

import pytest

from gradcheck_cli import reporters
from gradcheck_cli.reporters import table
from gradcheck_cli.results import CaseResult, CheckResult, Report, Status

ANSI = "\x1b["

# (flag, NO_COLOR, FORCE_COLOR, isatty) -> colour, for the table
TABLE_CASES = [
    # the flag wins over everything
    (True, None, None, False, True),  # --color into a pipe (less -R, CI logs)
    (True, "1", None, False, True),
    (True, "1", "1", True, True),
    (False, None, "1", True, False),  # --no-color beats FORCE_COLOR
    (False, None, None, True, False),
    # then NO_COLOR (any non-empty value), which beats FORCE_COLOR
    (None, "1", None, True, False),
    (None, "0", None, True, False),  # any non-empty value, as no-color.org says
    (None, "1", "1", True, False),
    (None, "", None, True, True),  # empty: as if unset
    # then FORCE_COLOR
    (None, None, "1", False, True),
    (None, "", "1", False, True),
    (None, None, "", False, False),  # empty: as if unset
    # then the terminal
    (None, None, None, True, True),
    (None, None, None, False, False),
]


def _env(no_color: str | None, force_color: str | None) -> dict[str, str]:
    env = {"TERM": "xterm"}
    if no_color is not None:
        env["NO_COLOR"] = no_color
    if force_color is not None:
        env["FORCE_COLOR"] = force_color
    return env


@pytest.mark.parametrize("flag, no_color, force_color, isatty, expected", TABLE_CASES)
def test_table_colour_follows_flag_then_environment_then_terminal(flag, no_color, force_color, isatty, expected):
    assert reporters.use_color(flag, "table", _env(no_color, force_color), isatty) is expected


@pytest.mark.parametrize("fmt", ["json", "github", "junit"])
@pytest.mark.parametrize("flag, no_color, force_color, isatty", [c[:4] for c in TABLE_CASES])
def test_machine_formats_are_never_coloured(fmt, flag, no_color, force_color, isatty):
    assert reporters.use_color(flag, fmt, _env(no_color, force_color), isatty) is False


def test_a_dumb_terminal_is_not_coloured_unless_asked():
    assert reporters.use_color(None, "table", {"TERM": "dumb"}, True) is False
    assert reporters.use_color(True, "table", {"TERM": "dumb"}, False) is True


def _report() -> Report:
    return Report(
        [
            CaseResult(
                "specs/a.yaml::default[cpu]",
                "specs/a.yaml",
                "default",
                "m:F",
                "cpu",
                0,
                Status.FAIL,
                0.1,
                None,
                [CheckResult("backward", Status.FAIL, "wrong")],
                line=1,
            )
        ]
    )


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"FORCE_COLOR": "1"},
        {"NO_COLOR": "1"},
        {"FORCE_COLOR": "1", "NO_COLOR": "1"},
        {"TERM": "dumb"},
        {"TTY_COMPATIBLE": "1"},
        {"TTY_COMPATIBLE": "0"},
    ],
)
@pytest.mark.parametrize("fmt", ["table", "github"])
def test_rich_does_not_override_the_decision_from_the_environment(env, fmt, monkeypatch):
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for color in (True, False):
        out = io.StringIO()  # not a terminal
        reporters.get(fmt)(_report(), out, color)
        assert (ANSI in out.getvalue()) is (color and fmt == "table"), (color, out.getvalue())


SPEC = """
function: gradcheck_cli.examples.relu:ReLU
inputs: [{shape: [4], avoid: [[-0.01, 0.01]]}]
"""


@pytest.mark.parametrize(
    "args, env, coloured",
    [
        (["--color"], {}, True),  # stdout is a pipe here: --color forces colour all the same
        (["--color"], {"NO_COLOR": "1"}, True),
        (["--no-color"], {"FORCE_COLOR": "1"}, False),
        ([], {"FORCE_COLOR": "1"}, True),
        ([], {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ([], {}, False),  # a pipe, nothing asked
        (["--format", "github"], {"FORCE_COLOR": "1"}, False),
        (["--format", "github", "--color"], {"FORCE_COLOR": "1"}, False),
        (["--format", "json", "--color"], {"FORCE_COLOR": "1"}, False),
    ],
)
def test_command_line_colour(args, env, coloured, write_spec, invoke, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    write_spec(SPEC, "relu.yaml")
    result = invoke("relu.yaml", "--no-isolate", "--junit-xml", "junit.xml", *args)
    assert result.exit_code == 0, result.output
    assert (ANSI in result.stdout) is coloured, result.stdout
    assert "relu.yaml::default[cpu]" in result.stdout
    assert ANSI not in (tmp_path / "junit.xml").read_text(encoding="utf-8")
    if "json" in args:
        json.loads(result.stdout)


def test_table_colour_is_the_table_text_plus_codes():
    plain, coloured = io.StringIO(), io.StringIO()
    table.render(_report(), plain, color=False)
    table.render(_report(), coloured, color=True)
    assert ANSI not in plain.getvalue() and ANSI in coloured.getvalue()
    assert "FAIL  specs/a.yaml::default[cpu]" in plain.getvalue()
