"""Spec cases -> checks -> results. User errors become error results; nothing is lost."""
from __future__ import annotations

import shlex
import time
from pathlib import Path
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Union

import torch

from . import inputs, loader
from .checks import UserCodeError, backward
from .results import CaseResult, CheckResult, ErrorInfo, Report, Status, overall
from .spec import Case, SpecError

IMPLEMENTED = {"backward": backward.run}


@dataclass(frozen=True)
class RunOptions:
    """Run-wide settings that the command line controls."""

    memory_bytes: int = backward.MEMORY_BYTES


def device_problem(device: str) -> Optional[str]:
    """Why ``device`` cannot be used here, or None when it can."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine (torch was built without CUDA or no GPU is visible)"
        if index and int(index) >= torch.cuda.device_count():
            return f"{device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
        return None
    if kind == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return "MPS is not available on this machine"
    return None


def run_case(case: Case, device: str, opts: RunOptions = RunOptions()) -> CaseResult:
    """Check one case on one device."""
    result = CaseResult(id=f"{case.name}[{device}]", spec=case.path, case=case.label, function=case.function,
                        device=device, seed=case.seed, status=Status.PASS, line=case.line, replay=replay(case))
    return guard(result, lambda: _check(case, device, opts, result), where=_at(case))


def replay(case: Case) -> Optional[str]:
    """A command that checks just this case again (same spec, same seed)."""
    if not Path(case.path).is_file():
        return None
    return f"gradcheck {shlex.quote(case.path)} -k {shlex.quote(case.name)}"


def guard(result: CaseResult, body: Callable[[], None], where: str = "") -> CaseResult:
    """Run ``body`` (which appends checks to ``result``); any failure to check becomes ``result.error``."""
    start = time.perf_counter()
    try:
        body()
    except SpecError as exc:
        result.error = ErrorInfo("spec", str(exc))
    except loader.LoadError as exc:
        result.error = ErrorInfo("import", f"{where}: function: {exc}" if where else str(exc), exc.where)
    except (loader.BindError, inputs.InputError) as exc:
        result.error = ErrorInfo("spec", f"{where}: {exc.key}: {exc}" if where else f"{exc.key}: {exc}")
    except UserCodeError as exc:
        result.error = ErrorInfo(exc.kind, str(exc), exc.where)
    except Exception as exc:  # noqa: BLE001 - a bug of ours is still one result, not a crash
        result.error = ErrorInfo("internal", f"internal error in gradcheck-cli: {type(exc).__name__}: {exc}",
                                 "".join(traceback.format_exception(exc)[-3:]).strip())
    result.status = Status.ERROR if result.error else overall([c.status for c in result.checks])
    result.duration_s = time.perf_counter() - start
    return result


def _at(case: Case) -> str:
    return f"{case.path}:{case.line}" if case.line else case.path


def _check(case: Case, device: str, opts: RunOptions, result: CaseResult) -> None:
    problem = device_problem(device)
    if problem:
        result.checks = [CheckResult(name, Status.SKIP, message=problem) for name in case.checks]
        return
    target = loader.load(case.function)
    params = target.parameters() or []
    positional, keywords = inputs.build(case, device, [p.name for p in params])
    bound = loader.bind(target, positional, keywords)
    for name in case.checks:
        run = IMPLEMENTED.get(name)
        if run is None:
            result.checks.append(CheckResult(name, Status.SKIP, message=f"the {name} check is not available "
                                                                        "in this version of gradcheck-cli"))
            continue
        check = run(target, bound, backward.Options(case.tolerance, case.seed, opts.memory_bytes))
        _spec_lines(check, case)
        result.checks.append(check)


def _spec_lines(check: CheckResult, case: Case) -> None:
    """Point each argument's row at its entry in the spec file (positional first, then kwargs by name)."""
    by_name = dict(case.kwargs)
    for row in check.inputs:
        arg = case.inputs[row.index] if row.index < len(case.inputs) else by_name.get(row.name)
        row.line = getattr(arg, "line", None)


def run_all(items: Iterable[Union[Case, SpecError]], opts: RunOptions = RunOptions(),
            on_result: Optional[Callable[[CaseResult], None]] = None) -> Report:
    """Check every case on every device it lists, in order; spec errors become error results."""
    start = time.perf_counter()
    results = []
    for item in items:
        batch = [spec_error_result(item)] if isinstance(item, SpecError) else [
            run_case(item, device, opts) for device in item.devices]
        for r in batch:
            results.append(r)
            if on_result:
                on_result(r)
    return Report(results, time.perf_counter() - start)


def spec_error_result(exc: SpecError) -> CaseResult:
    """An unusable spec document as an error result of its own."""
    return CaseResult(id=f"{exc.path}:{exc.line}" if exc.line else exc.path, spec=exc.path, case=None, function="", device="", seed=0,
                      status=Status.ERROR, error=ErrorInfo("spec", str(exc)), line=exc.line)
