"""Human report: one rich table per (spec, case, device) and check, one row per argument."""
from __future__ import annotations

import io
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..printable import printable
from ..results import COLUMNS, CaseResult, CheckResult, Report, Status, cells, titles
from . import writable

STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.ERROR: "bold magenta", Status.SKIP: "yellow",
         Status.XFAIL: "cyan"}
LABEL = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.ERROR: "ERROR", Status.SKIP: "SKIP", Status.XFAIL: "XFAIL"}


def check_table(check: CheckResult) -> Table:
    table = Table(title=f"{check.check} ({check.mode})" if check.mode else check.check, title_justify="left",
                  show_edge=False, pad_edge=False, header_style="bold")
    for col, align in zip(titles(check), COLUMNS.values()):
        table.add_column(col, justify="right" if align == ">" else "left")
    for row in check.inputs:
        values = cells(row)
        status = Text(values[3], style="dim" if row.status is Status.SKIP else STYLE[row.status])
        table.add_row(*values[:3], status, *values[4:])
    return table


def case_parts(result: CaseResult) -> list[RenderableType]:
    """What the report shows of one result, top to bottom: its head line, error, tables, messages,
    warnings, replay command and a blank line."""
    result = printable(result)  # text from user code may hold lone surrogates
    head = Text()
    head.append(f"{LABEL[result.status]:5} ", style=STYLE[result.status])
    head.append(result.id, style="bold")
    if result.function:
        head.append(f"  {result.function}  seed {result.seed}  {result.duration_s:.2f}s", style="dim")
    parts: list[RenderableType] = [head]
    if result.error:
        parts.append(Text(f"  {result.error.kind} error: {result.error.message}", style=STYLE[Status.ERROR]))
        if result.error.where:
            parts.append(Text(f"  at {result.error.where}", style="dim"))
    for check in result.checks:
        if check.inputs:
            parts.append(check_table(check))
        if check.message:
            style = STYLE[check.status] if check.status is not Status.PASS else "dim"
            parts.append(Text(f"  {check.check}: {check.message}", style=style))
        parts += [Text(f"  warning: {warning}", style="yellow") for warning in check.warnings]
    parts += [Text(f"  warning: {warning}", style="yellow") for warning in result.warnings]
    if result.replay and result.status in (Status.FAIL, Status.ERROR):
        parts.append(Text(f"  replay: {result.replay}", style="cyan"))
    return [*parts, Text()]


def render_case(result: CaseResult, console: Console) -> None:
    for part in case_parts(result):
        console.print(part)


def case_group(result: CaseResult) -> Group:
    """One result as one rich renderable (``CaseResult.__rich__``)."""
    return Group(*case_parts(result)[:-1])


def report_group(report: Report) -> Group:
    """A whole report as one rich renderable (``Report.__rich__``): every result, then the summary line."""
    return Group(*(part for result in report.results for part in case_parts(result)), summary_line(report))


def case_text(result: CaseResult) -> str:
    """The plain table of one result (as ``render`` writes it without colour), no trailing blanks."""
    buffer = io.StringIO()
    console = Console(file=buffer, no_color=True, highlight=False, soft_wrap=False, width=1000,
                      force_terminal=False, color_system=None)
    render_case(result, console)
    return "\n".join(line.rstrip() for line in buffer.getvalue().strip("\n").splitlines()) + "\n"


def summary_line(report: Report) -> Text:
    s = report.summary()
    text = Text(f"{s['total']} result{'s' * (s['total'] != 1)}: ")
    parts = [(s["passed"], "passed", Status.PASS), (s["failed"], "failed", Status.FAIL),
             (s["errors"], "errors" if s["errors"] != 1 else "error", Status.ERROR),
             (s["skipped"], "skipped", Status.SKIP)]
    parts += [(s["xfailed"], "xfailed", Status.XFAIL)] if s["xfailed"] else []  # as pytest: only when there are some
    for i, (n, word, status) in enumerate(parts):
        text.append(f"{n} {word}", style=STYLE[status] if n else "")
        text.append(", " if i < len(parts) - 1 else "")
    if s["not_run"]:
        why = f"interrupted by {s['interrupted']}" if s.get("interrupted") else "--fail-fast"
        text.append(f"; {s['not_run']} not run ({why})", style="yellow")
    text.append(f" in {s['duration_s']:.2f}s")
    return text


def render(report: Report, stream: TextIO, color: bool = True) -> None:
    # without colour (a file, a pipe, CI logs) never wrap: one line per argument, greppable
    report = printable(report)
    # colour decided by the caller (reporters.use_color), never by rich from FORCE_COLOR, NO_COLOR or a tty
    console = Console(file=writable(stream), no_color=not color, highlight=False, soft_wrap=False,
                      width=None if color else 1000, force_terminal=color, color_system="auto" if color else None)
    if color and console.color_system is None:  # TERM=dumb: colour was asked for all the same
        console = Console(file=writable(stream), highlight=False, soft_wrap=False, force_terminal=True,
                          color_system="standard")
    for result in report.results:
        render_case(result, console)
    console.print(summary_line(report))
