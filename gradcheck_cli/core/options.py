"""The run-wide options, each declared once: its name, its default (in its one unit), its help, and where it
is offered. The front ends make their options of these rows: ``--NAME`` on the command line (``cli``),
``--gradcheck-NAME`` in the pytest plugin where ``pytest`` says so, ``NAME`` in ``[tool.gradcheck]`` (``config``'s
``SETTINGS``, by the same name); ``run.plan.RunOptions`` takes its defaults from here, the checks their
memory budget (``MEMORY_BYTES``) and ``run.replay`` the defaults a replay command leaves out.

Plain values: no torch, no click, imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

MB = 2**20  # --max-memory's unit, in the bytes the numerics count


@dataclass(frozen=True)
class Option:
    name: str  # the long option without its dashes: --NAME, --gradcheck-NAME, [tool.gradcheck] NAME
    field: str  # the front ends' parameter and RunOptions' field
    default: Any  # the one place it is written
    help: str  # the command line's help ({probes}: the value of FAST_PROBES)
    metavar: Optional[str] = None
    unit: str = ""  # what the number counts, from the command line to the checks
    pytest: bool = False  # the pytest plugin offers --gradcheck-NAME


FAST_PROBES = 3  # random probes per argument for --fast (the first non-negative, the others signed)
DEFAULT_TIMEOUT = 300  # seconds a case may take: a hung Function costs at most this

OPTIONS = (
    Option(
        "max-memory",
        "max_memory_mb",
        512,
        "Jacobian entries held in memory at once; larger checks recompute in blocks.",
        "MB",
        unit="MB",
        pytest=True,
    ),
    Option(
        "timeout",
        "timeout",
        DEFAULT_TIMEOUT,
        "Stop a case that runs longer (an error result for that case alone); 0 or inf for no limit.",
        "SECONDS",
        unit="seconds",
        pytest=True,
    ),
    Option(
        "shrink",
        "shrink",
        5,
        "After a case fails, look this long for a smaller shape that still fails alike (same check, "
        "argument and pattern) and show it with its own replay command; within half of --timeout. 0: off.",
        "SECONDS",
        unit="seconds",
    ),
    Option(
        "trials",
        "trials",
        1,
        "Check each case with N seeds (seed, seed+1, ...); the first seed that fails is reported.",
        "N",
        pytest=True,
    ),
    Option("probes", "probes", 0, "Decide with N random probes per argument first (0: element by element).", "N"),
    Option(
        "seed",
        "seed",
        None,
        "Use this seed for every case (0 to 2**64 - 1; --trials' next seeds wrap around to 0).",
        "N",
        pytest=True,
    ),
)
BY_NAME = {option.name: option for option in OPTIONS}


def default(name: str) -> Any:
    """The default of the option ``name`` (``max-memory``: in MB)."""
    return BY_NAME[name].default


MEMORY_BYTES = default("max-memory") * MB  # the checks' memory budget unless --max-memory says otherwise
