"""The options that reach the run, each declared once: a row with its name, the parameter it sets, its
default (in its one unit), its help, the kind of value it takes, and where it is offered. The front ends
make their options of these rows and nothing else: ``--NAME`` (and the row's other spellings) on the
command line (``cli``), ``--gradcheck-NAME`` in the pytest plugin (``pytest``), the key ``project`` of
``[tool.gradcheck]`` (``config.SETTINGS``); ``config.read_text`` / ``config.read_value`` read every value
(one message per kind, whichever front end it came through). ``run.plan.RunOptions`` has a field of each
row's ``field`` (``run``) and takes its default from here; ``run.replay`` writes the rows marked
``replay`` that a task's options set; the checks take their memory budget (``MEMORY_BYTES``) from here.

A new option is one row here plus the code that reads its field. The options that do not reach the run
(the report's format, -q/-v, -k, --lf, --shard, ...) are the command line's own, written where they are read.

Plain values: no torch, no click, imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

MB = 2**20  # --max-memory's unit, in the bytes the numerics count
FAST_PROBES = 3  # random probes per argument for --fast (the first non-negative, the others signed)
DEFAULT_TIMEOUT = 300  # seconds a case may take: a hung Function costs at most this


@dataclass(frozen=True)
class Whole:
    """A whole number from ``low`` (to ``high``, when there is one), counting ``unit``."""

    low: int
    high: Optional[int] = None
    unit: str = ""


@dataclass(frozen=True)
class Seconds:
    """A number of seconds >= 0; ``no_limit``: 0 and inf mean none (read as None), else 0 means off and
    the number must be finite."""

    no_limit: bool


@dataclass(frozen=True)
class Flag:
    """A switch without a value: given, it sets its field to ``const`` (``--fast``: probes = 3)."""

    const: Any = True


@dataclass(frozen=True)
class Text:
    """A word that ``rule`` accepts (``config.RULES``: check, device, module, import path), once or, with
    ``repeat``, as often as given (a list in [tool.gradcheck])."""

    rule: str
    repeat: bool = False


Kind = Union[Whole, Seconds, Flag, Text]


@dataclass(frozen=True)
class Option:
    name: str  # the long option without its dashes: --NAME, --gradcheck-NAME
    field: str  # the parameter it sets: the command's, the plugin's, RunOptions' (or BatchOptions')
    default: Any  # the one place it is written (a row that shares another row's field: that row's)
    help: str
    kind: Kind
    metavar: Optional[str] = None
    flags: tuple[str, ...] = ()  # the command line's other spellings (-j, -x, --exitfirst, ...)
    project: Optional[str] = None  # its key in [tool.gradcheck]; None: the command line's alone
    pytest: bool = False  # the pytest plugin offers --gradcheck-NAME
    run: bool = True  # a field of RunOptions (else of the batch: how many workers, when to stop)
    replay: bool = False  # a replay command repeats it when a task's options set it


OPTIONS = (
    Option(
        "max-memory",
        "max_memory_mb",
        512,
        "Jacobian entries held in memory at once; larger checks recompute in blocks.",
        Whole(1, unit="megabytes"),
        "MB",
        project="max-memory",
        pytest=True,
        replay=True,
    ),
    Option(
        "timeout",
        "timeout",
        DEFAULT_TIMEOUT,
        "Stop a case that runs longer (an error result for that case alone); 0 or inf for no limit.",
        Seconds(no_limit=True),
        "SECONDS",
        project="timeout",
        pytest=True,
    ),
    Option(
        "shrink",
        "shrink",
        5,
        "After a case fails, look this long for a smaller shape that still fails alike (same check, "
        "argument and pattern) and show it with its own replay command; within half of --timeout. 0: off.",
        Seconds(no_limit=False),
        "SECONDS",
    ),
    Option("no-shrink", "shrink", 5, "Do not look for a smaller failing case (--shrink 0).", Flag(0.0)),
    Option(
        "trials",
        "trials",
        1,
        "Check each case with N seeds (seed, seed+1, ...); the first seed that fails is reported.",
        Whole(1),
        "N",
        project="trials",
        pytest=True,
    ),
    Option(
        "probes",
        "probes",
        0,
        "Decide with N random probes per argument first (0: element by element).",
        Whole(0),
        "N",
        project="probes",
        pytest=True,
        replay=True,
    ),
    Option(
        "fast",
        "probes",
        0,
        f"Decide with {FAST_PROBES} random probes v^T J u per argument; compare element by element "
        f"the arguments where one fails (same as --probes {FAST_PROBES}).",
        Flag(FAST_PROBES),
        project="fast",
        pytest=True,
    ),
    Option(
        "seed",
        "seed",
        None,
        "Use this seed for every case (0 to 2**64 - 1; --trials' next seeds wrap around to 0).",
        Whole(0, 2**64 - 1),
        "N",
        pytest=True,
    ),
    Option(
        "device",
        "devices",
        (),
        "Check on this device instead of the specs' (cpu, cuda, cuda:N). Repeat for several.",
        Text("device", repeat=True),
        "DEVICE",
        pytest=True,
    ),
    Option(
        "check",
        "checks",
        (),
        "Run this check instead of the specs'. Repeat for several.",
        Text("check", repeat=True),
        "NAME",
        project="checks",
        pytest=True,
    ),
    Option(
        "reference",
        "reference",
        None,
        "Compare with this reference implementation (same signature), as `reference:` in every spec; "
        "without --check (or the spec's `checks`), runs the reference check alone.",
        Text("import path"),
        "PKG.MOD:FN",
        pytest=True,
    ),
    Option(
        "import",
        "imports",
        (),
        "Import this module before resolving the targets (e.g. the module whose @torch.library.custom_op "
        "registers torch.ops.ns.op), as `import:` in every spec. Repeat for several.",
        Text("module", repeat=True),
        "MODULE",
        project="import",
        pytest=True,
    ),
    Option(
        "strict",
        "strict",
        False,
        "Fail a gradient off by a constant factor within the tolerance (e.g. 1.001x) when that is well "
        "beyond the finite differences' own error (by default a warning); as `strict: true` in every spec.",
        Flag(),
        project="strict",
        pytest=True,
        replay=True,
    ),
    Option(
        "require-device",
        "require_device",
        False,
        "An unavailable device is an error (exit 3) instead of a skip.",
        Flag(),
        pytest=True,
    ),
    Option(
        "no-compress",
        "compress",
        True,
        "Take every column of the numerical Jacobian on its own (no compressed finite differences): "
        "slower, the same verdicts; to compare the two.",
        Flag(False),
        pytest=True,
        replay=True,
    ),
    Option(
        "jobs",
        "jobs",
        None,
        "Worker processes (default: the number of cores). Results are the same and in the same order for any N.",
        Whole(1),
        "N",
        flags=("-j",),
        project="jobs",
        run=False,
    ),
    Option(
        "maxfail",
        "maxfail",
        0,
        "Start no new case after N failures or errors (0: no limit).",
        Whole(0),
        "N",
        project="maxfail",
        run=False,
    ),
    Option(
        "fail-fast",
        "fail_fast",
        False,
        "Start no new case after the first failure or error (--maxfail 1).",
        Flag(),
        flags=("-x", "--exitfirst"),
        project="fail-fast",
        run=False,
    ),
)
BY_NAME = {option.name: option for option in OPTIONS}
FIELDS = {option.field: BY_NAME[option.name] for option in reversed(OPTIONS)}  # field -> the first row setting it


def default(name: str) -> Any:
    """The default of the option ``name`` (``max-memory``: in MB)."""
    return BY_NAME[name].default


def shown(option: Option) -> bool:
    """Whether help shows the default of ``option``: a number, not a switch's or an unset one."""
    return not isinstance(option.kind, Flag) and isinstance(option.default, (int, float, str))


MEMORY_BYTES = default("max-memory") * MB  # the checks' memory budget unless --max-memory says otherwise
