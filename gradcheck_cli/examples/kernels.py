"""Kernels and intended gradients, as CPU stand-ins (for specs/kernels.yaml and broken-specs/).

- ``FusedGELU``: a fused GELU "kernel" as Triton/CUDA kernels are written: it accepts only float16
  and bfloat16, loads its input into float32, computes there and stores in the input's dtype.
  Finite differences cannot judge it (forward fails in float64, and in bfloat16 they measure
  rounding); ``gelu_reference`` (plain PyTorch) can.
- ``GELUBf16Inside``: a correct GELU that computes in bfloat16 inside whatever dtype it is given.
- ``RoundSTE``: rounding with a straight-through backward (gradient passed through unchanged), and
  ``round_ste_intended``, the surrogate it means to implement.
- ``GradReverse``: the gradient reversal layer of domain-adversarial training (DANN): identity
  forward, backward ``-lambd * grad``, deliberately not the derivative.

The broken variants (a 4%-wrong kernel backward, a clipped straight-through estimator) are in
``broken.py``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

HALF = (torch.float16, torch.bfloat16)
_SQRT1_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def _gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.erf(x * _SQRT1_2))


def gelu_grad(x: Tensor) -> Tensor:
    """d GELU(x) / dx (erf form)."""
    return 0.5 * (1 + torch.erf(x * _SQRT1_2)) + x * _INV_SQRT_2PI * torch.exp(-0.5 * x * x)


def gelu_reference(x: Tensor) -> Tensor:
    """The reference: GELU in plain PyTorch (autograd gives its gradient), in any dtype."""
    return torch.nn.functional.gelu(x)


class FusedGELU(torch.autograd.Function):
    """GELU as a half-precision kernel: float16/bfloat16 in, float32 inside, the input's dtype out."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        if x.dtype not in HALF:
            raise TypeError(f"fused_gelu: the kernel supports float16 and bfloat16, got {x.dtype}")
        ctx.save_for_backward(x)
        return _gelu(x.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return (grad.float() * gelu_grad(x.float())).to(x.dtype)


class GELUBf16Inside(torch.autograd.Function):
    """A correct GELU that computes in bfloat16 inside, whatever the dtype it is given."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return _gelu(x.to(torch.bfloat16)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return (grad.to(torch.bfloat16) * gelu_grad(x.to(torch.bfloat16))).to(x.dtype)


class RoundSTE(torch.autograd.Function):
    """Rounding with a straight-through estimator: backward passes the gradient through unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad


def round_ste_intended(inputs: tuple[Any, ...], grad_outputs: tuple[Optional[Tensor], ...]) -> tuple[Any, ...]:
    """The surrogate gradient a straight-through rounding means: d round(x) / dx taken as 1."""
    (grad,) = grad_outputs
    return (grad,)


class GradReverse(torch.autograd.Function):
    """Gradient reversal (DANN): the identity forward, backward ``-lambd * grad`` by design."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, lambd: float) -> Tensor:
        ctx.lambd = lambd
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.lambd * grad, None


def grad_reverse_intended(inputs: tuple[Any, ...], grad_outputs: tuple[Optional[Tensor], ...]) -> tuple[Any, ...]:
    """The gradient a reversal layer means to give: ``-lambd * grad`` for x, none for lambd."""
    _, lambd = inputs
    (grad,) = grad_outputs
    assert grad is not None
    return -lambd * grad, None
