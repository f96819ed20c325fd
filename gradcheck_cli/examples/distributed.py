"""Tensor- and sequence-parallel mappings as autograd.Functions that call torch.distributed collectives,
written for gradcheck-cli's examples (specs/distributed.yaml checks them across ranks), and one broken
variant per classic bug (broken-specs/distributed_*.yaml).

The placements say what the spec says: an argument is replicate (the same on every rank), shard(d) (one
tensor split along dim d, chunk r on rank r) or per_rank (each rank's own); an output likewise, or partial
(the ranks' outputs add up to the value)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _rank() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out)
    return out


def _all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    _, size = _rank()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim)


def _split(x: torch.Tensor, dim: int) -> torch.Tensor:
    rank, size = _rank()
    return x.chunk(size, dim)[rank].contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int) -> torch.Tensor:
    _, size = _rank()
    parts = [p.contiguous() for p in x.chunk(size, dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts)
    return out


# ----------------------------------------------------------------------------------- correct mappings


class CopyToParallelRegion(torch.autograd.Function):
    """x replicate -> y per_rank: forward is the identity, backward all-reduces (each rank's y feeds its own
    computation, so x's gradient is the sum of theirs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _all_reduce(g)


class ReduceFromParallelRegion(torch.autograd.Function):
    """x per_rank (partial sums) -> y replicate: forward all-reduces, backward is the identity."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _all_reduce(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class ScatterToParallelRegion(torch.autograd.Function):
    """x replicate -> y shard(-1): forward keeps this rank's chunk of the last dim, backward all-gathers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _split(x, -1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _all_gather(g, -1)


class GatherFromParallelRegion(torch.autograd.Function):
    """x shard(-1) -> y replicate: forward all-gathers along the last dim, backward keeps this rank's chunk."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _all_gather(x, -1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _split(g, -1)


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """x per_rank (partial sums) -> y shard(0): forward reduce-scatters along dim 0 (sequence parallel),
    backward all-gathers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter(x, 0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _all_gather(g, 0)


class AllGatherFromSequenceParallel(torch.autograd.Function):
    """x shard(0) -> y per_rank: forward all-gathers along dim 0 and each rank goes on with its own
    computation (a column-parallel layer), so backward reduce-scatters the ranks' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _all_gather(x, 0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter(g, 0)


class AverageAcrossRanks(torch.autograd.Function):
    """x per_rank -> y replicate, the mean over the ranks (a data-parallel loss): forward all-reduces and
    divides by world_size, backward divides by world_size."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _all_reduce(x) / dist.get_world_size()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g / dist.get_world_size()


class ColumnParallelLinear(torch.autograd.Function):
    """y = x W^T + b with W's rows (and b) split across ranks: x replicate [N, in], weight shard(0) [out, in],
    bias shard(0) [out] -> y shard(-1) [N, out]. x's gradient is all-reduced (its copy to the region)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        return _all_reduce(g @ weight), g.t() @ x, g.sum(0)


class RowParallelLinear(torch.autograd.Function):
    """y = x W^T + b with W's columns split across ranks: x shard(-1) [N, in], weight shard(1) [out, in],
    bias replicate [out] -> y replicate [N, out]; forward all-reduces the ranks' partial products."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return _all_reduce(x @ weight.t()) + bias

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        return g @ weight, g.t() @ x, g.sum(0)


class RowParallelPartial(torch.autograd.Function):
    """y = x W^T with W's columns split across ranks and no all-reduce: x shard(-1) [N, in], weight shard(1)
    [out, in] -> y partial (the ranks' products add up to y; the reduction comes later)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        return g @ weight, g.t() @ x


# ----------------------------------------------------------------------------- the classic bugs


class CopyForgetsAllReduce(CopyToParallelRegion):
    """BROKEN: backward forgets its all-reduce: each rank's gradient of x is partial."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class ReduceAllReducesBothWays(ReduceFromParallelRegion):
    """BROKEN: backward all-reduces too (an all-reduce in both directions): world_size x too large."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _all_reduce(g)


class AverageForgetsDivision(AverageAcrossRanks):
    """BROKEN: backward does not divide by world_size: world_size x too large."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class GatherSplitsWrongDim(GatherFromParallelRegion):
    """BROKEN: forward gathers along the last dim, backward splits the flat buffer (which is a split
    along dim 0): each rank gets another slice of the gradient, of the right size."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        rank, size = _rank()
        return g.reshape(-1).chunk(size)[rank].view(g.shape[0], g.shape[-1] // size)


class ScatterKeepsLocalChunk(ScatterToParallelRegion):
    """BROKEN: backward returns only this rank's chunk (zeros elsewhere) where every rank needs the whole
    gradient of the replicate x (an all-gather)."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        rank, size = _rank()
        out = g.new_zeros(*g.shape[:-1], g.shape[-1] * size)
        out[..., rank * g.shape[-1] : (rank + 1) * g.shape[-1]] = g
        return out
