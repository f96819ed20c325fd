"""A second look at the mismatching elements of a higher-order check's argument (double_backward,
forward_ad), as backward takes one (``numerics.kinks``): a kink, tie or domain edge of the function
the finite differences move, or its rounding (it computes in float32 inside), is not a wrong derivative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ...core.tolerance import Tolerance
from ...numerics import ArgumentComparison, kinks, precision, ties, unravel
from ...numerics.differences import Step, call_moved
from ...numerics.realify import outputs_vector
from ...results import InputReport
from .step import refuse_outside_domain

EXPLAINED, WRONG, PRECISION, NONFINITE = "explained", "wrong", "precision", "nonfinite"
NONFINITE_LOOKS = 8  # NaN or infinite columns examined; the others with a finite error still are, every one


@dataclass
class Look:
    """What the mismatches of one argument are: ``kind`` EXPLAINED (every one at a kink, tie or domain
    edge, or lost to cancellation, where the derivative agrees with a one-sided or settled one), WRONG
    (one element confirmed wrong), PRECISION (finite differences at this eps measure rounding: no
    verdict) or NONFINITE (autograd's derivative is NaN or infinite where the function is finite and
    smooth, the others explained); ``text``: why, naming an element; ``count``: the elements explained."""

    kind: str
    text: str = ""
    count: int = 0
    eps: float = 0.0  # PRECISION: a step at which finite differences resolve the derivative (0: none)


def inside(
    call: Callable[[Sequence[Any]], Any], values: Sequence[Any], x: torch.Tensor, positions: Sequence[int], eps: float
) -> str:
    """The float format a function computes in inside ('float32', 'bfloat16', ...), told by its outputs at
    ``positions`` near ``values`` (``x``, inside them, moved along every element at once and put back) fitting
    in fewer significant bits than float64's; '' where they do not (see ``numerics.precision``)."""
    u = torch.ones(x.shape, dtype=x.dtype, device=x.device)
    samples = [
        call_moved(call, values, Step(x, h * u), lambda outputs: outputs_vector(outputs, positions).cpu())
        for h in (0.0, *(k * eps for k in precision.OFFSETS))
    ]
    step, bits = precision.resolution(torch.stack(samples))
    moving = (torch.stack(samples) != samples[0]).any(0) & (step > 0)
    return precision.grid_name(int(bits[moving].max())) if bool(moving.any()) else ""


def look_again(
    row: InputReport,
    entry: ArgumentComparison,
    call: Callable[[Sequence[Any]], Any],
    values: Sequence[Any],
    x: torch.Tensor,
    positions: Sequence[int],
    tol: Tolerance,
    column: Callable[[int], torch.Tensor],
    derivative: str,
    low: str = "",
    corners: Optional[tuple[ties.Held, int]] = None,
) -> Look:
    """Examine ``row``'s mismatching elements, those the comparison kept first, worst first, until one is
    confirmed wrong. ``call`` is the function finite differences moved (``x`` inside ``values``: it is
    moved in place and put back), ``column(col)`` the analytical column of real element ``col`` where the
    comparison did not keep it; ``derivative`` names what gives the analytical side ("backward,
    differentiated,"); ``low``: the float format the Function computes in inside ('' if none is seen), where
    finite differences at eps measure rounding even though the values they differentiate show no grid (a
    float32 value times a float64 one): an element off at eps is judged again, with float32's tolerances
    (the spec's where it sets them), at the step chosen from the function's own curvature, by that step's
    error bound (``_coarser``). The elements explained at a corner go to ``corners`` (with the argument's
    number), to be judged together (``tied.judge``): the caller drops them where the look is not EXPLAINED."""
    per = 2 if x.is_complex() else 1
    kept = {col: a_col for col, a_col, _ in entry.bad_columns}
    err = entry.err
    order = sorted(entry.bad.nonzero().view(-1).tolist(), key=lambda c: (c not in kept, -float(err[c])))
    if not order:
        return Look(WRONG)
    explained: list[kinks.Verdict] = []
    nonfinite: list[str] = []
    flat = torch.view_as_real(x).reshape(-1) if x.is_complex() else x.reshape(-1)
    for col in order:
        if len(nonfinite) >= NONFINITE_LOOKS and not bool(torch.isfinite(err[col])):
            nonfinite.append("")  # NaN like those shown to be the edge story: not examined one by one
            continue
        a_col = kept[col] if col in kept else column(col)
        where = f"{row.name}{unravel(col // per, x.shape)}"
        verdict = kinks.examine(
            call, values, x, col, tol.eps, positions, a_col, atol=tol.atol, rtol=tol.rtol, index_text=where
        )
        if verdict.kind == "precision" and verdict.explained:
            return _imprecise(verdict, tol, derivative)
        if verdict.kind == "precision" and bool(torch.isfinite(a_col).all()):  # off by more than the outputs' rounding
            # at eps, but a forward that reads its input in float32 moves the points too: judged again by the bound
            return _coarser(call, values, x, col, positions, tol, a_col, derivative, low or verdict.grid, verdict.text)
        if verdict.kind == "precision":
            return Look(WRONG, verdict.text)
        # in a Function that computes in low precision inside, rounding looks like a kink or noise too
        if low and not verdict.explained and verdict.kind != "domain_edge" and bool(torch.isfinite(a_col).all()):
            return _coarser(call, values, x, col, positions, tol, a_col, derivative, low, verdict.text)
        if verdict.explained:
            explained.append(verdict)
            if corners is not None and verdict.sides is not None:
                corners[0].add(ties.corner(x, col, where, a_col, verdict.sides, corners[1]))
            continue
        if verdict.kind == "smooth" and not bool(torch.isfinite(a_col).all()):
            # the function is finite and smooth there, autograd's derivative is not: inf x 0 inside
            nonfinite.append(f"{where} = {float(flat[col]):.4g}")
            continue
        return Look(WRONG, verdict.text if verdict.kind != "smooth" else "")  # a smooth one: the row's words stand
    if nonfinite:
        more = f" (and {len(nonfinite) - 1} more)" if len(nonfinite) > 1 else ""
        return Look(
            NONFINITE,
            (
                f"{derivative} gives NaN or infinite values at {nonfinite[0]}{more}, where the values it "
                "differentiates are finite and change smoothly (left and right differences agree): an operation "
                "there is at the edge of its domain (a square root or fractional power of 0, log or division by 0), "
                "whose infinite derivative autograd multiplies by zero"
            ),
            len(explained),
        )
    refuse_outside_domain([v.kind for v in explained], per * x.numel(), x, row.name, tol)
    first = explained[0]
    kind = (
        "at a kink, tie or domain edge, where the finite differences need a one-sided derivative"
        if first.kind != "cancellation"
        else "where finite differences lose to cancellation"
    )
    return Look(
        EXPLAINED,
        f"{len(explained)} element{'s' * (len(explained) != 1)} {kind}: {first.text}; {kinks.resample_hint(row.name)}",
        len(explained),
    )


def _coarser(
    call: Callable[[Sequence[Any]], Any],
    values: Sequence[Any],
    x: torch.Tensor,
    col: int,
    positions: Sequence[int],
    tol: Tolerance,
    a_col: torch.Tensor,
    derivative: str,
    low: str,
    text: str,
) -> Look:
    """An element off at eps in a Function that computes in ``low`` precision inside, judged again at the
    step chosen from the function's own curvature (``precision.judged_step``, from this element and a few
    others) by that step's error bound (``precision.decide``), with float32's tolerances: PRECISION with
    that step where it is within the tolerance less the bound (the row is then judged again there), WRONG
    with the numbers where it is beyond the tolerance plus the bound, and PRECISION with no step (no
    verdict, never a pass) in between."""
    loose = tol.at_least(torch.float32)
    n = x.numel() * (2 if x.is_complex() else 1)
    chosen = precision.judged_step(
        call, values, x, precision.sampled([col], n), positions, tol.eps, loose.atol, loose.rtol
    )
    if chosen is None:
        return Look(WRONG, text)
    eps = chosen.eps
    decision = precision.decide(call, values, x, [(col, a_col)], positions, chosen.steps, loose.atol, loose.rtol)
    low = low or "float32"
    if decision.passed:
        return Look(
            PRECISION,
            f"the Function computes in {low} or lower precision inside, so finite "
            f"differences at eps={tol.eps:g} measure rounding ({text})",
            eps=eps,
        )
    assert decision.example is not None  # one element, failed or undecided
    _, a, d, bound, edge = decision.example
    numbers = (
        f"judged again at eps {eps:g} (the step whose error bound, from steps {eps:g} and {eps / 2:g} and "
        f"rounding, takes the least of the tolerance) with {low} tolerances (atol {loose.atol:g}, rtol "
        f"{loose.rtol:g}) {derivative} gives {a:.6g} where finite differences give {d:.6g} +- {bound:.2g}"
    )
    if decision.failed:
        return Look(WRONG, f"{text}; the Function computes in {low} or lower precision inside, but {numbers}")
    return Look(
        PRECISION,
        f"the Function computes in {low} or lower precision inside, so finite differences at eps={tol.eps:g} "
        f"measure rounding, and {numbers}, within that bound of the tolerance ({edge:.2g}): they cannot decide "
        f"(no verdict, not a pass); give `reference: pkg.mod:fn` for a tighter check ({text})",
    )


def _imprecise(verdict: kinks.Verdict, tol: Tolerance, derivative: str) -> Look:
    """Finite differences at ``tol.eps`` measure the rounding of a function computed in float32 (or lower)
    inside: no verdict, and what would resolve it."""
    advised = precision.advice(verdict.step, tol.eps, tol.atol)
    if advised is None:
        fix = "compare it with a plain PyTorch implementation in float64 instead"
    else:
        eps, atol = advised
        setting = f"eps: {eps:g}" + (f", atol: {atol:g}" if atol is not None else "")
        fix = f"a case with `tolerance: {{{setting}}}` may resolve it"
    inside = f"{verdict.grid} or lower precision" if verdict.grid else "low precision"
    again = precision.rejudge_eps(verdict.step, tol.eps, tol.at_least(torch.float32).atol)
    return Look(
        PRECISION,
        eps=again or 0.0,
        text=(
            f"finite differences cannot judge {derivative} at eps={tol.eps:g}: the function computes in {inside} "
            f"inside (its values change in steps of about {verdict.step:.2g}), so they measure rounding, not the "
            f"derivative (no verdict); {fix}; e.g. {verdict.text}"
        ),
    )
