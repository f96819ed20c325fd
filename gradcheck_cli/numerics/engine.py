"""``grad``: ``torch.autograd.grad`` without its first-call import, the one call into autograd's engine.

``torch.autograd.grad`` checks each given grad_output's shape through
``torch.fx.experimental.symbolic_shapes`` (for symbolic sizes), and the first such call in a process
imports it, and sympy with it: a third of a second, more than a small case's whole check. Where
every grad_output is a plain tensor with its output's size, that check is a comparison of two
``torch.Size``; ``grad`` makes it so and calls the engine exactly as ``torch.autograd.grad`` then
does, with the same arguments, so the gradients, and the errors of a user's backward, are the very
same. Anything else (a grad_output that is None, a size that differs, a symbolic size, a tensor
subclass with ``__torch_function__``, nested tensors, gradient edges, a torch without the engine
function) goes to ``torch.autograd.grad`` itself, with its own messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch
from torch.overrides import has_torch_function

Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]

_run_backward: Optional[Callable[..., tuple[Any, ...]]] = getattr(torch.autograd.graph, "_engine_run_backward", None)


def grad(
    outputs: Tensors,
    inputs: Tensors,
    grad_outputs: Optional[Tensors] = None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
    allow_unused: Optional[bool] = None,
    is_grads_batched: bool = False,
    materialize_grads: bool = False,
) -> tuple[Any, ...]:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, ...)``: the same gradients, the same errors."""
    outs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    ins = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    grads = (grad_outputs,) if isinstance(grad_outputs, torch.Tensor) else tuple(grad_outputs or ())
    if (
        _run_backward is None
        or not ins
        or (materialize_grads and allow_unused is False)
        or not _plain(outs, ins, grads, is_grads_batched)
    ):
        return tuple(
            torch.autograd.grad(
                outputs,
                inputs,
                grad_outputs,
                retain_graph=retain_graph,
                create_graph=create_graph,
                allow_unused=allow_unused,
                is_grads_batched=is_grads_batched,
                materialize_grads=materialize_grads,
            )
        )
    unused = materialize_grads if allow_unused is None else allow_unused
    keep = create_graph if retain_graph is None else retain_graph
    run = _run_backward

    def vjp(g: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        return run(outs, g, keep, create_graph, ins, unused, accumulate_grad=False)

    if is_grads_batched:
        from torch import _vmap_internals  # what torch.autograd.grad batches with

        result = _vmap_internals._vmap(vjp, 0, 0, allow_none_pass_through=True)(grads)
    else:
        result = vjp(grads)
    if materialize_grads:
        result = tuple(torch.zeros_like(x, requires_grad=create_graph) if r is None else r for r, x in zip(result, ins))
    return tuple(result)


def _plain(outs: tuple[Any, ...], ins: tuple[Any, ...], grads: tuple[Any, ...], batched: bool) -> bool:
    """Every output and input a tensor without ``__torch_function__``, every output not nested and given a
    grad_output of its own (real or complex as it is) whose size is the output's, in plain ints: then
    ``torch.autograd.grad``'s checks of the grad_outputs pass, and it calls the engine with them as they are."""
    if len(grads) != len(outs) or not all(isinstance(t, torch.Tensor) for t in (*outs, *ins, *grads)):
        return False
    if has_torch_function((*outs, *ins, *grads)):
        return False
    for out, g in zip(outs, grads):
        if out.is_nested or g.is_nested or out.dtype.is_complex != g.dtype.is_complex:
            return False
        if not all(type(s) is int for s in (*out.shape, *g.shape)) or (batched and g.dim() == 0):
            return False
        if (g.shape[1:] if batched else g.shape) != out.shape:
            return False
    return True
