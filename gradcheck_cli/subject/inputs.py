"""Spec arguments -> values on a device, drawn on the CPU from a seeded torch.Generator.

Drawing on the CPU and then moving makes the same seed give the same values on every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Callable, Optional

import torch

from ..spec import AliasArg, Arg, Case, DictArg, ListArg, TensorArg
from ..spec.model import Sparse
from . import sparse, structured

AVOID_TRIES = 100


class InputError(Exception):
    """An argument that cannot be built. ``key`` is its spec key path."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def build(
    case: Case, device: str, param_names: Sequence[str] = (), gen: Optional[torch.Generator] = None
) -> tuple[list[tuple[Optional[str], Any]], list[tuple[str, Any]]]:
    """The positional and keyword arguments of ``case`` as (name, value) pairs, in order.

    ``same_as`` entries resolve to the very same tensor object as the argument they name;
    an input without a ``name`` is known by its parameter's name in ``param_names``. A ``list:`` or
    ``dict:`` entry is a list or dict of its leaves' values, drawn in order (depth first); a leaf is
    known by its path (``xs[0]``, ``feats.q``) to later ``same_as`` and ``size_of``. Values are drawn from
    ``gen``, the inputs' stream of the attempt (``Streams.inputs()``); without it, from the case's own seed.
    """
    gen = torch.Generator().manual_seed(case.seed) if gen is None else gen
    by_name: dict[str, Any] = {}
    entries = [(None, a) for a in case.inputs] + list(case.kwargs)
    built: list[tuple[Optional[str], Any]] = []
    for i, (kw_name, arg) in enumerate(entries):
        name = arg.name or kw_name
        known_as = name or (param_names[i] if i < len(param_names) else None)
        value = _value(arg, case, device, gen, by_name, known_as or f"arg{i}")
        if known_as:
            by_name[known_as] = value
        built.append((name, value))
    n = len(case.inputs)
    return built[:n], [(k, v) for (k, _), (_, v) in zip(case.kwargs, built[n:])]


def _value(arg: Arg, case: Case, device: str, gen: torch.Generator, by_name: dict[str, Any], path: str) -> Any:
    if isinstance(arg, ListArg):
        return [_leaf(item, case, device, gen, by_name, f"{path}[{i}]") for i, item in enumerate(arg.items)]
    if isinstance(arg, DictArg):
        return {k: _leaf(item, case, device, gen, by_name, f"{path}.{k}") for k, item in arg.items}
    if isinstance(arg, AliasArg):
        if arg.same_as not in by_name:
            known = ", ".join(by_name)
            raise InputError(
                arg.key + ".same_as",
                f"no earlier argument named '{arg.same_as}' "
                f"({'earlier ones: ' + known if known else 'it is the first'}); "
                "name an earlier argument, or give it a `name:`",
            )
        return by_name[arg.same_as]
    if not isinstance(arg, TensorArg):
        return arg.value
    arg = _tied(arg, by_name)
    t = _draw(arg, case, gen)
    rg = arg.requires_grad if arg.requires_grad is not None else (t.is_floating_point() or t.is_complex())
    if rg and not (t.is_floating_point() or t.is_complex()):
        raise InputError(
            arg.key + ".requires_grad",
            f"{str(t.dtype)[6:]} tensors cannot require grad; use a floating or complex dtype, or drop requires_grad",
        )
    if rg:
        refuse_nonfinite(t, arg, path)
    if arg.sparse is not None:
        return _sparse(t, arg, arg.sparse, gen).to(device).requires_grad_(rg)
    return t.to(device).requires_grad_(rg)


def _sparse(t: torch.Tensor, arg: TensorArg, layout: Sparse, gen: torch.Generator) -> torch.Tensor:
    """The sparse tensor of ``layout`` with ``t``'s values at its specified elements (drawn from ``gen``
    after the values, with ``density``)."""
    if t.dim() == 0 or (layout.layout == "sparse_csr" and t.dim() != 2):
        need = "two dimensions" if layout.layout == "sparse_csr" else "at least one dimension"
        raise InputError(arg.key + ".data", f"a {layout.layout} tensor needs {need}, got shape {list(t.shape)}")
    try:
        mask = sparse.pattern(layout, tuple(t.shape), gen, nonzero=t)
    except IndexError as exc:
        raise InputError(arg.key + ".indices", f"{exc}: give indices within the data's shape") from exc
    if not bool(mask.any()):
        raise InputError(
            arg.key + ".data", "no element is specified (the data is all zeros): give `indices` or `density`"
        )
    return sparse.make(t, mask, layout.layout)


def refuse_nonfinite(t: torch.Tensor, arg: TensorArg, name: str) -> None:
    """InputError when ``t`` (argument ``name``, which requires grad) holds NaN or inf: a finite difference
    through it is NaN or 0 whatever backward returns, so no verdict on its gradient would mean anything."""
    found = nonfinite(t)
    if found is None:
        return
    if arg.data is not None:
        raise InputError(
            arg.key + ".data",
            f"'{name}': data holds {found} (as {str(t.dtype)[6:]}): {NONFINITE_WHY}; "
            "use finite values (or `requires_grad: false` for a mask that is not "
            "differentiated)",
        )
    params = "".join(f", {k} {v:g}" for k, v in arg.params).lstrip(",")
    raise InputError(
        arg.key,
        f"'{name}': {arg.dist or 'normal'}{params} overflows {str(t.dtype)[6:]}: draws "
        f"{found}: {NONFINITE_WHY}; narrow the range",
    )


NONFINITE_WHY = "finite differences cannot be taken through NaN or inf"


def nonfinite(t: torch.Tensor) -> Optional[str]:
    """Where a floating or complex tensor holds NaN or inf, in words ("NaN at [1, 2], 1 of 6 values not finite");
    None where every value is finite, or it holds no floating values."""
    if not (t.is_floating_point() or t.is_complex()) or t.layout is not torch.strided or t.device.type == "meta":
        return None  # (a user's sparse or meta tensor: its checks say what they can)
    finite = torch.isfinite(t.detach())
    if bool(finite.all()):
        return None
    where = [int(i) for i in (~finite).nonzero()[0]]
    value = t[tuple(where)].item()
    seen = "NaN" if value != value else str(value)
    return f"{seen} at {where}, {int((~finite).sum())} of {t.numel()} values not finite"


def _leaf(arg: Arg, case: Case, device: str, gen: torch.Generator, by_name: dict[str, Any], path: str) -> Any:
    """A list's or dict's item, known after by its ``path``."""
    value = _value(arg, case, device, gen, by_name, path)
    if not isinstance(arg, (ListArg, DictArg)):
        by_name[path] = value
    return value


def _tied(arg: TensorArg, by_name: dict[str, Any]) -> TensorArg:
    """``arg`` with its bounds tied to another argument's size (``high: {size_of: x, dim: 0}``) made numbers."""
    if not arg.size_of:
        return arg
    params = dict(arg.params)
    for bound, other, dim in arg.size_of:
        where = f"{arg.key}.{bound}.size_of"
        value = by_name.get(other)
        if not isinstance(value, torch.Tensor):
            known = ", ".join(k for k, v in by_name.items() if isinstance(v, torch.Tensor)) or "none"
            what = "is not a tensor" if other in by_name else "is not an earlier argument"
            raise InputError(
                where,
                f"'{other}' {what}; a bound takes the size of an earlier tensor argument "
                f"(the earlier tensors: {known})",
            )
        if not -max(value.dim(), 1) <= dim < max(value.dim(), 1) or value.dim() == 0:
            raise InputError(f"{arg.key}.{bound}.dim", f"'{other}' has shape {list(value.shape)}: no dimension {dim}")
        params[bound] = float(value.shape[dim])
    if params["low"] >= params["high"]:
        raise InputError(
            f"{arg.key}.high",
            f"expected high > low, got low={params['low']:g}, "
            f"high={params['high']:g} (the size of '{arg.size_of[-1][1]}')",
        )
    return replace(arg, params=tuple(params.items()), size_of=())


def _draw(arg: TensorArg, case: Case, gen: torch.Generator) -> torch.Tensor:
    """Draw (or build from ``data``) one tensor on the CPU."""
    if arg.data is not None:
        try:
            t = torch.tensor(arg.data)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:  # Overflow: an int beyond float range
            raise InputError(arg.key + ".data", f"not a rectangular nested list of numbers: {exc}") from exc
        if t.is_floating_point() or t.is_complex():  # Python floats are doubles: read them so, not in float32
            t = torch.tensor(arg.data, dtype=torch.complex128 if t.is_complex() else torch.float64)
        if arg.dtype:
            return t.to(torch_dtype(arg.dtype))
        return t.to(torch_dtype(case.dtype)) if t.is_floating_point() else t
    dtype = torch_dtype(arg.dtype or (case.dtype if arg.dist not in ("randint", "permutation") else "int64"))
    params = dict(arg.params)
    shape = arg.shape or ()
    if arg.dist in structured.DRAW:
        try:
            return structured.DRAW[arg.dist](shape, params, arg.dim, gen).to(dtype)
        except (RuntimeError, TypeError, OverflowError) as exc:
            raise InputError(
                arg.key + ".shape", f"cannot draw a tensor of shape {list(shape)}: {str(exc).splitlines()[0]}"
            ) from exc

    def sample(n: tuple[int, ...]) -> torch.Tensor:
        if arg.dist == "randint":
            return torch.randint(int(params["low"]), int(params["high"]), n, generator=gen, dtype=torch.float64)
        if arg.dist == "uniform":
            return params["low"] + (params["high"] - params["low"]) * torch.rand(n, generator=gen, dtype=torch.float64)
        return params["mean"] + params["std"] * torch.randn(n, generator=gen, dtype=torch.float64)

    parts = [_avoiding(sample, shape, arg) for _ in range(2 if dtype.is_complex else 1)]
    t = torch.complex(*parts) if dtype.is_complex else parts[0]
    return t.to(dtype)


def _avoiding(
    sample: Callable[[tuple[int, ...]], torch.Tensor], shape: tuple[int, ...], arg: TensorArg
) -> torch.Tensor:
    """``sample(shape)``, with the values that fall in an ``avoid`` interval drawn again."""
    try:
        t = sample(shape)
    except (RuntimeError, TypeError, OverflowError) as exc:  # a shape too large to allocate, or to index
        raise InputError(
            arg.key + ".shape", f"cannot draw a tensor of shape {list(shape)}: {str(exc).splitlines()[0]}"
        ) from exc
    for _ in range(AVOID_TRIES):
        bad = _in_avoid(t, arg.avoid)
        if not bool(bad.any()):
            return t
        t[bad] = sample((int(bad.sum()),))
    raise InputError(
        arg.key + ".avoid",
        f"could not draw values outside {list(map(list, arg.avoid))} "
        f"in {AVOID_TRIES} tries; widen the distribution or narrow `avoid`",
    )


def _in_avoid(t: torch.Tensor, avoid: tuple[tuple[float, float], ...]) -> torch.Tensor:
    bad = torch.zeros_like(t, dtype=torch.bool)
    for lo, hi in avoid:
        bad |= (t >= lo) & (t <= hi)
    return bad
