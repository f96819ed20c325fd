"""Linear layer ``y = x W^T + b`` as in PyTorch's "Extending PyTorch" tutorial."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


class LinearFunction(torch.autograd.Function):
    """``input @ weight.t() + bias``; ``bias`` may be ``None``."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        ctx.save_for_backward(input, weight, bias)
        output = input @ weight.t()
        if bias is not None:
            output = output + bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t() @ input
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias
