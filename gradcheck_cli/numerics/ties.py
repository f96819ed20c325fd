"""Ties: the corners of one comparison judged together, along the direction that moves them together.

``kinks.examine`` judges one element at a time: at a corner (relu, abs or clamp at its kink, one of
several tied maxima) backward passes where it lies between that element's own left and right
derivatives. That cannot see a tie counted twice: for y = max(a, b) at a == b each of a and b alone
has the one-sided derivatives 0 and 1, so a backward that gives the whole gradient to both passes
element by element; yet moving a and b together by t moves y by t, not 2t.

The rule. Let K be a set of corners (elements whose own verdict was a corner, from every argument of
one comparison), d the direction that moves each of them by 1 (the others stay), and g_k backward's
derivative of the outputs by element k (its analytical column). For each output entry m,
S_m = sum_k g_k[m] is backward's derivative along d. A valid gradient (an element of the convex hull of
the gradients f has at points near x, Clarke's generalised gradient: torch's choice of one tied element,
an equal split or any convex combination, relu's 0 or 1 at 0, anything in [-1, 1] for abs at 0) has
S_m within the range of f_m's derivatives along d at points near x. That range is estimated from inside:
- by the left and right derivatives along d at x itself (``kinks.settle``: the second-order one-sided
  formula, the step halved until two estimates agree), and, for an entry m where S_m is outside them,
- by the derivatives along d (left and right) at the two points x + delta s and x - delta s, delta = eps,
  s_k the sign of right_k[m] - left_k[m] (element k's own one-sided derivatives for entry m; + where they
  are equal): there every corner sits on the side where its own derivative is the larger (or the
  smaller). Separate kinks need these: relu(a) - relu(b) at a = b = 0 does not change along (1, 1), yet
  (0, -1) is a valid gradient, the one at (-delta, delta).
S_m is wrong when it is outside that range by more than atol + rtol (max |derivative| + sum_k |g_k[m]|)
plus the gap of the settled derivatives (their error bound), every derivative involved having settled;
where one does not settle, or forward's rounding limits the differences (``kinks.precision_verdict``),
there is no verdict and the elements' own verdicts stand. The range is exact where f_m is convex or
concave along d near x (max, min, relu, abs, clamp and their sums with weights of one sign: every point
near x gives a derivative between the one-sided ones at x) and for sums of separate kinks (the two
points reach both extremes); for other couplings it is an inner estimate, as the elements' own verdicts
are (they judge by the one-sided derivatives at x alone).

Directions: all the corners together first, then the corners of each input value (ties are among equal
values, and in one output entry another value's separate kinks could otherwise hide a tie's excess),
at most ``MAX_GROUPS``, the largest first; at the points around x at most ``ENTRIES`` output entries
are judged, the furthest outside first. Costs about 7 forwards per direction at x, and 14 per entry
judged at the points around it. Pure torch, no I/O.

For the next contributor: the moves are exact (every offset a multiple of one power of two at least the
spacing of every moved element's values, so x_k + offset is representable and each element moves by the
same amount); keep them so, or the one-sided formula mixes rounding into the derivative. A new
direction may only widen the range from points f actually takes near x: never compare S_m with a bound
that a convex combination of nearby gradients can exceed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core.tolerance import limit
from .differences import Element, call_moved, elements
from .kinks import Line, Point, Side, fmt, precision_verdict, settle
from .realify import as_tuple, outputs_vector

MAX_GROUPS = 8  # directions judged: all the corners together, then those of each value
ENTRIES = 4  # output entries judged again at the points around x, the furthest outside first
NAMED = 4  # tied elements named in the text


@dataclass(frozen=True)
class Corner:
    """An element whose own verdict was a corner: real element ``j`` of the argument ``x`` (a tensor inside
    the values finite differences move), named ``name`` (e.g. "x[2, 1]"); backward's derivative of the
    realified outputs by it (``analytical``), and its own settled one-sided derivatives (``left``, ``right``);
    ``argument``: the caller's number for the argument (its row)."""

    x: torch.Tensor
    j: int
    name: str
    analytical: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    argument: int = 0


class Held:
    """The corners kept for ``examine``: as many as a quarter of ``memory_bytes`` holds (three float64 columns
    each); those beyond are left to their own verdicts (any subset of the corners is a direction of the rule)."""

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self.items: list[Corner] = []

    def add(self, c: Corner) -> None:
        if len(self.items) * 3 * 8 * c.analytical.numel() < self.memory_bytes // 4:
            self.items.append(c)

    def since(self, mark: int) -> None:
        """Forget the corners added after the first ``mark``."""
        del self.items[mark:]


@dataclass(frozen=True)
class Tie:
    """Corners whose gradients together are wrong: ``members`` (indices into the corners given) those at a
    corner for the output entry the ``text`` names; ``short``: the same in a few words, for the other
    arguments of the tie."""

    text: str
    members: list[int]
    short: str


def corner(
    x: torch.Tensor,
    j: int,
    name: str,
    analytical: torch.Tensor,
    sides: tuple[torch.Tensor, torch.Tensor],
    argument: int = 0,
) -> Corner:
    """A ``Corner`` from an element's verdict (``kinks.Verdict.sides``), its column float64 on the CPU."""
    a = analytical.detach().to(torch.float64).cpu().reshape(-1)
    return Corner(x, j, name, a, sides[0], sides[1], argument)


def examine(
    call: Callable[[Sequence[Any]], Any],
    values: Sequence[Any],
    corners: Sequence[Corner],
    eps: float,
    positions: Sequence[int],
    *,
    atol: float,
    rtol: float,
    derivative: str = "backward's gradients",
) -> Tie | None:
    """The first set of ``corners`` whose gradients sum, for some output entry, outside what moving them
    together allows (the module's rule), or None where every direction judged agrees or cannot judge.
    The arguments inside ``values`` are moved in place and put back bit-exactly, also when ``call`` raises.
    ``derivative`` names the analytical columns in the text ("the derivatives jvp gives")."""
    if len(corners) < 2:
        return None
    for group in _groups(corners):
        tie = _judge(call, values, corners, group, eps, positions, atol, rtol, derivative)
        if tie is not None:
            return tie
    return None


def _groups(corners: Sequence[Corner]) -> list[list[int]]:
    """All the corners, then those of each input value (two or more, not all of them), the largest first."""
    every = list(range(len(corners)))
    by_value: dict[float, list[int]] = {}
    for i, c in enumerate(corners):
        by_value.setdefault(_value(c), []).append(i)
    more = sorted((g for g in by_value.values() if 1 < len(g) < len(every)), key=len, reverse=True)
    return [every, *more][:MAX_GROUPS]


def _value(c: Corner) -> float:
    real = torch.view_as_real(c.x) if c.x.is_complex() else c.x
    return float(real.reshape(-1)[c.j])


class _Together(Line):
    """f along d (every member moved by the same offset) from the point x + ``base`` (one offset per member)."""

    def __init__(
        self,
        call: Callable[[Sequence[Any]], Any],
        values: Sequence[Any],
        members: Sequence[Corner],
        positions: Sequence[int],
        eps: float,
    ) -> None:
        self.call, self.values, self.positions = call, values, list(positions)
        seen: dict[tuple[int, int], Element] = {}
        quantum = 0.0
        for c in members:  # a tensor passed as two arguments: its element moves once
            if (id(c.x), c.j) not in seen:
                e = elements(c.x)(c.j)
                seen[(id(c.x), c.j)] = e
                quantum = max(quantum, _spacing(e.x0 + math.copysign(4 * eps, e.x0), c.x))
        self.moved = list(seen.values())
        self.quantum = quantum
        self.least = self.floor = 64 * quantum  # no step within a few quanta: the offsets would lose their ratio
        self.base = [0.0] * len(self.moved)
        self.names = []

    def at(self, signs: Sequence[float], delta: float) -> _Together:
        """This line from the point where moved element i is moved by signs[i] * delta (exactly, as every move),
        the point x itself for delta = 0."""
        step = self._exact(delta)
        self.base = [s * step for s in signs]
        return self

    def center(self) -> torch.Tensor:
        """f at the line's point; also remembers the outputs' shapes to name entries."""
        y, outputs = self._call(0.0)
        self.names = [(p, outputs[p]) for p in self.positions]
        return y

    def __call__(self, offset: float) -> Point:
        taken = self._exact(offset)
        return taken, self._call(taken)[0]

    def _exact(self, offset: float) -> float:
        return round(offset / self.quantum) * self.quantum if self.quantum > 0 else offset

    def _call(self, offset: float) -> tuple[torch.Tensor, tuple[Any, ...]]:
        def read(outputs: tuple[Any, ...]) -> tuple[torch.Tensor, tuple[Any, ...]]:
            return outputs_vector(outputs, self.positions).cpu(), tuple(as_tuple(outputs))

        return call_moved(self.call, self.values, _Moves(self.moved, [b + offset for b in self.base]), read)


class _Moves:
    """Several elements moved at once (a ``differences.Move``), each by its own offset, and put back."""

    def __init__(self, moved: Sequence[Element], offsets: Sequence[float]) -> None:
        self.moved, self.offsets = moved, offsets

    def apply(self) -> None:
        done = 0
        try:
            for e, o in zip(self.moved, self.offsets):
                e.to(o).apply()
                done += 1
        except BaseException:
            for e in self.moved[:done]:
                e.restore()
            raise

    def restore(self) -> None:
        for e in reversed(self.moved):
            e.restore()


def _spacing(v: float, x: torch.Tensor) -> float:
    """The spacing of x's dtype at magnitude |v| (a power of two): sums of its multiples up to there are exact."""
    real = x.real if x.is_complex() else x
    info = torch.finfo(real.dtype)
    mag = max(abs(v), info.tiny)
    return info.eps * 2.0 ** math.floor(math.log2(mag))


def _derivatives(line: _Together, eps: float, atol: float, rtol: float) -> tuple[Side, Side] | None:
    """The settled left and right derivatives of ``line`` at its point, or None where a step leaves the
    domain, forward's rounding limits the differences, or a side does not settle."""
    y0 = line.center()
    minus, plus = line(-eps), line(eps)
    if not (bool(torch.isfinite(minus[1]).all()) and bool(torch.isfinite(plus[1]).all())):
        return None
    # judged as if backward gave 0: where the rounding of any moving entry could matter, no verdict
    if precision_verdict(line, "", y0, torch.zeros_like(y0), eps, minus, plus, atol, rtol) is not None:
        return None
    line.floor = max(line.floor, line.least)
    left, right = settle(line, y0, -1, eps, minus, atol, rtol), settle(line, y0, 1, eps, plus, atol, rtol)
    return None if left is None or right is None else (left, right)


def _judge(
    call: Callable[[Sequence[Any]], Any],
    values: Sequence[Any],
    corners: Sequence[Corner],
    group: list[int],
    eps: float,
    positions: Sequence[int],
    atol: float,
    rtol: float,
    derivative: str,
) -> Tie | None:
    """One direction: the corners ``group`` moved together (the module's rule)."""
    members = [corners[i] for i in group]
    s = torch.stack([c.analytical for c in members]).sum(0)
    size = torch.stack([c.analytical.abs() for c in members]).sum(0)
    line = _Together(call, values, members, positions, eps)
    at_x = _derivatives(line, eps, atol, rtol)
    if at_x is None:
        return None
    lo, hi = torch.minimum(at_x[0].d, at_x[1].d), torch.maximum(at_x[0].d, at_x[1].d)
    gap = torch.maximum(at_x[0].gap, at_x[1].gap)
    excess = _excess(s, lo, hi, size, gap, atol, rtol)
    for m in [int(m) for m in torch.argsort(excess, descending=True)[:ENTRIES] if excess[m] > 0]:
        signs = [1.0 if float(c.right[m]) >= float(c.left[m]) else -1.0 for c in _unique(members)]
        around = [_derivatives(line.at([v * t for t in signs], eps), eps / 4, atol, rtol) for v in (1.0, -1.0)]
        line.at(signs, 0.0)
        if any(pair is None for pair in around):
            continue  # a point around x where the derivative cannot be told: no verdict for this entry
        sides = [side for pair in around if pair is not None for side in pair]
        ds = [float(lo[m]), float(hi[m]), *(float(side.d[m]) for side in sides)]
        low, high = min(ds), max(ds)
        most = max([float(gap[m]), *(float(side.gap[m]) for side in sides)])
        slack = limit(max(abs(low), abs(high)) + float(size[m]), atol, rtol) + most
        total = float(s[m])
        if not low - slack <= total <= high + slack:
            return _tie(corners, group, m, total, (float(lo[m]), float(hi[m])), (low, high), line, derivative)
    return None


def _unique(members: Sequence[Corner]) -> list[Corner]:
    """The members in the order ``_Together`` moves them (a tensor passed as two arguments: once)."""
    seen: dict[tuple[int, int], Corner] = {}
    for c in members:
        seen.setdefault((id(c.x), c.j), c)
    return list(seen.values())


def _excess(
    s: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, size: torch.Tensor, gap: torch.Tensor, atol: float, rtol: float
) -> torch.Tensor:
    """How far each S_m lies outside [lo, hi], in units of its slack (0 inside; NaN counts as outside)."""
    slack = limit(torch.maximum(lo.abs(), hi.abs()) + size, atol, rtol) + gap
    out = torch.clamp(lo - s, min=0) + torch.clamp(s - hi, min=0)
    return torch.nan_to_num(out / slack, nan=math.inf)


def _tie(
    corners: Sequence[Corner],
    group: list[int],
    m: int,
    total: float,
    at_x: tuple[float, float],
    around: tuple[float, float],
    line: Line,
    derivative: str,
) -> Tie:
    """The words for a wrong sum of gradients over a tie at output entry m."""
    tied = [i for i in group if float(corners[i].left[m]) != float(corners[i].right[m])] or group
    names = [corners[i].name for i in tied]
    shown = ", ".join(names[:NAMED]) + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")
    vals = sorted({_value(corners[i]) for i in tied})
    at = f" (= {fmt(vals[0])})" if len(vals) == 1 else ""
    left, right = at_x
    rate = f"at rate {fmt(right)} either way" if _same(left, right) else f"at rate {fmt(right)} up, {fmt(left)} down"
    low, high = around
    bound = fmt(low) if _same(low, high) else f"between {fmt(low)} and {fmt(high)}"
    more = total > high
    text = (
        f"{shown}{at} are tied{line.entry(m)}: moved together, they move the output {rate}, so {derivative} "
        f"over them must sum to {bound}; they sum to {fmt(total)}, "
        f"{'more' if more else 'less'} than the one-sided derivatives allow"
    )
    times = total / high if high else 0.0
    if more and round(times) > 1 and _same(times, round(times)):
        text += (
            f" (the tie counted {round(times)} times: each tied element given the whole of it; at a tie "
            "it goes to one of them, or is shared among them)"
        )
    elif not more and low > 0 and _same(total, 0.0):
        text += " (the tie dropped: no tied element given the gradient; at a tie it goes to one of them or is shared)"
    short = f"the gradients over the tie {shown}{line.entry(m)} sum to {fmt(total)}, where {bound} is allowed"
    return Tie(text, tied, short)


def _same(u: float, v: float) -> bool:
    """Equal within rounding of the settled derivatives (far below any tolerance)."""
    return abs(u - v) <= 1e-9 * max(1.0, abs(u), abs(v))
