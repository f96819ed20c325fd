"""The resolution of a function's outputs: the step in which they change when an input moves.

A forward that computes in float32 (casts its input, or runs a float32 kernel) returns values on
float32's grid even when it is called on float64: its outputs change in steps of one float32 ulp
(about 6e-8 |y|), and a central difference (f(x + eps) - f(x - eps)) / 2 eps is then off by up
to step / 2 eps, 0.06 for eps = 1e-6 and outputs near 1: it measures rounding, not the
derivative. A quantised forward (round(y * 2**16) / 2**16) does the same with its own step.

``resolution`` estimates that step for each output entry from its values at a few points near x
(``OFFSETS``) by their significant bits: a value computed in a binary format of B bits has at most
B significant bits, so all the samples of an entry fitting in B bits (8 <= B <= 30) mean a grid of
spacing 2**(E - B + 1) at magnitude 2**E. Fewer bits are told by the values themselves (integers,
0.5), more are float64's own rounding; a float64 value fits in 30 bits by chance with probability
2**-23, all the samples of an entry together far less. Steps that are no power of two (a float32
result scaled in float64, a decimal rounding) are not seen: an exact gcd of the samples'
differences would find them, but in floating point it also finds false steps in smooth functions.

A float64 check of a forward that computes in float32 inside is judged again at a larger step,
chosen from the function's own curvature (``judged_step``), never fixed: a central difference
D(h) = (f(x + h) - f(x - h)) / 2h is off by its truncation error h**2 f''' / 6 plus its rounding
error (each output off by up to half its grid step s: s / 2h), and at h = 1e-2 the first alone is
0.17% for sin(10 x), beyond rtol. For each step h of ``CANDIDATES`` and ``CANDIDATES`` times the
argument's largest magnitude, above the spec's eps, ``SAMPLED`` input elements give D(h) and
D(h / 2). D(h) - D(h / 2) is 3/4 of D(h)'s truncation error plus both steps' rounding, so the error
bound of D(h) per output entry is taken as (``bounded``)

    E(h) = 2 |D(h) - D(h / 2)| + 2 s / h + 2 |D(h)| s_x / h

(8/3 of the truncation and about twice the rounding the two steps show; the worst case of two
roundings of each output, s / 2 each; and of two roundings of each point, for a forward that reads
x in float32 and scales it, s_x / 2 each with s_x the grid's spacing at x: a forward of a few
float32 operations). The step taken is the one whose bound takes the smallest share of the
tolerance atol + rtol |D(h)| over the sampled entries. Then every element is judged by its own
bound at that step and the next ``TRIED`` - 1 best ones (``decide``; an element whose derivative is
small is best judged at a larger step than one whose derivative is large): for any true
derivative t within E of D, an entry with |a - D| <= atol + rtol |D| - E has |a - t| within the
tolerance (the exact derivative's verdict is a pass), one with |a - D| > atol + rtol |D| + E has
it beyond (a fail). An argument passes where every entry is within, fails where one is beyond, and otherwise
the finite differences cannot decide: no verdict, never a pass. A factor 1 + rtol exactly (0.1%) is the
tolerance's own edge, within it by atol's margin: there the words say the check cannot decide wherever E
exceeds that margin.

For the next contributor: the bound is an estimate (the sampled elements' curvature chooses the
step; each element's own two steps bound its error); keep every term an overestimate, and never let
an element that is not within the tolerance less its bound pass. An entry that does not move at
any of the four points has D = 0 and bound 2 s / h (its derivative is below that); where backward
gives exactly 0 there it is taken as a structural zero and agrees (a term below 2 s / h that
backward leaves out there is not seen: 1e-5 for outputs near 1 at h = 1e-2). The bound holds
the exact derivative at every step up to a tenth of the function's length scale
(tests/unit/test_float32_inside_scales.py); beyond, two steps can agree by chance, which the
choice of the step over eight elements avoids.

Pure torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch

from ..core.tolerance import limit
from .differences import Step, call_moved, elements
from .realify import Call, outputs_vector

OFFSETS = (-1.0, 1.0, 0.5**0.5, -((1 / 3) ** 0.5))  # sample points x + k eps: no two in a ratio of small integers
MIN_BITS, MAX_BITS = 8, 30  # significant bits that tell a grid (bfloat16 has 8, float16 11, float32 24)
GRIDS = ((8, "bfloat16"), (11, "float16"), (24, "float32"))
STEPS = (1e-3, 1e-2)  # the steps at which a forward that computes in low precision is judged again
WELL_BELOW = 10  # there the central difference's rounding error, step / 2 eps, is at most atol / WELL_BELOW
MAX_EPS = 1e-2  # no larger step is advised: its truncation error eps**2 f''' / 6 nears rtol for ordinary f
CANDIDATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)  # the steps a judgement again chooses from, and these times |x|
SCALE_FREE = (0.1, 10.0)  # inputs of largest magnitude in here are tried at CANDIDATES only, others also at |x| times
TRIED = 3  # the steps of the smallest shares at which every element is judged
SAMPLED = 8  # input elements whose differences at two steps estimate the bound


def significant_bits(v: torch.Tensor) -> torch.Tensor:
    """Significant bits of each float64 value (1 for a power of two, 53 for most; 0 for 0 and non-finite)."""
    v = v.to(torch.float64)
    mantissa = (v.view(torch.int64) & ((1 << 52) - 1)) | (1 << 52)  # with the implicit leading bit
    lowest = mantissa & -mantissa
    bits = 53 - torch.log2(lowest.to(torch.float64)).round().to(torch.int64)
    return torch.where(torch.isfinite(v) & (v != 0), bits, 0)


def resolution(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(step, bits) per output entry, from ``samples`` [S, M] (float64): the values of M output
    entries at S points near x. ``step`` is 0 where the values show no grid coarser than float64's
    rounding; ``bits`` the significant bits of the grid (0 where there is none)."""
    samples = samples.to(torch.float64)
    finite = torch.isfinite(samples).all(0)
    samples = torch.where(finite, samples, 0.0)
    top = samples.abs().amax(0)
    bits = significant_bits(samples).amax(0)
    grid = (bits >= MIN_BITS) & (bits <= MAX_BITS)
    exponent = torch.floor(torch.log2(torch.where(top > 0, top, 1.0)))
    step = torch.where(finite & grid, torch.exp2(exponent - bits + 1), 0.0)
    return step, torch.where(step > 0, bits, 0)


def grid_name(bits: int) -> str:
    """The narrowest float format that holds ``bits`` significant bits ('float32' for 24), or ''."""
    return next((name for size, name in GRIDS if 0 < bits <= size), "")


def advice(step: float, eps: float, atol: float) -> tuple[float, float | None] | None:
    """(eps, atol) at which central differences resolve a derivative of a function whose outputs
    change in steps of ``step``, when ``eps`` and ``atol`` did not: eps near step**(1/3), which
    balances the rounding error step / 2 eps against the truncation error eps**2 f''' / 6, as a
    power of ten (1e-3 for float32 outputs near 1), or ten times ``eps`` where that is already as
    large (never the step already used), at most MAX_EPS; and an atol that covers the rounding error
    there (None where ``atol`` already does). None where neither helps (``eps`` is MAX_EPS already
    and ``atol`` covers the rounding): finite differences cannot check it."""
    balanced = 10.0 ** (math.ceil(math.log10(step) / 3) - 1)
    new_eps = balanced if balanced > eps else 10 * eps
    if new_eps > MAX_EPS * (1 + 1e-9):
        new_eps = eps
    rounding = step / (2 * new_eps)
    new_atol = 10.0 ** math.ceil(math.log10(rounding))
    if new_eps == eps and new_atol <= atol:
        return None
    return new_eps, new_atol if new_atol > atol else None


def rejudge_eps(step: float, eps: float, atol: float) -> float | None:
    """The step of ``STEPS`` at which to judge again an argument whose finite differences at ``eps``
    measure rounding (its outputs change in steps of ``step``): the smallest one above ``eps`` where
    the rounding error step / 2 eps is at most atol / WELL_BELOW (room for a low-precision
    computation's noise of a few steps), else the largest; None where none is above ``eps``."""
    above = [s for s in STEPS if s > eps]
    return next((s for s in above if step / (2 * s) <= atol / WELL_BELOW), above[-1] if above else None)


def directional(
    call: Call,
    values: Sequence[Any],
    x: torch.Tensor,
    u: torch.Tensor,
    eps: float,
    positions: Sequence[int],
    w: torch.Tensor,
) -> tuple[float, float]:
    """(d, err): d = w^T (f(x + eps u) - f(x - eps u)) / 2 eps, the central difference along
    direction ``u`` (one value per real element of ``x``, a tensor inside ``values``, moved in
    place and put back) of the realified outputs at ``positions`` weighted by ``w``; and an
    estimate of its error, the finite differences' own: the truncation error, 4/3 |d - d(eps/2)|
    (Richardson: it is O(eps^2), so d(eps/2) has a quarter of it), plus the rounding error
    sum |w| step / 2 eps, where step is the outputs' resolution or 4 float64 ulps."""

    def at(h: float) -> torch.Tensor:
        return call_moved(call, values, Step(x, h * u), lambda outputs: outputs_vector(outputs, positions).cpu())

    ys = torch.stack([at(h) for h in (-eps, eps, -eps / 2, eps / 2)])
    d = float(w @ (ys[1] - ys[0])) / (2 * eps)
    half = float(w @ (ys[3] - ys[2])) / eps
    step, _ = resolution(ys)
    step = torch.maximum(step, ys.abs().amax(0) * 2.0**-50)
    return d, 4 / 3 * abs(d - half) + float(w.abs() @ step) / (2 * eps)


class Judged(NamedTuple):
    """The step a row is judged again at, and the share of the tolerance its finite differences'
    error bound takes there: the largest E / (atol + rtol |D(h)|) over the sampled entries; ``steps``,
    the ``TRIED`` steps of the smallest shares, best first (``decide`` judges each element at each)."""

    eps: float
    share: float
    steps: tuple[float, ...]


class Decision(NamedTuple):
    """Each real element of a row judged again at one step (``decide``): how many are within the
    tolerance whatever the true derivative within the bound (``passed``), beyond it whatever it is
    (``failed``), or neither (``undecided``); ``example``: the first failed element's or, where none
    failed, the first undecided one's (col, analytical, numerical, bound, tolerance) at its worst entry."""

    passed: int
    failed: int
    undecided: int
    example: tuple[int, float, float, float, float] | None


def bounded(
    call: Call, values: Sequence[Any], x: torch.Tensor, col: int, positions: Sequence[int], h: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(D(h), E(h)) for real element ``col`` of ``x`` (a tensor inside ``values``, moved in place and
    put back), per output entry at ``positions``: the central difference at ``h`` and its error
    bound E = 2 |D(h) - D(h/2)| + 2 s / h + 2 |D(h)| s_x / h, s the entry's grid step (``_grid``; see
    the module's docstring) and s_x that grid's spacing at x (a forward that reads x in float32 moves
    the points themselves); 2 s / h for an entry that does not move at any of the four points (its
    derivative is below that). A bound that is not finite is infinite."""
    element = elements(x)(col)
    ys = torch.stack(
        [
            call_moved(call, values, element.to(k), lambda outputs: outputs_vector(outputs, positions).cpu())
            for k in (-h, h, -h / 2, h / 2)
        ]
    ).to(torch.float64)
    d, half = (ys[1] - ys[0]) / (2 * h), (ys[3] - ys[2]) / h
    grid, bits = _grid(ys)
    # the points x +- h read in the grid's format are off by up to half its spacing at x: D(h) by that / 2h, relative
    x0 = element.x0
    moved = 2.0 ** (math.floor(math.log2(abs(x0))) - bits + 1) if x0 and math.isfinite(x0) else 0.0
    still = (ys == ys[0]).all(0)  # an entry that does not move at any of the four points: D is exactly 0
    bound = torch.where(still, 2 * grid / h, 2 * (d - half).abs() + 2 * grid / h + 2 * d.abs() * moved / h)
    return d, torch.nan_to_num(bound, nan=math.inf)


def judged_step(
    call: Call,
    values: Sequence[Any],
    x: torch.Tensor,
    cols: Sequence[int],
    positions: Sequence[int],
    eps: float,
    atol: float,
    rtol: float,
) -> Judged | None:
    """The step above ``eps`` whose error bound (``bounded``) takes the smallest share of the
    tolerance atol + rtol |D(h)|, the largest share over the real elements ``cols`` of ``x`` and their
    output entries: the step chosen from the function's own curvature and rounding. The steps tried
    are ``CANDIDATES`` and, where ``x``'s largest magnitude |x| is outside ``SCALE_FREE``, ``CANDIDATES``
    times |x| to one digit (an input near 1e3 read in
    float32 moves in steps of 6e-5, which a step of 1e-2 would measure; near 1e-3 a step of 1e-4 is a
    tenth of the input).
    None where no step tried is above ``eps``."""
    shares: list[tuple[float, float]] = []
    real = torch.view_as_real(x) if x.is_complex() else x
    size = float(real.detach().abs().max()) if real.numel() else 0.0
    scaled = math.isfinite(size) and size > 0 and not SCALE_FREE[0] <= size <= SCALE_FREE[1]
    steps = {*CANDIDATES, *(float(f"{c * size:.0e}") for c in CANDIDATES if scaled)}
    for h in sorted(c for c in steps if c > eps):
        share = 0.0
        for col in cols:
            d, bound = bounded(call, values, x, col, positions, h)
            if d.numel():
                share = max(share, float((bound / limit(d.abs(), atol, rtol)).max()))
        shares.append((share, h))
    if not shares:
        return None
    ranked = sorted(shares)[:TRIED]
    return Judged(ranked[0][1], ranked[0][0], tuple(h for _, h in ranked))


def decide(
    call: Call,
    values: Sequence[Any],
    x: torch.Tensor,
    columns: Iterable[tuple[int, torch.Tensor]],
    positions: Sequence[int],
    steps: Sequence[float],
    atol: float,
    rtol: float,
) -> Decision:
    """Judge each (real element, analytical column) of ``columns`` at each of ``steps`` by the error
    bound of that step: with D = D(h) and E its bound (``bounded``), an output entry whose analytical
    value a has |a - D| <= atol + rtol |D| - E is within the tolerance of every derivative within E of
    D, one with |a - D| > atol + rtol |D| + E is beyond it. An element fails where, at a step, one of its
    entries is beyond; passes where, at a step, all are within; and is undecided otherwise, or where two
    steps disagree (a bound broken: never a pass). An entry that does not move at any of the four points,
    where backward gives exactly 0, agrees: a structural zero of the Jacobian (the one exception to the
    bound: a term below 2 s / h that backward leaves out there is not seen)."""
    passed = failed = undecided = 0
    example: tuple[int, float, float, float, float] | None = None
    for col, a_col in columns:
        a = a_col.detach().to(torch.float64).cpu().reshape(-1)
        fails, passes, worst = [], [], None
        for h in steps:
            d, bound = bounded(call, values, x, col, positions, h)
            off = torch.nan_to_num((a - d).abs(), nan=math.inf)
            tol = limit(d.abs(), atol, rtol)
            bound = torch.where((a == 0) & (d == 0), 0.0, bound)  # a structural zero (see ``bounded``): agreed
            beyond = off > tol + bound
            if bool(beyond.any()):
                m = int(torch.argmax(torch.where(beyond, off - tol - bound, -math.inf)))
                fails.append((col, float(a[m]), float(d[m]), float(bound[m]), float(tol[m])))
            elif bool((off <= tol - bound).all()):
                passes.append(h)
            elif worst is None:
                m = int(torch.argmax(off + bound - tol))
                worst = (col, float(a[m]), float(d[m]), float(bound[m]), float(tol[m]))
        if fails and not passes:
            failed += 1
            if failed == 1:
                example = fails[0]
        elif passes and not fails:
            passed += 1
        else:
            undecided += 1
            if example is None:
                example = worst or (fails[0] if fails else None)
    return Decision(passed, failed, undecided, example)


def _grid(samples: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Each output entry's grid step, from ``samples`` [S, M]: the spacing 2**(E - B + 1) at its
    largest magnitude 2**E of the grid the moving entries show (their most significant bits B, as
    ``resolution`` reads them); a constant entry's own bits are left out (its one value may fit in
    fewer by chance), or where none moves the values' own; 4 float64 ulps where none shows a grid (B = 51). And B."""
    step, bits = resolution(samples)
    moving = (samples != samples[0]).any(0) & (step > 0)
    shown = bits[moving] if bool(moving.any()) else bits[step > 0]  # none moves: the values' own bits
    b = int(shown.max()) if shown.numel() else 51
    top = samples.abs().amax(0)
    return torch.exp2(torch.floor(torch.log2(torch.where(top > 0, top, 1.0))) - b + 1) * (top > 0), b


def sampled(first: Sequence[int], n: int, k: int = SAMPLED) -> list[int]:
    """Up to ``k`` distinct columns of ``n``: those of ``first`` (the elements examined) in order,
    then columns spread evenly over all ``n``, so that the bound sees more than the worst ones."""
    out = list(dict.fromkeys(c for c in first if 0 <= c < n))[:k]
    for c in torch.linspace(0, n - 1, k).round().long().tolist() if n else []:
        if len(out) >= k:
            break
        if c not in out:
            out.append(c)
    return out
