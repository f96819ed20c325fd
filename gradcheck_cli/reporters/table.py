"""Human report: one rich table per (spec, case, device) and check, one row per argument.

How much is shown is the verbosity (-q, the default, -v); a table wider than the terminal is folded
into one block per argument, so no number is ever cut short.
"""

from __future__ import annotations

import enum
import io
from typing import Optional, TextIO

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from ..core.printable import printable
from ..results import COLUMNS, CaseResult, CheckResult, Report, Status, cells, expected_reason, titles
from . import writable


class Verbosity(enum.IntEnum):
    """How much of a run the table shows: failing cases in full always, the others less or more."""

    QUIET = -1  # failures and errors in full, then the summary; nothing about passing cases
    NORMAL = 0  # also one line per other case (with its warnings, skip reasons, expect reasons)
    VERBOSE = 1  # every case in full


FULL = (Status.FAIL, Status.ERROR)  # shown in full at every verbosity

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.SKIP: "yellow",
    Status.XFAIL: "cyan",
}
LABEL = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.ERROR: "ERROR", Status.SKIP: "SKIP", Status.XFAIL: "XFAIL"}


def title(check: CheckResult) -> str:
    return f"{check.check} ({check.mode})" if check.mode else check.check


def check_table(check: CheckResult) -> Table:
    """A check's table, one row per argument; a column empty (``-``) in every row is left out (an opcheck
    table's rows are tests, with no gradient columns; a check that compared nothing has no numbers)."""
    table = Table(title=title(check), title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
    rows = [cells(row) for row in check.inputs]
    shown = [j for j in range(len(COLUMNS)) if j in (0, 3) or not rows or any(r[j] != "-" for r in rows)]
    for j, (col, align) in enumerate(zip(titles(check), COLUMNS.values())):
        if j in shown:
            table.add_column(col, justify="right" if align == ">" else "left")
    for row, values in zip(check.inputs, rows):
        status = Text(values[3], style="dim" if row.status is Status.SKIP else STYLE[row.status])
        table.add_row(*(status if j == 3 else values[j] for j in shown))
    return table


def folded(check: CheckResult, width: int) -> list[Text]:
    """The table of ``check`` as one block per argument, for a terminal too narrow for the table: the
    argument's name, shape, dtype and status, then "column: value" pairs, as many to a line as fit in
    ``width`` (a pair is never split)."""
    lines = [Text(title(check), style="bold")]
    for row in check.inputs:
        values = cells(row)
        head = Text(f"  {'  '.join(values[:3])}  ")
        head.append(values[3], style="dim" if row.status is Status.SKIP else STYLE[row.status])
        lines.append(head)
        line = Text()
        for name, value in zip(titles(check)[4:], values[4:]):
            if value == "-":
                continue
            if line and len(line) + 3 + len(name) + 2 + len(value) > width:
                lines.append(line)
                line = Text()
            line.append("   " if line else "    ")
            line.append(f"{name}: ", style="dim")
            line.append(value)
        if line:
            lines.append(line)
    return lines


class CheckView:
    """The table of a check, folded per argument when wider than where it is printed (a rich renderable)."""

    def __init__(self, check: CheckResult) -> None:
        self.check = check

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = check_table(self.check)
        natural = console.measure(table, options=options.update_width(2**16)).maximum  # unclamped
        if natural <= options.max_width:
            yield table
        else:
            yield from folded(self.check, options.max_width)


class Command(Text):
    """A command to paste and run: printed on one line, however long."""


def head_line(result: CaseResult) -> Text:
    """A result in one line: status, id, and (for a case that ran) function, seed and time."""
    head = Text()
    head.append(f"{LABEL[result.status]:5} ", style=STYLE[result.status])
    head.append(result.id, style="bold")
    if result.function:
        head.append(f"  {result.function}  seed {result.seed}  {result.duration_s:.2f}s", style="dim")
    return head


def render_brief(result: CaseResult, console: Console) -> None:
    """A case that did not fail in a line, and what still needs reading: its warnings, why it was
    skipped, why its mismatch is expected."""
    result = printable(result, terminal=True)
    console.print(head_line(result))
    if result.status is Status.SKIP:
        reasons = [f"{c.check}: {c.message}" for c in result.checks if c.message]
        for reason in reasons or ([result.error.message] if result.error else []):
            console.print(Text(f"  {reason}", style=STYLE[Status.SKIP]))
    if result.status is Status.XFAIL:
        console.print(Text(f"  expected: {expected_reason(result)}", style=STYLE[Status.XFAIL]))
    for warning in dict.fromkeys([w for c in result.checks for w in c.warnings] + result.warnings):  # each once
        console.print(Text(f"  warning: {warning}", style="yellow"))


TRACEBACKS = ("short", "long", "line", "no")  # --tb, as pytest's


def case_parts(result: CaseResult, tb: str = "short") -> list[RenderableType]:
    """What the report shows of one result in full, top to bottom: its head line, error (with the user's
    traceback as ``tb`` says: ``short`` every frame of the user's code, ``long`` with their source lines,
    ``line`` the innermost, ``no`` none), tables, messages, warnings, replay command and a blank line."""
    result = printable(result, terminal=True)  # user text: lone surrogates, terminal control sequences
    parts: list[RenderableType] = [head_line(result)]
    if result.error:
        parts.append(Text(f"  {result.error.kind} error: {result.error.message}", style=STYLE[Status.ERROR]))
        parts += [Text(line, style="dim") for line in _traceback(result.error.where, result.error.traceback, tb)]
    for check in result.checks:
        if check.inputs:
            parts.append(CheckView(check))
        if check.message:
            style = STYLE[check.status] if check.status is not Status.PASS else "dim"
            parts.append(Text(f"  {check.check}: {check.message}", style=style))
        parts += [Text(f"  warning: {warning}", style="yellow") for warning in check.warnings]
    parts += [Text(f"  warning: {warning}", style="yellow") for warning in result.warnings]
    if result.replay and result.status in (Status.FAIL, Status.ERROR):
        parts.append(Command(f"  replay: {result.replay}", style="cyan"))
    if result.shrunk is not None:
        parts.append(Command(f"  {result.shrunk.line()}", style="cyan"))
    return [*parts, Text()]


def _traceback(where: Optional[str], frames: list[str], tb: str) -> list[str]:
    """The lines under an error that say where in the user's code it arose (``case_parts``)."""
    if tb == "no" or not where and not frames:
        return []
    if tb == "line" or len(frames) <= 1 and tb == "short":
        return [f"  at {where or frames[-1]}"]
    lines = ["  traceback (your code, innermost last):"]
    for frame in frames:
        lines.append(f"    {frame}")
        if tb == "long":
            lines += [f"      {text}" for text in _source(frame)]
    return lines


def _source(frame: str) -> list[str]:
    """Two lines of source before a frame's line (``path:line in function (code)``), as they are on disk."""
    import linecache

    path, _, rest = frame.partition(":")
    number = int(rest.split(" ", 1)[0]) if rest.split(" ", 1)[0].isdigit() else 0
    return [
        linecache.getline(path, k).rstrip()
        for k in range(max(1, number - 2), number)
        if linecache.getline(path, k).strip()
    ]


def render_case(result: CaseResult, console: Console, tb: str = "short") -> None:
    """A case in full: every check's table and message, warnings, and the replay command of a failure."""
    for part in case_parts(result, tb):
        # soft_wrap: a command is never broken by a newline (pasted, it must run)
        console.print(part, soft_wrap=isinstance(part, Command))


def case_group(result: CaseResult) -> Group:
    """One result as one rich renderable (``CaseResult.__rich__``)."""
    return Group(*case_parts(result)[:-1])


def report_group(report: Report) -> Group:
    """A whole report as one rich renderable (``Report.__rich__``): every result, then the summary line."""
    return Group(*(part for result in report.results for part in case_parts(result)), summary_line(report))


def case_text(result: CaseResult) -> str:
    """The plain table of one result (as ``render`` writes it without colour), no trailing blanks."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        no_color=True,
        highlight=False,
        soft_wrap=False,
        width=1000,
        force_terminal=False,
        color_system=None,
    )
    render_case(result, console)
    return "\n".join(line.rstrip() for line in buffer.getvalue().strip("\n").splitlines()) + "\n"


def summary_line(report: Report) -> Text:
    s = report.summary()
    text = Text(f"{s['total']} result{'s' * (s['total'] != 1)}: ")
    parts = [
        (s["passed"], "passed", Status.PASS),
        (s["failed"], "failed", Status.FAIL),
        (s["errors"], "errors" if s["errors"] != 1 else "error", Status.ERROR),
        (s["skipped"], "skipped", Status.SKIP),
    ]
    parts += [(s["xfailed"], "xfailed", Status.XFAIL)] if s["xfailed"] else []  # as pytest: only when there are some
    for i, (n, word, status) in enumerate(parts):
        text.append(f"{n} {word}", style=STYLE[status] if n else "")
        text.append(", " if i < len(parts) - 1 else "")
    if s["not_run"]:
        why = f"interrupted by {s['interrupted']}" if s.get("interrupted") else "--fail-fast"
        text.append(f"; {s['not_run']} not run ({why})", style="yellow")
    text.append(f" in {s['duration_s']:.2f}s")
    return text


def render(
    report: Report, stream: TextIO, color: bool = True, verbosity: Verbosity = Verbosity.VERBOSE, tb: str = "short"
) -> None:
    """The report on ``stream``: at ``verbosity`` (every case in full unless told otherwise), then the summary.
    On a terminal, as wide as the terminal (a table too wide for it folds), coloured or not; elsewhere (a
    file, a pipe, CI logs) never wrapped: one line per argument, greppable, without trailing padding."""
    report = printable(report, terminal=True)
    tty = _isatty(stream)
    out = writable(stream) if tty or color else io.StringIO()  # plain text elsewhere: its lines stripped at the end
    # colour decided by the caller (reporters.use_color), never by rich from FORCE_COLOR, NO_COLOR or a tty
    # coloured into a pipe (`--color | less -R`): as wide as COLUMNS or the terminal says, as on one
    width = None if tty or color else 1000
    console = Console(
        file=out,
        no_color=not color,
        highlight=False,
        soft_wrap=False,
        width=width,
        force_terminal=color,
        color_system="auto" if color else None,
    )
    if color and console.color_system is None:  # TERM=dumb: colour was asked for all the same
        console = Console(
            file=out, highlight=False, soft_wrap=False, force_terminal=True, color_system="standard", width=width
        )
    brief = False  # the last thing printed was a one-line result (a full one ends with a blank line)
    for result in report.results:
        if result.status in FULL or verbosity is Verbosity.VERBOSE:
            if brief:
                console.print()
            render_case(result, console, tb)
            brief = False
        elif verbosity is Verbosity.NORMAL:
            render_brief(result, console)
            brief = True
    if brief:
        console.print()
    console.print(summary_line(report))
    if isinstance(out, io.StringIO):
        writable(stream).write("".join(line.rstrip() + "\n" for line in out.getvalue().splitlines()))


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no such method, or a closed stream
        return False
