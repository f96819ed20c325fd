"""Copies from the host to a device that do not wait for it.

A plain copy from the host's pageable memory to a GPU (``torch.as_tensor(array, device=...)``,
``t.to("cuda")``) waits until the GPU has done the work queued before it: torch synchronises the stream
after the copy. The compressed check sends each stage's structure (the places, rows and groups of its
entries, which elements its batch moves) to the device, so such copies would wait once or more per
stage, and a check's waits would grow with its stages. ``sent`` copies through pinned memory without
waiting, from a pinned copy of its own made before it returns (the caller may change or free what it sent
at once); torch's caching host allocator keeps that pinned block until the copy has run. Pure torch."""

from __future__ import annotations

from typing import Any, Optional

import torch


def sent(x: Any, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x`` (a host array, list or tensor) as a tensor on ``device``: on a GPU copied without waiting for it,
    on the CPU as ``torch.as_tensor`` makes it (no copy of a tensor or array). A tensor already on a device is
    moved as ``Tensor.to`` moves it (no copy where it is there already)."""
    t = torch.as_tensor(x, dtype=dtype)
    if t.device.type == "cpu" and device.type == "cpu":
        return t
    if t.device.type != "cpu" or device.type != "cuda":
        return t.to(device)
    # pin_memory hands a pinned tensor back as it is: the copy would read the caller's memory when the device
    # gets to it, so a pinned one is copied first
    staged = (t.clone() if t.is_pinned() else t).pin_memory()
    return staged.to(device, non_blocking=True)
