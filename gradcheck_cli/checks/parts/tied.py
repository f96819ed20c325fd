"""The corners of one comparison judged together (``numerics.ties``), and the rows it fails: backward's and
forward_ad's (their elements at a corner, from ``kinks``, collected in a ``ties.Held``)."""

from __future__ import annotations

from typing import Any, Optional

from ...core.tolerance import Tolerance
from ...numerics import ties, unravel
from ...results import InputReport, Pattern, Status


def judge(
    rows: list[InputReport],
    corners: list[ties.Corner],
    forward: Any,
    plain: list[Any],
    positions: list[int],
    tol: Tolerance,
    derivative: str = "backward's gradients",
) -> None:
    """The corners of one comparison judged together (``numerics.ties``): where backward's gradients over
    a tie sum to more or less than moving its elements together allows, each passing row with an element
    in it fails, those elements its mismatches (pattern KINK: wrong at a kink or tie); the first says why,
    the others point to it. ``derivative`` names the analytical columns in the words
    ("the derivatives jvp gives")."""
    if not any(rows[c.argument].status is Status.PASS for c in corners):
        return
    tie = ties.examine(forward, plain, corners, tol.eps, positions, atol=tol.atol, rtol=tol.rtol, derivative=derivative)
    if tie is None:
        return
    first: Optional[InputReport] = None
    for i in dict.fromkeys(corners[k].argument for k in tie.members):
        row = rows[i]
        if row.status is not Status.PASS:
            continue
        mine = [corners[k] for k in tie.members if corners[k].argument == i]
        per = 2 if mine[0].x.is_complex() else 1
        elements = sorted({c.j // per for c in mine})
        row.status, row.pattern, row.ratio, row.reason = Status.FAIL, Pattern.KINK, None, None
        row.mismatched, row.at_kinks = len(elements), max(0, row.at_kinks - len(elements))
        row.diagnosis = tie.text if first is None else f"{tie.short} (see '{first.name}')"
        if row.at_kinks:
            row.diagnosis += (
                f"; its {row.at_kinks} other elements at kinks or ties not judged tie by tie (one wrong tie "
                "decides the fail)"
            )
        first = first or row
        if row.mismatched_indices is not None:
            row.mismatched_indices = [unravel(e, tuple(mine[0].x.shape)) for e in elements]
