"""The numerics of every check, in pure torch: they know no check, no result and no spec.

Submodules, bottom up:

- ``streams``: the named random streams of one attempt (``Streams``), probe values, the fork of the global RNG
- ``realify``: tensors as flat real vectors (complex elements as pairs of reals), the calls' types
- ``differences``: THE finite-difference primitive (move an argument in place, call, put it back)
- ``layout``: where each argument's columns and each output's rows lie in the Jacobian
- ``batching``: the batching policy (stage sizes, memory budgets) and the vmapped forward
- ``stats``: ``Entry``, the statistics of the entry by entry comparison
- ``rows``: the analytical rows, from backward over one-hot grad_outputs
- ``columns``: the numerical columns, from central differences
- ``jacobians``: both sides joined, ``compare``: the whole comparison in bounded memory
- ``probes``: the fast decision from random probes v^T J u
- ``kinks``: a mismatch at a kink, a tie or a domain edge told apart from a wrong gradient

Devices: the arguments, the outputs and the user's gradients stay on the case's device; the
Jacobians, their columns and every comparison buffer are float64 on the CPU, and a value from the
device is moved there (``.to("cpu")``) where it enters one.

This module re-exports the names the checks use.
"""

from __future__ import annotations

from .differences import Step, call_moved, central_difference, elements
from .jacobians import compare
from .layout import Layout, make_layout
from .realify import as_tuple, is_float_tensor, real_flat, real_numel, unravel, vjp
from .stats import Entry

__all__ = [
    "Entry",
    "Layout",
    "Step",
    "as_tuple",
    "call_moved",
    "central_difference",
    "compare",
    "elements",
    "is_float_tensor",
    "make_layout",
    "real_flat",
    "real_numel",
    "unravel",
    "vjp",
]
