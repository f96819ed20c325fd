"""Backward given undefined (None) grad_outputs: the situations of ``scenarios`` (only output k's gradient
defined, for each k; from three outputs on, only output k's undefined; then every one undefined), backward's
gradients in each against those with explicit zeros in place of the undefined ones, and what they show wrong.

Gradients are made undefined as torch's check makes them (``UndefinedGrad`` on the output), so the autograd
engine calls backward exactly as in training, materialization included. Read by the ``undefined_grad`` check
and by backward's contract (``contract``), each on its own graph.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ...core.tolerance import same
from ...numerics import engine, vjp
from ...numerics.realify import strided
from ...numerics.streams import Streams
from ...results import ErrorKind
from ...sandbox.errors import guarded, user_frame
from ...subject.target import Target
from .argument_rows import agreement, mismatched, zeros_if_none
from .base import probe_like

STREAM = 21  # the random stream of undefined_grad's grad_outputs (a seed replays it)


def scenarios(n: int) -> list[frozenset[int]]:
    """Which of ``n`` differentiable outputs have a defined gradient, situation by situation."""
    every = frozenset(range(n))
    found = [frozenset([k]) for k in range(n)] if n > 1 else []
    if n > 2:
        found += [every - {k} for k in range(n)]
    return list(dict.fromkeys(found + [frozenset()]))  # the one with every gradient undefined last


@dataclass
class Situations:
    """Backward's gradients in each situation (``labels``), per argument: with the undefined gradients
    (``got``) and with explicit zeros in their place (``want``), a leading index per situation; what
    else was wrong (``problems``: a raise, a nonzero gradient), and the arguments with a nonzero gradient
    when every output's gradient is undefined."""

    labels: list[str]
    got: dict[int, list[torch.Tensor]]
    want: dict[int, list[torch.Tensor]]
    problems: list[str] = field(default_factory=list)
    nonzero: set[int] = field(default_factory=set)


def situations(
    target: Target,
    arg_names: list[str],
    leaves: list[Any],
    outputs: tuple[Any, ...],
    positions: list[int],
    checked: list[int],
    streams: Streams,
    nondet_tol: float = 0.0,
) -> Optional[Situations]:
    """Backward through the graph of ``outputs`` (forward on ``leaves``, named ``arg_names``; the graph is
    kept) in each of ``scenarios``, for the arguments at ``checked``; None where torch cannot make an
    undefined gradient. With every output's gradient undefined, a gradient must be zero (within
    ``nondet_tol``, the nondeterminism the spec allows)."""
    undefine = make_undefined()
    if undefine is None or not positions or not checked:
        return None
    live, inputs = [outputs[p] for p in positions], [leaves[i] for i in checked]
    gen = streams.generator(STREAM)
    probes = [probe_like(o, gen) for o in live]
    names = _grad_names(target, len(outputs))
    seen = Situations([], {i: [] for i in checked}, {i: [] for i in checked})
    crashes: dict[tuple[str, Optional[str]], list[list[int]]] = {}  # (exception type, where) -> its situations
    for defined in scenarios(len(live)):
        undefined = [positions[k] for k in range(len(live)) if k not in defined]
        grads = [probes[k] if k in defined else torch.zeros_like(o) for k, o in enumerate(live)]
        marked = [o if k in defined else undefine()(o) for k, o in enumerate(live)]
        try:
            res = engine.grad(marked, inputs, [g.clone() for g in grads], retain_graph=True, allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - a backward that breaks on None is the finding
            # unless it breaks with explicit zeros as well: then backward itself is broken (an error, or its
            # contract's fail, as every check says it), not its handling of None
            guarded(ErrorKind.BACKWARD, "backward", vjp, live, inputs, [g.clone() for g in grads])
            key = (type(exc).__name__, user_frame(exc))
            if key not in crashes:
                seen.problems.append(_crash(exc, undefined, names, len(live)))
            crashes.setdefault(key, []).append(undefined)
            continue
        ref = zeros_if_none(
            guarded(ErrorKind.BACKWARD, "backward", vjp, live, inputs, [g.clone() for g in grads]), inputs
        )
        seen.labels.append(_situation(undefined, names, len(live)))
        for i, r, w in zip(checked, zeros_if_none([strided(g) if g is not None else g for g in res], inputs), ref):
            seen.got[i].append(r.detach().unsqueeze(0))
            seen.want[i].append(w.detach().unsqueeze(0))
            if not defined and not bool((r.abs() <= nondet_tol).all()):
                seen.problems.append(_nonzero(arg_names[i], r))
                seen.nonzero.add(i)
    seen.problems += [
        f"backward also raised {kind} with the {', '.join(_situation(u, names, len(live)) for u in more[1:])}"
        for (kind, _), more in crashes.items()
        if len(more) > 1
    ]
    return seen


def findings(
    seen: Situations, arg_names: list[str], values: list[Any], nondet_tol: float
) -> tuple[list[str], set[int]]:
    """What ``seen`` shows wrong, as the backward check says it: the messages, and the arguments whose
    gradient is wrong (a nonzero gradient with every output's gradient undefined, or one that differs from
    that of explicit zeros)."""
    problems, bad = list(seen.problems), set(seen.nonzero)
    for i, got in seen.got.items():
        if not got:
            continue
        entry = agreement(torch.cat(got), torch.cat(seen.want[i]), same(values[i].dtype, nondet_tol))
        if mismatched(entry, values[i]):
            problems.append(differs(arg_names[i], seen.labels[entry.worst_row], entry.max_abs))
            bad.add(i)
    return problems, bad


def make_undefined() -> Optional[Callable[[], Any]]:
    """torch's ``UndefinedGrad`` (applied to an output, it makes the output's gradient undefined), if it has one."""
    return getattr(getattr(torch._C, "_functions", None), "UndefinedGrad", None)


def differs(name: str, situation: str, max_abs: float) -> str:
    return (
        f"the gradient of '{name}' with the {situation} differs from the one with an explicit zero gradient "
        f"instead (max abs err {max_abs:.3g}): backward must treat an undefined (None) gradient as zero"
    )


def _grad_names(target: Target, n: int) -> list[Optional[str]]:
    """backward's parameter name for each output's gradient, where its signature says."""
    try:
        params = list(inspect.signature(target.obj.backward).parameters.values())[1:] if target.is_function else []
    except (TypeError, ValueError):
        params = []
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [named[p] if p < len(named) else None for p in range(n)]


def _outputs(undefined: list[int], names: list[Optional[str]]) -> str:
    quoted = [repr(names[p]) for p in undefined if names[p]]
    which = ", ".join(map(str, undefined))
    return f"output{'s' * (len(undefined) > 1)} {which}" + (f" ({', '.join(quoted)})" if quoted else "")


def _situation(undefined: list[int], names: list[Optional[str]], n_live: int) -> str:
    if len(undefined) == n_live:
        return "gradients of every output undefined"
    return f"gradient of {_outputs(undefined, names)} undefined"


def _crash(exc: BaseException, undefined: list[int], names: list[Optional[str]], n_live: int) -> str:
    """What a backward that raised with undefined gradients should do instead."""
    where = user_frame(exc)
    first = next((names[p] for p in undefined if names[p]), None)
    when = (
        "the gradients of every output are undefined (None)"
        if len(undefined) == n_live and n_live > 1
        else f"the gradient of {_outputs(undefined, names)} is undefined (None)"
    )
    return (
        f"backward raised {type(exc).__name__} when {when}{f' at {where}' if where else ''}: with "
        "ctx.set_materialize_grads(False) backward receives None for outputs that were not used; handle it "
        f"(e.g. `if {first or 'grad_output'} is not None:`) ({type(exc).__name__}: {str(exc)[:150]})"
    )


def _nonzero(name: str, grad: torch.Tensor) -> str:
    size = float(grad.detach().abs().max()) if grad.numel() else 0.0
    return (
        f"with every output's gradient undefined, backward returned a nonzero gradient for '{name}' (max "
        f"|value| {size:.3g}): a gradient must be zero when grad_output is; a term that does not depend on "
        "grad_output (e.g. a penalty added in backward) belongs in forward or the loss"
    )
