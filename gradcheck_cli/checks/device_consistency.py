"""The ``device_consistency`` check: the gradients on this device against those on the first
device the spec lists, for the same inputs (drawn again from the seed) and the same grad_output."""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

from ..numerics import as_tuple, is_float_tensor, unravel, vjp
from ..results import CheckResult, ErrorKind, InputReport, Status
from ..sandbox.errors import guarded
from ..subject.binding import Bound
from ..subject.devices import device_problem
from ..subject.target import Target
from .parts.argument_rows import NO_ELEMENTS, columns, dtype_name, fill, statistics
from .parts.base import CheckContext, call_forward, differentiable, fresh_leaves, probe_like

STREAM = 2  # the random stream of device_consistency's grad_output (a seed replays it)


def gradients(target: Target, bound: Bound) -> tuple[tuple[Any, ...], list[Optional[torch.Tensor]]]:
    """Outputs and the gradients of every argument for one signed random grad_output, on the CPU.

    The probe is drawn on the CPU from ``bound.streams`` and moved, so every device gets the same one.
    """
    leaves = fresh_leaves(bound.values)
    outputs = as_tuple(call_forward(target, bound, leaves))
    live = [outputs[p] for p in differentiable(outputs)]
    wanted = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
    gen = bound.streams.generator(STREAM)
    probes = [probe_like(o, gen) for o in live]
    grads = guarded(ErrorKind.BACKWARD, "backward", vjp, live, wanted, probes) if live and wanted else ()
    by_id = {id(v): g for v, g in zip(wanted, grads)}
    cpu = [by_id.get(id(v)) if isinstance(v, torch.Tensor) else None for v in leaves]
    return (
        tuple(o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in outputs),
        [g.detach().cpu() if g is not None else None for g in cpu],
    )


def run(ctx: CheckContext) -> CheckResult:
    """``device_consistency``: the gradients on this device agree with those on the first listed one."""
    start = time.perf_counter()
    devices, tol = ctx.devices, ctx.tolerance
    result = CheckResult("device_consistency", Status.SKIP)
    reference = devices[0] if devices else ctx.device
    if len(devices) < 2:
        result.message = "the spec lists one device; list two or more (e.g. device: [cpu, cuda]) to compare them"
    elif ctx.device == reference:
        result.message = f"{reference} is the reference device: the other listed devices are compared with it"
    elif device_problem(reference):
        result.message = f"the reference device {reference} is not available: {device_problem(reference)}"
    elif ctx.rebind is None:
        result.message = "the arguments cannot be drawn again on another device (no spec to draw them from)"
    else:
        ref_bound = ctx.rebind(reference)
        outs_here, here = gradients(ctx.target, ctx.bound)
        outs_ref, ref = gradients(ctx.target, ref_bound)
        result.inputs = [_row(i, ctx.bound, a, b, tol.atol, tol.rtol) for i, (a, b) in enumerate(zip(here, ref))]
        wrong = [r.name for r in result.inputs if r.status is Status.FAIL]
        forward = _forward_note(outs_here, outs_ref, tol.atol, tol.rtol)
        result.status = Status.FAIL if wrong or forward else Status.PASS
        pair = f"{ctx.device} vs {reference}"
        result.message = (
            f"{pair}: gradients of {', '.join(repr(n) for n in wrong)} differ"
            if wrong
            else f"{pair}: gradients agree within atol {tol.atol:g}, rtol {tol.rtol:g}"
        )
        result.message += forward
    result.duration_s = time.perf_counter() - start
    return result


def _row(
    i: int, bound: Bound, a: Optional[torch.Tensor], b: Optional[torch.Tensor], atol: float, rtol: float
) -> InputReport:
    """Argument i's gradient here (``a``) against the reference device's (``b``, in the numerical role)."""
    v = bound.values[i]
    if not isinstance(v, torch.Tensor) or not v.requires_grad or not v.numel():
        return InputReport(
            bound.indices[i],
            bound.names[i],
            list(getattr(v, "shape", [])),
            str(getattr(v, "dtype", type(v).__name__)).replace("torch.", ""),
            Status.SKIP,
            reason=NO_ELEMENTS if isinstance(v, torch.Tensor) and v.requires_grad else "no gradient to compare",
            line=bound.line(i),
        )

    def column(g: Optional[torch.Tensor]) -> torch.Tensor:
        return columns((torch.zeros(v.shape, dtype=v.dtype) if g is None else g).unsqueeze(0))

    entry = statistics(column(a), column(b), atol, rtol)
    row = InputReport(
        bound.indices[i], bound.names[i], list(v.shape), dtype_name(v), Status.PASS, numel=v.numel(), line=bound.line(i)
    )
    fill(row, entry, v, lambda _: None)
    # the element closest to failing is named even when every element agrees
    row.worst_index = unravel(entry.worst_col // (2 if v.is_complex() else 1), v.shape) if v.numel() else None
    row.analytical, row.numerical = entry.analytical, entry.numerical
    return row


def _forward_note(here: tuple[Any, ...], ref: tuple[Any, ...], atol: float, rtol: float) -> str:
    bad = [
        i
        for i, (a, b) in enumerate(zip(here, ref))
        if is_float_tensor(a) and is_float_tensor(b) and not torch.allclose(a, b.to(a.dtype), rtol, atol)
    ]
    return f"; forward output {', '.join(map(str, bad))} differs between the devices too" if bad else ""
