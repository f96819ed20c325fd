"""What several checks share: comparing two computations of the same values, filling an
argument's row from the comparison, and the SKIP result and one-line verdict of a check.

``batched``, ``undefined_grad`` and ``device_consistency`` compare results that must agree
(batched against looped, undefined against zero grad_outputs, one device against another);
``double_backward`` and ``forward_ad`` share the verdict helpers.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from ..loader import Bound, Target
from ..numerics import Entry, as_tuple, is_float_tensor, unravel
from ..results import CheckResult, InputReport, Status
from . import call_forward, contract

LOOSE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}  # dtype -> (rtol, atol)


def begin(bound: Bound, check: str, mode: str) -> tuple[float, list[InputReport], list[int], CheckResult]:
    """A check's start: the clock, a row per argument, the positions whose gradient it compares
    (the others' rows say why not), and a passing result holding the rows."""
    from .backward import _checked_positions, _skeleton  # at call time: backward imports devices, devices this

    start = time.perf_counter()
    rows = _skeleton(bound)
    checked = _checked_positions(bound, rows)
    return start, rows, checked, CheckResult(check, Status.PASS, mode=mode, inputs=rows)


def differentiable(outputs: tuple) -> list[int]:
    """Positions of the outputs a backward flows through (floating-point tensors that require grad)."""
    return [p for p, o in enumerate(outputs) if is_float_tensor(o) and o.requires_grad]


def graph_forward(target: Target, bound: Bound) -> tuple[list[Any], tuple, list[int]]:
    """Fresh leaves of ``bound``'s values, forward's outputs on them, and the differentiable ones' positions."""
    leaves = contract.fresh_leaves(bound.values)
    outputs = as_tuple(call_forward(target, bound, leaves))
    return leaves, outputs, differentiable(outputs)


# --------------------------------------------------------------- two computations of the same values

def tolerance(dtype: torch.dtype, nondet_tol: float) -> tuple[float, float]:
    """(atol, rtol) for two computations of the same values: torch.allclose's defaults, as torch's
    batched-grad test uses, looser in half precision, and never below the spec's nondet_tol."""
    rtol, atol = LOOSE.get(dtype, (1e-5, 1e-8))
    return max(atol, nondet_tol), rtol


def columns(t: torch.Tensor) -> torch.Tensor:
    """``[M, *shape]`` -> float64 ``[real elements, M]``: a row per real element, as Entry.update takes them."""
    t = t.detach().resolve_conj().cpu()
    real = torch.view_as_real(t) if t.is_complex() else t
    return real.reshape(t.shape[0], -1).t().to(torch.float64).contiguous()


def statistics(a: torch.Tensor, n: torch.Tensor, atol: float, rtol: float) -> Entry:
    """Entry of ``a`` (in the analytical role) against ``n`` (numerical), both as ``columns`` gives them."""
    entry = Entry(a.shape[0], atol, rtol)
    entry.update(a, n, 0, torch.ones(a.shape[1], dtype=torch.float64))
    return entry


def agreement(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> Entry:
    """Statistics of ``got`` against ``want`` (both ``[M, *shape]``): a column per real element,
    a row per leading index. Equal non-finite values (NaN and NaN) count as agreeing."""
    a, n = columns(got), columns(want)
    same = ~torch.isfinite(a) & ~torch.isfinite(n) & ((a == n) | (a.isnan() & n.isnan()))
    return statistics(torch.where(same, 0.0, a), torch.where(same, 0.0, n), atol, rtol)


def mismatched(entry: Entry, value: torch.Tensor) -> int:
    """Elements of ``value`` with a mismatch (a complex element: in either part)."""
    return int((entry.bad.view(-1, 2).any(1) if value.is_complex() else entry.bad).sum())


def fill_row(row: InputReport, entry: Entry, value: torch.Tensor, where: Callable[[int], Optional[str]]) -> None:
    """Put ``entry``'s statistics in ``row``; ``where(r)`` names leading index r of the compared stacks."""
    row.mismatched, row.atol, row.rtol = mismatched(entry, value), entry.atol, entry.rtol
    row.max_abs_err, row.max_rel_err = entry.max_abs, entry.max_rel
    if entry.worst_excess >= 0 and value.numel():
        row.worst_index = unravel(entry.worst_col // (2 if value.is_complex() else 1), value.shape)
        row.worst_output = where(entry.worst_row)
        row.analytical, row.numerical = entry.analytical, entry.numerical
    if row.mismatched:
        row.status = Status.FAIL


def zeros_if_none(grads: Any, like: list[torch.Tensor], lead: tuple = ()) -> list[torch.Tensor]:
    """Gradients with None (an unused input) replaced by zeros of shape ``lead + input's shape``."""
    return [g if g is not None else torch.zeros(lead + tuple(t.shape), dtype=t.dtype, device=t.device)
            for g, t in zip(grads, like)]


# --------------------------------------------------------------- the verdict

def label(row: InputReport) -> str:
    """How a message names a row: 'x' for an argument, grad_output 0 as it is."""
    return row.name if row.name.startswith("grad_output") else f"'{row.name}'"


def reword(entry: Entry, row: InputReport, all_zeros: str, derivative: str) -> Optional[str]:
    """The two patterns whose generic words blame ``backward``, said for this check; else None.
    ``all_zeros`` says why the analytical side may be all zeros."""
    if not row.mismatched or entry.nonfinite:
        return None
    if entry.sum_aa == 0 and entry.sum_nn > 0:
        return f"analytical is all zeros, numerical is not: {all_zeros}"
    if entry.sum_nn == 0 and entry.sum_aa > 0:
        return (f"numerical is zero (the values do not change with {label(row)}), but {derivative} "
                "gives a non-zero derivative")
    return None


def skip(result: CheckResult, reason: str, start: float, status: Status = Status.SKIP,
         row_reason: str = "see the message") -> CheckResult:
    """The check does not apply (SKIP), or failed before any comparison (FAIL): the reason is the
    message, and rows not yet marked say they were not checked (never a silent pass)."""
    for row in result.inputs:
        if row.status is Status.PASS:
            row.status, row.reason = Status.SKIP, row_reason
    result.status, result.message = status, reason
    result.duration_s = time.perf_counter() - start
    return result


def summarize(result: CheckResult, start: float, notes: list[str], what: Callable[[InputReport], str],
              checked: str, advice: str = "", omit: Optional[set[str]] = None) -> CheckResult:
    """Status and one-line message from the rows: the notes, what is wrong (``what(row)`` names
    it; rows named in ``omit``, which a note explains, are not repeated), what is right, and
    ``advice`` once when an analytical side is all zeros. ``checked`` leads the list of rows when
    all passed."""
    wrong = [r for r in result.inputs if r.status is Status.FAIL]
    right = [r for r in result.inputs if r.status is Status.PASS]
    parts = list(notes)
    parts += [f"{what(r)} is wrong: {r.diagnosis}" if r.diagnosis else f"{what(r)} is wrong"
              for r in wrong if r.name not in (omit or set())]
    if wrong or notes:
        result.status = Status.FAIL
        if right and wrong:
            parts.append(f"{', '.join(label(r) for r in right)} {'is' if len(right) == 1 else 'are'} right")
        if advice and any(r.diagnosis and r.diagnosis.startswith("analytical is all zeros") for r in wrong):
            parts.append(advice)
    else:
        parts.append(f"{checked} {', '.join(label(r) for r in right)}: all within tolerance")
    result.message = "; ".join(parts)
    result.duration_s = time.perf_counter() - start
    return result
