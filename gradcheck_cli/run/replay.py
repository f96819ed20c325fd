"""The command that checks one result's case again, made at the edge (the CLI, the pytest plugin):
the core records what was checked; the front ends know what their users type."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

from ..core.options import FIELDS, OPTIONS, Flag
from ..results import CaseResult
from ..spec import SpecError
from ..subject.overrides import described
from .plan import Task, task_id

INLINE = "<command line>"  # the path of a case made of a command line's inline inputs (discovery.inline_case)


def command(
    task: Task,
    seed: int,
    inline: Sequence[str] = (),
    shapes: Optional[dict[str, list[int]]] = None,
    values: Optional[dict[str, str]] = None,
) -> Optional[str]:
    """``gradcheck SPEC -k CASE`` with the seed (where it is not the spec's) and the command line's
    device and check overrides, and the options that ``core.options`` marks ``replay`` (--max-memory,
    --probes, --strict, --no-compress) where they are not their defaults; for a case made
    of inline inputs, ``gradcheck FUNCTION`` with ``inline`` (its -i and --kwarg options, as typed) and
    the --import and --reference it needs; with the --shape and --values of the run and ``shapes`` and
    ``values`` (a shrunk case's: argument -> shape, argument -> kind); None when the case has neither a spec
    file nor its inline options to rerun."""
    case = task.case
    if case.path == INLINE and inline:
        text = f"gradcheck {shlex.quote(case.function)} {' '.join(shlex.quote(t) for t in inline)}"
        text += "".join(f" --import {shlex.quote(m)}" for m in task.opts.imports)
        if task.opts.reference is not None:
            text += f" --reference {shlex.quote(task.opts.reference)}"
    elif Path(case.path).is_file():
        text = f"gradcheck {shlex.quote(case.path)} -k {shlex.quote(case.name)}"
    else:
        return None
    if seed != case.seed:
        text += f" --seed {seed}"
    if task.opts.devices is not None:
        text += f" --device {task.device}"
    if task.opts.all_checks:
        text += " --check all"
    elif task.opts.checks is not None:
        text += "".join(f" --check {name}" for name in task.opts.checks)
    for option in (o for o in OPTIONS if o.replay):  # the rest that a task's options set, as core.options marks them
        value = getattr(task.opts, option.field)
        if value != FIELDS[option.field].default:
            text += f" --{option.name}" if isinstance(option.kind, Flag) else f" --{option.name} {value}"
    given = {name: list(shape) for name, shape in task.opts.shapes} | (shapes or {})
    text += "".join(f" --shape {shlex.quote(f'{name}={described(shape)}')}" for name, shape in given.items())
    simpler = dict(task.opts.values) | (values or {})
    text += "".join(f" --values {shlex.quote(f'{name}={kind}')}" for name, kind in simpler.items())
    return text


def attach(results: list[CaseResult], planned: list[Union[Task, SpecError]], inline: Sequence[str] = ()) -> None:
    """Give each result of a planned task its replay command (``inline``: the command line's -i and --kwarg
    options, as typed, for a case made of them)."""
    tasks = {task_id(t): t for t in planned if isinstance(t, Task)}
    for result in results:
        task = tasks.get(result.id)
        if task is not None:
            result.replay = command(task, result.seed, inline)
            if result.shrunk is not None:
                shrunk = result.shrunk
                shrunk.replay = command(task, shrunk.seed, inline, shrunk.shapes, shrunk.values)
