"""GitHub Actions report: the plain table for the log, then one workflow command per problem.

``::error`` for each failing or error result, ``::notice`` for each expected failure (xfail) and
``::warning`` for each warning; GitHub shows them as annotations on the spec file, at the line of
the failing argument where known.
See https://docs.github.com/actions/reference/workflow-commands-for-github-actions.
"""
from __future__ import annotations

import hashlib
import io
from typing import Optional, TextIO

from ..printable import printable
from ..results import CaseResult, CheckResult, InputReport, Report, Status, expected_reason, num
from . import spec_file, table, writable


def escape_data(text: str) -> str:
    """Escape a command's message the way GitHub's toolkit does (``%``, CR and LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a property value (file, title): as a message, plus ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(kind: str, message: str, file: Optional[str] = None, line: Optional[int] = None,
            title: Optional[str] = None) -> str:
    """One workflow command line, e.g. ``::error file=a.yaml,line=3,title=T::message``.

    ``line`` is given only together with ``file`` (a line of no file means nothing to GitHub).
    """
    props = []
    if file:
        props.append(f"file={escape_property(file)}")
        if line:
            props.append(f"line={line}")
    if title:
        props.append(f"title={escape_property(title)}")
    return f"::{kind}{' ' + ','.join(props) if props else ''}::{escape_data(message)}"


def _failing_rows(result: CaseResult) -> list[tuple[CheckResult, InputReport]]:
    return [(c, row) for c in result.checks if c.status is Status.FAIL for row in c.inputs
            if row.status is Status.FAIL]


def _row_text(row: InputReport) -> str:
    """One failing argument in one line: where, how much, and the pattern in words."""
    text = f"argument {row.index} '{row.name}' {row.shape}"
    if row.mismatched is None:
        return text + (f": {row.reason}" if row.reason else ": fail")
    text += f": {row.mismatched} of {row.numel} elements out of tolerance"
    text += f", max abs err {num(row.max_abs_err)}, max rel err {num(row.max_rel_err)}"
    if row.worst_index is not None:
        text += f", worst at {row.worst_index}"
    if row.analytical is not None:
        text += f" (analytical {num(row.analytical)} vs numerical {num(row.numerical)})"
    return text + (f": {row.diagnosis}" if row.diagnosis else "")


def _fail_message(result: CaseResult) -> str:
    lines = []
    for check in result.checks:
        if check.status is not Status.FAIL:
            continue
        lines.append(f"{check.check}: {check.message}" if check.message else f"{check.check} failed")
        lines += [f"  {_row_text(row)}" for row in check.inputs if row.status is Status.FAIL]
    if result.replay:
        lines.append(f"replay: {result.replay}")
    return "\n".join(lines)


def _error_message(result: CaseResult) -> str:
    assert result.error is not None
    lines = [f"{result.error.kind} error: {result.error.message}"]
    if result.error.where:
        lines.append(f"at {result.error.where}")
    if result.replay:
        lines.append(f"replay: {result.replay}")
    return "\n".join(lines)


def commands(report: Report) -> list[str]:
    """The workflow commands for ``report``, one per line, in result order."""
    out = []
    for result in report.results:
        file = spec_file(result)
        if result.status is Status.FAIL:
            rows = [row.line for _, row in _failing_rows(result) if row.line]
            line = rows[0] if rows else result.line
            out.append(command("error", _fail_message(result), file, line, f"gradcheck fail: {result.id}"))
        elif result.status is Status.ERROR:
            kind = result.error.kind if result.error else "unknown"
            message = _error_message(result) if result.error else "could not be checked"
            out.append(command("error", message, file, result.line, f"gradcheck {kind} error: {result.id}"))
        elif result.status is Status.XFAIL:
            out.append(command("notice", f"expected failure: {expected_reason(result)}", file, result.line,
                               f"gradcheck xfail: {result.id}"))
        warnings = [f"{c.check}: {w}" for c in result.checks for w in c.warnings] + result.warnings
        out += [command("warning", w, file, result.line, f"gradcheck warning: {result.id}") for w in warnings]
    return out


def render(report: Report, stream: TextIO, color: bool = False) -> None:
    """The plain table (never coloured: Actions logs), then the annotations.

    The table is fenced with ``::stop-commands::``, so text from user code in it (an exception
    message starting with ``::``) can never run as a workflow command.
    """
    report, stream = printable(report), writable(stream)  # user text: lone surrogates, a narrow encoding
    text = io.StringIO()
    table.render(report, text, color=False)
    token = hashlib.sha256(text.getvalue().encode("utf-8")).hexdigest()[:16]
    stream.write(f"::stop-commands::{token}\n{text.getvalue()}::{token}::\n")
    for line in commands(report):
        stream.write(line + "\n")
