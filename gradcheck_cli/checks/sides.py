"""Two computations of the same values, compared elementwise: one side's outputs and gradients (one
forward, one backward for a shared grad_output) against the other's, by rule ``relative`` or
``allclose`` (see ``spec.ReferenceRule``), into a row with its error, baseline and pattern. The
reference check compares the target with a reference implementation, the compile check compiled
code with eager."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..binding import Bound
from ..errors import guarded
from ..numerics import as_tuple, is_float_tensor, unravel, vjp
from ..numerics.maps import per_element
from ..results import ErrorKind, InputReport, Pattern, Status
from ..target import Target
from ..tolerance import ReferenceRule, by_dtype, limit
from .base import call_forward, fresh_leaves
from .diagnosis import Diagnosis, ratio_text
from .rows import dtype_name, locate


@dataclass
class Side:
    """One side's outputs, its leaves of the checked arguments, and their gradients."""

    outputs: tuple[Any, ...]
    leaves: list[torch.Tensor]
    grads: list[torch.Tensor] = field(default_factory=list)


def side(
    fn: Target, bound: Bound, values: Sequence[Any], checked: list[int], what: str, kind: ErrorKind = ErrorKind.FORWARD
) -> Side:
    """``fn``'s outputs on fresh leaves of ``values`` (gradients to come); its errors are of ``kind``."""
    leaves = fresh_leaves(list(values))
    outputs = as_tuple(call_forward(fn, bound, leaves, kind, what=what))
    return Side(outputs, [leaves[i] for i in checked])


def gradients(
    side: Side, probes: dict[int, torch.Tensor], what: str, kind: ErrorKind = ErrorKind.BACKWARD
) -> list[torch.Tensor]:
    """The checked arguments' gradients for grad_outputs ``probes`` (output position -> probe),
    zeros where unused; errors of backward are of ``kind``."""
    live = [
        (side.outputs[p], g.to(side.outputs[p].dtype))
        for p, g in probes.items()
        if is_float_tensor(side.outputs[p]) and side.outputs[p].requires_grad
    ]
    if not live or not side.leaves:
        return [torch.zeros_like(x) for x in side.leaves]
    grads = guarded(kind, what, vjp, [o for o, _ in live], side.leaves, [g for _, g in live])
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, side.leaves)]


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def compare(
    row: InputReport, got: torch.Tensor, want: torch.Tensor, own: Optional[torch.Tensor], rule: ReferenceRule, what: str
) -> None:
    """Fill ``row`` with the target's ``got`` against the reference's ``want`` (and, for rule
    relative, the reference's own ``own`` in the target's dtype). Elementwise, in float64 on the CPU
    (complex as pairs of reals); equal non-finite values agree."""
    a, n = _real64(got), _real64(want)
    real = real_dtype(got)
    if rule.rule == "relative":
        assert own is not None
        baseline = _max_abs(_real64(own) - n)
        row.baseline_err, row.factor = max(baseline, eps(real) * _max_abs(n)), rule.factor
        row.atol, row.rtol = rule.atol or 0.0, None
        atol, rtol = rule.factor * row.baseline_err + row.atol, 0.0
    else:
        coarser = max(real, real_dtype(want), key=eps)  # a reference in a lower precision sets the defaults
        close = by_dtype(coarser).close
        row.rtol = rtol = rule.rtol if rule.rtol is not None else close.rtol
        row.atol = atol = rule.atol if rule.atol is not None else close.atol
    diff = torch.sub(a, n).abs_()
    broken = torch.zeros(0, dtype=torch.bool)
    if a.numel() and not math.isfinite(float(diff.max())):  # rare: the non-finite values apart
        finite = torch.isfinite(a) & torch.isfinite(n)
        broken = ~finite & ~((a == n) | (a.isnan() & n.isnan()))  # NaN against NaN, inf against inf agree
        a, n = torch.where(finite, a, 0.0), torch.where(finite, n, 0.0)
        diff = torch.sub(a, n).abs_()
    scale = n.abs()
    tol: Any = limit(scale, atol, rtol) if rtol else atol  # the relative rule's bound is one number
    bad = diff > tol
    if broken.numel():
        bad |= broken
    per = 2 if got.is_complex() else 1
    row.mismatched = int(bad.view(-1, per).any(1).sum()) if per == 2 else int(torch.count_nonzero(bad))
    if not a.numel():
        return
    row.max_abs_err = float(diff.max())
    big = scale > atol  # relative error only where the reference is not ~0
    rel = diff.div(scale).masked_fill_(~big, 0.0)
    row.max_rel_err = float(rel.max()) if bool(big.any()) else None
    excess = diff - tol
    if broken.numel():
        excess.masked_fill_(broken, math.inf)
    k = int(torch.argmax(excess))
    row.worst_index = unravel(k // per, tuple(got.shape))
    row.analytical, row.numerical = float(a[k]), float(n[k])
    if row.mismatched:
        row.status = Status.FAIL
        shape, complex_ = tuple(got.shape), got.is_complex()
        sides = (
            "the gradients for one random grad_output" if what == "gradient" else "the outputs"
        ) + ": the target's, the reference's"
        error = diff.masked_fill(broken, math.inf) if broken.numel() else diff
        locate(
            row, per_element(bad, complex_), per_element(error, complex_), shape, None if complex_ else (a, n, sides)
        )
        tol_t = tol if isinstance(tol, torch.Tensor) else torch.full_like(diff, tol)
        _pattern(a, n, tol_t, int(broken.sum()), row.mismatched, row.numel, what).put(row)
        if row.pattern in (Pattern.SOME_ELEMENTS, Pattern.NO_PATTERN):
            row.diagnosis = "; ".join(filter(None, [row.diagnosis, _coarser(rel[big], real)]))


def _coarser(rel: torch.Tensor, dtype: torch.dtype) -> Optional[str]:
    """Relative errors typical of rounding to a lower precision than ``dtype``: say which (a target that
    computes in bfloat16 inside, given float64)."""
    if not rel.numel():
        return None
    typical = float(rel.median())  # rounding to a dtype makes a median relative error of about eps / 4
    lower = [d for d in (torch.float32, torch.float16, torch.bfloat16) if eps(d) > eps(dtype)]
    if not lower or not typical > 0:
        return None
    low = min(lower, key=lambda d: abs(math.log(typical / (eps(d) / 4))))
    if abs(math.log(typical / (eps(low) / 4))) > math.log(4):
        return None
    name = str(low).replace("torch.", "")
    return (
        f"its typical relative error {typical:.1g} is {name}'s rounding: does it compute in {name} inside? "
        f"Check it in {name} (`dtype: {name}`), where the reference's own error sets the bar"
    )


def real_dtype(t: torch.Tensor) -> torch.dtype:
    return t.real.dtype if t.is_complex() else t.dtype


def _real64(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened as float64 on the CPU, a complex element as two reals."""
    t = t.detach().resolve_conj().cpu()
    return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1).to(torch.float64)


def _max_abs(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def _pattern(
    a: torch.Tensor, n: torch.Tensor, tol: torch.Tensor, nonfinite: int, mismatched: int, numel: int, what: str
) -> Diagnosis:
    """What a mismatch of ``a`` (the target's ``what``) against ``n`` (the reference's) shows:
    non-finite values, all zeros, a constant factor up to what the rule allows, a few elements, or nothing."""
    mine, theirs = f"the target's {what}", "the reference's"
    if nonfinite:
        return Diagnosis(Pattern.NONFINITE, f"{nonfinite} values are NaN or infinite on one side only")
    aa, nn, an = float(a @ a), float(n @ n), float(a @ n)
    if aa == 0 and nn > 0:
        culprit = (
            "backward returns zeros or None for it (a missing return, a detached result, or the wrong "
            "position in the returned tuple?)"
            if what == "gradient"
            else "forward returns zeros"
        )
        return Diagnosis(Pattern.ZERO_ANALYTICAL, f"{mine} is all zeros, {theirs} is not: {culprit}")
    if nn == 0 and aa > 0:
        return Diagnosis(Pattern.ZERO_NUMERICAL, f"{theirs} {what} is all zeros, {mine} is not")
    # to 10 digits: the sums' order, and so their last bits, follow torch's thread count, and a report is
    # the same for any number of workers
    r = float(f"{an / nn:.10g}") if nn else 0.0
    if r and bool(((a - r * n).abs() <= tol * max(1.0, abs(r))).all()):
        if abs(r + 1) < 1e-2:
            return Diagnosis(Pattern.SIGN_FLIP, f"sign flipped: {mine} = -{theirs}", r)
        return Diagnosis(Pattern.CONSTANT_RATIO, f"{mine} is {ratio_text(r, 1e-2)} {theirs}", r)
    if mismatched < numel:
        return Diagnosis(
            Pattern.SOME_ELEMENTS, f"{mismatched} of {numel} elements differ from {theirs}, the others match"
        )
    return Diagnosis(Pattern.NO_PATTERN, f"differs from {theirs} everywhere, with no constant ratio or sign flip")


def output_row(
    p: int, got: tuple[Any, ...], want: tuple[Any, ...], own: Optional[tuple[Any, ...]], rule: ReferenceRule
) -> InputReport:
    """Forward output ``p`` of the target against the reference's."""
    o = got[p]
    name = "output" if len(got) == 1 else f"output[{p}]"
    if not is_float_tensor(o):
        return InputReport(
            p,
            name,
            list(getattr(o, "shape", [])),
            dtype_name(o) if isinstance(o, torch.Tensor) else type(o).__name__,
            Status.SKIP,
            reason="not a floating-point output (not compared)",
            role="output",
        )
    row = InputReport(p, name, list(o.shape), dtype_name(o), Status.PASS, numel=o.numel(), role="output")
    compare(row, o, want[p], own[p] if own else None, rule, "output")
    return row
