"""Spec cases -> checks -> results. User errors become error results; nothing is lost."""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Callable, Optional, Union

import torch

from .. import checks
from ..checks import noncontiguous
from ..checks.parts import broken, verdict
from ..checks.parts.base import CheckContext, Options
from ..core.options import MB
from ..core.rng import seed_plus
from ..distributed import check as distributed
from ..numerics import engine
from ..numerics.streams import Streams
from ..results import CaseResult, CheckResult, ErrorInfo, ErrorKind, Report, Shrunk, Status, overall
from ..sandbox import state_guard
from ..sandbox.errors import BindError, LoadError, UserCodeError, device_kind, guarded
from ..spec import Case, SpecError, TensorArg, ValueArg
from ..spec.settings import thawed
from ..subject import devices, inputs, loader, oracle, overrides
from ..subject.binding import Bound, bind, positional_labels
from ..subject.custom_op import vmap_fallback_quiet
from ..subject.devices import device_problem
from ..subject.nn_module import init_target
from ..subject.structured import symmetric_part
from ..subject.target import Target
from . import expectations, plan, shrink
from .plan import RunOptions, Task


class DeviceError(Exception):
    """A required device that is not available (--require-device)."""


RESAMPLES = 3  # extra draws with `resample: true`
RESAMPLE_STRIDE = 1_000_003  # resampled seeds stay clear of --trials' seed, seed + 1, ...


def warm_up() -> None:
    """Pay this process's one-time costs before its first case: the checks' modules, and what torch
    loads on the first ``vmap`` of a backward (functorch). Otherwise the first case of each worker
    carries them in its duration (and its timeout)."""
    for name in checks.NAMES:
        checks.get(name)
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    y = x * x

    def vjp(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return engine.grad(y, x, v, retain_graph=True)

    torch.func.vmap(vjp)(torch.eye(2, dtype=torch.float64))


def run_case(case: Case, device: str, opts: RunOptions = RunOptions()) -> CaseResult:
    """Check one case on one device."""
    return run_task(Task(case, device, opts))


def run_task(
    task: Task, reached: Optional[Callable[[CaseResult], None]] = None, disposable: bool = False
) -> CaseResult:
    """Check one task; with several trials, seeds seed, seed + 1, ... until one does not pass.

    ``reached(result)``, where given, is called with a failing case's result before it is shrunk, so that a
    worker process can send its verdict before an interrupt ends it mid-search. ``disposable``: this process
    is replaced before its next task where ``state_guard.GUARD.tainted()`` says so (a pool's worker), so a CUDA
    case's failure may be shrunk in it (see ``_shrunk``). A case that ends in a CUDA error taints the process
    (its GPU context is unusable): a worker that asks ``tainted()`` alone (``--watch``'s) is replaced too. A
    warning is shown once per case (``state_guard.warnings_once``).

    A process that the code under test forked and that returns from it ends here: it must not go on
    as a copy of the worker (or of pytest) and report a second time."""
    me, started = os.getpid(), time.perf_counter()
    try:
        with state_guard.warnings_once():  # a warning of the code under test once per case, not once per check
            result = _trials(task)
            _unusable(result, "a case")
            if task.opts.shrink > 0 and result.status is Status.FAIL:
                if reached is not None:
                    reached(result)
                try:
                    result.shrunk = _shrunk(task, result, started, disposable)
                except BaseException as exc:  # Ctrl-C or SIGTERM while shrinking: the run stops, the verdict stands
                    exc.verdict = result  # type: ignore[attr-defined]  # session reports it (verdict_of)
                    raise
        return result
    finally:
        if os.getpid() != me:
            os._exit(0)


def verdict_of(exc: BaseException) -> Optional[CaseResult]:
    """The result a case reached before an interrupt stopped it while shrinking (``run_task``), if any."""
    found = getattr(exc, "verdict", None)
    return found if isinstance(found, CaseResult) else None


def _trials(task: Task) -> CaseResult:
    trials = max(1, task.opts.trials)
    result = _resampled(task, task.seed)
    for t in range(1, trials):
        if result.status is not Status.PASS:
            break
        result = _resampled(task, seed_plus(task.seed, t))
        if result.status is not Status.PASS:
            result.warnings.append(
                f"seed {seed_plus(task.seed, t)} (trial {t + 1} of {trials}) did not pass; "
                f"seeds {task.seed}..{seed_plus(task.seed, t - 1)} passed"
            )
    return result


SHRINK_SHARE = 0.5  # of the case's --timeout, at most, that the case and its shrinking take together


def _shrunk(task: Task, result: CaseResult, started: float, disposable: bool = False) -> Optional[Shrunk]:
    """A smaller case that fails as ``result`` does (``shrink``), searched within --shrink's seconds and half
    the case's --timeout; each attempt checks the case as ``--seed SEED --shape NAME=DIMS --values NAME=KIND``
    would, running only the failing check (a case's verdict does not depend on which other checks run).

    A CUDA case's search runs in this process (a CUDA context is not forked), and only in a ``disposable`` one:
    an attempt that ends in a CUDA error leaves the device unusable here, so it ends the search and taints the
    process, which is then replaced before its next task (in a process that stays, the next cases would fail)."""
    case = task.case
    budget = task.opts.shrink
    if task.opts.timeout is not None:
        budget = min(budget, SHRINK_SHARE * task.opts.timeout - (time.perf_counter() - started))
    here = task.device != "cpu"
    if budget <= 0 or case.distributed is not None or (here and not disposable):
        return None
    try:
        args = overrides.tensor_args(case, _names(case, loader.load(case.function)))
    except Exception:  # noqa: BLE001 - it was loaded for the case; shrinking is information only
        return None
    start = shrink.State(
        {name: dict(task.opts.shapes).get(name, arg.shape or ()) for name, arg in args.items()},
        {name: kind for name, kind in task.opts.values if name in args},
    )
    allowed = {name: tuple(overrides.kinds(arg, case.dtype)) for name, arg in args.items()}
    how = shrink.failure(result)
    only = (how.check,) if how is not None and case.expect is None else case.checks  # `expect:` names its checks

    unusable: list[str] = []  # the CUDA error of an attempt, where one ended so

    def attempt(at: shrink.State) -> CaseResult:
        shapes, values = tuple(at.shapes.items()), tuple(at.values.items())
        opts = replace(task.opts, seed=result.seed, trials=1, shrink=0.0, shapes=shapes, values=values)
        got = _trials(Task(replace(case, checks=only), task.device, opts))
        # tainted at once: what ends the search after it (an interrupt) cannot skip it
        if not unusable and _unusable(got, "the search for a smaller failing case"):
            unusable.append(got.error.message if got.error else "")
        return got

    # a forked child must not enter the OpenMP thread pool of its parent (GNU OpenMP hangs there): one thread;
    # where a forked child cannot run backward (a GPU machine), or the case is on a GPU, the search runs here
    setup = lambda: torch.set_num_threads(1)  # noqa: E731
    fork = (lambda: False) if here else devices.forks_run_backward
    return shrink.shrunk(result, start, allowed, attempt, budget, setup=setup, fork=fork, stop=lambda: bool(unusable))


def _unusable(result: CaseResult, where: str) -> bool:
    """Whether ``result`` ended in a CUDA error, which leaves this process's GPU unusable; if so the process is
    tainted (``state_guard.GUARD``: a worker is replaced before its next task), saying it came ``where``."""
    if result.error is None or result.error.kind is not ErrorKind.CUDA:
        return False
    state_guard.GUARD.taint(f"a CUDA error in {where}: {result.error.message}")
    return True


def _names(case: Case, target: Target) -> list[str]:
    """The names of the case's positional arguments (as ``inputs.build`` knows them)."""
    return positional_labels([arg.name for arg in case.inputs], [p.name for p in target.parameters() or []])


def _resampled(task: Task, seed: int) -> CaseResult:
    """Check with ``seed``; with ``resample: true``, draw again while an input sits on a kink. Each attempt
    has its own random streams, made here once and handed down."""
    notes: list[str] = []
    for k in range(RESAMPLES + 1):
        streams = Streams(seed_plus(seed, k * RESAMPLE_STRIDE))
        drawn: set[str] = set()  # the arguments drawn at random (not literal data), which a new seed moves

        def body(r: CaseResult, streams: Streams = streams, drawn: set[str] = drawn) -> None:
            # what loading, initialising and binding change; after its last check _check runs no code under test
            with state_guard.GUARD.preserved(r.warnings, ends_with_block=True):
                _check(task.case, task.device, task.opts, r, drawn, streams)

        result = plan.new_result(task)
        result.seed = streams.seed  # this attempt's (a trial's or a redraw's); the seed goes no further up
        result = guard(result, body, where=_at(task.case))
        result.warnings[:0] = notes
        at = [f"'{row.name}'" for check in result.checks for row in check.inputs if row.at_kinks and row.name in drawn]
        if not (task.case.resample and at) or k == RESAMPLES:
            return result
        notes.append(
            f"seed {streams.seed} put {', '.join(dict.fromkeys(at))} on a kink, tie or domain edge: "
            f"drew again with seed {seed_plus(streams.seed, RESAMPLE_STRIDE)} (resample: true)"
        )
    raise AssertionError("unreachable: the last draw returns")


# torch's note when autograd's GPU thread, started by an earlier backward before CUDA was initialised, first
# calls cuBLAS ("Attempting to run cuBLAS, but there was no current CUDA context! Attempting to set the primary
# context..."): torch sets the context itself; it is about how this process started its threads, not the gradient
CONTEXT_NOTE = r"Attempting to run cuBLAS, but there was no current CUDA context"


def run_check(name: str, ctx: CheckContext) -> CheckResult:
    """Check ``name`` on ``ctx``; where its call of backward raised because backward breaks its contract,
    the backward check's fail in its words (the same whichever check meets it), else the error goes on."""
    empty = verdict.nothing_to_compare(ctx.bound, name)  # every argument that requires grad has no elements
    if empty is not None:
        return empty
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=CONTEXT_NOTE, category=UserWarning)
            return checks.get(name)(ctx)
    except UserCodeError as exc:
        failed = broken.instead_of_error(ctx, name, exc)
        if failed is None:
            raise
        return failed


def guard(result: CaseResult, body: Callable[[CaseResult], None], where: str = "") -> CaseResult:
    """Run ``body(result)`` (which appends checks to it); any failure to check becomes ``result.error``."""
    start = time.perf_counter()
    try:
        body(result)
    except SpecError as exc:
        result.error = ErrorInfo(ErrorKind.SPEC, str(exc))
    except LoadError as exc:
        result.error = ErrorInfo(ErrorKind.IMPORT, f"{where}: {exc.key}: {exc}" if where else str(exc), exc.where)
    except (BindError, inputs.InputError) as exc:
        result.error = ErrorInfo(ErrorKind.SPEC, f"{where}: {exc.key}: {exc}" if where else f"{exc.key}: {exc}")
    except UserCodeError as exc:
        result.error = ErrorInfo(exc.kind, str(exc), exc.where, list(exc.frames))
    except DeviceError as exc:
        result.error = ErrorInfo(ErrorKind.DEVICE, str(exc))
    except Exception as exc:  # noqa: BLE001 - a bug of ours is still one result, not a crash
        kind = device_kind(exc)  # an asynchronous GPU error can surface anywhere after its kernel
        result.error = (
            ErrorInfo(kind, f"{type(exc).__name__}: {exc}")
            if kind
            else ErrorInfo(
                ErrorKind.INTERNAL,
                f"internal error in gradcheck-cli: {type(exc).__name__}: {exc}",
                "".join(traceback.format_exception(exc)[-3:]).strip(),
            )
        )
    result.status = Status.ERROR if result.error else overall([c.status for c in result.checks])
    result.duration_s = time.perf_counter() - start
    return result


def _at(case: Case) -> str:
    return f"{case.path}:{case.line}" if case.line else case.path


def _check(case: Case, device: str, opts: RunOptions, result: CaseResult, drawn: set[str], streams: Streams) -> None:
    problem = device_problem(device)
    if problem and opts.require_device:
        raise DeviceError(f"{device} is required (--require-device) but not available: {problem}")
    if problem:
        result.checks = [CheckResult(name, Status.SKIP, message=problem) for name in case.checks]
        return
    names = [*opts.imports, *case.imports, case.function]
    # the global state an import sets is recorded when a module is new here; a module imported already needs
    # no snapshot (two per case, most of a small case's time)
    before = None if all(m in sys.modules for m in _modules(names)) else state_guard.snapshot()
    known = set(sys.modules)
    loader.import_modules(opts.imports, "--import")
    loader.import_modules(case.imports, "import")
    target = loader.load(case.function)
    _import_effects(names, set(sys.modules) - known, state_guard.changes(before) if before is not None else [])
    init_target(target, case.init_args, dict(case.init_kwargs), streams, case.dtype, device, case.init_mode)
    case = overrides.applied(case, _names(case, target), opts.shapes, opts.values)  # a shrunk case's replay
    if case.distributed is not None:  # across ranks that it starts (gradcheck_cli.distributed)
        distributed.run(target, case, device, lambda where, s: bind_case(target, case, where, s), streams, result)
        return
    bound = bind_case(target, case, device, streams)
    if not any(isinstance(v, torch.Tensor) and v.requires_grad for v in bound.values):
        raise BindError(
            "inputs",
            f"no argument is a tensor that requires grad, so there is no gradient to check, "
            f"and {case.function} was not called: give it a floating-point tensor argument "
            "(`shape: [...]`, which requires grad by default). A spec names code to import "
            "and run: review spec files as you review code",
        )
    chosen = case.checks_given and opts.checks is None  # the checks are the ones the spec's `checks:` lists
    expectations.validate(case.expect, bound.names, case.checks, chosen)
    drawn.update(name for i, name in enumerate(bound.names) if bound.drawn(i))
    options = Options(case.tolerance, opts.max_memory_mb * MB, opts.probes, opts.compress)
    ctx = CheckContext(
        target,
        bound,
        device,
        options,
        case.devices,
        lambda other: bind_case(target, case, other, streams),
        named=not case.all_checks,
        oracle=oracle.load(case, target, device, streams) if "reference" in case.checks else None,
        settings={key: thawed(value) for key, value in case.settings},
    )
    declined = plan.declined(case)
    running = [name for name in case.checks if name not in declined]
    relaid = any(isinstance(entry, TensorArg) and not entry.contiguous for entry in bound.entries)
    for name in case.checks:
        if name in declined:
            result.checks.append(not_run(bound, name, declined[name]))
            continue
        last = name == running[-1]
        # no check sees others' changes (GUARD); torch's notes on a layout `contiguous: false` made are not printed
        quiet = noncontiguous.layout_notes_quiet(relaid)
        with state_guard.GUARD.preserved(result.warnings, last=last), vmap_fallback_quiet(), quiet:
            check = run_check(name, ctx)
        if device.startswith("cuda"):  # surface asynchronous CUDA errors here, as this case's
            guarded(ErrorKind.CUDA, "a CUDA kernel", torch.cuda.synchronize, torch.device(device))
        result.checks.append(check)
    if bound.found_in_place:
        result.warnings.append(
            "forward changes an argument in place and returns it (ctx.mark_dirty): every check "
            "called it on copies of the arguments (`clone_inputs: true` in the spec says so)"
        )
    result.warnings += target.notes()
    expectations.apply(result, case.expect, bound.names, chosen)  # before guard() combines the checks' statuses


def not_run(bound: Bound, name: str, reason: str) -> CheckResult:
    """The result of check ``name`` that the case's spec does not let run (``plan.declined``): a skip with
    the reason, a row per argument that says it was not checked."""
    start, _, _, result = verdict.begin(bound, name, None)
    return verdict.skip(result, reason, start, row_reason="not judged under `all` (see the message)")


_IMPORTED: dict[str, state_guard.Snapshot] = {}  # module -> the global state its import set


def _import_effects(names: list[str], imported: set[str], effects: state_guard.Snapshot) -> None:
    """Global state set by importing the target's module or the modules of ``import`` (``names``: module
    names, then the target's import path; ``torch.set_default_dtype`` at module level) is set again for
    every later case of those modules in this process, as if each case imported them afresh; every case's
    changes are undone after it."""
    for name in imported:  # what the modules imported now set (nothing, perhaps: it replaces older records)
        _IMPORTED[name] = effects
    if not imported:
        for module in _modules(names):
            state_guard.apply(_IMPORTED.get(module, []))


def _modules(names: list[str]) -> list[str]:
    """The modules of ``names`` (module names, then the target's import path), once each."""
    function = names[-1]
    return list(
        dict.fromkeys(names[:-1] + [function.partition(":")[0] if ":" in function else function.rpartition(".")[0]])
    )


def bind_case(target: Target, case: Case, device: str, streams: Streams) -> Bound:
    """The case's arguments drawn from ``streams`` on ``device`` and bound to the target's signature,
    each carrying its spec entry."""
    positional, keywords = inputs.build(case, device, [p.name for p in target.parameters() or []], streams.inputs())
    bound = bind(target, positional, keywords, list(case.inputs) + [arg for _, arg in case.kwargs])
    bound.streams = streams
    for i, entry in enumerate(bound.entries):
        if isinstance(entry, ValueArg) and entry.imported:
            bound.values[i] = value = loader.load_object(entry.imported, f"{entry.key}.value.import")
            found = inputs.nonfinite(value) if isinstance(value, torch.Tensor) and value.requires_grad else None
            if found:
                raise BindError(
                    f"{entry.key}.value.import",
                    f"'{bound.names[i]}' requires grad and holds {found}: {inputs.NONFINITE_WHY}; return finite values",
                )
        if isinstance(entry, TensorArg) and entry.via:
            bound.via[i] = entry.via
            bound.transforms[i] = (
                loader.load_callable(entry.param, f"{entry.key}.param") if entry.param else symmetric_part
            )
        if isinstance(entry, TensorArg) and not entry.contiguous:  # `contiguous: false`: after `param:`, at the call
            bound.transforms[i] = _then_relaid(bound.transforms.get(i))
    bound.clone_inputs = True if case.clone_inputs else None  # None: the first forward finds out
    return bound


def _then_relaid(first: Optional[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """The value as the target gets it (``first``, the `param:` map, applied), laid out non-contiguous."""
    return lambda value: noncontiguous.relaid(first(value) if first else value)


def run_all(
    items: Iterable[Union[Case, SpecError]],
    opts: RunOptions = RunOptions(),
    on_result: Optional[Callable[[CaseResult], None]] = None,
) -> Report:
    """Check every case on every device it lists, in order, in this process; spec errors become
    error results."""
    start = time.perf_counter()
    results = []
    for item in plan.expand(list(items), opts):
        result = plan.spec_error_result(item) if isinstance(item, SpecError) else run_task(item)
        results.append(result)
        if on_result:
            on_result(result)
    return Report(results, time.perf_counter() - start)
