"""Copies from the host to a device that do not wait for it.

A plain copy from the host's pageable memory to a GPU (``torch.as_tensor(array, device=...)``,
``t.to("cuda")``) waits until the GPU has done the work queued before it: torch synchronises the stream
after the copy. The compressed check sends each stage's structure (the places, rows and groups of its
entries, which elements its batch moves) to the device, so such copies would wait once or more per
stage, and a check's waits would grow with its stages. ``sent`` copies through pinned memory without
waiting; torch's caching host allocator keeps the pinned block until the copy has run. Pure torch."""

from __future__ import annotations

from typing import Any, Optional

import torch


def sent(x: Any, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x`` (a host array, list or tensor) as a tensor on ``device``: on a GPU copied without waiting for it,
    on the CPU as ``torch.as_tensor`` makes it (no copy of a tensor or array)."""
    t = torch.as_tensor(x, dtype=dtype)
    if device.type == "cpu":
        return t
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
