"""gradcheck-cli: check the hand-written backward of custom autograd Functions.

The library API is :func:`check` (its result is true only when it passed),
:func:`assert_gradients` and :func:`check_spec` (spec files, as the command line checks them);
the command line is ``gradcheck`` (see ``gradcheck --help``).
Importing this package does not import torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from .core.options import DEFAULT_TIMEOUT, FAST_PROBES  # --fast's probes; --timeout's seconds
from .core.options import default as _default
from .version import __version__

if TYPE_CHECKING:
    from .results import CaseResult, Report

__all__ = ["DEFAULT_TIMEOUT", "FAST_PROBES", "__version__", "assert_gradients", "check", "check_spec"]


def check(
    fn: Any,
    args: Sequence[Any],
    kwargs: Optional[dict[str, Any]] = None,
    *,
    checks: Optional[Sequence[str]] = None,
    device: Optional[str] = None,
    devices: Sequence[str] = (),
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    nondet_tol: float = 0.0,
    seed: int = 0,
    probes: int = _default("probes"),
    fast: bool = False,
    repeat: int = 3,
    order: int = 2,
    max_memory: Optional[int] = None,
    memory_bytes: Optional[int] = None,
    strict: bool = False,
    reference: Any = None,
    reference_backward: Any = None,
    reference_dtype: str = "float64",
    reference_tolerance: Optional[dict[str, Any]] = None,
    compress: bool = True,
) -> CaseResult:
    """Check ``fn`` (an autograd.Function class, a custom op or any callable) at ``args`` with the named
    ``checks`` (default: backward, or reference when a reference is given; any of
    ``gradcheck_cli.checks.NAMES``, or ``"all"``).

    ``kwargs`` are bound to forward's signature by name. ``device`` moves the tensor arguments
    there first (default: where they are); ``devices`` lists the devices ``device_consistency``
    compares (the first is the reference). Tolerances default to torch.autograd.gradcheck's.
    ``probes > 0`` decides with that many random probes first and compares element by element
    only the arguments where one fails (``fast=True``: 3 probes, as ``--fast`` and ``check_spec``'s
    ``fast``). ``max_memory`` (MB, as ``--max-memory`` and ``check_spec``'s ``max_memory``; or
    ``memory_bytes`` in bytes) bounds the Jacobian held at once. ``strict`` fails a constant factor within the tolerance
    (e.g. 1.001x) that is well beyond the finite differences' own error (else a warning). ``order``
    (2 to 6, as the spec's ``order:``) is the order of the derivative ``double_backward`` and
    ``forward_over_reverse`` check.
    ``reference`` (a plain PyTorch implementation with fn's signature) and ``reference_backward``
    (``f(inputs, grad_outputs) -> gradients``, the intended ones) are what the reference check
    compares with, in ``reference_dtype``, by ``reference_tolerance`` (``{"rule": "relative",
    "factor": 2.0, "atol": ...}`` or ``{"rule": "allclose", "atol": ..., "rtol": ...}``).
    Returns a CaseResult: ``.status`` is a Status,
    ``.checks`` one CheckResult per check with one ``InputReport`` per argument; it is true
    only when it passed (``assert check(fn, args)``), and ``str()`` of it is the per-argument
    table. Never raises for errors in ``fn``: they come back as ``.error``. ``compress=False`` takes
    every column of the numerical Jacobian on its own (slower, the same verdicts).
    """
    import torch

    from .api_arguments import refuse_unusable
    from .checks import NAMES
    from .checks.parts.base import CheckContext, Options
    from .core.options import MEMORY_BYTES
    from .numerics.streams import Streams
    from .reporters import display  # noqa: F401  (the result shows itself as the reporters draw it)
    from .results import CaseResult, CheckResult, Status
    from .run import runner
    from .sandbox.state_guard import GUARD
    from .spec import REFERENCE_DTYPES, ReferenceRule, Tolerance
    from .subject.binding import bind
    from .subject.custom_op import as_op, vmap_fallback_quiet
    from .subject.devices import device_problem
    from .subject.oracle import Oracle
    from .subject.target import Target

    if checks is None:
        checks = ("reference",) if reference is not None or reference_backward is not None else ("backward",)
    checks = [checks] if isinstance(checks, str) else checks
    names = list(NAMES) if list(checks) == ["all"] else list(checks)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}; known checks: {', '.join(NAMES)}, or 'all'")
    is_function = isinstance(fn, type) and issubclass(fn, torch.autograd.Function)
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    target = as_op(fn, getattr(fn, "_qualname", None) or str(fn)) or Target(name, fn, is_function)
    result = CaseResult(id=name, spec=None, case=None, function=name, device="", seed=seed, status=Status.PASS)
    default = Tolerance()
    given = tuple(k for k, v in (("eps", eps), ("atol", atol), ("rtol", rtol)) if v != getattr(default, k))
    if reference_dtype not in REFERENCE_DTYPES:
        raise ValueError(f"reference_dtype {reference_dtype!r}: use one of {', '.join(REFERENCE_DTYPES)}")
    tolerance = Tolerance(
        eps, atol, rtol, nondet_tol, given, strict, ReferenceRule(**(reference_tolerance or {})), prefix=""
    )
    oracle = None
    if reference is not None or reference_backward is not None:
        ref = (
            None
            if reference is None
            else Target(
                f"{getattr(reference, '__module__', '')}.{getattr(reference, '__qualname__', repr(reference))}",
                reference,
                isinstance(reference, type) and issubclass(reference, torch.autograd.Function),
            )
        )
        oracle = Oracle(
            getattr(torch, reference_dtype),
            ref,
            ref,
            reference_backward,
            ref.path if ref else None,
            getattr(reference_backward, "__qualname__", None),
        )
    if type(order) is not int or not 2 <= order <= 6:
        raise ValueError(f"order {order!r}: the order of the derivative checked is an integer from 2 to 6")
    if max_memory is not None and memory_bytes is not None:
        raise ValueError("give max_memory (MB) or memory_bytes, not both")
    memory = max_memory * 2**20 if max_memory is not None else memory_bytes
    opts = Options(tolerance, memory or MEMORY_BYTES, FAST_PROBES if fast and not probes else probes, compress)

    streams = Streams(seed)  # every draw of the checks, and the state every forward starts from
    given_values = [*args, *(kwargs or {}).values()]

    def on(where: Optional[str]) -> Any:
        """The arguments bound, moved to ``where`` first (a tensor passed twice stays one tensor)."""
        copies: dict[int, Any] = {}
        values = (
            given_values
            if where is None
            else [
                copies.setdefault(id(v), v.detach().to(where).requires_grad_(v.requires_grad))
                if isinstance(v, torch.Tensor)
                else v
                for v in given_values
            ]
        )
        bound = bind(target, [(None, a) for a in values[: len(args)]], list(zip(kwargs or {}, values[len(args) :])))
        bound.streams = streams
        return bound

    def body(result: CaseResult) -> None:
        refuse_unusable(
            eps=eps,
            atol=atol,
            rtol=rtol,
            nondet_tol=nondet_tol,
            seed=seed,
            repeat=repeat,
            probes=probes,
            device=device,
            other_devices=tuple(devices),
        )
        problem = device_problem(device) if device is not None else None
        if problem:  # as a spec's case on a device this machine lacks
            result.checks = [CheckResult(n, Status.SKIP, message=problem) for n in names]
            return
        bound = on(device)
        here = [str(v.device) for v in bound.values if isinstance(v, torch.Tensor)]
        result.device = ",".join(sorted(set(here))) or "cpu"
        ctx = CheckContext(
            target,
            bound,
            device or (here[0] if here else "cpu"),
            opts,
            tuple(devices),
            on,
            named=list(checks) != ["all"],
            oracle=oracle,
            settings={"repeat": repeat, "order": order},
        )
        # what fn changes of the process's global state is put back and named, as between the command's cases
        with GUARD.preserved(result.warnings), vmap_fallback_quiet():
            result.checks.extend(runner.run_check(n, ctx) for n in names)

    return runner.guard(result, body)


def assert_gradients(
    fn: Any, args: Sequence[Any], kwargs: Optional[dict[str, Any]] = None, **options: Any
) -> CaseResult:
    """Like :func:`check` (same arguments and options), but raise AssertionError with the
    per-argument table unless every check passed (a skip or an error too: neither proves the
    gradients right). Returns the passing result, warnings included."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    result = check(fn, args, kwargs, **options)
    if not result:
        raise AssertionError(f"gradients of {result.function} not shown right ({result.status}):\n{result}")
    return result


Paths = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


def check_spec(
    paths: Paths,
    *,
    select: Optional[str] = None,
    specs_dir: Union[str, os.PathLike[str]] = "specs",
    checks: Sequence[str] = (),
    devices: Sequence[str] = (),
    seed: Optional[int] = None,
    trials: int = _default("trials"),
    fast: bool = False,
    probes: int = _default("probes"),
    strict: bool = False,
    reference: Optional[str] = None,
    imports: Sequence[str] = (),
    require_device: bool = False,
    max_memory: Optional[int] = None,
    compress: bool = True,
) -> Report:
    """Check spec files in this process, as ``gradcheck PATHS`` does: ``paths`` is a spec file, a folder of
    them (recursively) or a Function's import path (its specs in ``specs_dir``), or a list of these.

    The options are the command line's: ``select`` (``-k``), ``checks`` (``--check``, or ``["all"]``),
    ``devices`` (``--device``), ``seed``, ``trials``, ``fast`` / ``probes``, ``strict``, ``reference``,
    ``imports`` (``--import``), ``require_device``, ``max_memory`` (MB) and ``compress`` (``--no-compress``
    is ``compress=False``). Returns the Report: ``.results``
    one CaseResult per (spec, case, device) with its replay command, ``.exit_code()`` what the command
    would exit with; in a notebook it shows as the HTML report. A broken spec or Function is an error
    result, as on the command line; ValueError for options or paths that name nothing to check.
    """
    from pathlib import Path

    from .checks import NAMES
    from .reporters import display  # noqa: F401  (the report shows itself as the reporters draw it)
    from .run import plan, replay, runner
    from .run.discovery import TargetError, collect
    from .spec import is_device, is_import_path, is_module_name

    targets = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    bad = (
        [
            f"checks: unknown check {c!r}; known checks: {', '.join(NAMES)}, or 'all'"
            for c in checks
            if c not in NAMES and list(checks) != ["all"]
        ]
        + [f"devices: expected cpu, cuda or cuda:N, got {d!r}" for d in devices if not is_device(d)]
        + [f"imports: expected a module name like 'my_pkg.ops', got {m!r}" for m in imports if not is_module_name(m)]
        + (
            [f"reference: expected an import path like 'pkg.mod:fn', got {reference!r}"]
            if reference is not None and not is_import_path(reference)
            else []
        )
    )
    if bad:
        raise ValueError(bad[0])
    try:
        items = collect(targets, Path(specs_dir), [], [], select, f"select={select!r}")
    except TargetError as exc:
        raise ValueError(str(exc)) from exc
    opts = plan.run_options(
        max_memory_mb=max_memory,
        seed=seed,
        trials=trials,
        devices=tuple(devices),
        checks=tuple(checks),
        probes=FAST_PROBES if fast else probes,
        strict=strict,
        reference=reference,
        require_device=require_device,
        imports=tuple(imports),
        compress=compress,
    )
    report = runner.run_all(items, opts)
    replay.attach(report.results, plan.expand(items, opts))
    return report
