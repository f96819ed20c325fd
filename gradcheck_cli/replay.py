"""The command that checks one result's case again, made at the edge (the CLI, the pytest plugin):
the core records what was checked; the front ends know what their users type."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional, Union

from .plan import Task, task_id
from .results import CaseResult
from .spec import SpecError


def command(task: Task, seed: int) -> Optional[str]:
    """``gradcheck SPEC -k CASE`` with the seed (where it is not the spec's) and the command line's
    device, check and --strict overrides; None when the case has no spec file to rerun."""
    case = task.case
    if not Path(case.path).is_file():
        return None
    text = f"gradcheck {shlex.quote(case.path)} -k {shlex.quote(case.name)}"
    if seed != case.seed:
        text += f" --seed {seed}"
    if task.opts.devices is not None:
        text += f" --device {task.device}"
    if task.opts.strict:
        text += " --strict"
    if not task.opts.compress:
        text += " --no-compress"
    if task.opts.all_checks:
        text += " --check all"
    elif task.opts.checks is not None:
        text += "".join(f" --check {name}" for name in task.opts.checks)
    return text


def attach(results: list[CaseResult], planned: list[Union[Task, SpecError]]) -> None:
    """Give each result of a planned task its replay command."""
    tasks = {task_id(t): t for t in planned if isinstance(t, Task)}
    for result in results:
        task = tasks.get(result.id)
        if task is not None:
            result.replay = command(task, result.seed)
