"""Whose difference the compile check found: the Function's, or torch.compile's on one call path.

The check compares two compiled paths with eager ``autograd.grad``: ``backward`` (the compiled callable,
differentiated with ``autograd.grad``: what ``loss.backward()`` of a compiled model runs) and
``torch.func.vjp`` compiled whole. An argument's difference is torch.compile's, not the Function's, when

- only the compiled ``torch.func.vjp`` differs: compiled ``autograd.grad`` agrees with eager, so the
  Function's backward is right under torch.compile, and
- eager ``torch.func.vjp`` agrees with eager ``autograd.grad``, so it is right under torch.func.

Each path alone is right; composing them is not: that is torch.compile's divergence on that path. Where
the compiled vjp also equals the gradient of forward's own operations (forward called without ``apply``,
differentiated by autograd), torch.compile dropped the custom backward: PyTorch issue 193279 (torch 2.13).
The check still fails (users who compile a torch.func transform get that gradient); its words say whose
it is, the ``expect:`` entry that keeps the check green while torch has it, and how to avoid it.

A Function whose own backward differs under compile (a branch on ``torch.compiler.is_compiling()``, state
that tracing does not see) fails on the compiled ``autograd.grad`` path: it stays the Function's.

For the next contributor: the rule must only exonerate the Function when both single paths agree with
eager; a new compiled path gets its own condition, never a looser one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Optional

import torch

from ...core.tolerance import ReferenceRule
from ...results import InputReport, Status
from ...sandbox.errors import UserCodeError
from ...subject.binding import Bound
from ...subject.target import Target
from .base import call_forward, fresh_leaves
from .sides import compare

VJP = "torch.func.vjp"
ISSUE = "PyTorch issue 193279"
OWN = (
    "compiled autograd.grad (what loss.backward() of a compiled model runs) differs from eager: the target's own "
    "code computes otherwise when torch.compile traces it; look for a branch on torch.compiler.is_compiling() or "
    "Python state that tracing reads once"
)
_PLAIN = re.compile(r"[A-Za-z_]\w*")  # a name YAML takes unquoted as a key


def agrees(got: torch.Tensor, want: torch.Tensor, row: InputReport, rule: ReferenceRule) -> bool:
    """Whether ``got`` is ``want`` within ``rule`` (a scratch row like ``row`` is filled)."""
    trial = InputReport(row.index, row.name, list(row.shape), row.dtype, Status.PASS)
    compare(trial, got, want, None, rule, "gradient")
    return trial.status is Status.PASS


def own_operations(
    target: Target, bound: Bound, checked: list[int], positions: list[int], probes: dict[int, torch.Tensor]
) -> Optional[list[torch.Tensor]]:
    """The gradients of forward's own operations (a Function's forward called without ``apply``, so
    autograd differentiates what it computes and its backward is not used), for the same grad_outputs;
    None where that cannot be computed (not a Function, or forward needs its ctx)."""
    if not target.is_function:
        return None
    leaves = fresh_leaves(bound.values)
    try:
        with torch.enable_grad():
            outs = call_forward(_Body(target), bound, leaves, what="forward (without apply)")
    except UserCodeError:
        return None
    outs = outs if isinstance(outs, tuple) else (outs,)
    pairs = [
        (outs[p], probes[p])
        for p in positions
        if p < len(outs) and isinstance(outs[p], torch.Tensor) and outs[p].requires_grad
    ]
    xs = [leaves[i] for i in checked]
    if not pairs:
        return [torch.zeros_like(x) for x in xs]
    grads: Any
    try:
        grads = torch.autograd.grad([o for o, _ in pairs], xs, [g for _, g in pairs], allow_unused=True)
    except RuntimeError:  # an operation autograd cannot differentiate: no such gradient to compare
        return None
    return [torch.zeros_like(x) if g is None else g.detach() for g, x in zip(grads, xs)]


class _Body(Target):
    """A Function's forward called without ``apply`` (``Target.body``): its operations are recorded."""

    def __init__(self, of: Target) -> None:
        super().__init__(of.path, of.obj, False)
        self.of = of

    def call(self, values: Sequence[Any], n_positional: int, kw_names: list[str]) -> Any:
        return self.of.body(values)


def divergence(rows: list[InputReport], dropped: bool, backend: str) -> str:
    """The words of a difference that only compiled ``torch.func.vjp`` shows, for these argument ``rows``
    (``dropped``: its gradient is that of forward's own operations): whose it is, how to keep it, how to
    avoid it."""
    names = ", ".join(r.name if r.name.startswith("grad_output") else f"'{r.name}'" for r in rows)
    how = (
        f"it is the gradient of forward's own operations, as if the Function had no backward: torch.compile "
        f"dropped the custom backward on that path ({ISSUE}, torch 2.13)"
        if dropped
        else "torch.compile computes that composition differently"
    )
    reason = (
        f"torch.compile drops the custom backward under torch.func.vjp ({ISSUE})"
        if dropped
        else "torch.compile differs from eager under torch.func.vjp"
    )
    entries = ", ".join(f"{_key(r.name)}: {r.pattern.value if r.pattern else 'fail'}" for r in rows)
    return (
        f"for {names} this is torch.compile's divergence on the {VJP} path, not the Function's: compiled "
        f"autograd.grad (what loss.backward() of a compiled model runs, backend {backend!r}) and eager {VJP} "
        f"both agree with eager autograd.grad, only torch.compile({VJP}(...)) (and torch.compile("
        f"torch.func.grad(...))) differs; {how}. To keep the check while torch has it, add to the spec "
        f'`expect: {{reason: "{reason}", checks: [compile], {entries}}}` (an xfail, exit 0, that fails once '
        "torch fixes it); to avoid it, differentiate the compiled call with autograd.grad or loss.backward(), "
        "take the torch.func transform outside torch.compile (torch.func.grad(torch.compile(f))), or call "
        "the Function through torch.compiler.disable"
    )


def _key(name: str) -> str:
    """``name`` as a YAML key of ``expect:`` (quoted where it is not a plain name: ``'xs[1]'``)."""
    return name if _PLAIN.fullmatch(name) else "'" + name.replace("'", "''") + "'"
