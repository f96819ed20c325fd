"""The fast decision: v^T J u for a few random probes, analytical against numerical.

Per checked argument and probe: u is a unit random direction in that argument, v a unit random
weighting of the outputs. Analytically v^T J u = <J^T v, u> (one backward per probe serves
every argument); numerically v^T (f(x + eps u) - f(x - eps u)) / 2 eps (two forwards). The
first probe is non-negative, as torch's fast mode's, so that errors of one sign (a constant
offset, a missing term) add up; the others are signed Gaussian, so that errors of both signs
(a transpose, a roll, one wrong element) cannot cancel. One probe per argument keeps a small
argument's error from drowning in a large one's tolerance.

A probe only decides "pass": one that fails sends the check to the element-by-element
comparison, which gives the verdict. So the tolerance can be tight: atol |u|_2 |v|_2 + rtol |n|
(atol + rtol |n| for unit probes), where torch's fast mode inflates atol by (sum u)(sum v),
about sqrt(N M), and lets wrong gradients pass. Pure torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .numerics import Call, Vjp, as_tuple, gaussian, outputs_vector, probe_generator, real_flat, real_numel, vjp


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
    """``count`` unit Gaussian directions in R^n, one per row."""
    u = gaussian((count, n), gen)
    return u / torch.linalg.vector_norm(u, dim=1, keepdim=True) if n else u


def decide(
    call: Call, outputs: tuple, positions: list[int], grad_inputs: list[torch.Tensor],
    plain_values: list[Any], plain_inputs: list[torch.Tensor], *, eps: float, atol: float, rtol: float,
    probes: int, seed: int, grad: Vjp = vjp,
) -> list[ProbeStats]:
    """Probe every argument ``probes`` times: |a - n| <= atol + rtol |n| for each (unit u and v)."""
    gen = probe_generator(seed, 3)
    diff_outputs = [outputs[p] for p in positions]
    live = [o for o in diff_outputs if o.requires_grad]
    n_rows = sum(real_numel(o) for o in diff_outputs)
    stats = [ProbeStats() for _ in plain_inputs]
    vs = _units(probes, n_rows, gen)
    us = [_units(probes, real_numel(x), gen) for x in plain_inputs]
    for w in (vs, *us):  # the first probe is non-negative, as torch's: errors of one sign add up in it
        w[0].abs_()
    for p, v in enumerate(vs):
        grad_outs, k = [], 0
        for o in diff_outputs:
            g = torch.zeros_like(o, memory_format=torch.contiguous_format)
            real_flat(g).copy_(v[k : k + real_numel(o)])
            grad_outs.append(g)
            k += real_numel(o)
        grads: Sequence[Any] = grad(live, grad_inputs, [g for g, o in zip(grad_outs, diff_outputs) if o.requires_grad]
                                    ) if live else [None] * len(grad_inputs)
        for x, g, s, u in zip(plain_inputs, grads, stats, us):
            a = float(real_flat(g.contiguous()).to(torch.float64) @ u[p]) if g is not None else 0.0
            n = _directional(call, plain_values, x, u[p], eps, positions, v) if n_rows else 0.0
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


def _directional(call: Call, values: list[Any], x: torch.Tensor, u: torch.Tensor, eps: float,
                 positions: list[int], v: torch.Tensor) -> float:
    """v^T (f(x + eps u) - f(x - eps u)) / 2 eps over the realified outputs; ``x`` is perturbed in
    place and restored."""
    real = torch.view_as_real(x) if x.is_complex() else x
    step = (eps * u).view(real.shape).to(real.dtype)
    orig = real.clone()
    with torch.no_grad():
        torch.sub(orig, step, out=real)
        minus = _weighted(as_tuple(call(values)), positions, v)
        torch.add(orig, step, out=real)
        plus = _weighted(as_tuple(call(values)), positions, v)
        real.copy_(orig)
    return (plus - minus) / (2 * eps)


def _weighted(outputs: tuple, positions: list[int], v: torch.Tensor) -> float:
    """v^T (the realified outputs at ``positions``)."""
    if len(positions) == 1:
        o = outputs[positions[0]]
        return float(v @ (torch.view_as_real(o) if o.is_complex() else o).reshape(-1).to(torch.float64))
    return float(v @ outputs_vector(outputs, positions))
