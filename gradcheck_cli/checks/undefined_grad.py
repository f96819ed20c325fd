"""The ``undefined_grad`` check: backward when some outputs' gradients are undefined (None).

Autograd leaves an output's gradient undefined when the loss does not use that output. A
Function's backward then gets zeros in its place (the default) or None (after
``ctx.set_materialize_grads(False)``). With several differentiable outputs, backward is run with
only output k's gradient defined, for each k (and, from three outputs on, with only output k's
undefined, as torch's check does): the gradients must equal those with explicit zero
grad_outputs in place of the undefined ones. With every output's gradient undefined they must
be undefined or zero (``torch.autograd.gradcheck(check_undefined_grad=True)``).

Gradients are made undefined as torch's check makes them (``UndefinedGrad`` on the output), so
the autograd engine calls backward exactly as in training, materialization included: calling
the graph node's ``apply`` directly would hand None even to Functions that get zeros.
A backward that raises on None is a failure with a message that says how to handle it.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch

from ..errors import guarded, user_frame
from ..numerics import engine, vjp
from ..results import CheckResult, ErrorKind, InputReport, Status
from ..rng import Stream, generator
from ..target import Target
from .base import CheckContext, graph_forward, probe_like
from .rows import agreement, fill, tolerance, zeros_if_none
from .verdict import begin, conclude, skip


def scenarios(n: int) -> list[frozenset[int]]:
    """Which of ``n`` differentiable outputs have a defined gradient, situation by situation."""
    every = frozenset(range(n))
    found = [frozenset([k]) for k in range(n)] if n > 1 else []
    if n > 2:
        found += [every - {k} for k in range(n)]
    return list(dict.fromkeys(found + [frozenset()]))  # the one with every gradient undefined last


def run(ctx: CheckContext) -> CheckResult:
    """The ``undefined_grad`` check of ``ctx.target`` on ``ctx.bound``."""
    target, bound, opts = ctx.target, ctx.bound, ctx.options
    start, rows, checked, result = begin(bound, "undefined_grad", "undefined")
    leaves, outputs, positions = graph_forward(target, bound)
    make_undefined = getattr(getattr(torch._C, "_functions", None), "UndefinedGrad", None)
    reason = ("no argument requires grad: nothing to check" if not checked else
              "no output requires grad: backward is never called" if not positions else
              None if make_undefined else "this version of torch cannot make an undefined gradient")
    if reason or make_undefined is None:
        return skip(result, reason or "", start)
    live, inputs = [outputs[p] for p in positions], [leaves[i] for i in checked]
    gen = generator(opts.seed, Stream.UNDEFINED_GRAD)
    probes = [probe_like(o, gen) for o in live]
    names = _grad_names(target, len(outputs))
    got: dict[int, list[torch.Tensor]] = {i: [] for i in checked}
    want: dict[int, list[torch.Tensor]] = {i: [] for i in checked}
    labels, problems = [], []
    crashes: dict[tuple[str, Optional[str]], list[list[int]]] = {}  # (exception type, where) -> its situations
    for defined in scenarios(len(live)):
        undefined = [positions[k] for k in range(len(live)) if k not in defined]
        grads = [probes[k] if k in defined else torch.zeros_like(o) for k, o in enumerate(live)]
        ref = zeros_if_none(guarded(ErrorKind.BACKWARD, "backward", vjp, live, inputs, [g.clone() for g in grads]),
                            inputs)
        marked = [o if k in defined else make_undefined()(o) for k, o in enumerate(live)]
        try:
            res = engine.grad(marked, inputs, [g.clone() for g in grads], retain_graph=True, allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - a backward that breaks on None is the finding
            key = (type(exc).__name__, user_frame(exc))
            if key not in crashes:
                problems.append(_crash(exc, undefined, names, len(live)))
            crashes.setdefault(key, []).append(undefined)
            continue
        labels.append(_situation(undefined, names, len(live)))
        for i, r, w in zip(checked, zeros_if_none(res, inputs), ref):
            got[i].append(r.detach().unsqueeze(0))
            want[i].append(w.detach().unsqueeze(0))
            if not defined and not bool((r == 0).all()):
                problems.append(_nonzero(bound.names[i], r))
                rows[i].status = Status.FAIL
    for i in checked:
        if not got[i]:
            rows[i].status, rows[i].reason = Status.SKIP, "not compared: backward raised (see the message)"
            continue
        atol, rtol = tolerance(bound.values[i].dtype, opts.tolerance.nondet_tol)
        fill(rows[i], agreement(torch.cat(got[i]), torch.cat(want[i]), atol, rtol), bound.values[i],
                 lambda r: labels[r])
        rows[i].reason = rows[i].reason or f"{len(labels)} situation(s) against explicit zero grad_outputs"
    problems += [f"backward also raised {kind} with the {', '.join(_situation(u, names, len(live)) for u in seen[1:])}"
                 for (kind, _), seen in crashes.items() if len(seen) > 1]
    return _finish(result, start, problems, labels)


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
    when = ("the gradients of every output are undefined (None)" if len(undefined) == n_live and n_live > 1 else
            f"the gradient of {_outputs(undefined, names)} is undefined (None)")
    return (f"backward raised {type(exc).__name__} when {when}{f' at {where}' if where else ''}: with "
            "ctx.set_materialize_grads(False) backward receives None for outputs that were not used; handle it "
            f"(e.g. `if {first or 'grad_output'} is not None:`) ({type(exc).__name__}: {str(exc)[:150]})")


def _nonzero(name: str, grad: torch.Tensor) -> str:
    size = float(grad.detach().abs().max()) if grad.numel() else 0.0
    return (f"with every output's gradient undefined, backward returned a nonzero gradient for '{name}' (max "
            f"|value| {size:.3g}): a gradient must be zero when grad_output is; a term that does not depend on "
            "grad_output (e.g. a penalty added in backward) belongs in forward or the loss")


def _finish(result: CheckResult, start: float, problems: list[str], labels: list[str]) -> CheckResult:
    """Status and message from the rows and the problems."""

    def wrong(r: InputReport) -> Optional[str]:
        if not r.mismatched:
            return None
        return (f"the gradient of '{r.name}' with the {r.worst_output} differs from the one with an explicit "
                f"zero gradient instead (max abs err {r.max_abs_err:.3g}): backward must treat an undefined "
                "(None) gradient as zero")

    def passed(right: list[InputReport]) -> str:
        partial = [label for label in labels if "every" not in label]
        message = "with every output's gradient undefined the gradients are zero"
        if partial:
            message = f"undefined grad_outputs give the gradients of explicit zeros ({'; '.join(partial)}); " + message
        return message

    return conclude(result, start, problems, wrong, passed, name_right=False)
