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

Pure torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .differences import Step, call_moved
from .realify import Call, outputs_vector

OFFSETS = (-1.0, 1.0, 0.5**0.5, -((1 / 3) ** 0.5))  # sample points x + k eps: no two in a ratio of small integers
MIN_BITS, MAX_BITS = 8, 30  # significant bits that tell a grid (bfloat16 has 8, float16 11, float32 24)
GRIDS = ((8, "bfloat16"), (11, "float16"), (24, "float32"))
STEPS = (1e-3, 1e-2)  # the steps at which a forward that computes in low precision is judged again
WELL_BELOW = 10  # there the central difference's rounding error, step / 2 eps, is at most atol / WELL_BELOW
MAX_EPS = 1e-2  # no larger step is advised: its truncation error eps**2 f''' / 6 nears rtol for ordinary f


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
