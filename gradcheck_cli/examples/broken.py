"""Deliberately broken Functions, each with one realistic mistake in backward (for broken-specs/)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from gradcheck_cli.examples.kernels import FusedGELU, RoundSTE, gelu_grad
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.examples.max_pool import GlobalMaxPool
from gradcheck_cli.examples.mul_constant import MulConstant
from gradcheck_cli.examples.relu import ReLU

_LinearGrads = tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]


class LinearWrongWeightTranspose(LinearFunction):
    """Weight gradient computed as ``input.t() @ grad_output`` (transposed).

    Right shape only when ``in_features == out_features``; even then the values are the
    transpose of the correct ``grad_output.t() @ input``. Input and bias gradients are right.
    """

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> _LinearGrads:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_output @ weight
        grad_weight = input.t() @ grad_output  # BUG: should be grad_output.t() @ input
        grad_bias = grad_output.sum(0) if bias is not None else None
        return grad_input, grad_weight, grad_bias


class LinearDoubleBias(LinearFunction):
    """Bias gradient is twice the right one (summed over the batch and then added again)."""

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> _LinearGrads:
        input, weight, bias = ctx.saved_tensors
        grad_bias = None
        if bias is not None:
            grad_bias = grad_output.sum(0)
            grad_bias = grad_bias + grad_output.sum(0)  # BUG: counted twice
        return grad_output @ weight, grad_output.t() @ input, grad_bias


class LinearWrongGradCount(LinearFunction):
    """backward returns 2 gradients for the 3 inputs of forward (the bias one is forgotten)."""

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        input, weight, _bias = ctx.saved_tensors
        return grad_output @ weight, grad_output.t() @ input  # BUG: no entry for bias


class MulConstantSignFlip(MulConstant):
    """Gradient has the wrong sign: ``-constant`` instead of ``constant``."""

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        return grad_output * -ctx.constant, None  # BUG: sign flipped


class ScalesGradOutputInPlace(MulConstant):
    """Values are right, but backward scales ``grad_output`` in place and returns it.

    This corrupts the incoming gradient for any other consumer of it (and torch's own
    gradcheck does not notice, since it hands backward a fresh grad_output each time).
    """

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        grad_output.mul_(ctx.constant)  # BUG: modifies grad_output in place
        return grad_output, None


class ReLUZeroGrad(ReLU):
    """Returns all zeros: the masked gradient is computed but never written into the result."""

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        grad_input = torch.zeros_like(grad_output)
        masked = grad_output * (x > 0).to(grad_output.dtype)  # noqa: F841  BUG: result unused
        return grad_input


class GlobalMaxPoolWrongIndex(GlobalMaxPool):
    """Scatters into a flattened view using the wrong row stride (rows instead of row length).

    Row 0 gets the right position; every other row puts its gradient in the wrong place.
    Needs rows <= row length (e.g. shape [4, 8]) so the wrong flat index stays in range.
    """

    @staticmethod
    def backward(ctx: Any, grad_values: Tensor, grad_indices: Optional[Tensor]) -> Tensor:
        (indices,) = ctx.saved_tensors
        shape = ctx.input_shape
        rows = indices.numel()
        grad_flat = grad_values.new_zeros(shape).reshape(-1)
        row_start = torch.arange(rows, device=indices.device) * rows  # BUG: should be * shape[-1]
        grad_flat[row_start + indices.reshape(-1)] = grad_values.reshape(-1)
        return grad_flat.reshape(shape)


class GELUWrongGrad(FusedGELU):
    """BROKEN: FusedGELU whose backward is 4% too large (a wrong constant in the kernel)."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return (grad.float() * gelu_grad(x.float()) * 1.04).to(x.dtype)  # BUG: * 1.04


class RoundSTEClipped(RoundSTE):
    """BROKEN (against ``round_ste_intended``): zeroes the gradient where |x| > 1 (a clipped STE, not the
    identity surrogate the spec asks for)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.round(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1)  # BUG: the intended surrogate passes every gradient through
