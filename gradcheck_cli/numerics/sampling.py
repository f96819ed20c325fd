"""Random probe vectors, drawn from the spec's seed on streams independent of the inputs'.

Pure torch.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def probe_generator(seed: int, stream: int) -> torch.Generator:
    """A generator for probes, seeded from the spec's seed but independent of the inputs' stream."""
    return torch.Generator().manual_seed((seed * 1_000_003 + 7919 * (stream + 1)) % 2**63)


def signed_uniform(shape: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """Float64 random probe values, uniform on (-1, 1) in 2^16 steps symmetric about 0. Made from
    the generator's raw bits, which torch draws faster than normals: a probe needs
    independent, symmetric values that are almost never equal, not a Gaussian (torch's fast mode
    draws uniform ones too)."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None, generator=gen)
    return bits.view(torch.int16)[:n].to(torch.float64).add_(0.5).div_(2**15).view(tuple(shape))
