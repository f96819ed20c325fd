"""Targets whose arguments are containers: a list or a dict of tensors (for specs/containers.yaml and
broken-specs/containers_weighted_cat_second_slice.yaml). A spec writes them with ``list:`` and
``dict:`` entries; every tensor in them gets its own row (``xs[0]``, ``feats.gate``).

An ``autograd.Function``'s ``apply`` tracks only the tensors passed to it directly, so a Function
that works on a list is reached through a function that unpacks the list (``weighted_cat``).

- ``weighted_cat(xs, weights)``: ``cat([w_0 x_0, w_1 x_1, ...])`` along dim 0, through the
  Function ``WeightedCat``, correct.
- ``weighted_cat_second_slice``: the same, with a backward that takes the second tensor's gradient
  from the wrong slice of grad_output (the first tensor's rows): ``xs[1]`` is wrong, the rest right.
- ``gated(feats)``: ``feats['x'] * sigmoid(feats['gate'])`` from a dict, through the Function ``Gate``.
- ``scaled_sum``: the custom op ``gradcheck_examples::scaled_sum(Tensor[] xs, float scale) -> Tensor``,
  ``scale * (x_0 + 2 x_1 + 3 x_2 + ...)``, gradients by ``register_autograd``.
- ``ListMix``: an nn.Module whose forward takes a list: ``tanh(sum_i w_i x_i)``.
"""

from typing import Any

import torch
from torch import Tensor

# No `from __future__ import annotations` here: custom_op reads the schema from the annotations.

NAMESPACE = "gradcheck_examples"


class WeightedCat(torch.autograd.Function):
    """``cat([w_i x_i])`` along dim 0: ``forward(ctx, weights, *xs)``, one weight per tensor."""

    @staticmethod
    def forward(weights: Tensor, *xs: Tensor) -> Tensor:
        return torch.cat([w * x for w, x in zip(weights, xs)])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, ...]:
        weights, *xs = ctx.saved_tensors
        parts = grad.split([x.shape[0] for x in xs])
        grad_weights = torch.stack([(p * x).sum() for p, x in zip(parts, xs)])
        return (grad_weights, *(w * p for w, p in zip(weights, parts)))


class WeightedCatSecondSlice(WeightedCat):
    """BROKEN: the second tensor's gradient comes from the first tensor's rows of grad_output."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, ...]:
        weights, *xs = ctx.saved_tensors
        parts = list(grad.split([x.shape[0] for x in xs]))
        grad_weights = torch.stack([(p * x).sum() for p, x in zip(parts, xs)])
        parts[1] = grad[: xs[1].shape[0]]  # should start after the first tensor's rows
        return (grad_weights, *(w * p for w, p in zip(weights, parts)))


def weighted_cat(xs: list[Tensor], weights: Tensor) -> Tensor:
    """``cat([weights[i] * xs[i]])`` along dim 0."""
    return WeightedCat.apply(weights, *xs)


def weighted_cat_second_slice(xs: list[Tensor], weights: Tensor) -> Tensor:
    """BROKEN version of ``weighted_cat``."""
    return WeightedCatSecondSlice.apply(weights, *xs)


class Gate(torch.autograd.Function):
    """``x * sigmoid(gate)``."""

    @staticmethod
    def forward(x: Tensor, gate: Tensor) -> Tensor:
        return x * torch.sigmoid(gate)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, gate = ctx.saved_tensors
        s = torch.sigmoid(gate)  # computed here, with autograd: backward is differentiable (double_backward)
        return grad * s, grad * x * s * (1 - s)


def gated(feats: dict[str, Tensor]) -> Tensor:
    """``feats['x'] * sigmoid(feats['gate'])``."""
    return Gate.apply(feats["x"], feats["gate"])


@torch.library.custom_op(f"{NAMESPACE}::scaled_sum", mutates_args=())
def scaled_sum(xs: list[Tensor], scale: float) -> Tensor:
    """``scale * sum_i (i + 1) xs[i]``: tensors of one shape."""
    return scale * torch.stack([(i + 1) * x for i, x in enumerate(xs)]).sum(0)


@scaled_sum.register_fake
def _(xs: list[Tensor], scale: float) -> Tensor:
    return torch.empty_like(xs[0])


def _sum_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.n, ctx.scale = len(inputs[0]), inputs[1]


def _sum_backward(ctx: Any, grad: Tensor) -> tuple[list[Tensor], None]:
    return [ctx.scale * (i + 1) * grad for i in range(ctx.n)], None


scaled_sum.register_autograd(_sum_backward, setup_context=_sum_context)


class ListMix(torch.nn.Module):
    """``tanh(sum_i w_i x_i)`` over a list of ``n`` tensors of one shape."""

    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, xs: list[Tensor]) -> Tensor:
        return torch.tanh(torch.stack([w * x for w, x in zip(self.weight, xs)]).sum(0))
