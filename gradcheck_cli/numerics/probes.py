"""The fast decision: v^T J u for random probes, analytical against numerical.

Per checked argument: ``probes`` unit random directions u in that argument; for all arguments
together: a few unit random weightings v of the outputs (``weightings``). Every pair (u, v) is a
probe. Analytically v^T J u = <J^T v, u> (one backward per v serves every argument and every
u); numerically v^T (f(x + eps u) - f(x - eps u)) / 2 eps (two forwards per u serve every v). So
N directions and N // 2 + 1 weightings give N (N // 2 + 1) probes per argument from fewer calls
than N independent ones (the same forwards, N // 2 + 1 backwards instead of N), and catch more:
a wrong element is missed only where it is small in every u or in every v, where N independent
probes miss it where it is small in each pair. The first u and the first v are non-negative, as
torch's fast mode's probe, so that errors of one sign (a constant offset, a missing term) add
up; the others are signed (see ``signed_uniform``), so that errors of both signs (a transpose, a
roll, one wrong element) cannot cancel. With several arguments, direction a first moves all of
them at once (``_combined``: 2 forwards per direction, not per argument), each weighted by its
analytical gradient's size so that a small argument's error does not drown in a large one's
tolerance; only where that fails is each argument probed with its own directions, to name it.

Where a batched forward is given (see ``columns``), the 2 x arguments x directions perturbed
forwards are one vmapped call (several if they do not fit in BATCH_BYTES, or in a stage's share of
the memory budget: see ``batching``), each used when one
of its rows gives a single call's difference quotient. Backward's contract has already called backward
with one signed random grad_output; where autograd would pass its return on unchanged, that
call is the last weighting v.

A probe only decides "pass": one that fails sends the check to the element-by-element
comparison, which gives the verdict. So the tolerance can be tight: atol |u|_2 |v|_2 + rtol |n|
(atol + rtol |n| for unit probes), where torch's fast mode inflates atol by (sum u)(sum v),
about sqrt(N M), and lets wrong gradients pass. Pure torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from ..core.tolerance import limit
from .batching import BATCH_BYTES, Batches, argument_groups, copies, same, stage_budget, try_batched, vmapped
from .differences import Step, call_moved
from .realify import Call, Vjp, as_tuple, outputs_vector, real_flat, real_numel, vjp
from .streams import Stream, Streams, signed_uniform

GRAIN = 32768  # elements: torch runs an elementwise operation on fewer on one thread (at::internal::GRAIN_SIZE)


@dataclass
class ProbeStats:
    """How the probes of one argument went."""

    probes: int = 0
    failed: int = 0
    max_abs: float = 0.0
    analytical: float = 0.0  # at the probe furthest out of tolerance
    numerical: float = 0.0
    worst_excess: float = -1.0
    combined: bool = False  # the probes moved every argument at once (see ``_combined``)


def weightings(probes: int) -> int:
    """How many output weightings v go with ``probes`` directions u per argument (see the module's note)."""
    return probes // 2 + 1 if probes > 0 else 0


def footprint(probes: int, n_rows: int, sizes: Sequence[int]) -> int:
    """Bytes that ``decide`` holds at once beyond its batches of forwards (which keep to their budget):
    the weightings v and directions u, J^T v for every v, and the analytical and numerical products of
    every argument, direction and weighting (float64)."""
    n_v, total = weightings(probes), sum(sizes)
    return 8 * (n_v * n_rows + probes * total + n_v * total + 2 * len(sizes) * probes * n_v)


def decide(
    call: Call,
    outputs: tuple[Any, ...],
    positions: list[int],
    grad_inputs: list[torch.Tensor],
    plain_values: list[Any],
    plain_inputs: list[torch.Tensor],
    *,
    eps: float,
    atol: float,
    rtol: float,
    probes: int,
    streams: Streams,
    grad: Vjp = vjp,
    batched: Call | None = None,
    given: tuple[list[Any], list[Any]] | None = None,
    at_x: bool = False,
    memory_bytes: int = BATCH_BYTES * 8,
) -> list[ProbeStats]:
    """Probe every argument with ``probes`` directions u and ``weightings(probes)`` weightings v:
    |a - n| <= atol + rtol |n| for each pair (unit u and v).
    ``batched``: the same forward as ``call``, in a form torch.func.vmap may batch. ``given``: one
    signed probe's backward already called, (g for every output, J^T g for every argument in
    ``grad_inputs``, as autograd gives it): it is the last weighting (v = g / |g|), and saves a backward.
    ``at_x``: ``outputs`` are what ``call`` gives for ``plain_values`` (not taken in another dtype).
    ``memory_bytes``: the memory budget, of which one vmapped forward takes at most a stage's share."""
    if not plain_inputs:
        return []
    diff_outputs = [outputs[p] for p in positions]
    live = [o for o in diff_outputs if o.requires_grad]
    n_rows = sum(real_numel(o) for o in diff_outputs)
    sizes = [real_numel(x) for x in plain_inputs]
    n_v = weightings(probes)
    reuse = given if n_v > 1 and n_rows > 0 and len(live) == len(diff_outputs) else None
    drawn = n_v - (reuse is not None)
    # every probe drawn in one call: the weightings v, then the directions u of all arguments side by side
    w = signed_uniform((drawn * n_rows + probes * sum(sizes),), streams.generator(Stream.PROBES), scaled=False)
    vs, u_all = w[: drawn * n_rows].view(drawn, n_rows), w[drawn * n_rows :].view(probes, sum(sizes))
    vs[0].abs_()  # the first u and v are non-negative, as torch's: errors of one sign add up in their probe
    u_all[0].abs_()
    us = list(u_all.split(sizes, dim=1)) if len(sizes) > 1 else [u_all]
    for unit in (vs, *us):
        if unit.shape[1]:
            unit.div_(torch.linalg.vector_norm(unit, dim=1, keepdim=True))
    norm = 1.0
    if reuse is not None:
        g = torch.cat([real_flat(reuse[0][p].contiguous()).to("cpu", torch.float64) for p in positions])
        norm = float(torch.linalg.vector_norm(g))
        vs = torch.cat([vs, g.div_(norm).view(1, -1)])
    # J^T v first: one backward per v serves every argument and direction (and sizes the combined directions)
    grads: list[list[torch.Tensor | None]] = []
    for b, v in enumerate(vs):
        reused = reuse is not None and b == n_v - 1
        back = reuse[1] if reuse is not None and reused else _backward(grad, diff_outputs, live, grad_inputs, v)
        flat = [None if g is None else real_flat(g.contiguous()).to("cpu", torch.float64) for g in back]
        grads.append([g * (1 / norm) if reused and g is not None else g for g in flat])  # J^T g for v = g / |g|
    analytical = torch.stack([_products(u, [row[i] for row in grads]) for i, u in enumerate(us)])  # args x u x v
    centre = outputs_vector(outputs, positions, copy=False).cpu().view(1, -1) if at_x else None  # only read
    budget = stage_budget(memory_bytes, BATCH_BYTES)
    if n_rows and len(sizes) > 1:
        weights = _weights(grads, sizes, atol, rtol)
        if weights is not None:  # one direction over all the arguments: 2 forwards per direction, not per argument
            decided = _combined(
                call,
                batched,
                plain_values,
                plain_inputs,
                us,
                weights,
                analytical,
                eps,
                positions,
                vs,
                centre,
                budget,
                atol,
                rtol,
            )
            if decided is not None:
                return decided
    numerical = (
        _numerical(call, batched, plain_values, plain_inputs, us, eps, positions, vs, centre, budget)
        if n_rows
        else torch.zeros(len(sizes), probes, n_v, dtype=torch.float64)
    )
    return _stats(analytical.view(len(sizes), -1), numerical.view(len(sizes), -1), atol, rtol)


def _products(u: torch.Tensor, jts: list[torch.Tensor | None]) -> torch.Tensor:
    """<J^T v_b, u_a> for one argument's directions (rows of ``u``) and every weighting's J^T v_b (0 for
    None): directions x weightings, one matrix product (as the numerical side's)."""
    return torch.mm(u, torch.stack([torch.zeros_like(u[0]) if jt is None else jt for jt in jts]).T)


def _weights(grads: list[list[torch.Tensor | None]], sizes: list[int], atol: float, rtol: float) -> list[float] | None:
    """How much of a combined direction each argument takes (see ``_combined``): 1 / (its analytical
    gradient's root-mean-square size over the weightings' largest, at least atol / rtol, the size
    below which atol decides anyway); None where that cannot be sized (an empty argument, a
    non-finite gradient, rtol 0 and a zero gradient): each argument is probed on its own."""
    if rtol <= 0:
        return [1.0] * len(sizes) if atol > 0 else None
    weights = []
    for i, n in enumerate(sizes):
        if n == 0:
            return None
        size = max((float(torch.linalg.vector_norm(row[i])) for row in grads if row[i] is not None), default=0.0)
        rms = max(size / math.sqrt(n), atol / rtol)
        if not 0 < rms < math.inf:
            return None
        weights.append(1 / rms)
    return weights


def _combined(
    call: Call,
    batched: Call | None,
    values: list[Any],
    inputs: list[torch.Tensor],
    us: list[torch.Tensor],
    weights: list[float],
    analytical: torch.Tensor,
    eps: float,
    positions: list[int],
    vs: torch.Tensor,
    centre: torch.Tensor | None,
    budget: int,
    atol: float,
    rtol: float,
) -> list[ProbeStats] | None:
    """The probes of every argument at once: direction a is argument i's unit direction u_ia times
    ``weights[i]`` for every i, made a unit vector, so its 2 forwards move all the arguments (as
    torch's fast mode moves one argument). The weights make each argument move the outputs about
    alike, so that a small argument's error does not drown in a large one's tolerance. All agree:
    every argument's ProbeStats (the same, of all the probes); None where one fails (the caller
    probes each argument on its own, to name those that fail)."""
    norm = math.sqrt(sum(w * w for w in weights))  # of every direction: each argument's part is a unit vector
    parts = [u * (w / norm) for u, w in zip(us, weights)]  # unit directions over all the arguments
    a = (analytical * torch.tensor(weights, dtype=torch.float64).view(-1, 1, 1)).sum(0) / norm
    n = _numerical_all(call, batched, values, inputs, parts, eps, positions, vs, centre, budget)
    tight = math.sqrt(len(inputs))  # a failure only costs the probes of each argument: no verdict changes
    (stats,) = _stats(a.view(1, -1), n.view(1, -1), atol / tight, rtol / tight)
    return None if stats.failed else [replace(stats, combined=True) for _ in inputs]


def _numerical_all(
    call: Call,
    batched: Call | None,
    values: list[Any],
    inputs: list[torch.Tensor],
    parts: list[torch.Tensor],
    eps: float,
    positions: list[int],
    vs: torch.Tensor,
    centre: torch.Tensor | None,
    budget: int,
) -> torch.Tensor:
    """v_b^T (f(x + eps u_a) - f(x - eps u_a)) / 2 eps for directions u_a over all the arguments
    (argument i moved by row a of ``parts[i]``): directions x weightings. One vmapped forward where
    ``batched`` gives the single calls' outputs (checked by one single call, see ``_agrees``) and it
    fits in ``budget`` bytes, else two forwards per direction."""
    n_u = len(parts[0])
    if batched is not None and _bytes(n_u, sum(real_numel(x) for x in inputs), len(vs[0])) <= budget:

        def agrees(got: tuple[torch.Tensor, torch.Tensor] | None) -> bool:
            assert got is not None  # try_batched verifies a result it got
            here = centre
            if here is None:
                with torch.no_grad():
                    here = outputs_vector(as_tuple(call(values)), positions).cpu().view(1, -1)
            return bool(
                call_moved(
                    call,
                    values,
                    _Steps(inputs, [eps * p[0] for p in parts]),  # read before put back
                    lambda outputs: _agrees(
                        got[1], n_u, here, outputs_vector(outputs, positions, copy=False).cpu(), eps
                    ),
                )
            )

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            return _all_moved_at_once(batched, values, inputs, parts, eps, positions, vs)

        done, _ = try_batched(None, batch, agrees)
        if done is not None:
            return done[0]
    out = torch.empty(n_u, len(vs), dtype=torch.float64)
    for a in range(n_u):
        minus, plus = (
            call_moved(
                call,
                values,
                _Steps(inputs, [sign * eps * p[a] for p in parts]),
                lambda outputs: outputs_vector(outputs, positions).cpu(),
            )
            for sign in (-1.0, 1.0)
        )
        out[a] = vs @ (plus - minus) / (2 * eps)
    return out


def _bytes(n_u: int, elements: int, n_rows: int) -> int:
    """Perturbed arguments and outputs of one vmapped forward over 2 ``n_u`` moves of all the arguments."""
    return 2 * n_u * (elements + n_rows) * 8


def _all_moved_at_once(
    batched: Call,
    values: list[Any],
    inputs: list[torch.Tensor],
    parts: list[torch.Tensor],
    eps: float,
    positions: list[int],
    vs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_numerical_all`` from one vmapped forward, and its rows: row a moves every argument i by
    -eps ``parts[i][a]``, row D + a by +eps ``parts[i][a]`` (D directions)."""
    n_u = len(parts[0])
    batches: Batches = {}
    for x, part in zip(inputs, parts):
        if id(x) in batches:  # a tensor passed twice moves by both its parts, as in a single call
            batch = batches[id(x)][1]
            step = eps * part.to(batch)
            batch[:n_u].sub_(step)  # in place on the views: `batch[a:b] -= step` would copy the rows back too
            batch[n_u:].add_(step)
            continue
        real = (torch.view_as_real(x) if x.is_complex() else x).contiguous().view(1, -1)
        batch = torch.empty(2 * n_u, real.shape[1], dtype=real.dtype, device=real.device)
        step = eps * part.to(batch)
        torch.sub(real, step, out=batch[:n_u])  # x - step and x + step written straight into the batch
        torch.add(real, step, out=batch[n_u:])
        batches[id(x)] = x, batch
    flat = vmapped(batched, values, batches, positions).cpu()
    return torch.matmul(flat[n_u:] - flat[:n_u], vs.T).div_(2 * eps), flat


class _Steps:
    """Every argument moved by its step at once (see ``Step``), and put back in the reverse order:
    bit-exactly, also a tensor passed twice."""

    def __init__(self, inputs: list[torch.Tensor], steps: list[torch.Tensor]) -> None:
        self.moves = [Step(x, s) for x, s in zip(inputs, steps)]

    def apply(self) -> None:
        """Move every argument."""
        for m in self.moves:
            m.apply()

    def restore(self) -> None:
        """Put every argument back."""
        for m in reversed(self.moves):
            m.restore()


def _stats(analytical: torch.Tensor, numerical: torch.Tensor, atol: float, rtol: float) -> list[ProbeStats]:
    """Every argument's probes (one row each) compared: |a - n| <= atol + rtol |n| (NaN fails).
    A few numbers per argument: compared in Python, which is quicker than torch at that size."""
    out = []
    for a_row, n_row in zip(analytical.tolist(), numerical.tolist()):
        s = ProbeStats(len(a_row))
        for a, n in zip(a_row, n_row):
            tol = limit(abs(n), atol, rtol)  # atol |u|_2 |v|_2 for unit probes: a failure only costs an escalation
            err = abs(a - n)
            s.max_abs = max(s.max_abs, err)
            if not err <= tol:  # NaN fails too
                s.failed += 1
            excess = err / tol if tol else (float("inf") if err else 0.0)
            if excess > s.worst_excess:
                s.worst_excess, s.analytical, s.numerical = excess, a, n
        out.append(s)
    return out


def _backward(
    grad: Vjp,
    diff_outputs: list[torch.Tensor],
    live: list[torch.Tensor],
    grad_inputs: list[torch.Tensor],
    v: torch.Tensor,
) -> Sequence[Any]:
    """J^T v for the realified outputs weighted by ``v``: one backward (None where an argument is unused)."""
    if not live:
        return [None] * len(grad_inputs)
    grad_outs, k = [], 0
    for o in diff_outputs:
        part = v[k : k + real_numel(o)]
        if o.is_complex():
            g = torch.zeros_like(o, memory_format=torch.contiguous_format)
            real_flat(g).copy_(part)
        else:  # a copy of its own: backward may not change v
            g = part.view(o.shape).to(o.device, o.dtype, copy=True)
        grad_outs.append(g)
        k += real_numel(o)
    return grad(live, grad_inputs, [g for g, o in zip(grad_outs, diff_outputs) if o.requires_grad])


def _numerical(
    call: Call,
    batched: Call | None,
    values: list[Any],
    inputs: list[torch.Tensor],
    us: list[torch.Tensor],
    eps: float,
    positions: list[int],
    vs: torch.Tensor,
    centre: torch.Tensor | None = None,
    budget: int | None = None,
) -> torch.Tensor:
    """v_b^T (f(x_i + eps u_ia) - f(x_i - eps u_ia)) / 2 eps for every argument i, direction a
    (row a of ``us[i]``) and weighting b (row b of ``vs``): arguments x directions x weightings.
    One vmapped forward per group of arguments where ``batched`` gives the single calls' outputs
    (checked on every group, see ``_agrees``; ``centre``: the outputs at x, as one row, if known;
    each group's batch within ``budget`` bytes, default BATCH_BYTES), else two forwards per direction."""
    n_u = len(us[0]) if us else 0
    out = torch.empty(len(inputs), n_u, len(vs), dtype=torch.float64)
    todo = set(range(len(inputs)))

    def agrees(group: list[int], got: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """The batch of ``group`` gives a single call's numbers (see ``_agrees``)."""
        nonlocal centre
        if centre is None:
            with torch.no_grad():
                centre = outputs_vector(as_tuple(call(values)), positions).cpu().view(1, -1)
        x, u, here = inputs[group[0]], us[group[0]][0], centre
        return bool(_perturbed(call, values, x, eps * u, positions, lambda plus: _agrees(got[1], n_u, here, plus, eps)))

    if batched is not None:  # arguments batched in groups, each group verified, until one is not
        for group in argument_groups(inputs, n_u, len(vs[0]), BATCH_BYTES if budget is None else budget):
            batch = partial(
                _all_at_once, batched, values, [inputs[i] for i in group], [us[i] for i in group], eps, positions, vs
            )
            got, _ = try_batched(None, batch, partial(agrees, group))
            if got is None:
                break
            if len(group) == len(inputs):
                return got[0]
            out[group] = got[0]
            todo -= set(group)
    for i in sorted(todo):
        for a, u in enumerate(us[i]):
            minus = _perturbed(call, values, inputs[i], -eps * u, positions)
            out[i, a] = vs @ (_perturbed(call, values, inputs[i], eps * u, positions) - minus) / (2 * eps)
    return out


def _agrees(rows: torch.Tensor, n_u: int, centre: torch.Tensor, plus: torch.Tensor, eps: float) -> bool:
    """The batch's ``rows`` (see ``_all_at_once``) give the single call's outputs at x + eps u for
    their first argument's first direction (``plus``), compared as difference quotients from the
    outputs at x (``centre``): a perturbation that the batch dropped shows there (the outputs
    themselves move by only eps), as does any other difference."""
    row = rows[n_u]
    return torch.equal(row, plus) or same((row - centre[0]) / eps, (plus - centre[0]) / eps)  # equal: equal quotients


def _all_at_once(
    batched: Call,
    values: list[Any],
    inputs: list[torch.Tensor],
    us: list[torch.Tensor],
    eps: float,
    positions: list[int],
    vs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_numerical`` of ``inputs`` from one vmapped forward, and the forward's rows: row
    (2 D i + a) perturbs argument i by -eps u_ia, row (2 D i + D + a) by +eps u_ia (D directions),
    every other argument as it is."""
    n_u = len(us[0])
    if len(inputs) == 1:  # the same rows as one direction over all the arguments
        got, flat = _all_moved_at_once(batched, values, inputs, us, eps, positions, vs)
        return got.unsqueeze(0), flat
    rows = 2 * len(inputs) * n_u
    batches: Batches = {}
    for i, x in enumerate(inputs):
        batch = copies(batches, x, rows)
        at, step = 2 * n_u * i, eps * us[i].to(batch)
        batch[at : at + n_u].sub_(step)
        batch[at + n_u : at + 2 * n_u].add_(step)
    flat = vmapped(batched, values, batches, positions).cpu()  # probes are reduced on the CPU
    pairs = flat[:rows].view(len(inputs), 2, n_u, -1)
    return torch.matmul(pairs[:, 1] - pairs[:, 0], vs.T).div_(2 * eps), flat


@contextmanager
def one_thread_below_grain(elements: int) -> Iterator[None]:
    """Torch on one CPU thread while a check of small tensors (``elements`` in its arguments, below
    GRAIN) runs: its operations are too small to gain from threads (torch's own elementwise ones
    would not split below GRAIN anyway), but a batch of probes, a small matmul or a cumulative op
    is split, and on a busy machine each split waits for a time slice of the other thread
    (milliseconds, against microseconds of work)."""
    threads = torch.get_num_threads()
    if threads == 1 or elements >= GRAIN:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _perturbed(
    call: Call,
    values: list[Any],
    x: torch.Tensor,
    step: torch.Tensor,
    positions: list[int],
    read: Callable[[torch.Tensor], Any] | None = None,
) -> Any:
    """The realified outputs (a copy) of one single call with ``x`` moved by ``step`` in place, then
    restored; or ``read`` of them (not a copy), before x is put back."""
    if read is not None:
        return call_moved(
            call, values, Step(x, step), lambda outputs: read(outputs_vector(outputs, positions, copy=False).cpu())
        )
    # a copy, made before x is put back: an output may be a view of x
    return call_moved(call, values, Step(x, step), lambda outputs: outputs_vector(outputs, positions).cpu())
