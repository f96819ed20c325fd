"""Inputs on a set: draws of the structured ``dist:`` values, and the map that keeps a
perturbation on the set (symmetric matrices).

Every draw is float64 (int64 for permutations) on the CPU from the inputs' generator; the
caller casts and moves it.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

Draw = Callable[[tuple[int, ...], dict[str, float], int, torch.Generator], torch.Tensor]


def symmetric_part(x: torch.Tensor) -> torch.Tensor:
    """(X + X^T) / 2 over the last two dimensions: X itself where X is symmetric, and a perturbation of
    one entry becomes half of it on the entry and its mirror, so finite differences stay symmetric."""
    return (x + x.mT) / 2


def _normal(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _uniform(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float64)


def symmetric(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """(B + B^T) / 2 of a standard normal B."""
    return symmetric_part(_normal(shape, gen))


def spd(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """B B^T / n + I of a standard normal n x n B: symmetric, eigenvalues at least 1 (well conditioned)."""
    n = shape[-1]
    b = _normal(shape, gen)
    return symmetric_part(b @ b.mT / max(n, 1) + torch.eye(n, dtype=torch.float64))


def orthogonal(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """Q of the QR decomposition of a standard normal matrix, signs fixed by R's diagonal (Haar
    distributed); orthonormal columns for m >= n, orthonormal rows for m < n."""
    m, n = shape[-2], shape[-1]
    b = _normal(shape if m >= n else shape[:-2] + (n, m), gen)
    q, r = torch.linalg.qr(b)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q if m >= n else q.mT


def simplex(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """Points uniform on the probability simplex along ``dim`` (Dirichlet(1)): positive, summing to 1."""
    e = -torch.log1p(-_uniform(shape, gen))  # exponential(1); 1 - U > 0
    return e / e.sum(dim, keepdim=True)


def sorted_(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """Uniform values in (low, high), sorted along ``dim`` (increasing)."""
    u = params["low"] + (params["high"] - params["low"]) * _uniform(shape, gen)
    return torch.sort(u, dim=dim).values


def permutation(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """A random permutation of 0..n-1 along ``dim`` (each slice its own)."""
    return torch.argsort(_uniform(shape, gen), dim=dim)


def positive(shape: tuple[int, ...], params: dict[str, float], dim: int, gen: torch.Generator) -> torch.Tensor:
    """Log-uniform values in (low, high), 0 < low: positive, spread over scales."""
    lo, hi = math.log(params["low"]), math.log(params["high"])
    return torch.exp(lo + (hi - lo) * _uniform(shape, gen))


DRAW: dict[str, Draw] = {
    "symmetric": symmetric,
    "spd": spd,
    "orthogonal": orthogonal,
    "simplex": simplex,
    "sorted": sorted_,
    "permutation": permutation,
    "positive": positive,
}
