"""Where a low-precision Function's finite differences are taken: its forward run on float64 /
complex128 copies, each argument judged by its own dtype's tolerances (shared by backward,
double_backward and forward_ad)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch

from ...core.tolerance import Tolerance
from ...sandbox.errors import UserCodeError
from .base import HALF

REFERENCE = {
    torch.float32: torch.float64,
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.complex64: torch.complex128,
}  # the dtype finite differences are taken in


def reference(
    forward: Callable[[Sequence[Any]], Any],
    plain: list[Any],
    names: Sequence[str],
    checked: list[int],
    tol: Tolerance,
    judged: str = "backward",
    numerical: str = "the numerical gradient comes from forward",
) -> tuple[Optional[list[Any]], list[Tolerance], list[str]]:
    """Finite differences of a low-precision Function are taken in double precision (its forward
    run on float64/complex128 copies of ``plain``, the values they move, named ``names``); each
    checked argument gets its own dtype's tolerances (returned in ``checked``'s order) unless the
    spec set its own: a float64 argument beside a float32 one keeps float64's. If forward fails in
    double precision, they are taken in float32 itself with a larger step, and every argument gets
    the low dtype's tolerances (forward's outputs carry its rounding, whatever an argument's dtype);
    in float16 or bfloat16 they are not taken at all (None, and why). ``judged`` and ``numerical``
    word the notes for the check ("backward"; "the numerical gradient comes from forward")."""
    low = [i for i in checked if plain[i].dtype in REFERENCE]
    if not low:
        return plain, [tol] * len(checked), []
    listed = ", ".join(repr(names[i]) if not names[i].startswith("grad_output ") else names[i] for i in low)
    dtypes = ", ".join(sorted({str(plain[i].dtype)[6:] for i in low}))
    subject = f"{listed} {'is' if len(low) == 1 else 'are'} {dtypes}"
    refs = " / ".join(sorted({str(REFERENCE[plain[i].dtype])[6:] for i in low}))
    copies: dict[int, torch.Tensor] = {}
    upcast = [
        copies.setdefault(id(v), v.to(REFERENCE[v.dtype]))
        if isinstance(v, torch.Tensor) and v.dtype in REFERENCE
        else v
        for v in plain
    ]

    try:
        forward(upcast)
    except UserCodeError as exc:
        half = sorted({str(plain[i].dtype)[6:] for i in low if plain[i].dtype in HALF})
        if half:
            return (
                None,
                [tol] * len(checked),
                [
                    f"{subject}, and forward fails in {refs} ({exc}): finite differences in "
                    f"{' / '.join(half)} measure its rounding (about "
                    f"{max(torch.finfo(getattr(torch, h)).eps for h in half):.0e} relative), not the "
                    f"derivative, so they cannot judge {judged}"
                ],
            )
        shared = tol
        for dtype in {plain[i].dtype for i in low}:  # the loosest of their limits, and their step
            shared = shared.at_least(dtype, eps=True)
        every = " for every argument" if len(low) < len(checked) else ""
        return (
            plain,
            [shared] * len(checked),
            [
                f"{subject}, and forward fails in {refs} ({exc}): finite differences are taken in {dtypes} with eps "
                f"{shared.eps:g} and atol {shared.atol:g}, rtol {shared.rtol:g}{every}; they are unreliable there: "
                "check in float64 if you can, or against a plain PyTorch implementation with `reference: pkg.mod:fn` "
                "(the reference check)"
            ],
        )
    tols = [tol.at_least(plain[i].dtype) if i in low else tol for i in checked]
    own = {str(plain[i].dtype)[6:]: t for i, t in zip(checked, tols) if i in low}
    words = "; ".join(
        f"{d}: atol {t.atol:g}, rtol {t.rtol:g}" if len(own) > 1 else f"atol {t.atol:g}, rtol {t.rtol:g}"
        for d, t in sorted(own.items())
    )
    others = (
        f" (the other arguments keep atol {tol.atol:g}, rtol {tol.rtol:g}: each is judged by its own dtype's)"
        if len(low) < len(checked)
        else ""
    )
    return (
        upcast,
        tols,
        [f"{subject}: {numerical} run in {refs} (the reference), with tolerances for {dtypes}: {words}{others}"],
    )


def by_tolerance(todo: Sequence[int], tols: Sequence[Tolerance]) -> list[list[int]]:
    """``todo`` (indices into ``tols``) in groups of one tolerance (eps, atol, rtol), in order of first appearance."""
    groups: dict[tuple[float, float, float], list[int]] = {}
    for k in todo:
        groups.setdefault((tols[k].eps, tols[k].atol, tols[k].rtol), []).append(k)
    return list(groups.values())
