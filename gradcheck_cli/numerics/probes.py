"""The fast decision: v^T J u for a few random probes, analytical against numerical.

Per checked argument and probe: u is a unit random direction in that argument, v a unit random
weighting of the outputs. Analytically v^T J u = <J^T v, u> (one backward per probe serves
every argument); numerically v^T (f(x + eps u) - f(x - eps u)) / 2 eps (two forwards). The
first probe is non-negative, as torch's fast mode's, so that errors of one sign (a constant
offset, a missing term) add up; the others are signed (see ``signed_uniform``), so that errors of both signs
(a transpose, a roll, one wrong element) cannot cancel. One probe per argument keeps a small
argument's error from drowning in a large one's tolerance.

Where a batched forward is given (see ``columns``), the 2 x arguments x probes perturbed
forwards are one vmapped call (several if they do not fit in BATCH_BYTES, or in a stage's share of
the memory budget: see ``batching``), each used when one
of its rows gives a single call's difference quotient. Backward's contract has already called backward
with one signed random grad_output; where autograd would pass its return on unchanged, that
call is one of the probes.

A probe only decides "pass": one that fails sends the check to the element-by-element
comparison, which gives the verdict. So the tolerance can be tight: atol |u|_2 |v|_2 + rtol |n|
(atol + rtol |n| for unit probes), where torch's fast mode inflates atol by (sum u)(sum v),
about sqrt(N M), and lets wrong gradients pass. Pure torch, no I/O.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ..rng import Stream, generator, signed_uniform
from .batching import (
    BATCH_BYTES,
    Batches,
    argument_groups,
    copies,
    same,
    stage_budget,
    try_batched,
    vmapped,
)
from .differences import Step, call_moved
from .realify import Call, Vjp, as_tuple, outputs_vector, real_flat, real_numel, vjp


@dataclass
class ProbeStats:
    """How the probes of one argument went."""

    probes: int = 0
    failed: int = 0
    max_abs: float = 0.0
    analytical: float = 0.0  # at the probe furthest out of tolerance
    numerical: float = 0.0
    worst_excess: float = -1.0


def _units(count: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` unit random directions in R^n, one per row."""
    u = signed_uniform((count, n), gen)
    return u / torch.linalg.vector_norm(u, dim=1, keepdim=True) if n else u


def decide(
    call: Call, outputs: tuple[Any, ...], positions: list[int], grad_inputs: list[torch.Tensor],
    plain_values: list[Any], plain_inputs: list[torch.Tensor], *, eps: float, atol: float, rtol: float,
    probes: int, seed: int, grad: Vjp = vjp, batched: Call | None = None,
    given: tuple[list[Any], list[Any]] | None = None, at_x: bool = False, memory_bytes: int = BATCH_BYTES * 8,
) -> list[ProbeStats]:
    """Probe every argument ``probes`` times: |a - n| <= atol + rtol |n| for each (unit u and v).
    ``batched``: the same forward as ``call``, in a form torch.func.vmap may batch. ``given``: one
    signed probe's backward already called, (g for every output, J^T g for every argument in
    ``grad_inputs``, as autograd gives it): it is the last probe (v = g / |g|), and saves a backward.
    ``at_x``: ``outputs`` are what ``call`` gives for ``plain_values`` (not taken in another dtype).
    ``memory_bytes``: the memory budget, of which one vmapped forward takes at most a stage's share."""
    gen = generator(seed, Stream.PROBES)
    diff_outputs = [outputs[p] for p in positions]
    live = [o for o in diff_outputs if o.requires_grad]
    n_rows = sum(real_numel(o) for o in diff_outputs)
    stats = [ProbeStats() for _ in plain_inputs]
    reuse = given if probes > 1 and n_rows > 0 and len(live) == len(diff_outputs) else None
    reused = reuse is not None
    vs = _units(probes - reused, n_rows, gen)
    us = [_units(probes, real_numel(x), gen) for x in plain_inputs]
    for w in (vs, *us):  # the first probe is non-negative, as torch's: errors of one sign add up in it
        w[0].abs_()
    norm = torch.ones(())
    if reuse is not None:
        g = torch.cat([real_flat(reuse[0][p].contiguous()).to("cpu", torch.float64) for p in positions])
        norm = torch.linalg.vector_norm(g)
        vs = torch.cat([vs, (g / norm).view(1, -1)])
    centre = outputs_vector(outputs, positions).cpu().view(1, -1) if at_x else None
    numerical = (_numerical(call, batched, plain_values, plain_inputs, us, eps, positions, vs, centre,
                            stage_budget(memory_bytes, BATCH_BYTES)) if n_rows
                 else torch.zeros(len(plain_inputs), probes, dtype=torch.float64))
    grads: Sequence[Any]
    for p, v in enumerate(vs):
        if reuse is not None and p == probes - 1:
            grads, scale = reuse[1], 1 / float(norm)
        else:
            grads, scale = _backward(grad, diff_outputs, live, grad_inputs, v), 1.0
        for g, s, u, n_row in zip(grads, stats, us, numerical):
            a = scale * float(real_flat(g.contiguous()).to("cpu", torch.float64) @ u[p]) if g is not None else 0.0
            n = float(n_row[p])
            tol = atol + rtol * abs(n)  # atol |u|_2 |v|_2 for unit probes: a failure only costs an escalation
            err = abs(a - n)
            s.probes += 1
            s.max_abs = max(s.max_abs, err)
            if not err <= tol:  # NaN fails too
                s.failed += 1
            excess = err / tol if tol else (float("inf") if err else 0.0)
            if excess > s.worst_excess:
                s.worst_excess, s.analytical, s.numerical = excess, a, n
    return stats


def _backward(grad: Vjp, diff_outputs: list[torch.Tensor], live: list[torch.Tensor],
              grad_inputs: list[torch.Tensor], v: torch.Tensor) -> Sequence[Any]:
    """J^T v for the realified outputs weighted by ``v``: one backward (None where an argument is unused)."""
    if not live:
        return [None] * len(grad_inputs)
    grad_outs, k = [], 0
    for o in diff_outputs:
        g = torch.zeros_like(o, memory_format=torch.contiguous_format)
        real_flat(g).copy_(v[k : k + real_numel(o)])
        grad_outs.append(g)
        k += real_numel(o)
    return grad(live, grad_inputs, [g for g, o in zip(grad_outs, diff_outputs) if o.requires_grad])


def _numerical(call: Call, batched: Call | None, values: list[Any], inputs: list[torch.Tensor],
               us: list[torch.Tensor], eps: float, positions: list[int], vs: torch.Tensor,
               centre: torch.Tensor | None = None, budget: int | None = None) -> torch.Tensor:
    """v_p^T (f(x_i + eps u_ip) - f(x_i - eps u_ip)) / 2 eps for every argument i and probe p
    (arguments x probes): one vmapped forward per group of arguments where ``batched`` gives the
    single calls' outputs (checked on every group, see ``_agrees``; ``centre``: the outputs at x,
    as one row, if known; each group's batch within ``budget`` bytes, default BATCH_BYTES), else two
    forwards each."""
    out = torch.empty(len(inputs), len(vs), dtype=torch.float64)
    todo = set(range(len(inputs)))

    def agrees(group: list[int], got: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """The batch of ``group`` gives a single call's numbers (see ``_agrees``)."""
        nonlocal centre
        if centre is None:
            with torch.no_grad():
                centre = outputs_vector(as_tuple(call(values)), positions).cpu().view(1, -1)
        x, u = inputs[group[0]], us[group[0]][0]
        return _agrees(got[1], len(vs), centre, _perturbed(call, values, x, eps * u, positions), eps)

    if batched is not None:  # arguments batched in groups, each group verified, until one is not
        for group in argument_groups(inputs, len(vs), len(vs[0]), BATCH_BYTES if budget is None else budget):
            batch = partial(_all_at_once, batched, values, [inputs[i] for i in group], [us[i] for i in group], eps,
                            positions, vs)
            got, _ = try_batched(None, batch, partial(agrees, group))
            if got is None:
                break
            out[group] = got[0]
            todo -= set(group)
    for i in sorted(todo):
        for p, v in enumerate(vs):
            minus = _perturbed(call, values, inputs[i], -eps * us[i][p], positions)
            out[i, p] = v @ (_perturbed(call, values, inputs[i], eps * us[i][p], positions) - minus) / (2 * eps)
    return out


def _agrees(rows: torch.Tensor, n_probes: int, centre: torch.Tensor, plus: torch.Tensor, eps: float) -> bool:
    """The batch's ``rows`` (see ``_all_at_once``) give the single call's outputs at x + eps u for
    their first argument's first probe (``plus``), compared as difference quotients from the
    outputs at x (``centre``): a perturbation that the batch dropped shows there (the outputs
    themselves move by only eps), as does any other difference."""
    return same((rows[n_probes] - centre[0]) / eps, (plus - centre[0]) / eps)


def _all_at_once(batched: Call, values: list[Any], inputs: list[torch.Tensor], us: list[torch.Tensor],
                 eps: float, positions: list[int], vs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_numerical`` of ``inputs`` from one vmapped forward, and the forward's rows: row
    (2 P i + p) perturbs argument i by -eps u_ip, row (2 P i + P + p) by +eps u_ip, every other
    argument as it is."""
    n_probes, rows = len(vs), 2 * len(inputs) * len(vs)
    batches: Batches = {}
    for i, x in enumerate(inputs):
        batch = copies(batches, x, rows)
        at, step = 2 * n_probes * i, eps * us[i].to(batch)
        batch[at : at + n_probes] -= step
        batch[at + n_probes : at + 2 * n_probes] += step
    flat = vmapped(batched, values, batches, positions).cpu()  # probes are reduced on the CPU
    pairs = flat[:rows].view(len(inputs), 2, n_probes, -1)
    return torch.linalg.vecdot(pairs[:, 1] - pairs[:, 0], vs) / (2 * eps), flat


def _perturbed(call: Call, values: list[Any], x: torch.Tensor, step: torch.Tensor,
               positions: list[int]) -> torch.Tensor:
    """The realified outputs (a copy) of one single call with ``x`` moved by ``step`` in place, then restored."""
    # a copy, made before x is put back: an output may be a view of x
    return call_moved(call, values, Step(x, step), lambda outputs: outputs_vector(outputs, positions).cpu())
