"""An argument's row: one per argument before anything is compared, which ones are compared,
and the one filler that turns comparison statistics into the row."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, Callable, Optional

import torch

from ...core.tolerance import Limits
from ...numerics import ArgumentComparison, Layout, is_float_tensor, real_numel, unravel
from ...numerics.maps import downsample, first_indices, per_element, view_2d
from ...numerics.stats import STANDS_IN
from ...results import ErrorMap, InputReport, Status
from ...subject.binding import Bound
from .diagnosis import CONJUGATE, conjugate, diagnose, systematic

SYSTEMATIC = {torch.float16: 1e-2, torch.bfloat16: 5e-2}  # |ratio - 1| worth a warning; 1e-4 otherwise
INDEX_CAP = 100  # mismatching multi-indices listed per argument (the JSON's mismatched_indices)
MAP_CELLS = 4096  # cells of an argument's error map at most (larger arguments are downsampled)
SIDES = "gradients for one random grad_output (u^T J)"  # what a Jacobian check's error map sides are


def skeleton(bound: Bound) -> list[InputReport]:
    """One row per argument, before anything is compared, born with its spec line."""
    rows = []
    for i, (name, index, v) in enumerate(zip(bound.names, bound.indices, bound.values)):
        if isinstance(v, torch.Tensor):
            row = InputReport(index, name, list(v.shape), dtype_name(v), Status.PASS, numel=v.numel())
        else:
            row = InputReport(
                index,
                name,
                [],
                type(v).__name__,
                Status.SKIP,  # shape [] = not a tensor
                reason=f"not a tensor ({short(v)})",
            )
        row.line = bound.line(i)
        row.via = bound.via.get(i)
        rows.append(row)
    return rows


def checked_positions(bound: Bound, rows: list[InputReport]) -> list[int]:
    """Arguments whose gradient is compared; mark the others' rows as not checked, with the reason (a tensor
    that requires grad but has no elements included: ``NO_ELEMENTS``)."""
    checked: list[int] = []
    seen: dict[int, int] = {}
    for i, v in enumerate(bound.values):
        if not isinstance(v, torch.Tensor):
            continue
        if id(v) in seen:
            rows[i].status = Status.SKIP
            rows[i].reason = f"same tensor as '{bound.names[seen[id(v)]]}' (checked there)"
        elif not v.requires_grad:
            rows[i].status = Status.SKIP
            rows[i].reason = "requires_grad is false" if is_float_tensor(v) else "not a floating-point tensor"
        elif not v.numel():
            rows[i].status, rows[i].reason = Status.SKIP, NO_ELEMENTS
        else:
            seen[id(v)] = i
            checked.append(i)
    return checked


NO_ELEMENTS = "no elements: nothing to compare"  # the row of an argument with no elements (never a pass)


def no_elements(name: str, shape: Sequence[int]) -> str:
    """What a message says of argument ``name`` of ``shape`` with no elements, and what to do."""
    return f"{name} has no elements ({list(shape)}): nothing to compare; give it a shape with elements"


def dtype_name(v: torch.Tensor) -> str:
    """'float64' for torch.float64."""
    return str(v.dtype).replace("torch.", "")


def short(value: Any, limit: int = 30) -> str:
    """A value's repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def mismatched(entry: ArgumentComparison, value: torch.Tensor) -> int:
    """Elements of ``value`` with a mismatch (a complex element: in either part)."""
    return int(per_element(entry.bad, value.is_complex()).sum())


def locate(
    row: InputReport,
    bad: torch.Tensor,
    error: torch.Tensor,
    shape: tuple[int, ...],
    sides: Optional[tuple[torch.Tensor, torch.Tensor, str]] = None,
) -> None:
    """Where a mismatching row's mismatches are: its first mismatching multi-indices (``bad``, one per
    element) and its error map (``error``, one per element); ``sides``: both sides per element and what
    they are, kept where the map is not downsampled."""
    row.mismatched_indices, row.mismatched_indices_cap = first_indices(bad, shape, INDEX_CAP), INDEX_CAP
    grid, block = downsample(error, shape, MAP_CELLS)
    picture = ErrorMap(*view_2d(shape), list(block), grid.reshape(-1).tolist())
    if sides is not None and block == (1, 1):
        picture.analytical, picture.numerical = (s.detach().reshape(-1).tolist() for s in sides[:2])
        picture.sides = sides[2]
    row.error_map = picture


def fill(
    row: InputReport,
    entry: ArgumentComparison,
    value: torch.Tensor,
    where: Callable[[int], Optional[str]],
    parts: bool = False,
    sides: bool = False,
) -> None:
    """Put ``entry``'s statistics in ``row`` (of argument ``value``); ``where(r)`` names the output
    row r of the compared Jacobian (or leading index r of two compared stacks), and with ``parts``
    a complex argument's worst entry names its real or imaginary part. A row with a mismatch fails,
    and gets where its mismatches are (with ``sides``, a real argument's map keeps the entry's
    projections ``u^T J`` too)."""
    row.mismatched, row.atol, row.rtol = mismatched(entry, value), entry.atol, entry.rtol
    if row.numel == 0:
        return
    row.max_abs_err, row.max_rel_err = entry.max_abs, entry.max_rel
    if entry.worst_excess >= STANDS_IN:
        elem, part = divmod(entry.worst_col, 2 if value.is_complex() else 1)
        row.worst_index = unravel(elem, value.shape)
        row.worst_output = where(entry.worst_row)
        if parts and value.is_complex() and row.worst_output is not None:
            row.worst_output += f", input {'imaginary' if part else 'real'} part"
        if math.isfinite(entry.analytical) and math.isfinite(entry.numerical):
            row.analytical, row.numerical = entry.analytical, entry.numerical
    if row.mismatched:
        row.status = Status.FAIL
        shape, complex_ = tuple(value.shape), value.is_complex()
        locate(
            row,
            per_element(entry.bad, complex_),
            per_element(entry.err, complex_),
            shape,
            (entry.proj_a, entry.proj_n, SIDES) if sides and not complex_ else None,
        )


def blank(row: InputReport) -> InputReport:
    """A passing row for ``row``'s argument without its statistics: the row judged again is filled here,
    then ``take``n over."""
    return InputReport(
        row.index,
        row.name,
        row.shape,
        row.dtype,
        Status.PASS,
        numel=row.numel,
        line=row.line,
        role=row.role,
        via=row.via,
    )


def take(row: InputReport, fresh: InputReport) -> None:
    """``row`` becomes ``fresh`` (its judgement again), in place: the result holds ``row``."""
    for f in fields(InputReport):
        setattr(row, f.name, getattr(fresh, f.name))


def fill_jacobian(
    row: InputReport, entry: ArgumentComparison, layout: Layout, value: torch.Tensor, outputs: tuple[Any, ...]
) -> None:
    """The argument's row from its Jacobian's statistics, with the pattern of a mismatch or, for a
    passing argument, of a systematic factor the tolerance hides."""
    fill(row, entry, value, output_at(layout, outputs), parts=True, sides=True)
    if row.numel == 0:
        return
    diagnose(row, entry, tuple(value.shape))
    if row.mismatched and (value.is_complex() or any(outputs[p].is_complex() for p in layout.outputs)):
        if conjugate(entry, imaginary_rows(layout, outputs), value.is_complex()):
            CONJUGATE.put(row)
    if not row.mismatched:
        found = systematic(entry, SYSTEMATIC.get(value.dtype, 1e-4))
        if found:
            found.put(row)


def output_at(layout: Layout, outputs: tuple[Any, ...]) -> Callable[[int], str]:
    """Names row r of a Jacobian laid out by ``layout``: 'output 0 [2, 1]' (and its imaginary part)."""

    def where(r: int) -> str:
        _, real_idx, pos = layout.row_location(r)
        out = outputs[pos]
        out_elem, out_part = divmod(real_idx, 2 if out.is_complex() else 1)
        text = f"output {pos}" + (f" {unravel(out_elem, out.shape)}" if out.dim() else "")
        return text + (" (imaginary part)" if out.is_complex() and out_part else "")

    return where


def imaginary_rows(layout: Layout, outputs: tuple[Any, ...]) -> torch.Tensor:
    """For each row of the layout: whether it is the imaginary part of a complex output element."""
    return torch.cat(
        [
            torch.arange(real_numel(outputs[p])) % 2 == 1
            if outputs[p].is_complex()
            else torch.zeros(real_numel(outputs[p]), dtype=torch.bool)
            for p in layout.outputs
        ]
    )


# --------------------------------------------------------------- two computations of the same values


def columns(t: torch.Tensor) -> torch.Tensor:
    """``[M, *shape]`` -> float64 ``[real elements, M]``: a row per real element, as
    ArgumentComparison.update takes them."""
    t = t.detach().resolve_conj().cpu()
    real = torch.view_as_real(t) if t.is_complex() else t
    return real.reshape(t.shape[0], -1).t().to(torch.float64).contiguous()


def statistics(a: torch.Tensor, n: torch.Tensor, atol: float, rtol: float) -> ArgumentComparison:
    """The ArgumentComparison of ``a`` (in the analytical role) against ``n`` (numerical), both as ``columns``
    gives them."""
    entry = ArgumentComparison(a.shape[0], atol, rtol)
    entry.update(a, n, 0, torch.ones(a.shape[1], dtype=torch.float64))
    return entry


def agreement(got: torch.Tensor, want: torch.Tensor, limits: Limits) -> ArgumentComparison:
    """Statistics of ``got`` against ``want`` (both ``[M, *shape]``): a column per real element,
    a row per leading index. Equal non-finite values (NaN and NaN) count as agreeing."""
    a, n = columns(got), columns(want)
    same = ~torch.isfinite(a) & ~torch.isfinite(n) & ((a == n) | (a.isnan() & n.isnan()))
    return statistics(torch.where(same, 0.0, a), torch.where(same, 0.0, n), limits.atol, limits.rtol)


def zeros_if_none(grads: Any, like: list[torch.Tensor], lead: tuple[int, ...] = ()) -> list[torch.Tensor]:
    """Gradients with None (an unused input) replaced by zeros of shape ``lead + input's shape``."""
    return [
        g if g is not None else torch.zeros(lead + tuple(t.shape), dtype=t.dtype, device=t.device)
        for g, t in zip(grads, like)
    ]
