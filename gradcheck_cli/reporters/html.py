"""HTML report (``--html PATH``): one self-contained page, with no network (inline CSS and SVG, no scripts,
no web fonts). Per case and check: the per-argument table; per mismatching argument: a heatmap of
|analytical - numerical| over its elements and, when small, the two sides next to each other; the replay
command. A passing case folds to one line. ``fragment`` is the same without the page (Jupyter)."""

from __future__ import annotations

import math
import os
from html import escape
from typing import Optional, TextIO, Union

from ..core.printable import printable
from ..results import COLUMNS, CaseResult, CheckResult, ErrorMap, InputReport, Report, Status, cells, titles
from ..version import __version__
from .json_ import torch_version
from .table import summary_line

WRAP = 64  # a one-row map (a 1-d argument) wider than this is drawn in rows of this many cells
SIZE = 480  # pixels the longer side of a map aims at
SHOWN_INDICES = 20  # mismatching indices written out under a map
HEAT = [(255, 255, 229), (254, 217, 118), (253, 141, 60), (227, 26, 28), (128, 0, 38)]  # 0 -> max
COOL, WARM = (33, 102, 172), (178, 24, 43)  # a side's negative and positive values (white: 0)
NONFINITE = "#3b0a57"

CSS = """
.gradcheck-report{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;max-width:1200px}
.gradcheck-report h1{font-size:1.4em;margin:.2em 0}
.gradcheck-report .summary{font-size:1.05em;margin:.3em 0 1em}
.gradcheck-report section.case{border:1px solid #d0d7de;border-radius:6px;padding:.4em .8em;margin:.8em 0}
.gradcheck-report .head{font-weight:600}
.gradcheck-report .dim{color:#656d76;font-weight:normal}
.gradcheck-report .badge{display:inline-block;min-width:3.6em;text-align:center;border-radius:4px;color:#fff;
 padding:0 .3em;margin-right:.5em;font-size:.9em}
.gradcheck-report .pass{background:#1a7f37}.gradcheck-report .fail{background:#cf222e}
.gradcheck-report .error{background:#8250df}.gradcheck-report .skip{background:#9a6700}
.gradcheck-report .xfail{background:#0969da}
.gradcheck-report .scroll{overflow-x:auto}
.gradcheck-report table{border-collapse:collapse;margin:.4em 0;font-size:.9em}
.gradcheck-report th,.gradcheck-report td{border-bottom:1px solid #d0d7de;padding:.15em .6em;vertical-align:top}
.gradcheck-report td.num{text-align:right;font-family:ui-monospace,Menlo,Consolas,monospace;white-space:nowrap}
.gradcheck-report td:nth-child(-n+3){white-space:nowrap}.gradcheck-report td.status{min-width:6em;max-width:28em}
.gradcheck-report td.st-fail{color:#cf222e;font-weight:600}.gradcheck-report td.st-skip{color:#656d76}
.gradcheck-report .message{margin:.3em 0}.gradcheck-report .warning{color:#9a6700}
.gradcheck-report pre{background:#f6f8fa;padding:.4em .6em;overflow-x:auto;white-space:pre;margin:.3em 0}
.gradcheck-report section.argument{margin:.6em 0 .9em;padding-left:.6em;border-left:3px solid #cf222e}
.gradcheck-report .maps{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start;overflow-x:auto}
.gradcheck-report figure{margin:0}
.gradcheck-report figcaption{font-size:.85em;color:#444;max-width:260px}
.gradcheck-report .indices{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em;color:#444}
"""


def write(report: Report, path: Union[str, os.PathLike[str]]) -> None:
    """Write the HTML page of ``report`` to the file ``path`` (UTF-8), replacing it."""
    with open(path, "w", encoding="utf-8", newline="\n") as stream:
        render(report, stream)


def render(report: Report, stream: TextIO, color: bool = True) -> None:
    stream.write(page(report))


def page(report: Report) -> str:
    """The whole page: a head, the summary, then every result."""
    failed = sum(r.status in (Status.FAIL, Status.ERROR) for r in report.results)
    title = f"gradcheck report: {len(report.results)} results, {failed} failed or errors"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n</head>\n<body>\n{fragment(report.results, report)}\n</body>\n</html>\n"
    )


def fragment(results: list[CaseResult], report: Optional[Report] = None) -> str:
    """The report's body in one ``div`` with its own style: the summary (given ``report``) and ``results``."""
    parts = [f'<div class="gradcheck-report"><style>{CSS}</style>']
    if report is not None:
        parts.append(
            f'<h1>gradcheck-cli report</h1><div class="summary">{escape(summary_line(report).plain)}'
            f' <span class="dim">(gradcheck-cli {__version__}, torch {torch_version()})</span></div>'
        )
    parts += [_case(printable(r)) for r in results]
    return "\n".join(parts) + "</div>"


def _case(result: CaseResult) -> str:
    status = result.status.value
    head = (
        f'<span class="badge {status}">{status.upper()}</span>{escape(result.id)}'
        f' <span class="dim">{escape(result.function)} &middot; seed {result.seed} &middot; '
        f"{result.duration_s:.2f}s</span>"
    )
    body: list[str] = []
    if result.error:
        body.append(f'<div class="message">{escape(f"{result.error.kind} error: {result.error.message}")}</div>')
        if result.error.where:
            body.append(f'<div class="dim">at {escape(result.error.where)}</div>')
    for check in result.checks:
        body.append(_check(check))
    body += [f'<div class="warning">warning: {escape(w)}</div>' for w in result.warnings]
    if result.replay and result.status in (Status.FAIL, Status.ERROR):
        body.append(f'<div>replay:</div><pre class="replay"><code>{escape(result.replay)}</code></pre>')
    if result.shrunk is not None:
        body.append(f"<div>shrunk: {escape(result.shrunk.words())}</div>")
        if result.shrunk.replay:
            body.append(f'<pre class="replay"><code>{escape(result.shrunk.replay)}</code></pre>')
    if result.status in (Status.PASS, Status.SKIP, Status.XFAIL) and not result.error:
        return (
            f'<section class="case"><details><summary class="head">{head}</summary>{"".join(body)}</details></section>'
        )
    return f'<section class="case"><div class="head">{head}</div>{"".join(body)}</section>'


def _check(check: CheckResult) -> str:
    out = [f"<h3>{escape(check.check)}{f' ({escape(check.mode)})' if check.mode else ''}</h3>"]
    if check.inputs:
        out.append(_table(check))
    if check.message:
        out.append(f'<div class="message">{escape(f"{check.check}: {check.message}")}</div>')
    out += [f'<div class="warning">warning: {escape(w)}</div>' for w in check.warnings]
    out += [_argument(check, row) for row in check.inputs if row.error_map is not None]
    return "".join(out)


def _table(check: CheckResult) -> str:
    """The per-argument table, with the cells the table report shows."""
    head = "".join(f"<th>{escape(t)}</th>" for t in titles(check))
    rows = []
    for row in check.inputs:
        tds = []
        for text, align in zip(cells(row), COLUMNS.values()):
            tds.append(f'<td class="num">{escape(text)}</td>' if align == ">" else f"<td>{escape(text)}</td>")
        tds[3] = tds[3].replace("<td>", f'<td class="status st-{row.status.value}">', 1)
        rows.append(f"<tr>{''.join(tds)}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _argument(check: CheckResult, row: InputReport) -> str:
    """One mismatching argument: its heatmaps and where its first mismatches are."""
    picture = row.error_map
    assert picture is not None
    label = row.name if row.role in ("output", "test") else f"{row.index}: {row.name}"
    count = f"{row.mismatched} of {row.numel} element{'s' * (row.numel != 1)} mismatch" if row.mismatched else ""
    down = (
        f"; each cell is the max over {picture.block[0]} x {picture.block[1]} elements"
        if picture.block != [1, 1]
        else ""
    )
    other = "reference" if check.check == "reference" else "numerical"
    mine = "target" if check.check == "reference" else "analytical"
    outlined = "; outlined: out of tolerance" if _marked(row, picture) else ""
    figures = [
        _figure(_svg(picture, picture.error, row, "heat"), f"|{mine} - {other}| (max over the outputs){down}{outlined}")
    ]
    if picture.analytical is not None and picture.numerical is not None:
        scale = max((abs(v) for v in picture.analytical + picture.numerical if math.isfinite(v)), default=0.0)
        figures += [
            _figure(_svg(picture, picture.analytical, row, "side", scale), f"{mine}: {picture.sides}"),
            _figure(_svg(picture, picture.numerical, row, "side", scale), f"{other}"),
        ]
    indices = ""
    if row.mismatched_indices:
        shown = ", ".join(str(ix) for ix in row.mismatched_indices[:SHOWN_INDICES])
        more = (
            f", ... ({len(row.mismatched_indices)} listed in the JSON report, of {row.mismatched})"
            if (row.mismatched or 0) > SHOWN_INDICES
            else ""
        )
        indices = f'<div class="indices">mismatching: {escape(shown + more)}</div>'
    diagnosis = f'<div class="message">{escape(row.diagnosis)}</div>' if row.diagnosis else ""
    return (
        f'<section class="argument"><h4>{escape(check.check)} &middot; {escape(label)} '
        f'{escape(str(row.shape))} <span class="dim">{escape(count)}</span></h4>{diagnosis}'
        f'<div class="maps">{"".join(figures)}</div>{indices}</section>'
    )


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _svg(picture: ErrorMap, values: list[float], row: InputReport, kind: str, scale: float = 0.0) -> str:
    """One map as an SVG of rectangles, each with its element (or block) and value as a tooltip; a cell is
    as wide and high as the elements it stands for, so a downsampled map keeps the argument's proportions."""
    h, w = picture.height, picture.width
    bh, bw = picture.block
    wrap = h == 1 and w > WRAP
    shown_h, shown_w = (math.ceil(w / WRAP), WRAP) if wrap else (h, w)
    unit = min(24 / max(bh, bw), SIZE / max(shown_h * bh, shown_w * bw))  # pixels per element
    unit = max(unit, 3 / min(bh, bw))
    ch, cw = bh * unit, bw * unit
    top = max((v for v in values if math.isfinite(v)), default=0.0) if kind == "heat" else scale
    marked = _marked(row, picture)
    rects = []
    for k, value in enumerate(values):
        r, c = divmod(k, w)
        y, x = divmod(c, WRAP) if wrap else (r, c)
        fill = _heat(value, top) if kind == "heat" else _diverging(value, top)
        stroke = ' stroke="#000" stroke-width="1"' if (r, c) in marked and kind == "heat" else ""
        rects.append(
            f'<rect x="{x * cw:.6g}" y="{y * ch:.6g}" width="{cw:.6g}" height="{ch:.6g}" '
            f'fill="{fill}"{stroke}><title>{escape(_where(picture, row, r, c))}: {_number(value)}'
            "</title></rect>"
        )
    width, height = shown_w * cw, shown_h * ch
    frame = (
        f'<rect x="0" y="0" width="{width:.6g}" height="{height:.6g}" fill="none" stroke="#8c959f" stroke-width="0.5"/>'
    )
    legend = (
        f'<text x="0" y="{height + 14:.6g}" font-size="11">'
        + (f"0 .. {_number(top)}" if kind == "heat" else f"-{_number(top)} .. {_number(top)}")
        + (f" (wrapped every {WRAP})" if wrap else "")
        + "</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(width, 160):.6g}" '
        f'height="{height + 18:.6g}" role="img">{"".join(rects)}{frame}{legend}</svg>'
    )


def _marked(row: InputReport, picture: ErrorMap) -> set[tuple[int, int]]:
    """The map cells of the listed mismatching elements, where each cell is one element."""
    if picture.block != [1, 1] or not row.mismatched_indices:
        return set()
    out = set()
    for ix in row.mismatched_indices:
        flat = 0
        for i, size in zip(ix, row.shape):
            flat = flat * size + i
        out.add(divmod(flat, picture.cols))
    return out


def _where(picture: ErrorMap, row: InputReport, r: int, c: int) -> str:
    """The element (or elements) cell (r, c) stands for, e.g. ``x[2, 3]`` or ``x rows 0-7, cols 8-15``."""
    bh, bw = picture.block
    if (bh, bw) == (1, 1):
        flat = r * picture.cols + c
        index = []
        for size in reversed(row.shape):
            flat, i = divmod(flat, size)
            index.append(i)
        return f"{row.name}{index[::-1]}"
    rows = f"{r * bh}-{min(picture.rows, (r + 1) * bh) - 1}"
    cols = f"{c * bw}-{min(picture.cols, (c + 1) * bw) - 1}"
    return f"{row.name} rows {rows}, cols {cols}"


def _number(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else str(value)


def _heat(value: float, top: float) -> str:
    """A colour from light yellow (0) to dark red (``top``); non-finite values stand out in violet."""
    if not math.isfinite(value):
        return NONFINITE
    t = value / top if top > 0 else 0.0
    pos = min(max(t, 0.0), 1.0) * (len(HEAT) - 1)
    i = min(int(pos), len(HEAT) - 2)
    return _mix(HEAT[i], HEAT[i + 1], pos - i)


def _diverging(value: float, top: float) -> str:
    """Blue for negative, white for 0, red for positive values, by their size against ``top``."""
    if not math.isfinite(value):
        return NONFINITE
    t = min(abs(value) / top, 1.0) if top > 0 else 0.0
    return _mix((255, 255, 255), WARM if value > 0 else COOL, t)


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))
