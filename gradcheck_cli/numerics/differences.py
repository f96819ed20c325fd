"""The one finite-difference primitive: move an argument in place, call, read, put it back.

Every numerical derivative here is made of calls at moved arguments (``call_moved``): one real
element moved to x0 + offset (``Element``: the Jacobian's columns, the one-sided differences at
kinks) or a whole argument moved by a step (``Step``: the random probes' directions). The argument
is moved in place, inside the values the call takes, so that a tensor passed as two arguments
moves in both places as in the user's own call, and it is put back bit-exactly after every call,
also when the call raises. Pure torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Protocol, TypeVar

import torch

from .realify import Call, as_tuple, element_ref, outputs_vector, real_view

T = TypeVar("T")


class Move(Protocol):
    """A change made in place to one argument, and its undoing."""

    def apply(self) -> None:
        """Change the argument in place."""

    def restore(self) -> None:
        """Put the argument back as it was, bit for bit."""


def call_moved(call: Call, values: Sequence[Any], move: Move, read: Callable[[tuple[Any, ...]], T]) -> T:
    """``read`` of the outputs of ``call(values)`` made with ``move`` applied. The argument is put
    back after the read (outputs that are views of it are read moved), also when the call or the
    read raises. Without grad, as ``apply`` runs forward."""
    if torch.is_grad_enabled():  # entered only where grad is on: once per call, it shows on small forwards
        with torch.no_grad():
            return call_moved(call, values, move, read)
    move.apply()
    try:
        return read(as_tuple(call(values)))
    finally:
        move.restore()


class Element:
    """Real element ``index`` of ``base`` (a tensor, or a NumPy view of one: see ``elements``), to
    move to x0 + offset and put back bit-exactly."""

    __slots__ = ("base", "index", "offset", "orig", "x0")

    def __init__(self, base: Any, index: Any) -> None:
        orig = base[index]
        self.base, self.index = base, index
        self.orig = orig.detach().clone() if isinstance(orig, torch.Tensor) else orig  # a NumPy scalar is a copy
        self.x0 = float(orig)
        self.offset = 0.0

    def to(self, offset: float) -> Element:
        """This element as the move to x0 + offset (rounded to the tensor's dtype when written)."""
        self.offset = offset
        return self

    def apply(self) -> None:
        """Write x0 + offset."""
        self.base[self.index] = self.x0 + self.offset

    def restore(self) -> None:
        """Write the original value back, bit for bit."""
        self.base[self.index] = self.orig

    def taken(self, offset: float) -> float:
        """The offset that the move to x0 + offset actually takes: x0 + offset rounded to the
        tensor's dtype, minus x0 (written, read and put back; no call)."""
        with torch.no_grad():
            self.base[self.index] = self.x0 + offset
            try:
                return float(self.base[self.index]) - self.x0
            finally:
                self.restore()


def elements(x: torch.Tensor) -> Callable[[int], Element]:
    """Real element j of ``x`` as an ``Element``, for each j: x flattened row-major, a complex
    element as its real then its imaginary part; any strides."""
    real = torch.view_as_real(x) if x.is_complex() else x
    if (
        real.device.type == "cpu"
        and real.is_contiguous()
        and real.dtype in (torch.float64, torch.float32)
        and not real.requires_grad
    ):
        flat = real.numpy().reshape(-1)  # a NumPy view: cheap element writes
        return lambda j: Element(flat, j)
    ref = element_ref(x)
    return lambda j: Element(*ref(j))


class Step:
    """All of ``x`` moved by ``step`` (one offset per real element, cast to x's dtype before it is
    added), and put back bit-exactly."""

    def __init__(self, x: torch.Tensor, step: torch.Tensor) -> None:
        self.real = torch.view_as_real(x) if x.is_complex() else x
        self.step = step
        self.orig: torch.Tensor | None = None

    def apply(self) -> None:
        """Write x + step."""
        self.orig = self.real.clone()
        torch.add(self.orig, self.step.view(self.real.shape).to(self.real), out=self.real)

    def restore(self) -> None:
        """Write x back, bit for bit."""
        if self.orig is not None:
            self.real.copy_(self.orig)


def difference_into(
    row: torch.Tensor,
    call: Call,
    values: Sequence[Any],
    element: Element,
    eps: float,
    segments: Sequence[tuple[int, int, int]],
) -> None:
    """``row`` = f(x + eps e_j) - f(x - eps e_j), not yet divided by 2 eps, for ``element`` j of an
    argument x in ``values``: the realified outputs at ``segments`` ((position, first row, end
    row) in ``row``, float64), written straight into ``row``."""
    call_moved(call, values, element.to(-eps), lambda outputs: _into(row, outputs, segments, False))
    call_moved(call, values, element.to(eps), lambda outputs: _into(row, outputs, segments, True))


def _into(
    row: torch.Tensor, outputs: tuple[Any, ...], segments: Sequence[tuple[int, int, int]], subtract: bool
) -> None:
    """The realified outputs into their segments of ``row`` (moved to its device, the CPU), or, with
    ``subtract``, minus what is there."""
    for p, lo, hi in segments:
        o, seg = outputs[p], row[lo:hi]
        flat = real_view(o).reshape(-1).to(seg.device)  # no grad here: no detach
        if subtract:
            torch.sub(flat, seg, out=seg)
        else:
            seg.copy_(flat)


def central_difference(
    call: Call, values: Sequence[Any], x: torch.Tensor, j: int, eps: float, positions: Sequence[int]
) -> torch.Tensor:
    """(f(x + eps e_j) - f(x - eps e_j)) / 2 eps: a column of the numerical Jacobian, the realified
    float64 outputs at ``positions`` (on the CPU), real element ``j`` of ``x`` (a tensor in
    ``values``) moved in place and put back."""
    element = elements(x)(j)
    minus = call_moved(call, values, element.to(-eps), lambda outputs: outputs_vector(outputs, positions).cpu())
    plus = call_moved(call, values, element.to(eps), lambda outputs: outputs_vector(outputs, positions).cpu())
    return (plus - minus) / (2 * eps)
