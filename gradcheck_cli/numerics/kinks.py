"""Kinks, ties and domain edges: explain a finite-difference mismatch at one input element.

The central difference (f(x + eps) - f(x - eps)) / 2 eps assumes f is smooth on [x - eps, x + eps].
At a kink (relu, abs or clamp at a corner), a tie (max of equal values) or a domain edge (sqrt or
log just above 0) it is not, and a correct backward looks wrong. ``examine`` looks again at one
input element whose Jacobian column mismatched and says which case it is, by estimating the
left and the right derivative separately. Pure torch, no I/O.

The maths. On side s (-1 or +1) of x the derivative is estimated by the second-order one-sided
formula through (0, f(x)), (a, f(x + a)), (b, f(x + b)) with a = s h, b = 2 s h (the offsets
actually taken after rounding x + a to x's dtype); its error is O(h^2 f'''). The step starts at
h = eps and is halved until two successive estimates agree within atol + rtol |d| ("settled"). On
a smooth piece, e.g. each side of a kink that sits exactly at x, they agree at once; a kink or a
domain edge closer than 2h, or strong curvature, keeps them apart until h is small enough; a
jump or noise never settles. For an O(h^2) formula the gap between the last two estimates is
about 3x the error of the last one, so a settled derivative is compared with
atol + rtol |d| + gap: the tolerance is loosened only by the measured error, at most twofold.

None of this holds where the outputs change in steps coarser than float64's rounding (a forward
computed in float32, or quantised: see ``precision``): a difference of such outputs over a step h
is off by up to step / h, and two equal values read as a flat side. So the outputs are first
sampled at a few more points; where the rounding of the central difference at eps can take a
quarter of the tolerance of a mismatching entry, the verdict is "precision" (finite differences
cannot resolve the derivative at this eps), never a kink; elsewhere steps are never halved below
where that rounding reaches a quarter of atol.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import precision
from .differences import call_moved, elements
from .realify import as_tuple, outputs_vector, real_numel, unravel

HALVINGS = 16  # smallest step eps / 2**16 (~1.5e-11 for eps = 1e-6): rounding noise stays far below rtol
Point = tuple[float, torch.Tensor]  # (offset actually taken, realified float64 outputs there)


@dataclass
class Verdict:
    """What one mismatched element is: ``kind`` "kink" | "domain_edge" | "smooth" | "precision";
    ``explained`` True when backward is consistent with a one-sided derivative, or for
    "precision" with the central difference within its rounding error (not a wrong gradient);
    ``text`` one phrase for the report. For "precision": ``step``, the largest step in which the
    outputs change, and ``grid``, the float format their values fit ('float32'), or ''."""

    kind: str
    explained: bool
    text: str
    step: float = 0.0
    grid: str = ""


@dataclass
class _Side:
    """A settled one-sided derivative per output entry, and the gap that bounds its error."""

    d: torch.Tensor
    gap: torch.Tensor


class _Element:
    """f as a function of one real element of ``x``, which is restored bit-exactly after every call."""

    def __init__(self, call: Callable[[Sequence[Any]], Any], values: Sequence[Any], x: torch.Tensor, j: int,
                 positions: Sequence[int]) -> None:
        self.call, self.values, self.positions = call, values, list(positions)
        self.element = elements(x)(j)
        self.x0 = self.element.x0
        self.floor = 0.0  # no one-sided step below this: rounding of the outputs would drown it
        self.names: list[tuple[int, torch.Tensor]] = []  # (position, output) for naming entries

    def center(self) -> torch.Tensor:
        """f(x), unperturbed; also remembers the outputs' shapes to name entries."""
        with torch.no_grad():
            outputs = as_tuple(self.call(self.values))
        self.names = [(p, outputs[p]) for p in self.positions]
        return outputs_vector(outputs, self.positions).cpu()

    def __call__(self, offset: float) -> Point:
        taken = self.element.taken(offset)

        def read(outputs: tuple[Any, ...]) -> torch.Tensor:  # while moved: a view of the input moves back with it
            return outputs_vector(outputs, self.positions).cpu()

        return taken, call_moved(self.call, self.values, self.element.to(offset), read)

    def entry(self, m: int) -> str:
        """' (output P [i, j])' naming realified output entry m, or '' when there is one entry."""
        if sum(real_numel(o) for _, o in self.names) <= 1:
            return ""
        for p, o in self.names:
            size = real_numel(o)
            if m < size:
                elem, part = divmod(m, 2 if o.is_complex() else 1)
                index = f" {unravel(elem, o.shape)}" if o.dim() else ""
                return f" (output {p}{index}{', imaginary part' if o.is_complex() and part else ''})"
            m -= size
        return ""


def examine(call: Callable[[Sequence[Any]], Any], values: Sequence[Any], x: torch.Tensor, j: int, eps: float,
            positions: Sequence[int], analytical: torch.Tensor, *, atol: float, rtol: float,
            index_text: str) -> Verdict:
    """Say whether the mismatch of ``analytical`` (d outputs / d real element ``j`` of ``x``) is
    explained by a kink, a tie or a domain edge at x, or is a wrong gradient.

    ``x`` is one tensor inside ``values`` (the detached arguments ``call`` takes); it is perturbed
    in place and restored bit-exactly, also when ``call`` raises (the exception propagates).
    ``index_text`` names the element (e.g. "x[2, 1]"); for complex ``x`` the part is appended.
    Costs 3 forwards for a smooth point, about 7 at a kink, more at a domain edge or a kink
    within eps (one per halving of the step).
    """
    f = _Element(call, values, x, j, positions)
    part = f" ({'imaginary' if j % 2 else 'real'} part)" if x.is_complex() else ""
    what = f"{index_text}{part} = {_num(f.x0)}"
    a = analytical.detach().to(torch.float64).cpu().reshape(-1)
    y0 = f.center()
    if y0.numel() != a.numel():
        raise ValueError(f"analytical has {a.numel()} entries, the outputs at {list(positions)} have {y0.numel()}")
    if y0.numel() == 0:
        return Verdict("smooth", False, f"{what}: no output entries to compare")
    if not bool(torch.isfinite(y0).all()):
        m = int((~torch.isfinite(y0)).nonzero()[0])
        return Verdict("domain_edge", False, f"{what}: f(x){f.entry(m)} is not finite ({_num(float(y0[m]))}), "
                                             "so no derivative can be checked there")
    minus, plus = f(-eps), f(eps)
    if not (_finite(minus) and _finite(plus)):
        return _domain_edge(f, what, y0, a, eps, minus, plus, atol, rtol)
    coarse = _precision(f, what, y0, a, eps, minus, plus, atol, rtol)
    if coarse is not None:
        return coarse
    left, right = _slope(y0, minus), _slope(y0, plus)
    if _agree(left, right, atol, rtol):
        central = (left + right) / 2
        m = _worst(a, central, _tol(central, atol, rtol))
        return Verdict("smooth", False, f"{what} is not at a kink or domain edge{f.entry(m)}: the left and right "
                                        f"differences agree on {_num(central[m])}, backward gives {_num(a[m])}")
    return _kink(f, what, y0, a, eps, minus, plus, atol, rtol)


def resample_hint(name: str) -> str:
    """One line of advice for an argument whose values sit at kinks or domain edges."""
    return (f"keep '{name}' away from kinks and domain edges: add `avoid: [[lo, hi]]` around them to the "
            f"argument '{name}' in the spec (e.g. `avoid: [[-0.001, 0.001]]` for a kink at 0), or `resample: true`")


def _precision(f: _Element, what: str, y0: torch.Tensor, a: torch.Tensor, eps: float, minus: Point,
               plus: Point, atol: float, rtol: float) -> Verdict | None:
    """A "precision" verdict where the outputs change in steps too coarse for a central difference
    at eps to meet the tolerance; else None, with ``f.floor`` set so that no one-sided step goes
    below where the rounding reaches a quarter of atol."""
    more = [f(k * eps) for k in precision.OFFSETS[2:]]
    samples = torch.stack([y0, minus[1], plus[1], *(p[1] for p in more)])
    step, bits = precision.resolution(samples)
    if not bool((step > 0).any()):
        return None
    moving = (samples != y0).any(0)  # entries that depend on this element (others may hold float32 constants)
    # the one-sided formula's rounding is about 2.5 step / h: a quarter of atol at h = 10 step / atol
    f.floor = 10 * float(torch.where(moving, step, 0.0).max()) / atol if atol > 0 else float("inf")
    width = plus[0] - minus[0]
    central = (plus[1] - minus[1]) / width
    rounding = step / width  # each output off by up to step / 2: the central difference by step / width
    tol = _tol(central, atol, rtol)
    off = torch.nan_to_num((a - central).abs(), nan=torch.inf)
    limited = (off > tol) & (4 * rounding > tol)
    if not bool(limited.any()):
        return None
    m = int(torch.argmax(torch.where(limited, rounding / tol, -1.0)))
    grid = precision.grid_name(int(bits[m]))
    head = (f"{what}: forward's output{f.entry(m)} fits in {int(bits[m])} significant bits ({grid} or lower "
            f"precision) and changes in steps of {_num(step[m])}, so its central difference at eps={_num(eps)} is "
            f"good only to +-{_num(rounding[m])}")
    wrong = (off > tol + 2 * rounding) & (off > tol)
    if bool(wrong.any()):
        w = int(torch.argmax(torch.where(wrong, off / (tol + 2 * rounding), -1.0)))
        return Verdict("precision", False, f"{head}; yet backward gives {_num(a[w])}{f.entry(w)} where it is "
                                           f"{_num(central[w])}, further off than that", float(step[m]), grid)
    return Verdict("precision", True, f"{head} (the tolerance is {_num(tol[m])}): backward gives {_num(a[m])}, "
                                      f"within that of {_num(central[m])}", float(step[m]), grid)


def _domain_edge(f: _Element, what: str, y0: torch.Tensor, a: torch.Tensor, eps: float, minus: Point,
                 plus: Point, atol: float, rtol: float) -> Verdict:
    """A step left the domain: judge with the one-sided derivative of the side that stayed inside."""
    gone = " and ".join(f"f(x {sign} eps)" for sign, p in (("-", minus), ("+", plus)) if not _finite(p))
    head = f"{what} is at the edge of the domain: {gone} {'are' if ' and ' in gone else 'is'} not finite"
    if not _finite(plus) and not _finite(minus):
        return Verdict("domain_edge", False, head + ", so no one-sided difference can be taken")
    s, first = (1, plus) if _finite(plus) else (-1, minus)
    name = "right" if s > 0 else "left"
    side = _settle(f, y0, s, eps, first, atol, rtol)
    if side is None:
        return Verdict("domain_edge", False, f"{head}; the one-sided differences from the {name} do not settle as "
                                             "the step shrinks (the derivative may be infinite there)")
    tol = _tol(side.d, atol, rtol) + side.gap
    m = _worst(a, side.d, tol)
    ok = bool(((a - side.d).abs() <= tol).all())
    return Verdict("domain_edge", ok, f"{head}; the one-sided derivative from the {name}{f.entry(m)} is "
                                      f"{_num(side.d[m])}, backward gives {_num(a[m])}")


def _kink(f: _Element, what: str, y0: torch.Tensor, a: torch.Tensor, eps: float, minus: Point, plus: Point,
          atol: float, rtol: float) -> Verdict:
    """Left and right differences at eps disagree: settle each side with smaller steps and compare."""
    left = _settle(f, y0, -1, eps, minus, atol, rtol)
    right = _settle(f, y0, 1, eps, plus, atol, rtol)
    if left is None and right is None:
        return Verdict("smooth", False, f"{what}: the one-sided differences do not settle as the step shrinks "
                                        "(noise or a jump); the central difference stands")
    if left is None or right is None:
        side, name, other = (right, "right", "left") if left is None else (left, "left", "right")
        assert side is not None  # both None returned above
        tol = _tol(side.d, atol, rtol) + side.gap
        m = _worst(a, side.d, tol)
        ok = bool(((a - side.d).abs() <= tol).all())
        return Verdict("kink", ok, f"{what} is at a jump or kink{f.entry(m)}: the {other} differences do not "
                                   f"settle; the {name} derivative is {_num(side.d[m])}, backward gives {_num(a[m])}")
    tol = _tol(torch.maximum(left.d.abs(), right.d.abs()), atol, rtol)
    if _agree(left.d, right.d, atol, rtol):
        d = (left.d + right.d) / 2
        tol = tol + torch.maximum(left.gap, right.gap) + (left.d - right.d).abs() / 2
        m = _worst(a, d, tol)
        if bool(((a - d).abs() <= tol).all()):
            return Verdict("kink", True, f"{what} is within eps of a kink (or of curvature too strong for this eps)"
                                         f"{f.entry(m)}: with smaller steps both sides give {_num(d[m])}, "
                                         f"backward gives {_num(a[m])}")
        return Verdict("smooth", False, f"{what} is not at a kink{f.entry(m)}: the left and right derivatives "
                                        f"agree on {_num(d[m])}, backward gives {_num(a[m])}")
    tol = tol + torch.maximum(left.gap, right.gap)
    lo, hi = torch.minimum(left.d, right.d) - tol, torch.maximum(left.d, right.d) + tol
    # a subgradient: anything between the two one-sided derivatives (any convex combination at a tie)
    outside = torch.clamp(lo - a, min=0) + torch.clamp(a - hi, min=0)
    outside = torch.where(torch.isnan(a), torch.inf, outside)
    ok = bool((outside == 0).all())
    m = int(torch.argmax((left.d - right.d).abs() / tol)) if ok else int(torch.argmax(outside / tol))
    return Verdict("kink", ok, f"{what} is a kink or tie{f.entry(m)}: one-sided derivatives {_num(left.d[m])} "
                               f"and {_num(right.d[m])}, backward gives {_num(a[m])}")


def _settle(f: _Element, y0: torch.Tensor, s: int, eps: float, first: Point, atol: float,
            rtol: float) -> _Side | None:
    """The one-sided derivative on side ``s``, halving the step until two estimates agree; None if never."""
    points = (first, f(2 * s * eps))  # (near, far): offsets h and 2h
    previous: torch.Tensor | None = None
    for k in range(HALVINGS + 1):
        if k and eps / 2**k < f.floor:
            break
        if k:
            points = (f(s * eps / 2**k), points[0])
        d = _one_sided(y0, *points)
        if d is not None and previous is not None:
            gap = (d - previous).abs()
            if bool((gap <= _tol(d, atol, rtol)).all()):
                return _Side(d, gap)
        previous = d
    return None


def _one_sided(y0: torch.Tensor, near: Point, far: Point) -> torch.Tensor | None:
    """f'(x) from f at offsets 0, a, b (same sign, a != b), exact for quadratics; None if unusable."""
    (a, ya), (b, yb) = near, far
    if a == 0 or b == 0 or a == b or not (_finite(near) and _finite(far)):
        return None
    # the usual -(a+b)/(ab) y0 + b/(a(b-a)) ya - a/(b(b-a)) yb, written with differences so that a
    # constant f gives exactly 0 (the coefficients are ~1/h and would not cancel in rounding)
    return (b * b * (ya - y0) - a * a * (yb - y0)) / (a * b * (b - a))


def _slope(y0: torch.Tensor, point: Point) -> torch.Tensor:
    """First-order one-sided difference (f(x + a) - f(x)) / a."""
    a, ya = point
    return (ya - y0) / a


def _tol(d: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    return atol + rtol * d.abs()


def _agree(u: torch.Tensor, v: torch.Tensor, atol: float, rtol: float) -> bool:
    return bool(((u - v).abs() <= _tol(torch.maximum(u.abs(), v.abs()), atol, rtol)).all())


def _worst(a: torch.Tensor, d: torch.Tensor, tol: torch.Tensor) -> int:
    """The output entry where ``a`` is furthest from ``d`` in units of tolerance (NaN counts as worst)."""
    if a.numel() == 0:
        return 0
    excess = torch.nan_to_num((a - d).abs() / tol, nan=torch.inf)
    return int(torch.argmax(excess))


def _finite(point: Point) -> bool:
    return bool(torch.isfinite(point[1]).all())


def _num(v: Any) -> str:
    v = float(v)
    return "0" if v == 0 else f"{v:.4g}"
