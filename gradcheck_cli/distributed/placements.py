"""Placements in torch: what each rank holds of a tensor, the elements finite differences move (the
global independent variables, in one order every rank shares), the grad_outputs of the global
objective, and each rank's share of the objective.

The objective is ``L = sum over outputs of <g, y>``: a per_rank output adds ``<g_r, y_r>`` over the
ranks (independent g_r), a partial output ``<g, sum_r y_r>`` (one g), a shard(d) output ``<g, cat_r y_r>``
(one global g, split as the output is), a replicate output ``<g, y>`` once (rank 0's share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..numerics.streams import Streams
from ..spec.distributed import shard_dim

STREAM = 40  # the grad_outputs' random stream (each output and rank its own number above it)


@dataclass(frozen=True)
class Placement:
    """A placement word: replicate, shard(d) (``dim``), per_rank or partial."""

    kind: str
    dim: Optional[int] = None

    @staticmethod
    def of(text: Optional[str]) -> Placement:
        """The placement ``text`` names (None: replicate)."""
        text = text or "replicate"
        dim = shard_dim(text)
        return Placement("shard", dim) if dim is not None else Placement(text)

    def __str__(self) -> str:
        return f"shard({self.dim})" if self.kind == "shard" else self.kind


def local(value: torch.Tensor, placement: Placement, rank: int, size: int) -> torch.Tensor:
    """What rank ``rank`` holds of the global ``value`` (a per_rank value is already the rank's own)."""
    if placement.kind == "shard":
        return value.detach().chunk(size, placement.dim or 0)[rank].clone()
    return value.detach().clone()


@dataclass(frozen=True)
class Moves:
    """The global elements of one argument that finite differences move, in order: for each, the rank
    that holds it (-1: every rank, a replicate argument) and its flat index in that rank's tensor."""

    owner: torch.Tensor  # int64, one per global element
    index: torch.Tensor


def moves(placement: Placement, shape: tuple[int, ...], size: int) -> Moves:
    """The moves of an argument of global ``shape`` (a per_rank argument: each rank's shape): replicate,
    element by element on every rank; shard(d), the global tensor's elements row-major, each on the rank
    whose chunk holds it; per_rank, rank 0's elements, then rank 1's, ..."""
    numel = 1
    for n in shape:
        numel *= n
    if placement.kind == "replicate":
        return Moves(torch.full((numel,), -1, dtype=torch.int64), torch.arange(numel))
    if placement.kind == "per_rank":
        return Moves(torch.arange(size).repeat_interleave(numel), torch.arange(numel).repeat(size))
    owner = torch.empty(numel, dtype=torch.int64)
    index = torch.empty(numel, dtype=torch.int64)
    flat = torch.arange(numel).view(shape)
    for r, chunk in enumerate(flat.chunk(size, placement.dim or 0)):
        held = chunk.reshape(-1)  # the global indices rank r holds, in its own row-major order
        owner[held] = r
        index[held] = torch.arange(held.numel())
    return Moves(owner, index)


def expected(
    numerical: torch.Tensor, placement: Placement, shape: tuple[int, ...], rank: int, size: int
) -> torch.Tensor:
    """Rank ``rank``'s part of an argument's numerical gradient (``numerical``: one value per move, in
    ``moves``' order): the whole gradient for replicate, the rank's chunk for shard(d), its own for per_rank."""
    if placement.kind == "replicate":
        return numerical.view(shape)
    if placement.kind == "per_rank":
        return numerical.view(size, *shape)[rank]
    return numerical.view(shape).chunk(size, placement.dim or 0)[rank]


def grad_output(
    output: torch.Tensor, placement: Placement, position: int, rank: int, size: int, streams: Streams
) -> torch.Tensor:
    """The grad_output rank ``rank`` gives output ``position`` (of its local ``output``): its own for per_rank,
    the one shared g for replicate and partial, its chunk of one global g for shard(d)."""
    own = placement.kind == "per_rank"
    gen = streams.generator(STREAM * 1000 + position * 100 + (rank + 1 if own else 0))
    shape = list(output.shape)
    if placement.kind == "shard":
        shape[placement.dim or 0] *= size
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if placement.kind == "shard":
        g = g.chunk(size, placement.dim or 0)[rank]
    return g.to(dtype=output.dtype, device=output.device).contiguous()


def share(outputs: list[torch.Tensor], grads: list[torch.Tensor], placements: list[Placement], rank: int) -> float:
    """This rank's share of the objective: ``<g, y>`` summed over its outputs, a replicate output on rank 0 only."""
    total = 0.0
    for y, g, p in zip(outputs, grads, placements):
        if p.kind == "replicate" and rank != 0:
            continue
        total += float(torch.sum(y.detach().to(torch.float64) * g.to(torch.float64)))
    return total
