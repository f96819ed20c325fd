"""Devices: availability, the ``device_consistency`` check, and GPU memory estimates."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .. import inputs, loader
from ..loader import Bound, Target
from ..numerics import as_tuple, is_float_tensor, probe_generator, unravel, vjp
from ..results import CheckResult, InputReport, Status
from ..spec import Case
from . import UserCodeError, call_forward, contract, guarded
from .common import columns, differentiable, fill_row, statistics

MEMORY_FACTOR = 6  # leaves, outputs, saved tensors, grad_outputs, gradients, slack: x (inputs + outputs)


def device_problem(device: str) -> Optional[str]:
    """Why ``device`` cannot be used here, or None when it can."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine (torch was built without CUDA or no GPU is visible)"
        if index and int(index) >= torch.cuda.device_count():
            return f"{device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
        return None
    if kind == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return "MPS is not available on this machine"
    return None


def nbytes(values: Any) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def memory_problem(bound: Bound, outputs: tuple, device: str) -> Optional[str]:
    """On a CUDA device: a refusal when the check will likely not fit in free GPU memory."""
    if not device.startswith("cuda"):
        return None
    need = MEMORY_FACTOR * (nbytes(bound.values) + nbytes(outputs))
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if need <= free:
        return None
    return (f"this check needs about {need / 2**30:.2f} GiB on {device}, but only {free / 2**30:.2f} GiB "
            "are free: use smaller shapes, or free GPU memory (another process may hold it)")


def refuse_if_too_big(ctx: Context, outputs: tuple) -> None:
    """On a GPU: an out_of_memory error result, before starting, when the check will not fit."""
    refusal = memory_problem(ctx.bound, outputs, ctx.device)
    if refusal:
        raise UserCodeError("out_of_memory", refusal)


@dataclass
class Context:
    """What a check that looks beyond one device needs."""

    case: Case
    device: str
    target: Target
    bound: Bound


def gradients(target: Target, bound: Bound, seed: int) -> tuple[tuple, list[Optional[torch.Tensor]]]:
    """Outputs and the gradients of every argument for one signed random grad_output, on the CPU.

    The probe is drawn on the CPU from ``seed`` and moved, so every device gets the same one.
    """
    leaves = contract.fresh_leaves(bound.values)
    outputs = as_tuple(call_forward(target, bound, leaves))
    live = [outputs[p] for p in differentiable(outputs)]
    wanted = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
    gen = probe_generator(seed, 2)
    probes = [contract.probe_like(o, gen) for o in live]
    grads = guarded("backward", "backward", vjp, live, wanted, probes) if live and wanted else ()
    by_id = {id(v): g for v, g in zip(wanted, grads)}
    cpu = [by_id.get(id(v)) if isinstance(v, torch.Tensor) else None for v in leaves]
    return (tuple(o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in outputs),
            [g.detach().cpu() if g is not None else None for g in cpu])


def consistency(ctx: Context) -> CheckResult:
    """``device_consistency``: the gradients on this device agree with those on the first listed one."""
    start = time.perf_counter()
    devices, tol = ctx.case.devices, ctx.case.tolerance
    result = CheckResult("device_consistency", Status.SKIP)
    reference = devices[0]
    if len(devices) < 2:
        result.message = "the spec lists one device; list two or more (e.g. device: [cpu, cuda]) to compare them"
    elif ctx.device == reference:
        result.message = f"{reference} is the reference device: the other listed devices are compared with it"
    elif device_problem(reference):
        result.message = f"the reference device {reference} is not available: {device_problem(reference)}"
    else:
        names = [p.name for p in ctx.target.parameters() or []]
        ref_bound = loader.bind(ctx.target, *inputs.build(ctx.case, reference, names))
        ref_bound.seed = ctx.bound.seed
        outs_here, here = gradients(ctx.target, ctx.bound, ctx.case.seed)
        outs_ref, ref = gradients(ctx.target, ref_bound, ctx.case.seed)
        result.inputs = [_row(i, ctx.bound, a, b, tol.atol, tol.rtol) for i, (a, b) in enumerate(zip(here, ref))]
        wrong = [r.name for r in result.inputs if r.status is Status.FAIL]
        forward = _forward_note(outs_here, outs_ref, tol.atol, tol.rtol)
        result.status = Status.FAIL if wrong or forward else Status.PASS
        pair = f"{ctx.device} vs {reference}"
        result.message = (f"{pair}: gradients of {', '.join(repr(n) for n in wrong)} differ" if wrong
                          else f"{pair}: gradients agree within atol {tol.atol:g}, rtol {tol.rtol:g}")
        result.message += forward
    result.duration_s = time.perf_counter() - start
    return result


def _row(i: int, bound: Bound, a: Optional[torch.Tensor], b: Optional[torch.Tensor], atol: float,
         rtol: float) -> InputReport:
    """Argument i's gradient here (``a``) against the reference device's (``b``, in the numerical role)."""
    v = bound.values[i]
    if not isinstance(v, torch.Tensor) or not v.requires_grad:
        return InputReport(bound.indices[i], bound.names[i], list(getattr(v, "shape", [])),
                           str(getattr(v, "dtype", type(v).__name__)).replace("torch.", ""), Status.SKIP,
                           reason="no gradient to compare")

    def column(g: Optional[torch.Tensor]) -> torch.Tensor:
        return columns((torch.zeros(v.shape, dtype=v.dtype) if g is None else g).unsqueeze(0))

    entry = statistics(column(a), column(b), atol, rtol)
    row = InputReport(bound.indices[i], bound.names[i], list(v.shape), str(v.dtype).replace("torch.", ""),
                      Status.PASS, numel=v.numel())
    fill_row(row, entry, v, lambda _: None)
    # the element closest to failing is named even when every element agrees
    row.worst_index = unravel(entry.worst_col // (2 if v.is_complex() else 1), v.shape) if v.numel() else None
    row.analytical, row.numerical = entry.analytical, entry.numerical
    return row


def _forward_note(here: tuple, ref: tuple, atol: float, rtol: float) -> str:
    bad = [i for i, (a, b) in enumerate(zip(here, ref))
           if is_float_tensor(a) and is_float_tensor(b) and not torch.allclose(a, b.to(a.dtype), rtol, atol)]
    return f"; forward output {', '.join(map(str, bad))} differs between the devices too" if bad else ""
