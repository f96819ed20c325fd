"""The keys of a distributed spec: ``distributed: {world_size, backend, timeout}``, an input's
``placement`` and the document's ``outputs``, read and checked (no torch here: the checking side is
``gradcheck_cli.distributed``)."""

from __future__ import annotations

import re
from typing import Any, Optional

from .lines import Ctx, keystr
from .model import Case, Distributed, Key, SpecError, TensorArg
from .values import mapping, number, show, whole
from .vocabulary import DEFS, enum, keys, prop

DISTRIBUTED_KEYS = keys("distributed")
BACKENDS = enum(prop("distributed", "backend"))
WORLD_SIZES: tuple[int, int] = (
    prop("distributed", "world_size")["minimum"],
    prop("distributed", "world_size")["maximum"],
)
INPUT_PLACEMENT = re.compile(DEFS["placement"]["pattern"])
OUTPUT_PLACEMENT = re.compile(DEFS["outputs"]["items"]["pattern"])
DEFAULT_TIMEOUT = Distributed.timeout  # seconds without progress on any rank


def shard_dim(placement: str) -> Optional[int]:
    """The dim of ``shard(d)``; None for the other placements."""
    found = re.fullmatch(r"shard\((-?[0-9]+)\)", placement)
    return int(found.group(1)) if found else None


def distributed(value: Any, key: Key, ctx: Ctx) -> Optional[Distributed]:
    """``distributed: {world_size: N, backend: gloo | nccl, timeout: SECONDS}`` (null: one process)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ctx.fail(key, f"expected a mapping such as `distributed: {{world_size: 2}}`, got {show(value)}")
    mapping(value, key, DISTRIBUTED_KEYS, ctx)
    if "world_size" not in value:
        raise ctx.fail(key + ("world_size",), "missing; say how many ranks to start, e.g. `world_size: 2`")
    size = whole(value["world_size"])
    low, high = WORLD_SIZES
    if size is None or not low <= size <= high:
        raise ctx.fail(
            key + ("world_size",),
            f"expected an integer from {low} to {high} (the ranks to start), got {show(value['world_size'])}",
        )
    backend = value.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise ctx.fail(
            key + ("backend",),
            f"expected one of {', '.join(BACKENDS)} (gloo on the CPU, nccl with one GPU per rank), got {show(backend)}",
        )
    timeout = DEFAULT_TIMEOUT
    if value.get("timeout") is not None:
        timeout = number(value["timeout"], key + ("timeout",), ctx, positive=True)
    return Distributed(size, backend, timeout)


def outputs(value: Any, key: Key, ctx: Ctx) -> tuple[str, ...]:
    """``outputs: [replicate | shard(d) | partial | per_rank, ...]``, one per tensor output (null: none given)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ctx.fail(
            key,
            f"expected a list with one placement per output of forward, e.g. `outputs: [per_rank]`, got {show(value)}",
        )
    for i, item in enumerate(value):
        if not isinstance(item, str) or not OUTPUT_PLACEMENT.fullmatch(item):
            raise ctx.fail(
                key + (i,), f"expected replicate, shard(d) (d an integer dim), partial or per_rank, got {show(item)}"
            )
    return tuple(value)


def placement(value: Any, key: Key, ctx: Ctx) -> Optional[str]:
    """An input's ``placement: replicate | shard(d) | per_rank`` (null: replicate)."""
    if value is None:
        return None
    if not isinstance(value, str) or not INPUT_PLACEMENT.fullmatch(value):
        hint = (
            " (partial is an output's placement; an input that differs per rank is per_rank)"
            if value == "partial"
            else ""
        )
        raise ctx.fail(key, f"expected replicate, shard(d) (d an integer dim) or per_rank{hint}, got {show(value)}")
    return value


def consistent(case: Case, ctx: Ctx, where: Key) -> Case:
    """``case`` when its placements fit it: placements and ``outputs`` (written at ``where``: the document or
    a case entry) only under ``distributed``, and a ``shard(d)`` input's dim d within its shape and a multiple
    of the world size long."""
    placed = [arg for arg in case.inputs if isinstance(arg, TensorArg) and arg.placement is not None]
    placed += [arg for _, arg in case.kwargs if isinstance(arg, TensorArg) and arg.placement is not None]
    label = f"case {case.label!r}: " if case.label != "default" else ""
    if case.distributed is None:
        if placed:
            arg = placed[0]
            raise SpecError(
                ctx.path,
                f"{arg.key}.placement",
                f"{label}a placement needs `distributed: {{world_size: N}}` in the spec (or drop it)",
                arg.line_of("placement"),
            )
        if case.outputs:
            raise SpecError(
                ctx.path,
                keystr(where + ("outputs",)),
                f"{label}`outputs` places outputs across ranks: it needs `distributed: {{world_size: N}}` (or drop it)",
                ctx.lines.get(ctx.prefix + where + ("outputs",)),
            )
        return case
    sparse = [a for a in (*case.inputs, *(a for _, a in case.kwargs)) if isinstance(a, TensorArg) and a.sparse]
    if sparse:
        raise SpecError(
            ctx.path,
            f"{sparse[0].key}.layout",
            f"{label}a sparse input is not checked across ranks yet: drop `distributed`, or give it a dense layout",
            sparse[0].line_of("layout"),
        )
    size = case.distributed.world_size
    for arg in placed:
        dim = shard_dim(arg.placement or "")
        if dim is None or arg.shape is None:
            continue
        n = len(arg.shape)
        if not -n <= dim < n:
            raise SpecError(
                ctx.path,
                f"{arg.key}.placement",
                f"{label}shard({dim}) of a tensor with {n} dims: give a dim from {-n} to {n - 1}",
                arg.line_of("placement"),
            )
        if arg.shape[dim] % size:
            raise SpecError(
                ctx.path,
                f"{arg.key}.placement",
                f"{label}shard({dim}) splits dim {dim} of shape {list(arg.shape)} into {size} equal chunks "
                f"(world_size {size}): make its size a multiple of {size}",
                arg.line_of("placement"),
            )
    return case
