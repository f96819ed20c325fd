"""The numerics of every check, in pure torch: they know no check, no result and no spec.

Submodules, bottom up:

- ``streams``: the named random streams of one attempt (``Streams``), probe values, the fork of the global RNG
- ``realify``: tensors as flat real vectors (complex elements as pairs of reals), the calls' types
- ``transfer``: copies from the host to a device that do not wait for it (``sent``)
- ``differences``: THE finite-difference primitive (move an argument in place, call, put it back)
- ``layout``: where each argument's columns and each output's rows lie in the Jacobian
- ``batching``: the batching policy (stage sizes, memory budgets) and the vmapped forward
- ``stats``: ``ArgumentComparison``, the statistics of the entry by entry comparison
- ``rows``: the analytical rows, from backward over one-hot grad_outputs
- ``columns``: the numerical columns, from central differences
- ``jacobians``: both sides joined, ``compare``: the whole comparison in bounded memory
- ``probes``: the fast decision from random probes v^T J u
- ``kinks``: a mismatch at a kink, a tie or a domain edge told apart from a wrong gradient
- ``ties``: the corners ``kinks`` explained, judged together along the direction that moves them together

Devices and host synchronisations: the arguments, the outputs and the user's gradients stay on the
case's device, and so does the per-stage work of the compressed check: the grouped rows' products and
their decoding into entries (``row_groups``), the groups' moved batches, quotients, verdicts and numerical
entries, and the statistics folded from the accepted entries (``compressed``, ``stats.ArgumentComparison.fold_agreed``).
A stage reads no value on the host, and what it sends to the device it sends without waiting
(``transfer.sent``): its results stay where they are, and a check reads them a constant
number of times, however many groups, stages or pieces it has (the entries found and the overlapping groups
once per pass, the groups' verdicts once per round of halving, the statistics of the accepted entries once
per argument, ``stats.ArgumentComparison.flush``); where a pass may have found more entries than the store holds, a
bound known on the host says so before any value is read. The store's values stay where they were found
(sorted there, ``rows.sorted_there``); its structure (rows, column bounds), the colouring and the groups'
members are made on the host from one copy. The dense Jacobians, the columns made one by one and their
comparison are float64 on the CPU, a value from the device moved there (``.to("cpu")``) where it enters
one (the numerical entries of a compressed check, copied once, where a fold runs on the host: entries not
finite, a failing argument's maps). tests/unit/test_host_syncs.py counts the synchronisations (what counts
is written there); tests/unit/test_store_on_device.py holds where the numbers are, and on a GPU counts
the synchronisations the CUDA runtime makes.

This module re-exports the names the checks use.
"""

from __future__ import annotations

from .differences import Step, call_moved, central_difference, elements
from .jacobian_layout import Layout, make_layout
from .jacobians import compare
from .realify import as_tuple, is_float_tensor, real_flat, real_numel, unravel, vjp
from .stats import ArgumentComparison

__all__ = [
    "ArgumentComparison",
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
