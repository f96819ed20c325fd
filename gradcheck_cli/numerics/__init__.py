"""The numerics of every check, in pure torch: they know no check, no result and no spec.

Submodules, bottom up: ``realify`` (tensors as flat real vectors), ``jacobians`` (analytical
rows and numerical columns), ``stats`` (the entry by entry comparison of both Jacobians, in
bounded memory), ``probes`` (the fast decision from random probes v^T J u), ``kinks`` (a
mismatch at a kink, a tie or a domain edge told apart from a wrong gradient).

This module re-exports the names the checks use.
"""
from __future__ import annotations

from .stats import Entry, compare, probe_generator, signed_uniform
from .jacobians import Layout, make_layout
from .realify import as_tuple, is_float_tensor, real_flat, real_numel, unravel, vjp

__all__ = [
    "Entry", "Layout", "as_tuple", "compare", "is_float_tensor", "make_layout", "probe_generator", "real_flat",
    "real_numel", "signed_uniform", "unravel", "vjp",
]
