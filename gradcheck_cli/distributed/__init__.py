"""Distributed Functions: a Function whose forward or backward calls torch.distributed collectives,
checked across ranks that gradcheck-cli starts itself (``distributed:`` in a spec).

Bottom up: ``launch`` (fork the ranks, watch their progress, end them all), ``layout`` (placements:
what each rank holds, the moves of finite differences, the grad_outputs and the objective), ``rank``
(what every rank runs), ``judge`` (rows per argument and rank, and what they show together), ``check``
(a case: arguments, world, verdict).
"""

from __future__ import annotations
