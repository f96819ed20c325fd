"""A tensor entry's ``layout`` and what a sparse layout takes (``density``, ``indices``, ``masked``): read,
checked against the entry's shape, dtype and other keys, and made a ``Sparse``."""

from __future__ import annotations

from typing import Any, Optional

from .lines import Ctx
from .model import SYMMETRIC_DISTS, Case, Key, Sparse, TensorArg, leaves
from .values import number, show, whole
from .vocabulary import enum, prop

LAYOUTS = enum(prop("tensor", "layout"))  # strided (dense, the default), sparse_coo, sparse_csr
SPARSE_KEYS = ("density", "indices", "masked")  # keys that only a sparse layout takes
SPARSE_DTYPES = ("float", "complex", "bfloat")  # a sparse input's values are differentiated


def sparse(
    entry: dict[str, Any], shape: Optional[list[int]], dtype: Optional[str], dist: str, key: Key, ctx: Ctx
) -> Optional[Sparse]:
    """The entry's sparse layout (None for a dense one), its keys checked; a SpecError names the key."""
    layout = entry.get("layout")
    if layout is not None and (not isinstance(layout, str) or layout not in LAYOUTS):
        raise ctx.fail(
            key + ("layout",),
            f"unknown layout {show(layout)}; use sparse_coo or sparse_csr (a sparse input), or strided (dense, "
            "the default)",
        )
    if layout in (None, "strided"):
        given = next((k for k in SPARSE_KEYS if entry.get(k) is not None), None)
        if given:
            raise ctx.fail(
                key + (given,),
                f"`{given}` is for a sparse input: add `layout: sparse_coo` (or sparse_csr), or drop `{given}`",
            )
        return None
    _compatible(entry, shape, dtype, dist, layout, key, ctx)
    if entry.get("density") is not None and entry.get("indices") is not None:
        raise ctx.fail(
            key + ("indices",), "give the specified elements one way: `density` (drawn) or `indices`, not both"
        )
    masked = entry.get("masked")
    if masked is not None and not isinstance(masked, bool):
        raise ctx.fail(
            key + ("masked",),
            f"expected true (only the specified elements are variables) or false (every element is), "
            f"got {show(masked)}",
        )
    density = None
    if entry.get("density") is not None:
        given = entry["density"]
        density = number(given, key + ("density",), ctx) if isinstance(given, (int, float)) else -1.0
        if not 0 < density <= 1 or isinstance(given, bool):
            raise ctx.fail(
                key + ("density",),
                f"expected the fraction of the elements that are specified, in (0, 1] (e.g. 0.3), "
                f"got {show(entry['density'])}",
            )
    indices = _indices(entry["indices"], shape, key + ("indices",), ctx) if entry.get("indices") is not None else None
    if density is None and indices is None and "data" not in entry:
        density = 0.5
    return Sparse(layout, density, indices, masked is not False)


def _compatible(
    entry: dict[str, Any], shape: Optional[list[int]], dtype: Optional[str], dist: str, layout: str, key: Key, ctx: Ctx
) -> None:
    """What a sparse layout asks of the rest of the entry."""
    differentiated = entry.get("requires_grad") is not False
    if differentiated and dist in ("randint", "permutation") and not (dtype or "int64").startswith(SPARSE_DTYPES):
        raise ctx.fail(
            key + ("dtype" if dtype else "dist",),
            f"a sparse input's values are differentiated: it needs a floating dtype (float64, float32) or a complex "
            f"one, not {dtype or 'int64'} (dist {dist}); give `dtype: float64`, or `requires_grad: false`",
        )
    if differentiated and dtype is not None and not dtype.startswith(SPARSE_DTYPES):
        raise ctx.fail(
            key + ("dtype",),
            f"a sparse input's values are differentiated: it needs a floating dtype (float64, float32) or a complex "
            f"one, not {dtype}; or give `requires_grad: false`",
        )
    if shape is not None and len(shape) == 0:
        raise ctx.fail(key + ("shape",), f"a {layout} tensor has at least one dimension, got shape []")
    if layout == "sparse_csr" and shape is not None and len(shape) != 2:
        raise ctx.fail(
            key + ("shape",),
            f"sparse_csr is for matrices (two dimensions: rows, columns), got shape {shape}; use sparse_coo",
        )
    refused = {
        "contiguous": "a sparse tensor has no strides to lay out otherwise: drop `contiguous`",
        "param": "`param:` maps a dense tensor; a sparse input is its specified elements: drop one of them",
        "placement": "a sparse input cannot be placed across ranks yet: drop `placement`",
    }
    for k, why in refused.items():
        if entry.get(k) is not None and not (k == "contiguous" and entry[k] is True):
            raise ctx.fail(key + (k,), f"`{k}` with layout {layout}: {why}")
    if dist in SYMMETRIC_DISTS:
        raise ctx.fail(
            key + ("dist",),
            f"dist {dist} is perturbed along the symmetric matrices, which a sparse pattern breaks: "
            f"use another dist with layout {layout}",
        )


def _indices(value: Any, shape: Optional[list[int]], key: Key, ctx: Ctx) -> tuple[tuple[int, ...], ...]:
    """``indices: [[i, j], ...]``: each an index into the dense shape, in range, none twice."""
    example = "e.g. [[0, 1], [2, 5]] for x[0, 1] and x[2, 5]"
    if not isinstance(value, list) or not value:
        raise ctx.fail(key, f"expected a non-empty list of element indices, {example}; got {show(value)}")
    seen: dict[tuple[int, ...], int] = {}
    out = []
    for n, index in enumerate(value):
        at = key + (n,)
        items = [whole(i) for i in index] if isinstance(index, list) else [None]
        if not items or any(i is None or i < 0 for i in items):
            raise ctx.fail(
                at, f"expected an element's index (a list of non-negative ints), {example}; got {show(index)}"
            )
        idx = tuple(int(i) for i in items if i is not None)
        if shape is not None and len(idx) != len(shape):
            raise ctx.fail(at, f"expected {len(shape)} ints (one per dimension of shape {shape}), got {list(idx)}")
        if shape is not None and any(i >= s for i, s in zip(idx, shape)):
            raise ctx.fail(at, f"{list(idx)} is outside shape {shape}: each int must be below its dimension's size")
        if idx in seen:
            raise ctx.fail(at, f"{list(idx)} is given twice (first at indices[{seen[idx]}]): give each element once")
        seen[idx] = n
        out.append(idx)
    return tuple(out)


FORWARD = (
    "forward-mode AD with a sparse input (layout: {layout}, '{name}') is not checked yet: gradcheck-cli carries "
    "no tangent into a sparse tensor; the backward check judges its gradient"
)
NOT_RUN = {  # check -> why it does not run on a case with a sparse input that requires grad
    "forward_ad": FORWARD,
    "forward_over_reverse": FORWARD,
    "batched_forward": FORWARD,
    "batched": (
        "torch's vmap cannot batch sparse tensors, so backward cannot be vmapped with a sparse input "
        "(layout: {layout}, '{name}'); the backward check judges its gradient"
    ),
    "opcheck": (
        "torch.library.opcheck cannot take a sparse argument (layout: {layout}, '{name}'): its test_schema reads "
        "every argument's storage, which a sparse tensor has not; the backward check judges its gradient"
    ),
}


def declined(case: Case) -> dict[str, str]:
    """The checks that do not run on ``case`` because an argument is sparse and requires grad, each with the
    reason (a skip)."""
    found = [
        (arg.name or arg.key, arg.sparse.layout)
        for entry in (*case.inputs, *(arg for _, arg in case.kwargs))
        for _, arg in leaves(entry)
        if isinstance(arg, TensorArg) and arg.sparse is not None and arg.requires_grad is not False
    ]
    if not found:
        return {}
    name, layout = found[0]
    return {check: why.format(name=name, layout=layout) for check, why in NOT_RUN.items() if check in case.checks}
