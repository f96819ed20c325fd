"""What the numbers show, as data (a Pattern and a ratio) and in words: constant ratios, sign
flips, zeros (of a whole side, or a gradient where the outputs do not depend on some elements), a
transpose, the complex conjugate convention, a few bad elements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...core.tolerance import limit, within
from ...numerics import ArgumentComparison, unravel
from ...results import InputReport, Pattern
from ...subject import sparse

CONSTANT_RATIO_RESIDUAL = 1e-6  # relative squared residual below which a ratio counts as constant
# a numerical gradient this small against atol (the root of its sum of squares) is rounding: a batched
# forward's matmul rounds each batch row in its own way, so an input the outputs do not depend on gets
# differences of about ulp / eps (1e-10) there, not zeros
ROUNDING = 1e-3


@dataclass(frozen=True)
class Diagnosis:
    """A pattern, its ratio (analytical / numerical) where it has one, and the words for it."""

    pattern: Pattern
    text: str
    ratio: Optional[float] = None

    def put(self, row: InputReport) -> None:
        """Write this diagnosis into ``row``."""
        row.pattern, row.diagnosis, row.ratio = self.pattern, self.text, self.ratio


CONJUGATE = Diagnosis(
    Pattern.CONJUGATE,
    "backward uses the conjugate convention: it returns grad_output * f'(z) "
    "where PyTorch expects grad_output * conj(f'(z)) (the conjugate Wirtinger derivative); "
    "conjugate it",
)


def ratio_text(r: float, rtol: float = 1e-3) -> str:
    """2.0 -> '2.00x'; keeps more digits when two would hide the point (1.001 -> '1.001x')."""
    close = max(1e-4, rtol / 10) * abs(r)  # as many digits as the tolerance can tell apart
    text = next((t for t in (f"{r:.2f}", f"{r:.4g}", f"{r:.5g}") if abs(float(t) - r) <= close), f"{r:.6g}")
    return f"{text}x"


def constant_ratio(entry: ArgumentComparison) -> Optional[float]:
    """The factor r with analytical = r * numerical for every entry, if there is one."""
    if entry.sum_nn <= 0 or entry.sum_aa <= 0:
        return None
    r = entry.sum_an / entry.sum_nn
    # least-squares residual |a - r n|^2 relative to |a|^2
    residual = (entry.sum_aa - 2 * r * entry.sum_an + r * r * entry.sum_nn) / entry.sum_aa
    return r if residual < max(CONSTANT_RATIO_RESIDUAL, entry.rtol**2) else None  # constant within tolerance


def explains(entry: ArgumentComparison, r: float) -> bool:
    """Whether analytical = ``r`` x numerical accounts for the mismatch: ``r`` is off 1 by more than
    rtol, and each mismatching column is within tolerance of ``r`` x numerical: exactly where it is
    kept whole, in its projection u^T J elsewhere (``r`` takes at least half of its error away)."""
    if abs(r - 1) <= entry.rtol:  # such a ratio is within tolerance of 1: it cannot make an entry wrong
        return False
    for _, a, n in entry.bad_columns:
        rn = n * r
        if not bool(within(a, rn, entry.atol, entry.rtol).all()):
            return False
    bad = entry.bad.nonzero().view(-1)
    pa, pn = entry.proj_a[bad], entry.proj_n[bad]
    return bool(((pa - r * pn).abs() <= (pa - pn).abs() / 2).all())


def systematic(entry: ArgumentComparison, threshold: float) -> Optional[Diagnosis]:
    """For a gradient within tolerance: a constant factor off 1 by more than ``threshold``
    everywhere (e.g. 1.001x) is no rounding noise but a small bug that tolerances hide."""
    r = constant_ratio(entry)
    if r is None or abs(r - 1) <= threshold:
        return None
    return Diagnosis(
        Pattern.SYSTEMATIC,
        f"within tolerance, but analytical is {ratio_text(r, entry.rtol)} numerical "
        "everywhere: a systematic factor (a constant slightly off?); tighten rtol to fail on it",
        r,
    )


def conjugate(entry: ArgumentComparison, imag_rows: torch.Tensor, complex_input: bool) -> bool:
    """Whether the mismatching columns kept whole fit backward's conjugate-convention mistake:
    returning grad_output * f'(z) where PyTorch expects grad_output * conj(f'(z)). Realified,
    that flips the sign of exactly the entries where one of (output part, input part) is imaginary."""
    if not entry.bad_columns:
        return False
    for col, a, n in entry.bad_columns:
        flip = imag_rows ^ bool(complex_input and col % 2)
        expected = torch.where(flip, -n, n)
        if not bool(((a - expected).abs() <= limit(n.abs(), entry.atol, entry.rtol)).all()):
            return False
    return True


def transposed(entry: ArgumentComparison, shape: tuple[int, ...]) -> bool:
    """Whether the analytical gradient is the numerical one with the last two dims swapped."""
    if len(shape) < 2 or shape[-1] != shape[-2] or entry.real_numel != _prod(shape):
        return False
    a = entry.proj_a.view(shape).transpose(-1, -2)
    n = entry.proj_n.view(shape)
    scale = (float(n.abs().max()) or 1.0) * max(1e-6, entry.rtol / 10)  # what rounding in the dtype allows
    return bool((a - n).abs().max() <= scale) and not bool((entry.proj_a.view(shape) - n).abs().max() <= scale)


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def describe(
    entry: ArgumentComparison,
    mismatched: int,
    numel: int,
    shape: tuple[int, ...] = (),
    name: str = "",
    output: Optional[str] = None,
) -> Optional[Diagnosis]:
    """The pattern of a failing argument, or None when nothing is wrong. ``name``: the argument's, and
    ``output``: where the worst entry is among the outputs (for the words)."""
    if entry.nonfinite:
        return Diagnosis(
            Pattern.NONFINITE,
            f"{entry.nonfinite} Jacobian entries are NaN or infinite: the function or "
            "its backward produces non-finite values at these inputs",
        )
    if not mismatched:
        return None
    if entry.sum_aa == 0 and entry.sum_nn > 0:
        return Diagnosis(
            Pattern.ZERO_ANALYTICAL,
            "analytical gradient is all zeros: backward returns zeros or None "
            "for it (a missing return, a detached result, or the wrong position in the returned tuple?)",
        )
    if entry.sum_nn <= (entry.atol * ROUNDING) ** 2 and entry.sum_aa > 0:
        return Diagnosis(
            Pattern.ZERO_NUMERICAL,
            "the outputs do not depend on it (numerical gradient zero, up to "
            "rounding), but backward returns a non-zero gradient",
        )
    at = f" at {output}" if output else ""
    if entry.wrong and entry.wrong_at_zero == entry.wrong:  # every wrong entry: numerical 0, analytical not
        if not bool((entry.bad & entry.live).any()):  # and the outputs depend on none of those elements
            return Diagnosis(
                Pattern.ZERO_NUMERICAL,
                f"analytical is non-zero at {_elements(mismatched)} the outputs "
                f"do not depend on (e.g. {_worst(entry, shape, name)})",
            )
        return Diagnosis(
            Pattern.ZERO_NUMERICAL,
            f"analytical is non-zero where the outputs do not depend on "
            f"{name or 'the argument'}: at {entry.wrong} Jacobian entries of {_elements(mismatched)} "
            f"(e.g. {_worst(entry, shape, name, at)})",
        )
    r = constant_ratio(entry)
    if r is not None and explains(entry, r):
        if abs(r + 1) < max(1e-3, entry.rtol):
            return Diagnosis(Pattern.SIGN_FLIP, "sign flipped: analytical = -numerical", r)
        return Diagnosis(Pattern.CONSTANT_RATIO, f"analytical is {ratio_text(r, entry.rtol)} numerical", r)
    if transposed(entry, shape):
        return Diagnosis(
            Pattern.TRANSPOSED,
            "analytical is the numerical gradient transposed (last two dims swapped): a missing or extra .t()?",
        )
    if mismatched < numel:
        return Diagnosis(
            Pattern.SOME_ELEMENTS,
            f"{mismatched} of {numel} elements are wrong, the others match (worst {_worst(entry, shape, name, at)})",
        )
    return Diagnosis(
        Pattern.NO_PATTERN,
        f"wrong everywhere, with no constant ratio or sign flip (worst {_worst(entry, shape, name, at)})",
    )


def _elements(n: int) -> str:
    return f"{n} element{'s' * (n != 1)}"


def _worst(entry: ArgumentComparison, shape: tuple[int, ...], name: str, at: str = "") -> str:
    """The worst entry in words: 'x[3]: analytical 0.25, numerical 0' (a complex argument's: of its real view);
    ``at``: where among the outputs (' at output 0 [1]')."""
    per = 2 if entry.real_numel == 2 * _prod(shape) and entry.real_numel else 1
    where = f"{name}{unravel(entry.worst_col // per, shape)}" if shape else name
    return f"{where}{at}: analytical {entry.analytical + 0.0:.3g}, numerical {entry.numerical + 0.0:.3g}"  # no -0


def diagnose(row: InputReport, entry: ArgumentComparison, shape: tuple[int, ...]) -> None:
    """Write the pattern of ``row``'s mismatch (or none) into it."""
    found = describe(entry, row.mismatched or 0, row.numel, shape, row.name, row.worst_output)
    if found:
        found.put(row)
        if found.pattern is Pattern.ZERO_NUMERICAL:
            row.diagnosis = f"{row.diagnosis}{sparse.outside(row.name, row.via)}"
    else:
        row.pattern, row.diagnosis, row.ratio = None, None, None
