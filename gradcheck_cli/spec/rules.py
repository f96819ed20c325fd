"""The rules of a spec that its JSON Schema cannot express, one small named validator each: they compare
two values (``high > low``, an ``avoid`` interval's ends, an expectation's pattern and ratio), count
(how deep ``data`` nests, whether a case name is taken) or read a number the schema sees as text. Each
returns what is wrong, in the words a message uses, or None when the rule holds (a bool where the
message quotes the value as written); the caller names the file, line and key.
``tests/unit/test_spec_schema.py`` (``SCHEMA_CANNOT``) shows the schema letting each one through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from .model import MATRIX_DISTS, MAX_DIMS
from .values import show

INT64 = (-(2**63), 2**63)  # randint's bounds: low <= v < high


def unordered(low: float, high: float) -> Optional[str]:
    """``high`` not above ``low`` (a distribution's bounds)."""
    return f"expected high > low, got low={low}, high={high}" if low >= high else None


def reversed_interval(intervals: tuple[tuple[float, float], ...]) -> Optional[str]:
    """An ``avoid`` interval ``[lo, hi]`` with ``lo > hi``."""
    return "each interval must be [lo, hi] with lo <= hi" if any(lo > hi for lo, hi in intervals) else None


def not_matrices(dist: str, shape: Sequence[int]) -> Optional[str]:
    """A shape that ``dist`` cannot draw: a matrix dist (symmetric, spd, orthogonal) with fewer than two
    dimensions, or a square one (symmetric, spd) whose last two dimensions differ (it would draw a square
    matrix of another shape, or none)."""
    if dist not in MATRIX_DISTS:
        return None
    if len(shape) < 2:
        dims = "(..., m, n)" if dist == "orthogonal" else "(..., n, n)"
        return f"dist {dist} draws matrices: expected at least 2 dimensions {dims}, got {list(shape)}"
    if dist != "orthogonal" and shape[-1] != shape[-2]:
        return (
            f"dist {dist} draws square matrices (or batches of them): the last two dimensions must be equal, "
            f"got {list(shape)}"
        )
    return None


def square_example(shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """A square shape near ``shape`` and a batch of such matrices, for a message's example."""
    n = max([*shape[-2:], 2])
    return [n, n], [*(shape[:-2] or [2]), n, n]


def depth(data: Any) -> int:
    """How deep the first elements of nested lists go: the dimensions of a tensor made from ``data``."""
    n = 0
    while isinstance(data, list):
        n += 1
        data = data[0] if data else None
    return n


def too_deep(data: Any) -> Optional[str]:
    """``data`` lists nested deeper than a torch tensor has dimensions."""
    n = depth(data)
    return f"lists nested {n} deep: torch tensors have at most {MAX_DIMS} dimensions" if n > MAX_DIMS else None


def outside_int64(value: float) -> bool:
    """A randint bound that is not a whole number within int64 (``'2.5'`` and ``'1e30'`` are numbers to the
    schema's pattern)."""
    return not (value.is_integer() and INT64[0] <= value < INT64[1])


def name_taken(name: object, taken: set[str]) -> bool:
    """A case name another case of the document has already, written or by default (``case1``, which
    depends on the case's position); ``1`` and ``'1'`` are one name."""
    return str(name) in taken


def contradicts(pattern: Optional[str], ratio: Optional[float], written: Any = None) -> Optional[str]:
    """Why an expectation's fields cannot all hold at once (None: they can): a sign flip is the ratio -1, and
    only the ratio patterns have a ratio."""
    if ratio is not None and pattern not in (None, "constant_ratio", "sign_flip"):
        return f"a ratio belongs to pattern constant_ratio or sign_flip, not {pattern}"
    if pattern == "sign_flip" and ratio is not None and ratio != -1:
        return (
            f"pattern sign_flip means ratio -1, got ratio {show(ratio if written is None else written)}: "
            f"give the pattern or the ratio (`{{ratio: {ratio:g}}}` for a constant ratio)"
        )
    return None
