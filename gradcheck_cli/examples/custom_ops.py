"""Custom operators made with ``torch.library.custom_op`` (for specs/custom_ops.yaml and broken-specs/).

Importing this module registers the ops ``gradcheck_examples::scaled_linear``, ``softplus``,
``softplus_forgets_beta``, ``row_sum_wrong_fake`` and ``double_and_count`` (a process may import
it once: registering an op name twice raises). A spec reaches them as ``torch.ops.gradcheck_examples.NAME``
with ``import: [gradcheck_cli.examples.custom_ops]``, or as ``gradcheck_cli.examples.custom_ops:NAME``
(the CustomOpDef that ``@custom_op`` returns).

- ``scaled_linear``: ``scale * x W^T + b``, correct: gradients by ``register_autograd``, shapes by
  ``register_fake``; ``bias`` is ``Tensor?``, ``scale`` a float with a default.
- ``softplus``: ``log(1 + exp(beta x)) / beta``, correct.
- ``softplus_forgets_beta``: its backward uses ``sigmoid(x)`` instead of ``sigmoid(beta x)``: a wrong
  gradient that torch.library.opcheck passes (it never compares gradient values) and gradcheck catches.
- ``row_sum_wrong_fake``: ``x.sum(-1)`` whose fake kernel keeps the summed dimension: right
  gradients (gradcheck passes), wrong shapes under torch.compile (opcheck's test_faketensor catches it).
- ``double_and_count``: ``2 x``, and adds one to its ``calls`` counter in place although the op
  declares no mutation (``mutates_args=()``): gradcheck passes, opcheck's test_schema catches it.
"""

from typing import Any, Optional

import torch
from torch import Tensor

# No `from __future__ import annotations` here: custom_op reads the schema from the annotations.

NAMESPACE = "gradcheck_examples"


@torch.library.custom_op(f"{NAMESPACE}::scaled_linear", mutates_args=())
def scaled_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, scale: float = 1.0) -> Tensor:
    """``scale * x @ weight.T + bias``."""
    out = scale * (x @ weight.t())
    return out + bias if bias is not None else out


@scaled_linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, scale: float = 1.0) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _linear_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias, scale = inputs
    ctx.save_for_backward(x, weight)
    ctx.scale, ctx.has_bias = scale, bias is not None


def _linear_backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    x, weight = ctx.saved_tensors
    grad_bias = grad.sum(0) if ctx.has_bias else None
    return ctx.scale * grad @ weight, ctx.scale * grad.t() @ x, grad_bias, None


scaled_linear.register_autograd(_linear_backward, setup_context=_linear_context)


def _softplus(x: Tensor, beta: float) -> Tensor:
    return torch.nn.functional.softplus(x, beta=beta)


@torch.library.custom_op(f"{NAMESPACE}::softplus", mutates_args=())
def softplus(x: Tensor, beta: float = 1.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``."""
    return _softplus(x, beta)


@torch.library.custom_op(f"{NAMESPACE}::softplus_forgets_beta", mutates_args=())
def softplus_forgets_beta(x: Tensor, beta: float = 1.0) -> Tensor:
    """Softplus as above; its backward forgets ``beta`` (see ``_softplus_backward_forgets_beta``)."""
    return _softplus(x, beta)


def _same_shape(x: Tensor, beta: float = 1.0) -> Tensor:
    return torch.empty_like(x)


def _softplus_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.beta = inputs[1]


def _softplus_backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None]:
    (x,) = ctx.saved_tensors
    return grad * torch.sigmoid(ctx.beta * x), None


def _softplus_backward_forgets_beta(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None]:
    (x,) = ctx.saved_tensors
    return grad * torch.sigmoid(x), None  # BUG: d/dx softplus(x; beta) = sigmoid(beta * x)


for _op, _backward in ((softplus, _softplus_backward), (softplus_forgets_beta, _softplus_backward_forgets_beta)):
    _op.register_fake(_same_shape)
    _op.register_autograd(_backward, setup_context=_softplus_context)


@torch.library.custom_op(f"{NAMESPACE}::row_sum_wrong_fake", mutates_args=())
def row_sum_wrong_fake(x: Tensor) -> Tensor:
    """``x.sum(-1)``."""
    return x.sum(-1)


@row_sum_wrong_fake.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(x.shape)  # BUG: the real kernel drops the last dimension: x.new_empty(x.shape[:-1])


def _row_sum_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.shape = inputs[0].shape


def _row_sum_backward(ctx: Any, grad: Tensor) -> Tensor:
    return grad.unsqueeze(-1).expand(ctx.shape)


row_sum_wrong_fake.register_autograd(_row_sum_backward, setup_context=_row_sum_context)


@torch.library.custom_op(f"{NAMESPACE}::double_and_count", mutates_args=())  # BUG: mutates `calls`
def double_and_count(x: Tensor, calls: Tensor) -> Tensor:
    """``2 x``; counts its calls in ``calls`` (in place, undeclared: it should say ``mutates_args=("calls",)``)."""
    calls.add_(1)
    return 2 * x


@double_and_count.register_fake
def _(x: Tensor, calls: Tensor) -> Tensor:
    return torch.empty_like(x)


def _double_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    return 2 * grad, None


double_and_count.register_autograd(_double_backward, setup_context=lambda ctx, inputs, output: None)
