"""Kinks, ties and domain edges: explain a finite-difference mismatch at one input element.

The central difference (f(x + eps) - f(x - eps)) / 2 eps assumes f is smooth on [x - eps, x + eps].
At a kink (relu, abs or clamp at a corner), a tie (max of equal values) or a domain edge (sqrt or
log just above 0) it is not, and a correct backward looks wrong. ``examine`` looks again at one
input element whose Jacobian column mismatched and says which case it is, by estimating the
left and the right derivative separately. Pure torch, no I/O. One element at a time cannot see a tie
counted twice (each of two tied maxima alone has one-sided derivatives 0 and 1): the elements found at a
corner (``Verdict.sides``) are judged together by ``numerics.ties``.

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

Cancellation (a removable singularity such as (cos a - cos b) / (a - b) at a == b, or any forward
that loses digits to cancellation): the outputs are float64 but carry a rounding error r far above
float64's, so the central difference at step h is off by about r / h, and at eps that can exceed
the tolerance. Where the left and right differences at eps agree, or neither side settles as the
step shrinks (a kink within eps settles both: that story stands), the central difference is also
taken at eps / 4 and at eps * 4^k, k = 1..6. The element is excused ("cancellation", explained)
only if all of these hold:
(1) the error grows as the step shrinks, as rounding's does: the estimate at eps / 4 differs from
    the one at eps by more than the tolerance;
(2) the estimates settle at larger steps: three neighbouring steps above eps agree within a quarter
    of the tolerance (neither truncation, O(h^2), nor rounding, O(r / h), matters there; noise or a
    jump never settles); the middle one is the most reliable estimate d, the larger of the two gaps
    its error bound;
(3) the estimate at eps is further than the tolerance from d, and the one at eps / 4 further still;
(4) backward agrees with d: |a - d| <= atol + rtol |d| + gap on every output entry.
(1)-(3) show that the finite differences at eps are unreliable; (4) is the check of backward, as
strict as the comparison's own. Where (1)-(3) hold and (4) does not, the verdict is "cancellation",
not explained: a wrong gradient, with d in its text. Elsewhere the central difference stands.

Every mismatching element is examined, none skipped for a cap: ``analytical_columns`` gives the
analytical columns of elements whose columns the comparison did not keep, a batch at a time (one
pass of backward calls per batch), so that a caller can look at the worst first and stop as soon
as one element is confirmed wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core.tolerance import limit
from . import precision
from .differences import call_moved, elements
from .jacobian_layout import make_layout
from .realify import Vjp, as_tuple, outputs_vector, real_numel, unravel
from .rows import Rows

HALVINGS = 16  # smallest step eps / 2**16 (~1.5e-11 for eps = 1e-6): rounding noise stays far below rtol
STEPS = range(1, 7)  # central differences at eps * 4^k to find the plateau (see the module's docstring)
Point = tuple[float, torch.Tensor]  # (offset actually taken, realified float64 outputs there)


@dataclass
class Verdict:
    """What one mismatched element is: ``kind`` "kink" | "domain_edge" | "smooth" | "precision" |
    "cancellation"; ``explained`` True when backward is consistent with a one-sided derivative, or for
    "precision" with the central difference within its rounding error, or for "cancellation" with the
    most reliable central difference where the one at eps is shown unreliable (not a wrong gradient);
    ``text`` one phrase for the report. For "precision": ``step``, the largest step in which the
    outputs change, and ``grid``, the float format their values fit ('float32'), or ''. At a corner (a
    kink or tie at x itself: both one-sided derivatives settle and differ), ``sides`` holds them (left,
    right), per output entry, for judging several corners together (``numerics.ties``)."""

    kind: str
    explained: bool
    text: str
    step: float = 0.0
    grid: str = ""
    sides: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class Side:
    """A settled one-sided derivative per output entry, and the gap that bounds its error."""

    d: torch.Tensor
    gap: torch.Tensor


class Line:
    """f along one direction through a point of the arguments: ``self(offset)`` is (the offset actually
    taken, the realified float64 outputs there); ``entry(m)`` names output entry m (``names``: the outputs
    at the point, as (position, output)); no one-sided step goes below ``floor``."""

    floor: float = 0.0
    names: list[tuple[int, torch.Tensor]]

    def __call__(self, offset: float) -> Point:
        raise NotImplementedError

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


class _Element(Line):
    """f as a function of one real element of ``x``, which is restored bit-exactly after every call."""

    def __init__(
        self,
        call: Callable[[Sequence[Any]], Any],
        values: Sequence[Any],
        x: torch.Tensor,
        j: int,
        positions: Sequence[int],
    ) -> None:
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


def examine(
    call: Callable[[Sequence[Any]], Any],
    values: Sequence[Any],
    x: torch.Tensor,
    j: int,
    eps: float,
    positions: Sequence[int],
    analytical: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    index_text: str,
) -> Verdict:
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
    what = f"{index_text}{part} = {fmt(f.x0)}"
    a = analytical.detach().to(torch.float64).cpu().reshape(-1)
    y0 = f.center()
    if y0.numel() != a.numel():
        raise ValueError(f"analytical has {a.numel()} entries, the outputs at {list(positions)} have {y0.numel()}")
    if y0.numel() == 0:
        return Verdict("smooth", False, f"{what}: no output entries to compare")
    if not bool(torch.isfinite(y0).all()):
        m = int((~torch.isfinite(y0)).nonzero()[0])
        return Verdict(
            "domain_edge",
            False,
            f"{what}: f(x){f.entry(m)} is not finite ({fmt(float(y0[m]))}), so no derivative can be checked there",
        )
    minus, plus = f(-eps), f(eps)
    if not (_finite(minus) and _finite(plus)):
        return _domain_edge(f, what, y0, a, eps, minus, plus, atol, rtol)
    coarse = precision_verdict(f, what, y0, a, eps, minus, plus, atol, rtol)
    if coarse is not None:
        return coarse
    left, right = _slope(y0, minus), _slope(y0, plus)
    if _agree(left, right, atol, rtol):
        central = (left + right) / 2
        m = _worst(a, central, limit(central.abs(), atol, rtol))
        return _cancellation(f, what, a, eps, minus, plus, atol, rtol) or Verdict(
            "smooth",
            False,
            f"{what} is not at a kink or domain edge{f.entry(m)}: the left and right differences "
            f"agree on {fmt(central[m])}, backward gives {fmt(a[m])}",
        )
    return _kink(f, what, y0, a, eps, minus, plus, atol, rtol)


def analytical_columns(
    grad: Vjp,
    outputs: Sequence[Any],
    positions: Sequence[int],
    x: torch.Tensor,
    order: Iterable[int],
    kept: Mapping[int, torch.Tensor],
    memory_bytes: int,
) -> Iterator[tuple[int, torch.Tensor]]:
    """(column, analytical column) for the real columns ``order`` of d outputs / d ``x``, in that order,
    lazily: a column in ``kept`` as it is, the others a batch at a time, each batch one pass of
    backward calls over one-hot grad_outputs (``grad`` is ``vjp``'s signature; ``x`` requires grad
    and ``outputs`` are its live graph). A batch holds at most a quarter of ``memory_bytes``."""
    live = [outputs[p] for p in positions]
    layout = make_layout([x], tuple(outputs), list(positions))
    rows = Rows(grad, live, [x], layout, memory_bytes)
    batch = max(1, memory_bytes // 4 // (8 * max(1, layout.n_rows)))
    pending: list[int] = []
    done: dict[int, torch.Tensor] = {}
    wanted = list(order)
    for i, col in enumerate(wanted):
        if col in kept:
            yield col, kept[col]
            continue
        if col not in done:
            done.clear()
            pending = [c for c in wanted[i:] if c not in kept][:batch]
            done.update(zip(pending, _columns(rows, live, pending, layout.n_rows)))
        yield col, done[col]


def _columns(rows: Rows, live: list[Any], cols: list[int], n_rows: int) -> torch.Tensor:
    """Analytical columns ``cols`` (len(cols) x rows), from every row's backward call, a stage at a time."""
    out = torch.zeros(len(cols), n_rows, dtype=torch.float64)
    needing = [o for o in live if o.requires_grad]
    index = torch.tensor(cols, dtype=torch.long)
    k = 0
    for o in live:
        size = real_numel(o)
        for j0 in range(0, size if o.requires_grad else 0, rows.stage):
            j1 = min(size, j0 + rows.stage)
            grad_outs = [torch.zeros((j1 - j0,) + g.shape, dtype=g.dtype, device=g.device) for g in needing]
            one = grad_outs[next(i for i, g in enumerate(needing) if g is o)]
            flat = (torch.view_as_real(one) if one.is_complex() else one).view(j1 - j0, -1)
            flat[torch.arange(j1 - j0), torch.arange(j0, j1)] = 1
            out[:, k + j0 : k + j1] = rows.products(grad_outs)[:, index].t()
        k += size
    return out


def resample_hint(name: str) -> str:
    """One line of advice for an argument whose values sit at kinks or domain edges."""
    return (
        f"keep '{name}' away from kinks and domain edges: add `avoid: [[lo, hi]]` around them to the "
        f"argument '{name}' in the spec (e.g. `avoid: [[-0.001, 0.001]]` for a kink at 0), or `resample: true`"
    )


def precision_verdict(
    f: Line,
    what: str,
    y0: torch.Tensor,
    a: torch.Tensor,
    eps: float,
    minus: Point,
    plus: Point,
    atol: float,
    rtol: float,
) -> Verdict | None:
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
    tol = limit(central.abs(), atol, rtol)
    off = torch.nan_to_num((a - central).abs(), nan=torch.inf)
    limited = (off > tol) & (4 * rounding > tol)
    if not bool(limited.any()):
        return None
    m = int(torch.argmax(torch.where(limited, rounding / tol, -1.0)))
    grid = precision.grid_name(int(bits[m]))
    head = (
        f"{what}: forward's output{f.entry(m)} fits in {int(bits[m])} significant bits ({grid} or lower "
        f"precision) and changes in steps of {fmt(step[m])}, so its central difference at eps={fmt(eps)} is "
        f"good only to +-{fmt(rounding[m])}"
    )
    wrong = (off > tol + 2 * rounding) & (off > tol)
    if bool(wrong.any()):
        w = int(torch.argmax(torch.where(wrong, off / (tol + 2 * rounding), -1.0)))
        return Verdict(
            "precision",
            False,
            f"{head}; yet backward gives {fmt(a[w])}{f.entry(w)} where it is {fmt(central[w])}, further off than that",
            float(step[m]),
            grid,
        )
    return Verdict(
        "precision",
        True,
        f"{head} (the tolerance is {fmt(tol[m])}): backward gives {fmt(a[m])}, within that of {fmt(central[m])}",
        float(step[m]),
        grid,
    )


def _cancellation(
    f: Line, what: str, a: torch.Tensor, eps: float, minus: Point, plus: Point, atol: float, rtol: float
) -> Verdict | None:
    """A "cancellation" verdict where the central difference at eps is shown unreliable by those at
    smaller and larger steps (see the module's docstring for the rule); else None."""
    estimates: dict[int, tuple[float, torch.Tensor]] = {0: (eps, _central(minus, plus))}

    def at(k: int) -> torch.Tensor:
        if k not in estimates:
            h = eps * 4.0**k
            estimates[k] = (h, _central(f(-h), f(h)))
        return estimates[k][1]

    d0 = at(0)
    if not bool(torch.isfinite(d0).all()) or _agree(at(-1), d0, atol, rtol):
        return None  # the error does not grow as the step shrinks: not rounding
    ds = [at(k) for k in STEPS]
    if not all(bool(torch.isfinite(d).all()) for d in ds):
        return None
    # three neighbouring steps above eps whose estimates agree: the plateau (in units of the tolerance)
    gaps = [
        float(((u - v).abs() / limit(torch.maximum(u.abs(), v.abs()), atol, rtol)).max()) for u, v in zip(ds, ds[1:])
    ]
    i = min(range(len(STEPS) - 2), key=lambda i: max(gaps[i], gaps[i + 1]))
    if not 4 * max(gaps[i], gaps[i + 1]) <= 1:
        return None  # never settles: noise or a jump, the central difference stands
    d, gap = ds[i + 1], torch.maximum((ds[i] - ds[i + 1]).abs(), (ds[i + 2] - ds[i + 1]).abs())
    tol = limit(d.abs(), atol, rtol)
    moved = (d0 - d).abs()
    # rounding's signature: the estimate at eps is off by more than the tolerance, and further off at eps / 4
    shown = (moved > tol) & ((at(-1) - d).abs() > moved)
    if not bool(shown.any()):
        return None
    m = int(torch.argmax(torch.where(shown, moved / tol, -1.0)))
    head = (
        f"finite differences unreliable at {what}{f.entry(m)} (cancellation: the estimate moves by "
        f"{fmt(moved[m])} between steps {fmt(eps)} and {fmt(estimates[STEPS[i + 1]][0])}, and is off by "
        f"{fmt((at(-1) - d)[m].abs())} at step {fmt(estimates[-1][0])}); at steps "
        f"{fmt(estimates[STEPS[i]][0])} to {fmt(estimates[STEPS[i + 2]][0])} it settles on {fmt(d[m])}"
    )
    off = torch.nan_to_num((a - d).abs(), nan=torch.inf)
    wrong = off > tol + gap
    if bool(wrong.any()):
        w = int(torch.argmax(torch.where(wrong, off / (tol + gap), -1.0)))
        return Verdict(
            "cancellation", False, f"{head}; yet backward gives {fmt(a[w])}{f.entry(w)} where it is {fmt(d[w])}"
        )
    return Verdict("cancellation", True, f"{head}, backward gives {fmt(a[m])}")


def _central(minus: Point, plus: Point) -> torch.Tensor:
    return (plus[1] - minus[1]) / (plus[0] - minus[0])


def _domain_edge(
    f: Line,
    what: str,
    y0: torch.Tensor,
    a: torch.Tensor,
    eps: float,
    minus: Point,
    plus: Point,
    atol: float,
    rtol: float,
) -> Verdict:
    """A step left the domain: judge with the one-sided derivative of the side that stayed inside."""
    gone = " and ".join(f"f(x {sign} eps)" for sign, p in (("-", minus), ("+", plus)) if not _finite(p))
    head = f"{what} is at the edge of the domain: {gone} {'are' if ' and ' in gone else 'is'} not finite"
    if not _finite(plus) and not _finite(minus):
        return Verdict("domain_edge", False, head + ", so no one-sided difference can be taken")
    s, first = (1, plus) if _finite(plus) else (-1, minus)
    name = "right" if s > 0 else "left"
    side = settle(f, y0, s, eps, first, atol, rtol)
    if side is None:
        return Verdict(
            "domain_edge",
            False,
            f"{head}; the one-sided differences from the {name} do not settle as "
            "the step shrinks (the derivative may be infinite there)",
        )
    tol = limit(side.d.abs(), atol, rtol) + side.gap
    m = _worst(a, side.d, tol)
    ok = bool(((a - side.d).abs() <= tol).all())
    return Verdict(
        "domain_edge",
        ok,
        f"{head}; the one-sided derivative from the {name}{f.entry(m)} is {fmt(side.d[m])}, backward gives {fmt(a[m])}",
    )


def _kink(
    f: Line,
    what: str,
    y0: torch.Tensor,
    a: torch.Tensor,
    eps: float,
    minus: Point,
    plus: Point,
    atol: float,
    rtol: float,
) -> Verdict:
    """Left and right differences at eps disagree: settle each side with smaller steps and compare."""
    left = settle(f, y0, -1, eps, minus, atol, rtol)
    right = settle(f, y0, 1, eps, plus, atol, rtol)
    if left is None and right is None:  # rounding, noise or a jump: cancellation may tell
        return _cancellation(f, what, a, eps, minus, plus, atol, rtol) or Verdict(
            "smooth",
            False,
            f"{what}: the one-sided differences do not settle as the step shrinks (noise or a "
            "jump); the central difference stands",
        )
    if left is None or right is None:
        side, name, other = (right, "right", "left") if left is None else (left, "left", "right")
        assert side is not None  # both None returned above
        tol = limit(side.d.abs(), atol, rtol) + side.gap
        m = _worst(a, side.d, tol)
        ok = bool(((a - side.d).abs() <= tol).all())
        return Verdict(
            "kink",
            ok,
            f"{what} is at a jump or kink{f.entry(m)}: the {other} differences do not "
            f"settle; the {name} derivative is {fmt(side.d[m])}, backward gives {fmt(a[m])}",
        )
    tol = limit(torch.maximum(left.d.abs(), right.d.abs()), atol, rtol)
    if _agree(left.d, right.d, atol, rtol):
        d = (left.d + right.d) / 2
        tol = tol + torch.maximum(left.gap, right.gap) + (left.d - right.d).abs() / 2
        m = _worst(a, d, tol)
        if bool(((a - d).abs() <= tol).all()):
            return Verdict(
                "kink",
                True,
                f"{what} is within eps of a kink (or of curvature too strong for this eps)"
                f"{f.entry(m)}: with smaller steps both sides give {fmt(d[m])}, "
                f"backward gives {fmt(a[m])}",
            )
        return Verdict(
            "smooth",
            False,
            f"{what} is not at a kink{f.entry(m)}: the left and right derivatives "
            f"agree on {fmt(d[m])}, backward gives {fmt(a[m])}",
        )
    tol = tol + torch.maximum(left.gap, right.gap)
    lo, hi = torch.minimum(left.d, right.d) - tol, torch.maximum(left.d, right.d) + tol
    # a subgradient: anything between the two one-sided derivatives (any convex combination at a tie)
    outside = torch.clamp(lo - a, min=0) + torch.clamp(a - hi, min=0)
    outside = torch.where(torch.isnan(a), torch.inf, outside)
    ok = bool((outside == 0).all())
    m = int(torch.argmax((left.d - right.d).abs() / tol)) if ok else int(torch.argmax(outside / tol))
    return Verdict(
        "kink",
        ok,
        f"{what} is a kink or tie{f.entry(m)}: one-sided derivatives {fmt(left.d[m])} "
        f"and {fmt(right.d[m])}, backward gives {fmt(a[m])}",
        sides=(left.d, right.d),
    )


def settle(f: Line, y0: torch.Tensor, s: int, eps: float, first: Point, atol: float, rtol: float) -> Side | None:
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
            if bool((gap <= limit(d.abs(), atol, rtol)).all()):
                return Side(d, gap)
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


def _agree(u: torch.Tensor, v: torch.Tensor, atol: float, rtol: float) -> bool:
    return bool(((u - v).abs() <= limit(torch.maximum(u.abs(), v.abs()), atol, rtol)).all())


def _worst(a: torch.Tensor, d: torch.Tensor, tol: torch.Tensor) -> int:
    """The output entry where ``a`` is furthest from ``d`` in units of tolerance (NaN counts as worst)."""
    if a.numel() == 0:
        return 0
    excess = torch.nan_to_num((a - d).abs() / tol, nan=torch.inf)
    return int(torch.argmax(excess))


def _finite(point: Point) -> bool:
    return bool(torch.isfinite(point[1]).all())


def fmt(v: Any) -> str:
    v = float(v)
    return "0" if v == 0 else f"{v:.4g}"
