"""Backward differentiated again and again: the function whose derivative a check of order N compares
with finite differences (the spec's ``order:``, read by ``double_backward`` and ``forward_over_reverse``).

With G1(x..., v1...) = backward (the gradients of the checked arguments for grad_outputs v1), order 2
checks G1's derivative. Order N checks the derivative of G(N-1), where

    G(k)(values..., w...) = the gradients of <w, G(k-1)(values...)> with respect to every value G(k-1)'s
                            derivative is taken in (the checked arguments and all grad_outputs so far)

so the N-th derivative of forward is reached by N-1 backwards (as ``gradgradcheck`` of a vjp checks the
third, and JAX's ``check_grads(order=N)`` the N-th): each level's grad_outputs ``w`` are random, shaped as
the gradients G(k-1) returns, and are arguments of G(k) that finite differences move too. The leaves each
level makes keep a dual number's tangent (``forward_over_reverse`` pushes G(N-1) forward)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.autograd.forward_ad as fwAD

from ...numerics import engine
from ...numerics.realify import strided
from ...results import CheckResult, ErrorKind, Status
from ...sandbox.errors import guarded
from .base import CheckContext, probe_like

G = Callable[..., tuple[Any, ...]]  # (values..., grad_outputs...), create_graph= -> gradients
FULL_BITS = 0.7853981633974483  # pi / 4: probes with 53 significant bits (see double_backward)


@dataclass(frozen=True)
class Settings:
    """The spec's ``order:`` (``x-check: double_backward`` in the schema; forward_over_reverse reads it too)."""

    order: int = 2  # the order of the derivative checked: 2 is backward's derivative

    @classmethod
    def of(cls, ctx: CheckContext) -> Settings:
        given = ctx.settings.get("order")
        return cls() if given is None else cls(order=given)


def ordinal(n: int) -> str:
    """2 -> '2nd', 3 -> '3rd', 11 -> '11th'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def every_order(ctx: CheckContext, one: Callable[[int], CheckResult]) -> CheckResult:
    """The check of order ``order:``, as JAX's check_grads(order=N) checks it: every order from 2 up, each
    on its own (``one(k)``), stopping at the first that does not pass (a wrong derivative of a lower order
    can make a higher one agree with itself: a backward computed outside autograd has a zero derivative of
    every order, whose finite differences are zero too). The result is the last order's, with the warnings
    and the time of all."""
    order = Settings.of(ctx).order
    warnings: list[str] = []
    spent = 0.0
    for k in range(2, order + 1):
        result = one(k)
        spent += result.duration_s
        warnings += [w for w in result.warnings if w not in warnings]
        if result.status is not Status.PASS or k == order:
            if k < order:
                rest = f"order {order} was" if k + 1 == order else f"orders {k + 1} to {order} were"
                result.message += f" (at order {k}; {rest} not checked)"
            result.warnings, result.duration_s = warnings, spent
            return result
    raise AssertionError("order is at least 2")  # pragma: no cover


def times(order: int) -> str:
    """' 2 times' where backward is differentiated more than once (order 3 and up), else nothing."""
    return f" {order - 1} times" if order > 2 else ""


def reversed_(order: int) -> str:
    """What forward mode pushes forward at order ``order``: backward, differentiated ``order - 2`` times by
    reverse mode."""
    if order == 2:
        return "backward"
    count = {3: "once", 4: "twice"}.get(order, f"{order - 2} times")
    return f"backward differentiated {count} by reverse mode"


@dataclass
class Tower:
    """The grad_outputs of levels 2 and up (``probes``, their rows named ``names``), the positions in
    (values..., grad_outputs of every level...) of what G(order-1)'s derivative is taken in (``moved``) and
    of what its outputs are the gradients of (``of``), and each level's lift (``steps``: its ``wrt`` and
    ``width``)."""

    probes: list[torch.Tensor]
    names: list[str]
    moved: list[int]
    of: list[int]
    steps: list[tuple[list[int], int]]

    def over(self, first: G) -> G:
        """G(order-1) from G1 = ``first`` (backward, or backward on dual numbers)."""
        g = first
        for wrt, width in self.steps:
            g = lift(g, wrt, width)
        return g


def leaves(values: list[Any], wrt: list[int]) -> list[Any]:
    """``values`` with those at ``wrt`` that do not require grad made leaves that do, a dual number keeping
    its tangent (detach() would drop it); aliases (same_as) stay aliased."""
    args = list(values)
    for i in wrt:
        if not args[i].requires_grad:
            primal, tangent = fwAD.unpack_dual(values[i])
            leaf = primal.detach().requires_grad_(True)
            dual = fwAD.make_dual(leaf, tangent) if tangent is not None else leaf
            args = [dual if a is values[i] else a for a in args]
    return args


def lift(inner: G, wrt: list[int], width: int, kind: ErrorKind = ErrorKind.BACKWARD) -> G:
    """G(k) from G(k-1) = ``inner``, which returns ``width`` gradients: the gradients of <w, inner(values)>
    with respect to ``values[wrt]``, for the ``width`` grad_outputs ``w`` that follow the values. Gradients it
    leaves out (an output that does not depend on a value) are zeros."""

    def call(values: list[Any], create_graph: bool = False) -> tuple[Any, ...]:
        m = len(values) - width
        args = leaves(values[:m], wrt)
        with torch.enable_grad():
            outs = inner(args, create_graph=True)
            live = [k for k, o in enumerate(outs) if o.requires_grad]
            grads: Any = [None] * len(wrt)
            if live:
                grads = guarded(
                    kind,
                    "backward",
                    engine.grad,
                    [outs[k] for k in live],
                    [args[i] for i in wrt],
                    [values[m + k] for k in live],
                    create_graph=create_graph,
                    allow_unused=True,
                )
        return tuple(strided(g) if g is not None else torch.zeros_like(args[i]) for g, i in zip(grads, wrt))

    return call


def build(values: list[Any], names: list[str], checked: list[int], n: int, order: int, gen: Any) -> Tower:
    """The tower of order ``order`` over G1, whose values are the ``n`` arguments and the grad_outputs after
    them (``values``, named ``names`` as their rows are); the grad_outputs of levels 2 and up are drawn from
    ``gen`` (none at order 2, so order 2 draws what it always drew)."""
    of = list(checked)
    moved = list(checked) + list(range(n, len(values)))
    values, names = list(values), list(names)
    probes: list[torch.Tensor] = []
    labels: list[str] = []
    steps: list[tuple[list[int], int]] = []
    for k in range(2, order):
        ws = [probe_like(values[j], gen) * FULL_BITS for j in of]
        called = [f"grad_output of backward {k} for {_grouped(names[j])}" for j in of]
        steps.append((moved, len(of)))
        of, moved = moved, moved + list(range(len(values), len(values) + len(ws)))
        values, names, probes, labels = values + ws, names + called, probes + ws, labels + called
    return Tower(probes, labels, moved, of, steps)


def _grouped(name: str) -> str:
    """A row's name as part of another's: in parentheses where it is itself a grad_output of a backward."""
    return f"({name})" if " of backward " in name else name
