"""nn.Module examples: layers whose parameters pass through custom Functions.

``gradcheck`` builds a module from the spec's ``init``, and checks the gradients of its
parameters (named as in ``named_parameters()``: ``weight``, ``bias``, ``hidden.weight``) like
those of forward's arguments.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.examples.stochastic import Dropout


class LinearWrongWeightGrad(LinearFunction):
    """Weight gradient scaled by 2 (a stray factor); input and bias gradients are right."""

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, Tensor, Any]:
        input, weight, bias = ctx.saved_tensors
        grad_bias = grad_output.sum(0) if bias is not None else None
        return grad_output @ weight, 2 * grad_output.t() @ input, grad_bias  # BUG: 2x for the weight


class LinearModule(torch.nn.Module):
    """``torch.nn.Linear`` written with the custom ``LinearFunction`` (the Extending PyTorch tutorial)."""

    function: Any = LinearFunction

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features))
        self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None
        bound = 1 / math.sqrt(in_features)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        return self.function.apply(input, self.weight, self.bias)


class LinearModuleWrongWeight(LinearModule):
    """Deliberately broken: its Function's backward doubles the weight gradient only."""

    function = LinearWrongWeightGrad


class MLP(torch.nn.Module):
    """Two LinearModules with tanh between them: parameters ``hidden.weight``, ``out.bias``, ..."""

    def __init__(self, sizes: tuple[int, int, int] = (4, 6, 3), *, wrong_out: bool = False) -> None:
        super().__init__()
        self.hidden = LinearModule(sizes[0], sizes[1])
        self.out = (LinearModuleWrongWeight if wrong_out else LinearModule)(sizes[1], sizes[2])

    def forward(self, input: Tensor) -> Tensor:
        return self.out(torch.tanh(self.hidden(input)))


class DropoutLinear(torch.nn.Module):
    """A LinearModule followed by the custom (random) ``Dropout``: checkable because the RNG is forked."""

    def __init__(self, in_features: int = 4, out_features: int = 3, p: float = 0.5) -> None:
        super().__init__()
        self.linear = LinearModule(in_features, out_features)
        self.p = p

    def forward(self, input: Tensor) -> Tensor:
        return Dropout.apply(self.linear(input), self.p)
