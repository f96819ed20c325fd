"""Tolerances: one table by dtype, the tolerance a case is judged by, and the one comparison.

Every comparison of two computations of the same numbers is torch.allclose's,
``|a - n| <= atol + rtol |n|`` with ``n`` the side trusted more (the numerical gradient, the
reference, the first of two runs), and NaN within nothing: ``limit`` and ``within`` are it.

The table (``PRECISIONS``, by dtype, as torch keeps ``_DTYPE_PRECISIONS``) holds what each dtype's
numbers can be held to where the spec sets nothing:

- ``gradient``: an analytical gradient against finite differences, for an argument of this dtype
  (finite differences taken in float64 on an upcast copy) or a Function that computes in it inside;
  ``eps``: the step of finite differences taken in this dtype itself;
- ``same``: two computations of the same values (batched against one by one, a device against
  another): torch.allclose's defaults, as torch's batched-gradient test uses, looser in half precision;
- ``close``: a target against its reference (rule allclose): torch.testing.assert_close's rtol; in
  half precision an atol of a few units at magnitude 1, as kernel suites (Liger) use: a kernel rounds
  its intermediates, so its error near a zero of the result is that of the values around it.

``Tolerance`` is what a case is judged by: the spec's eps, atol and rtol (each argument of a lower
dtype gets its own dtype's ``gradient`` limits where the spec did not set them), nondet_tol, and the
reference check's rule: what the spec writes under ``tolerance:``. (The compile check's ``compile: {atol,
rtol}`` is its own setting, a ``ReferenceRule`` it builds.)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional, overload

if TYPE_CHECKING:  # torch is not imported here: the spec (and the CLI's start) reads this module
    import torch


@dataclass(frozen=True)
class Limits:
    """An allclose pair: ``|a - n| <= atol + rtol |n|``."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Precision:
    """What one dtype's numbers can be held to (see the module's docstring)."""

    gradient: Limits
    eps: float
    same: Limits
    close: Limits


_SAME = Limits(atol=1e-8, rtol=1e-5)  # torch.allclose's defaults
_FLOAT64 = Precision(gradient=Limits(atol=1e-5, rtol=1e-3), eps=1e-6, same=_SAME, close=Limits(atol=1e-7, rtol=1e-7))
_FLOAT32 = Precision(gradient=Limits(atol=1e-4, rtol=1e-3), eps=1e-3, same=_SAME, close=Limits(atol=1e-5, rtol=1.3e-6))
PRECISIONS: dict[str, Precision] = {  # by torch's name of the dtype
    "float64": _FLOAT64,
    "complex128": _FLOAT64,
    "float32": _FLOAT32,
    "complex64": _FLOAT32,
    "float16": Precision(
        gradient=Limits(atol=1e-2, rtol=1e-2),
        eps=1e-2,
        same=Limits(atol=1e-5, rtol=1e-3),
        close=Limits(atol=1e-3, rtol=1e-3),
    ),
    "bfloat16": Precision(
        gradient=Limits(atol=5e-2, rtol=5e-2),
        eps=5e-2,
        same=Limits(atol=1e-5, rtol=1.6e-2),
        close=Limits(atol=1e-2, rtol=1.6e-2),
    ),
}


def by_dtype(dtype: torch.dtype) -> Precision:
    """``dtype``'s row of the table; float32's for a dtype it does not list."""
    return PRECISIONS.get(str(dtype).removeprefix("torch."), _FLOAT32)


def same(dtype: torch.dtype, nondet_tol: float = 0.0) -> Limits:
    """The limits of two computations of the same values in ``dtype``: the table's, with atol never
    below the spec's ``nondet_tol``."""
    limits = by_dtype(dtype).same
    return Limits(max(limits.atol, nondet_tol), limits.rtol)


@overload
def limit(n_abs: float, atol: float, rtol: float, in_place: bool = False) -> float: ...
@overload
def limit(n_abs: torch.Tensor, atol: float, rtol: float, in_place: bool = False) -> torch.Tensor: ...
def limit(n_abs: float | torch.Tensor, atol: float, rtol: float, in_place: bool = False) -> float | torch.Tensor:
    """``atol + rtol |n|`` (elementwise), from ``|n|``: a new tensor, or ``n_abs`` overwritten ``in_place``."""
    if isinstance(n_abs, float):
        return n_abs * rtol + atol
    return (n_abs.mul_(rtol) if in_place else n_abs.mul(rtol)).add_(atol)


def within(a: torch.Tensor, n: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Elementwise ``|a - n| <= atol + rtol |n|``; NaN is within nothing."""
    return (a - n).abs_() <= limit(n.abs(), atol, rtol, in_place=True)


@dataclass(frozen=True)
class ReferenceRule:
    """How a target is compared with a reference computation of the same values (the reference
    check's ``tolerance.reference``, the compile check's ``compile: {atol, rtol}``).

    ``relative`` (flash-attention's rule): the target's max error against the reference run in
    ``reference_dtype`` is at most ``factor`` times the reference's own error when run in the
    target's dtype, plus ``atol``. ``allclose``: ``|target - reference| <= atol + rtol * |reference|``
    elementwise. None: the defaults (``relative`` where the target runs in a lower precision than the
    reference, else ``allclose``; atol and rtol per dtype: ``Precision.close``)."""

    rule: Optional[str] = None
    factor: float = 2.0
    atol: Optional[float] = None
    rtol: Optional[float] = None


@dataclass(frozen=True)
class Tolerance:
    """What a case is judged by (see the module's docstring)."""

    eps: float = _FLOAT64.eps
    atol: float = _FLOAT64.gradient.atol
    rtol: float = _FLOAT64.gradient.rtol
    nondet_tol: float = 0.0
    # the keys the spec set (the others may be adapted, e.g. to a low dtype)
    given: tuple[str, ...] = field(default=(), compare=False)
    # `strict: true` / --strict: a constant factor within tolerance but well beyond the finite
    # differences' own error estimate fails (by default it is a warning, as torch.autograd.gradcheck passes it)
    strict: bool = False
    reference: ReferenceRule = ReferenceRule()
    # how the user set these values, for messages: the spec's keys ("tolerance." + name) or the Python
    # API's arguments ("" + name)
    prefix: str = field(default="tolerance.", compare=False)

    def key(self, name: str) -> str:
        """How the user set ``name`` (``eps``, ``atol``): ``tolerance.eps`` in a spec, ``eps`` in the Python API."""
        return self.prefix + name

    def at_least(self, dtype: torch.dtype, eps: bool = False) -> Tolerance:
        """This tolerance with ``dtype``'s gradient limits (and, with ``eps``, its step) where the
        spec did not set them; never tighter than this one's own."""
        low = by_dtype(dtype)

        def pick(key: str, value: float) -> float:
            own = float(getattr(self, key))
            return own if key in self.given else max(own, value)

        return replace(
            self,
            atol=pick("atol", low.gradient.atol),
            rtol=pick("rtol", low.gradient.rtol),
            eps=pick("eps", low.eps) if eps else self.eps,
        )
