"""The step of finite differences against the values it moves: a spec error (naming ``tolerance.eps``,
or ``eps`` of the Python API) where it cannot measure a derivative.

A central difference is ``(f(x + eps) - f(x - eps)) / 2 eps`` with ``x ± eps`` rounded to the dtype the
element is moved in (``numerics.differences.Element``). The step is refused for an argument where

- it does not move an element: ``x + eps == x == x - eps`` (eps below half a unit in the last place of
  x: 1e-320 for every normal float64, 1e-17 at |x| = 1). That column of differences is zero whatever f
  is, so a right backward would fail "the outputs do not depend on it";
- it swallows the argument: every nonzero element has ``x + eps == eps`` and ``x - eps == -eps`` (1e300
  beside values near 1). The differences are then those of f at ±eps, the same for every x: they say
  nothing of the derivative at x;
- it leaves the dtype's range: ``x ± eps`` is infinite where x is finite (1e300 in a float32 moved in
  float32).

These read only the values and eps (a few elementwise operations per argument, no call of forward). Zeros
move (0 + eps is eps, subnormal or not), and a few elements swallowed beside others that are not (1e-20
beside 1 at eps 1e-3) are right: those elements sit at about 0 on the step's scale.

A step the spec set (``tolerance.eps``; ``eps`` in the Python API) is refused too where it leaves the
function's domain at every element of an argument: ``f(x - eps)`` or ``f(x + eps)`` is not finite at each one
(log at eps 1 beside values in [0.5, 1]; ``refuse_outside_domain``, after the kinks' second look). No
two-sided difference exists at that step, and the one-sided ones the second look takes at smaller steps are
not the step the spec asked for. Where only some elements are that close to the edge, those are the inputs'
business (the kink warning's `avoid:`), and a default step's edge is too: the inputs sit within it.

For the next contributor: the rule must never refuse a step that moves every element and keeps the
argument's values apart (a step too large for the function's curvature is the truncation error, judged
by the checks' own re-judgement); what it refuses must be one that makes every verdict meaningless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch

from ...core.tolerance import Tolerance, by_dtype
from ...sandbox.errors import BindError

SCALE = 10.0  # above this largest |x|, the step advised is the dtype's step at 1 times |x|


def refuse_unusable(
    values: Sequence[Any], moved: Sequence[int], names: Sequence[str], tols: Sequence[Tolerance]
) -> None:
    """Raise BindError (the spec's ``tolerance.eps``, or the ``eps`` option) where ``tols[k].eps`` cannot
    measure a derivative at ``values[moved[k]]`` (named ``names[moved[k]]``), the values finite differences
    move, in the dtype they are moved in (see the module's docstring)."""
    for k, i in enumerate(moved):
        x = values[i]
        problem = _problem(x, tols[k].eps) if isinstance(x, torch.Tensor) else None
        if problem is None:
            continue
        tol = tols[k]
        name = names[i] if names[i].startswith("grad_output") else f"'{names[i]}'"
        scale = float(_real(x).abs().max())
        unit = by_dtype(x.dtype).eps  # the dtype's step at |x| = 1
        near = f"{unit:.0e}" + (f" times the largest |{names[i]}| ({unit * scale:.2g})" if scale > SCALE else "")
        raise BindError(
            tol.key("eps"),
            f"{tol.eps:.3g} {problem.format(name=name, dtype=str(x.dtype).removeprefix('torch.'))}, so finite "
            f"differences at that step measure no derivative; use a value near {near}",
        )


def refuse_outside_domain(kinds: Sequence[str], total: int, x: torch.Tensor, name: str, tol: Tolerance) -> None:
    """Raise BindError (``tolerance.eps``) where the spec set the step and every one of the ``total`` real
    numbers finite differences move in ``x`` (named ``name``) was found at a domain edge: ``kinds``, the
    second look's verdict kind for each element it examined (see the module's docstring)."""
    if "eps" not in tol.given or total == 0 or len(kinds) < total or any(k != "domain_edge" for k in kinds):
        return
    shown = name if name.startswith("grad_output") else f"'{name}'"
    raise BindError(
        tol.key("eps"),
        f"{tol.eps:.3g} leaves the function's domain at every element of {shown} (f(x - eps) or f(x + eps) is "
        "not finite at each one), so no two-sided difference exists at that step; use a step smaller than the "
        f"elements' distance to the domain's edge (the default for {str(x.dtype).removeprefix('torch.')} is "
        f"{by_dtype(x.dtype).eps:.0e})",
    )


def _real(x: torch.Tensor) -> torch.Tensor:
    """The real numbers finite differences move in ``x`` (a sparse tensor's stored values; a complex one's
    real and imaginary parts), flat."""
    if x.layout is torch.sparse_coo:
        x = x.coalesce().values()
    elif x.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        x = x.values()
    x = x.detach()
    return (torch.view_as_real(x) if x.is_complex() else x).reshape(-1)


def _problem(x: torch.Tensor, eps: float) -> Optional[str]:
    """Why ``eps`` cannot move ``x`` (a template of ``name`` and ``dtype``), or None."""
    if not (x.is_floating_point() or x.is_complex()) or x.numel() == 0:
        return None
    flat = _real(x)
    wide = flat.double()  # x0 + offset is computed in float64, then rounded to x's dtype when written
    plus, minus = (wide + eps).to(flat.dtype), (wide - eps).to(flat.dtype)
    finite = flat.isfinite()
    still = (plus == flat) & (minus == flat) & finite
    if bool(still.any()):
        n, at = int(still.sum()), int(still.nonzero()[0, 0])
        count = "any element" if n == finite.sum() == flat.numel() else f"{n} of {flat.numel()} elements"
        return (
            f"does not move {count} of {{name}} (x + eps == x in {{dtype}}, e.g. at {float(flat[at]):.6g}: "
            "eps is below half the spacing of {dtype} numbers there)"
        )
    out = finite & ~(plus.isfinite() & minus.isfinite())
    if bool(out.any()):
        return f"moves {{name}} out of {{dtype}}'s range (x + eps is infinite, e.g. at {float(flat[out][0]):.6g})"
    nonzero = finite & (flat != 0)
    ends = torch.tensor([eps, -eps], dtype=torch.float64).to(flat.dtype)
    lost = nonzero & (plus == ends[0]) & (minus == ends[1])
    if bool(nonzero.any()) and bool(lost.sum() == nonzero.sum()):
        return (
            "swallows {name} (x + eps == eps and x - eps == -eps in {dtype} for every nonzero element: the "
            "differences are those of f at ±eps, whatever the values)"
        )
    return None
