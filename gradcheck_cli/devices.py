"""Devices: whether one can be used here, and whether a check will fit in its memory."""

from __future__ import annotations

from typing import Any, Optional

import torch

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
    """Bytes held by the tensors among ``values``."""
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def memory_problem(values: list[Any], outputs: tuple[Any, ...], device: str, batch: int = 0) -> Optional[str]:
    """On a CUDA device: a refusal when a check will likely not fit in free GPU memory (its
    arguments, outputs and their copies, and ``batch`` bytes of batched calls)."""
    if not device.startswith("cuda"):
        return None
    need = MEMORY_FACTOR * (nbytes(values) + nbytes(outputs)) + batch
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if need <= free:
        return None
    return (
        f"this check needs about {need / 2**30:.2f} GiB on {device}, but only {free / 2**30:.2f} GiB "
        "are free: use smaller shapes, or free GPU memory (another process may hold it)"
    )
