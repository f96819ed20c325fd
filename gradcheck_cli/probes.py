"""The fast decision: v^T J u for a few signed random probes, analytical against numerical.

Per checked argument and probe: u is a unit Gaussian direction in that argument, v a unit
Gaussian weighting of the outputs. Analytically v^T J u = <J^T v, u> (one backward per probe
serves every argument); numerically v^T (f(x + eps u) - f(x - eps u)) / 2 eps (two forwards).
Signed probes, unlike torch's non-negative fast-mode probe, do not let errors of opposite sign
cancel, and one probe per argument keeps a small argument's error from drowning in a large
one's tolerance. A probe that fails sends the check to the element-by-element comparison.
Pure torch, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .numerics import Call, Vjp, as_tuple, outputs_vector, probe_generator, real_flat, real_numel, vjp


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
    u = torch.randn(count, n, generator=gen, dtype=torch.float64)
    return u / torch.linalg.vector_norm(u, dim=1, keepdim=True) if n else u


def decide(
    call: Call, outputs: tuple, positions: list[int], grad_inputs: list[torch.Tensor],
    plain_values: list[Any], plain_inputs: list[torch.Tensor], *, eps: float, atol: float, rtol: float,
    probes: int, seed: int, grad: Vjp = vjp,
) -> list[ProbeStats]:
    """Probe every argument ``probes`` times; the tolerance is torch's, summed along the probes:
    |a - n| <= atol * |u|_1 |v|_1 + rtol * |n|."""
    gen = probe_generator(seed, 3)
    diff_outputs = [outputs[p] for p in positions]
    live = [o for o in diff_outputs if o.requires_grad]
    n_rows = sum(real_numel(o) for o in diff_outputs)
    stats = [ProbeStats() for _ in plain_inputs]
    vs = _units(probes, n_rows, gen)
    us = [_units(probes, real_numel(x), gen) for x in plain_inputs]
    scale = [(atol * u.abs().sum(1) * vs.abs().sum(1)).tolist() for u in us]  # atol |u|_1 |v|_1 per probe
    for p, v in enumerate(vs):
        grad_outs, k = [], 0
        for o in diff_outputs:
            g = torch.zeros_like(o, memory_format=torch.contiguous_format)
            real_flat(g).copy_(v[k : k + real_numel(o)])
            grad_outs.append(g)
            k += real_numel(o)
        grads: Sequence[Any] = grad(live, grad_inputs, [g for g, o in zip(grad_outs, diff_outputs) if o.requires_grad]
                                    ) if live else [None] * len(grad_inputs)
        for x, g, s, u, tols in zip(plain_inputs, grads, stats, us, scale):
            a = float(real_flat(g.contiguous()).to(torch.float64) @ u[p]) if g is not None else 0.0
            n = float(v @ _directional(call, plain_values, x, u[p], eps, positions)) if n_rows else 0.0
            tol = tols[p] + rtol * abs(n)
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
                 positions: list[int]) -> torch.Tensor:
    """(f(x + eps u) - f(x - eps u)) / 2 eps, realified outputs; ``x`` is perturbed in place and restored."""
    real = torch.view_as_real(x) if x.is_complex() else x
    step = (eps * u).view(real.shape).to(real.dtype)
    orig = real.clone()
    with torch.no_grad():
        real.copy_(orig - step)
        minus = outputs_vector(as_tuple(call(values)), positions)
        real.copy_(orig + step)
        plus = outputs_vector(as_tuple(call(values)), positions)
        real.copy_(orig)
    return (plus - minus) / (2 * eps)
