"""Argument entries (``inputs``, ``kwargs``, ``--arg``): exactly one of shape/data, value, same_as, list,
dict; a tensor's shape, data, dtype, distribution and its parameters, ``avoid``, ``dim`` and bounds tied
to another argument's size."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from .distributed import placement
from .lines import Ctx, keystr
from .model import (
    ALIAS_KEYS,
    BOUNDS,
    CONTAINER_KEYS,
    DIST_DEFAULTS,
    DIST_KEYS,
    DISTS,
    IMPORT_KEYS,
    KINDS,
    MAX_DIMS,
    SET_DISTS,
    SIZE_OF_KEYS,
    TENSOR_KEYS,
    VALUE_KEYS,
    AliasArg,
    Arg,
    DictArg,
    Key,
    ListArg,
    TensorArg,
    ValueArg,
)
from .rules import not_matrices, outside_int64, reversed_interval, square_example, too_deep, unordered
from .tensor_layout import sparse
from .values import did_you_mean, dtype_of, import_path, mapping, number, show, whole


def parse_argument(entry: Any, where: str) -> Arg:
    """One argument entry given outside a spec file (e.g. on the command line), validated like
    an entry of ``inputs``; a SpecError names ``where``."""
    return replace(argument(entry, (), Ctx(where)), key=where)


def argument(entry: Any, key: Key, ctx: Ctx, name: Optional[str] = None, leaf: bool = False) -> Arg:
    """One input or kwargs entry: exactly one of shape/data, value, same_as, list, dict. ``leaf``: an
    entry inside a list or dict, named by its path (no ``name:`` of its own)."""
    if not isinstance(entry, dict):
        raise ctx.fail(key, f"expected a mapping with one of {', '.join(KINDS)}; got {show(entry)}")
    kinds = [k for k in KINDS if k in entry]
    if not kinds:  # a typo of a kind's key (`shpe:`) says so before what is missing
        every = tuple(dict.fromkeys(TENSOR_KEYS + KINDS))
        unknown = [k for k in entry if k not in every]
        if unknown:
            raise ctx.fail(
                key + (unknown[0],),
                f"unknown key{did_you_mean(unknown[0], every)}; an argument needs exactly one of {', '.join(KINDS)}",
            )
    if len(kinds) != 1:
        found = f"found {', '.join(kinds)}" if kinds else "found none"
        raise ctx.fail(key, f"an argument needs exactly one of {', '.join(KINDS)} ({found})")
    if "name" in entry and leaf:
        raise ctx.fail(
            key + ("name",),
            "an entry inside a list or dict is named by its place (e.g. xs[0], "
            "feats.q): drop `name:` here, or name the list or dict itself",
        )
    if "name" in entry and not isinstance(entry["name"], str):
        raise ctx.fail(key + ("name",), f"expected a string, got {show(entry['name'])}")
    name = entry.get("name", name)
    where = keystr(key)
    line = ctx.lines.get(ctx.prefix + key)
    if "layout" in entry and kinds not in (["shape"], ["data"]):
        raise ctx.fail(
            key + ("layout",),
            f"unknown key for a {kinds[0]} entry: `layout` is for a tensor entry (shape or data)"
            + (": give it to each tensor inside" if kinds[0] in ("list", "dict") else ""),
        )
    if kinds in (["list"], ["dict"]):
        return _container(entry, kinds[0], name, key, ctx)
    if kinds == ["value"]:
        mapping(entry, key, VALUE_KEYS, ctx)
        value = entry["value"]
        if isinstance(value, dict) and "import" in value:  # a callable: `value: {import: pkg.mod:fn}`
            mapping(value, key + ("value",), IMPORT_KEYS, ctx)
            return ValueArg(None, name, where, line, import_path(value["import"], key + ("value", "import"), ctx))
        return ValueArg(value, name, where, line)
    if kinds == ["same_as"]:
        mapping(entry, key, ALIAS_KEYS, ctx)
        if not isinstance(entry["same_as"], str):
            raise ctx.fail(key + ("same_as",), f"expected the name of another argument, got {show(entry['same_as'])}")
        return AliasArg(entry["same_as"], name, where, line)
    mapping(entry, key, TENSOR_KEYS, ctx)
    lines = tuple((k, ctx.lines[ctx.prefix + key + (k,)]) for k in entry if ctx.prefix + key + (k,) in ctx.lines)
    return replace(_tensor(entry, name, key, where, ctx), line=line, lines=lines)


def _container(entry: dict[str, Any], kind: str, name: Optional[str], key: Key, ctx: Ctx) -> Arg:
    """``list: [ENTRY, ...]`` or ``dict: {KEY: ENTRY, ...}``: non-empty, every item an argument entry."""
    mapping(entry, key, CONTAINER_KEYS[kind], ctx)
    items, where, line = entry[kind], keystr(key), ctx.lines.get(ctx.prefix + key)
    if kind == "list":
        if not isinstance(items, list) or not items:
            raise ctx.fail(
                key + ("list",),
                f"expected a non-empty list of argument entries, e.g. "
                f"`list: [{{shape: [2, 3]}}, {{shape: [4, 3]}}]`, got {show(items)}; "
                "for a literal list (of numbers, or empty) write `value: [...]`",
            )
        return ListArg(
            tuple(argument(e, key + ("list", i), ctx, leaf=True) for i, e in enumerate(items)), name, where, line
        )
    if not isinstance(items, dict) or not items:
        raise ctx.fail(
            key + ("dict",),
            f"expected a non-empty mapping of KEY: argument entry, e.g. "
            f"`dict: {{q: {{shape: [2, 3]}}, k: {{shape: [2, 3]}}}}`, got {show(items)}; "
            "for a literal mapping (or an empty one) write `value: {...}`",
        )
    return DictArg(
        tuple((str(k), argument(e, key + ("dict", str(k)), ctx, leaf=True)) for k, e in items.items()),
        name,
        where,
        line,
    )


def _not_a_number(data: Any) -> list[Any]:
    """The first value in ``data`` (a number or nested lists of them) that is neither a number, a
    boolean nor a list, as a list of one; an empty list when there is none."""
    todo = [data]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(reversed(item))
        elif not isinstance(item, (int, float, bool)):
            return [item]
    return []


def _tensor(entry: dict[str, Any], name: Optional[str], key: Key, where: str, ctx: Ctx) -> TensorArg:
    shape = entry.get("shape")
    if "shape" in entry:
        dims = [whole(d) for d in shape] if isinstance(shape, list) else [None]
        if not all(d is not None and d >= 0 for d in dims):
            raise ctx.fail(key + ("shape",), f"expected a list of non-negative ints, got {show(shape)}")
        shape = dims
    if shape is not None and len(shape) > MAX_DIMS:
        raise ctx.fail(key + ("shape",), f"{len(shape)} dimensions: torch tensors have at most {MAX_DIMS}")
    bad = _not_a_number(entry["data"]) if "data" in entry else []
    if bad:
        raise ctx.fail(key + ("data",), f"expected a number or a (nested) list of numbers, got {show(bad[0])}")
    deep = too_deep(entry["data"]) if "data" in entry else None
    if deep:
        raise ctx.fail(key + ("data",), deep)
    dtype = dtype_of(entry["dtype"], key + ("dtype",), ctx) if "dtype" in entry else None
    dist = entry.get("dist")
    if "dist" in entry and (not isinstance(dist, str) or dist not in DISTS):
        raise ctx.fail(key + ("dist",), f"unknown distribution {show(dist)}; use one of {', '.join(DISTS)}")
    if dist is not None and "data" in entry:
        raise ctx.fail(key + ("dist",), "`dist` draws values, `data` gives them: use one or the other")
    dist = dist or ("randint" if dtype and (dtype.startswith(("int", "uint")) or dtype == "bool") else "normal")
    allowed = DISTS[dist]
    for k in DIST_KEYS:
        if k in entry and k not in allowed:
            takes = f"it takes {', '.join(allowed)}" if allowed else "it takes no parameters"
            raise ctx.fail(key + (k,), f"`{k}` does not apply to dist {dist}; {takes}")
    _structure(dist, shape, dtype, entry, key, ctx)
    size_of = tuple(
        _size_of(k, entry[k], dist, key + (k,), ctx) for k in ("low", "high") if isinstance(entry.get(k), dict)
    )
    params = {
        k: number(entry[k], key + (k,), ctx)
        for k in allowed  # a bound {size_of: ...} is read above
        if k in entry and k != "dim" and not (k in ("low", "high") and isinstance(entry[k], dict))
    }
    if dist == "normal":
        params = {**DIST_DEFAULTS, **params}
        if params["std"] < 0:
            raise ctx.fail(key + ("std",), "expected a non-negative number")
    elif dist in BOUNDS:
        low, high = BOUNDS[dist]
        params = {"low": params.get("low", low), "high": params.get("high", high)}
        if dist == "positive" and params["low"] <= 0:
            raise ctx.fail(
                key + ("low",),
                f"dist positive draws values above low: expected low > 0, got {show(entry.get('low', params['low']))}",
            )
    elif dist == "randint":
        params = {"low": params.get("low", 0.0), "high": params.get("high", 2.0 if dtype == "bool" else 10.0)}
        for k, v in params.items():
            if k in entry and isinstance(entry[k], dict):
                continue
            if outside_int64(v):
                raise ctx.fail(
                    key + (k,), f"randint draws integers: expected a whole number within int64, got {show(entry[k])}"
                )
    disorder = None if size_of else unordered(params.get("low", 0), params.get("high", 1))
    if disorder:
        raise ctx.fail(key + ("high",), disorder)
    if entry.get("avoid") and dist in SET_DISTS:  # an empty list avoids nothing
        raise ctx.fail(
            key + ("avoid",),
            f"`avoid` redraws single values, which would leave the set dist {dist} draws from: drop it",
        )
    param = import_path(entry["param"], key + ("param",), ctx) if entry.get("param") is not None else None
    avoid = entry.get("avoid", [])
    if not isinstance(avoid, list) or not all(
        isinstance(iv, list) and len(iv) == 2 and all(isinstance(x, (int, float, str)) for x in iv) for iv in avoid
    ):
        raise ctx.fail(key + ("avoid",), f"expected a list of [lo, hi] intervals, got {show(avoid)}")
    intervals = tuple(
        (number(lo, key + ("avoid", i, 0), ctx), number(hi, key + ("avoid", i, 1), ctx))
        for i, (lo, hi) in enumerate(avoid)
    )
    reversed_ = reversed_interval(intervals)
    if reversed_:
        raise ctx.fail(key + ("avoid",), reversed_)
    rg = entry.get("requires_grad")
    if rg is not None and not isinstance(rg, bool):
        raise ctx.fail(key + ("requires_grad",), f"expected true or false, got {show(rg)}")
    contiguous = entry.get("contiguous")
    if contiguous is not None and not isinstance(contiguous, bool):
        raise ctx.fail(
            key + ("contiguous",),
            f"expected true or false (false: the tensor reaches the target non-contiguous), got {show(contiguous)}",
        )
    layout = sparse(entry, shape, dtype, dist, key, ctx)
    return TensorArg(
        name=name,
        shape=tuple(shape) if shape is not None else None,
        data=entry.get("data"),
        dtype=dtype,
        dist=None if "data" in entry else dist,
        params=tuple(params.items()),
        avoid=intervals,
        requires_grad=rg,
        contiguous=contiguous is not False,
        key=where,
        dim=_dim(entry, shape, key, ctx),
        size_of=size_of,
        param=param,
        placement=placement(entry.get("placement"), key + ("placement",), ctx),
        sparse=layout,
    )


def _structure(
    dist: str, shape: Optional[list[int]], dtype: Optional[str], entry: dict[str, Any], key: Key, ctx: Ctx
) -> None:
    """What a structured dist asks of the shape and dtype: a (batch of) matrices, a real dtype."""
    if dist not in SET_DISTS + ("positive",):
        return
    if dtype is not None and dtype.startswith("complex"):
        raise ctx.fail(key + ("dtype",), f"dist {dist} draws real tensors; use a floating dtype")
    if dist != "permutation" and dtype is not None and not dtype.startswith(("float", "bfloat")):
        raise ctx.fail(
            key + ("dtype",),
            f"dist {dist} draws floating-point values; use a floating dtype (randint or permutation draw integers)",
        )
    problem = not_matrices(dist, shape) if shape is not None else None
    if problem:
        square, batch = square_example(shape or [])
        raise ctx.fail(key + ("shape",), f"{problem}; give a shape such as {square} (or {batch} for a batch)")


def _dim(entry: dict[str, Any], shape: Optional[list[int]], key: Key, ctx: Ctx) -> int:
    """``dim`` of simplex, sorted and permutation: an int within the shape's dimensions (default -1)."""
    dim = entry.get("dim", -1)
    n = len(shape) if shape is not None else None
    if not isinstance(dim, int) or isinstance(dim, bool) or (n is not None and not -max(n, 1) <= dim < max(n, 1)):
        within = f" within shape {shape}" if n is not None else ""
        raise ctx.fail(
            key + ("dim",), f"expected a dimension (an int{within}, negative counts from the end), got {show(dim)}"
        )
    return dim


def _size_of(bound: str, value: dict[str, Any], dist: str, key: Key, ctx: Ctx) -> tuple[str, str, int]:
    """``high: {size_of: NAME, dim: D}``: the bound is the size of argument NAME along D (default 0)."""
    if dist != "randint":
        raise ctx.fail(key, f"a bound tied to another argument's size is for dist randint (indices), not {dist}")
    mapping(value, key, SIZE_OF_KEYS, ctx)
    other, dim = value.get("size_of"), value.get("dim", 0)
    if not isinstance(other, str) or not other:
        raise ctx.fail(key + ("size_of",), f"expected the name of another argument, got {show(other)}")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ctx.fail(key + ("dim",), f"expected a dimension of '{other}' (an int), got {show(dim)}")
    return bound, other, dim
