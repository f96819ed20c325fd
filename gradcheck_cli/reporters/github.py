"""GitHub Actions report: the plain table for the log, then one workflow command per problem.

``::error`` for each failing or error result, ``::notice`` for each expected failure (xfail) and
``::warning`` for each warning; GitHub shows them as annotations on the spec file, at the line of
the failing argument where known, and for an exception in user code also at the line of the
user's ``.py`` file that raised. Each case's table sits in a ``::group::`` (folded in the log).
``step_summary`` is the Markdown the command line appends to ``$GITHUB_STEP_SUMMARY``.
See https://docs.github.com/actions/reference/workflow-commands-for-github-actions.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
from typing import Optional, TextIO

from ..core.printable import printable
from ..results import CaseResult, CheckResult, InputReport, Report, Status, expected_reason, num
from . import spec_file, table, writable


def escape_data(text: str) -> str:
    """Escape a command's message the way GitHub's toolkit does (``%``, CR and LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a property value (file, title): as a message, plus ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(
    kind: str, message: str, file: Optional[str] = None, line: Optional[int] = None, title: Optional[str] = None
) -> str:
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
    return [(c, row) for c in result.checks if c.status is Status.FAIL for row in c.inputs if row.status is Status.FAIL]


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
    if result.shrunk is not None:
        lines.append(result.shrunk.line())
    return "\n".join(lines)


def _error_message(result: CaseResult) -> str:
    assert result.error is not None
    lines = [f"{result.error.kind} error: {result.error.message}"]
    if result.error.where:
        lines.append(f"at {result.error.where}")
    if result.replay:
        lines.append(f"replay: {result.replay}")
    return "\n".join(lines)


_WHERE = re.compile(r"(?P<path>[^\n]+?):(?P<line>\d+)(?: \(.*\))?")


def user_location(where: Optional[str]) -> Optional[tuple[str, int]]:
    """(file, line) of ``ErrorInfo.where`` (``path:line (code)``) when it is a file inside the working
    directory (the workspace: GitHub places annotations on the repository's files only)."""
    match = _WHERE.fullmatch(where or "")
    if match is None:
        return None
    path = match["path"]
    if os.path.isabs(path):
        try:
            path = os.path.relpath(path)
        except ValueError:  # another drive (Windows)
            return None
    path = path.replace("\\", "/")
    if path == ".." or path.startswith("../") or os.path.isabs(path):
        return None
    return path, int(match["line"])


SHOWN = 10  # annotations GitHub shows per step and kind (error, warning, notice); it drops the rest silently


def annotations_by_kind(report: Report) -> dict[str, list[str]]:
    """Every workflow command for ``report`` by kind, in result order; for a kind with more than GitHub shows,
    the most useful first: each failing case on its spec line, then each case that could not be checked, then
    the user's line that raised (result order within each)."""
    found: dict[str, list[tuple[int, str]]] = {"error": [], "notice": [], "warning": []}  # (rank, command)
    for result in report.results:
        file = spec_file(result)
        if result.status is Status.FAIL:
            rows = [row.line for _, row in _failing_rows(result) if row.line]
            line = rows[0] if rows else result.line
            found["error"].append(
                (0, command("error", _fail_message(result), file, line, f"gradcheck fail: {result.id}"))
            )
        elif result.status is Status.ERROR:
            kind = result.error.kind if result.error else "unknown"
            message = _error_message(result) if result.error else "could not be checked"
            title = f"gradcheck {kind} error: {result.id}"
            found["error"].append((1, command("error", message, file, result.line, title)))
            at = user_location(result.error.where if result.error else None)
            if at is not None and result.error is not None:  # and at the user's line that raised
                text = f"{kind} error: {result.error.message}\nwhile checking {result.id}"
                found["error"].append((2, command("error", text, at[0], at[1], title)))
        elif result.status is Status.XFAIL:
            text = f"expected failure: {expected_reason(result)}"
            found["notice"].append((0, command("notice", text, file, result.line, f"gradcheck xfail: {result.id}")))
        warnings = [f"{c.check}: {w}" for c in result.checks for w in c.warnings] + result.warnings
        title = f"gradcheck warning: {result.id}"
        found["warning"] += [(0, command("warning", w, file, result.line, title)) for w in warnings]
    return {
        kind: [text for _, text in (sorted(items, key=lambda item: item[0]) if len(items) > SHOWN else items)]
        for kind, items in found.items()
    }


def folded(report: Report) -> dict[str, int]:
    """How many annotations of each kind ``commands`` leaves out (GitHub would drop them)."""
    return _left_out(annotations_by_kind(report))


def _left_out(found: dict[str, list[str]]) -> dict[str, int]:
    return {kind: len(items) - (SHOWN - 1) if len(items) > SHOWN else 0 for kind, items in found.items()}


def commands(report: Report) -> list[str]:
    """The workflow commands for ``report``, one per line: at most ``SHOWN`` of each kind, the most useful first
    (``annotations_by_kind``); where a kind has more, its last says how many were folded into the step summary."""
    out = []
    every = annotations_by_kind(report)
    left_out = _left_out(every)
    for kind, items in every.items():
        if left_out[kind]:
            more = left_out[kind]
            items = items[: SHOWN - 1] + [
                command(
                    kind,
                    f"{more} more {kind} annotations folded (GitHub shows {SHOWN} per step): the step summary and "
                    "the log above hold every result",
                    title=f"gradcheck: {more} more {kind}s",
                )
            ]
        out += items
    return out


def _fenced(text: str) -> str:
    """``text`` between ``::stop-commands::`` and its end token, so text from user code in it (an exception
    message starting with ``::``) can never run as a workflow command."""
    token = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return f"::stop-commands::{token}\n{text}::{token}::\n"


def render(report: Report, stream: TextIO, color: bool = False) -> None:
    """The plain table (never coloured: Actions logs), one folded group per case, then the summary line
    and the annotations. Each case's text is fenced (``_fenced``); its group's title is escaped as
    @actions/core's ``startGroup`` escapes it."""
    report, stream = printable(report, terminal=True), writable(stream)  # user text: lone surrogates, control
    # sequences (a log is shown on a terminal too), a narrow encoding
    for result in report.results:
        stream.write(command("group", f"{table.LABEL[result.status]} {result.id}") + "\n")
        stream.write(_fenced(table.case_text(result)))
        stream.write("::endgroup::\n")
    stream.write(table.summary_line(report).plain + "\n")
    for line in commands(report):
        stream.write(line + "\n")


def _cell(text: object) -> str:
    """A Markdown table cell: one line, ``|`` escaped, HTML's special characters as entities."""
    text = html.escape(str(text), quote=False).replace("|", "\\|")
    return " ".join(text.split())


def _code(text: str) -> str:
    """A code span in a Markdown table cell (backticks longer than any run inside, ``|`` escaped)."""
    ticks = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{ticks} {' '.join(text.split())} {ticks}".replace("|", "\\|")


def step_summary(report: Report) -> str:
    """The Markdown summary of a run for ``$GITHUB_STEP_SUMMARY``: the counts, a table of the failing
    arguments (case, check, argument, pattern, ratio, replay command), and the cases not checked."""
    report = printable(report, terminal=True)
    lines = [f"### gradcheck: {_cell(table.summary_line(report).plain)}", ""]
    failures = []
    for result in report.results:
        replay = _code(result.replay) if result.replay else ""
        for check in result.checks:
            if check.status is not Status.FAIL:
                continue
            rows = [row for row in check.inputs if row.status is Status.FAIL]
            for row in rows:
                pattern = row.pattern.value if row.pattern else ""
                words = row.diagnosis or row.reason or ""
                failures.append(
                    [
                        _cell(result.id),
                        _cell(check.check),
                        _cell(f"{row.index}: {row.name}"),
                        _cell(f"{pattern}: {words}" if pattern and words else pattern or words),
                        _cell(num(row.ratio)) if row.ratio is not None else "",
                        replay,
                    ]
                )
            if not rows:  # a contract problem, not an argument's values
                failures.append([_cell(result.id), _cell(check.check), "", _cell(check.message), "", replay])
    if failures:
        lines += ["| case | check | argument | pattern | ratio | replay |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in failures]
        lines.append("")
    errors = [r for r in report.results if r.status is Status.ERROR and r.error is not None]
    if errors:
        lines += ["| case | error | replay |", "|---|---|---|"]
        lines += [
            f"| {_cell(r.id)} | {_cell(f'{r.error.kind} error: {r.error.message}')} | "
            f"{_code(r.replay) if r.replay else ''} |"
            for r in errors
            if r.error is not None
        ]
        lines.append("")
    warnings = [(r.id, f"{c.check}: {w}") for r in report.results for c in r.checks for w in c.warnings]
    warnings += [(r.id, w) for r in report.results for w in r.warnings]
    if warnings:
        lines += ["| case | warning |", "|---|---|"]
        lines += [f"| {_cell(case)} | {_cell(w)} |" for case, w in warnings]
        lines.append("")
    left_out = folded(report)
    if any(left_out.values()):
        said = ", ".join(f"{n} {kind}{'s' * (n != 1)}" for kind, n in left_out.items() if n)
        lines += [
            f"{said} not shown as annotations (GitHub shows {SHOWN} of each kind per step): every one is above.",
            "",
        ]
    return "\n".join(lines).rstrip("\n") + "\n"


def append_step_summary(report: Report, path: str) -> None:
    """Append the run's Markdown summary to ``path`` (``$GITHUB_STEP_SUMMARY``), as @actions/core's
    ``summary.write()`` does (UTF-8, appended: several steps may write it)."""
    with open(path, "a", encoding="utf-8", newline="\n") as stream:
        stream.write(step_summary(report))
