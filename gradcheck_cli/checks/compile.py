"""The ``compile`` check: gradients under ``torch.compile`` against eager, on the same inputs and
grad_outputs.

Two compiled paths, each against eager autograd (one forward and one ``autograd.grad``):

- ``backward``: ``torch.compile(fn)`` called on leaves, differentiated with ``autograd.grad`` (what
  ``loss.backward()`` of a compiled model runs: AOTAutograd's compiled backward);
- ``torch.func.vjp``: ``torch.compile`` of ``torch.func.vjp(fn, ...)`` applied to the grad_outputs (a
  transform traced whole: ``torch.compile(torch.func.grad(loss))`` is the vjp of a scalar loss).

Forward outputs are compared too. Backend ``aot_eager`` (default) runs the same kernels as eager, so
float64 results agree to rounding; ``inductor`` generates code, and gets torch.testing.assert_close's
per-dtype tolerances. A forward that draws random numbers draws different ones when compiled by a
backend with its own RNG (inductor): that is a skip ("RNG differs"), not a wrong gradient. Graph
breaks are warnings, with their reasons. Eager and compiled runs get fresh leaves, and a module's buffers
as built; a difference is reported only when a second run on fresh copies shows it again.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from ..core.tolerance import ReferenceRule
from ..numerics import as_tuple
from ..results import CheckResult, InputReport, Pattern, Status
from ..sandbox.errors import UserCodeError
from ..subject.binding import Bound
from ..subject.nn_module import ModuleTarget, call_with, restore_buffers
from ..subject.target import Target
from .parts import compile_blame as blame
from .parts.base import CheckContext, call_forward, differentiable, draws_random, fresh_leaves, probe_like
from .parts.diagnosis import ratio_text
from .parts.sides import compare, gradients, output_row, side
from .parts.verdict import begin, conclude, skip, unsupported

STREAM = 31  # the random stream of the compile check's grad_outputs (a seed replays it)

VJP = blame.VJP
# logger -> its level while compiling; fake_tensor's traceback of a failing fake kernel: the check's message says it
QUIET = {
    "torch._dynamo": logging.ERROR,
    "torch._inductor": logging.ERROR,
    "torch._subclasses.fake_tensor": logging.CRITICAL,
}
_PATCHED = ("__init__", "__setstate__", "___needs_generation_tag_patch")  # what dynamo patches on nn.Module
_MISSING = object()
_GUARD_PROFILE = "profile_guard_manager"  # torch._dynamo.guards times every guard it builds, for its logs
BREAKS_SHOWN = 3  # graph-break reasons named in the warning


@dataclass(frozen=True)
class Settings:
    """The spec's ``compile: {backend, atol, rtol}`` (``x-check: compile`` in the schema): torch.compile's
    backend, and the rule compiled is compared with eager by (allclose; per dtype where not given)."""

    backend: str = "aot_eager"
    rule: ReferenceRule = field(default_factory=lambda: ReferenceRule("allclose"))

    @classmethod
    def of(cls, ctx: CheckContext) -> Settings:
        given = ctx.settings.get("compile") or {}
        rule = ReferenceRule("allclose", atol=given.get("atol"), rtol=given.get("rtol"))
        return cls(given.get("backend") or cls.backend, rule)


class _Calls(Target):
    """A callable of all the bound values (module parameters included), called as a target is; a module
    target's buffers are put back as built after every call, outside the compiled code too."""

    def __init__(self, path: str, fn: Callable[..., Any], of: Optional[Target] = None) -> None:
        super().__init__(path, fn, False)
        self.of = of

    def call(self, values: Sequence[Any], n_positional: int, kw_names: list[str]) -> Any:
        try:
            return self.obj(*values)
        finally:
            if isinstance(self.of, ModuleTarget):
                for buffers in self.of.buffers.values():
                    restore_buffers(buffers)


def run(ctx: CheckContext) -> CheckResult:
    """``compile``: outputs and gradients of the compiled target against eager. A difference is
    confirmed by a second run on fresh copies (inputs, parameters and buffers as built, a fresh
    torch.compile) before it is reported."""
    start = time.perf_counter()
    missing = _unavailable()
    if missing:
        result = begin(ctx.bound, "compile", Settings.of(ctx).backend)[3]
        return skip(result, f"torch.compile is not available here: {missing}", start)
    first = _attempt(ctx)
    if not any(r.status is Status.FAIL for r in first.inputs):
        return first  # passed, skipped, or torch.compile refused it: no difference to confirm
    second = _attempt(ctx)
    second.duration_s = time.perf_counter() - start
    if any(r.status is Status.FAIL for r in second.inputs):
        second.message += "; confirmed by a second run on fresh copies"
        return second
    outcome = "agreed" if second.status is Status.PASS else f"ended {second.status.value} ({second.message})"
    second.warnings.append(
        f"a first run under torch.compile differed from eager ({first.message}), a second run on "
        f"fresh copies (inputs, parameters and buffers as built, a fresh torch.compile) {outcome}: "
        "the difference is not reproducible, so it is not reported"
    )
    return second


def _attempt(ctx: CheckContext) -> CheckResult:
    """One comparison of the compiled target with eager, on fresh leaves and buffers as built."""
    target, bound = ctx.target, ctx.bound
    settings = Settings.of(ctx)
    backend = settings.backend
    start, rows, checked, result = begin(bound, "compile", backend)
    changed: list[str] = []
    with _in_place_buffers(target, changed):
        eager = side(target, bound, bound.values, checked, "forward")
    positions = differentiable(eager.outputs)
    gen = ctx.streams.generator(STREAM)
    probes = {p: probe_like(eager.outputs[p], gen) for p in positions}
    eager.grads = gradients(eager, probes, "backward")
    rule = settings.rule
    breaks: dict[str, int] = {}
    n, kw = bound.n_positional, bound.kw_names
    call = _traced(target)
    plain = lambda *values: call(_copied(values) if bound.clone_inputs else values, n, kw)  # noqa: E731
    try:
        with _compiling(breaks):
            compiled = side(
                _Calls(target.path, torch.compile(plain, backend=backend), target),
                bound,
                bound.values,
                checked,
                f"torch.compile(forward, backend={backend!r})",
            )
            outs = [output_row(p, compiled.outputs, eager.outputs, None, rule) for p in range(len(eager.outputs))]
            for r in outs:
                r.diagnosis = _words(r, ["forward"]) if r.status is Status.FAIL else None
            if any(r.status is Status.FAIL for r in outs) and draws_random(target, bound, eager.outputs):
                result.warnings += _break_notes(breaks)
                return skip(
                    result,
                    f"RNG differs: forward draws random numbers (its outputs change with the seed) "
                    f"and the code torch.compile (backend {backend!r}) makes draws other ones, so its "
                    "outputs and gradients cannot be compared with eager's",
                    start,
                )
            compiled.grads = gradients(compiled, probes, f"backward of torch.compile(forward, backend={backend!r})")
    except UserCodeError as exc:
        result.warnings += _break_notes(breaks)
        return unsupported(
            result, f"torch.compile (backend {backend!r}) failed on it: {_first_line(exc)}", start, ctx.named
        )
    paths = ["backward"]
    via_vjp, vjp_note, eager_vjp = _vjp_path(target, bound, checked, positions, probes, backend, eager.grads, breaks)
    if via_vjp is not None:
        paths.append(VJP)
    only_vjp = []  # the arguments where compiled torch.func.vjp alone differs, and eager torch.func.vjp agrees
    own = False  # an argument's compiled autograd.grad differs: the Function's (or module's) own code
    for k, i in enumerate(checked):
        failing = _against(
            rows[i], {"backward": compiled.grads[k], **({VJP: via_vjp[k]} if via_vjp else {})}, eager.grads[k], rule
        )
        if failing == [VJP] and eager_vjp is not None and blame.agrees(eager_vjp[k], eager.grads[k], rows[i], rule):
            only_vjp.append(k)
        own = own or "backward" in failing
    divergence = _divergence(target, bound, checked, positions, probes, rows, only_vjp, via_vjp, rule, backend)
    rows += outs
    result.mode = f"{backend}: {', '.join(paths)}"
    result.warnings += _break_notes(breaks)
    notes = [_buffer_hazard(changed)] if changed and any(r.status is Status.FAIL for r in rows) else []
    notes += [blame.OWN] if own and not notes else []
    notes += [vjp_note] if vjp_note else []
    notes += [divergence] if divergence else []
    return conclude(
        result,
        start,
        [],
        _wrong,
        lambda right: _passed(right, backend, paths),
        name_right=False,
        nothing="nothing to compare: no argument requires grad and no output",
        notes=notes,
    )


def _divergence(
    target: Target,
    bound: Bound,
    checked: list[int],
    positions: list[int],
    probes: dict[int, torch.Tensor],
    rows: list[InputReport],
    only_vjp: list[int],
    via_vjp: Any,
    rule: ReferenceRule,
    backend: str,
) -> str:
    """The words saying that the arguments ``only_vjp`` (indices into ``checked``) differ by torch.compile's
    doing on the torch.func.vjp path (``compile_blame``), or ''."""
    if not only_vjp:
        return ""
    own = blame.own_operations(target, bound, checked, positions, probes)
    dropped = own is not None and all(blame.agrees(via_vjp[k], own[k], rows[checked[k]], rule) for k in only_vjp)
    return blame.divergence([rows[checked[k]] for k in only_vjp], dropped, backend)


def _buffer_hazard(names: list[str]) -> str:
    """What a forward that changes buffers in place risks under torch.compile, and the fix."""
    shown = ", ".join(f"'{n}'" for n in names)
    many = len(names) != 1
    return (
        f"forward changes buffer{'s' * many} {shown} in place: the backward torch.compile makes may read "
        f"{'them' if many else 'it'} as forward left {'them' if many else 'it'}, eager's reads the values "
        f"forward used; assign the new values instead (`self.{names[0].rpartition('.')[2]} = ...` under "
        "torch.no_grad()), which compiled and eager code differentiate alike"
    )


@contextmanager
def _in_place_buffers(target: Target, changed: list[str]) -> Iterator[None]:
    """Adds to ``changed`` the module's buffers that the body changed in place (not those it assigned anew)."""
    if not isinstance(target, ModuleTarget) or target.module is None:
        yield
        return
    seen = [(name, b, b._version) for module, _ in target.copies.values() for name, b in module.named_buffers()]
    try:
        yield
    finally:
        changed.extend(dict.fromkeys(name for name, b, v in seen if b._version != v and name not in changed))


def _traced(target: Target) -> Callable[[Sequence[Any], int, list[str]], Any]:
    """The target's call as torch.compile is to trace it: a module's without the bookkeeping of its buffers
    (``_Calls`` puts them back after each call, outside the compiled code)."""
    if not isinstance(target, ModuleTarget):
        return target.call

    def call(values: Sequence[Any], n_positional: int, kw_names: list[str]) -> Any:
        split = n_positional + len(kw_names)
        params = values[split:]
        module, slots = target.on(str(params[0].device) if params else None)
        return call_with(
            module, slots, list(params), list(values[:n_positional]), dict(zip(kw_names, values[n_positional:split]))
        )

    return call


def _copied(values: Sequence[Any]) -> list[Any]:
    """An in-place target's arguments (lists and dicts of tensors included) as copies made inside the
    compiled code, aliasing kept: as it is called in a model, on a tensor the compiled graph made, not on
    one of the graph's own inputs (dynamo treats a mutated graph input as a change to the caller's tensor)."""
    made: dict[int, Any] = {}

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return made.setdefault(id(v), v.clone())
        if isinstance(v, (list, tuple)):
            return type(v)(copy(x) for x in v)
        if isinstance(v, dict):
            return {k: copy(x) for k, x in v.items()}
        return v

    return [copy(v) for v in values]


def _vjp_path(
    target: Target,
    bound: Bound,
    checked: list[int],
    positions: list[int],
    probes: dict[int, torch.Tensor],
    backend: str,
    want: list[torch.Tensor],
    breaks: dict[str, int],
) -> tuple[Any, str, Optional[list[torch.Tensor]]]:
    """The gradients from ``torch.compile(torch.func.vjp(...))``, or None and why that path was not run
    (torch.func cannot run the target eagerly: an autograd.Function without ``setup_context``); and those
    of eager ``torch.func.vjp`` (None where it did not run)."""
    if not checked or not positions:
        return None, "", None
    n, kw = bound.n_positional, bound.kw_names
    cotangents = tuple(probes[p] for p in positions)
    call = _traced(target)

    def pulled(*arguments: Any) -> Any:
        values = bound.flatten(arguments)  # one per leaf of a list or dict argument

        def f(*xs: Any) -> tuple[Any, ...]:
            full = list(values)
            for i, x in zip(checked, xs):
                full[i] = x
            outs = as_tuple(call(bound.assemble(full), n, kw))
            return tuple(outs[p] for p in positions)

        pull = torch.func.vjp(f, *(values[i] for i in checked))[1]
        return pull(cotangents)

    values = fresh_leaves(bound.values, grad=False)

    def grads(got: tuple[Any, ...]) -> list[torch.Tensor]:
        return [g.detach() if isinstance(g, torch.Tensor) else torch.zeros_like(w) for g, w in zip(got, want)]

    try:
        eager = grads(as_tuple(call_forward(_Calls(target.path, pulled, target), bound, values, what=f"{VJP} (eager)")))
    except UserCodeError as exc:
        return None, f"{VJP} not compared: it cannot run eagerly ({_first_line(exc)})", None
    try:
        with _compiling(breaks):
            fn = _Calls(target.path, torch.compile(pulled, backend=backend), target)
            got = as_tuple(call_forward(fn, bound, values, what=f"torch.compile({VJP}, backend={backend!r})"))
    except UserCodeError as exc:
        why = f"{VJP} not compared: torch.compile (backend {backend!r}) failed on it: {_first_line(exc)}"
        return None, why, eager
    return grads(got), "", eager


def _against(row: InputReport, got: dict[str, torch.Tensor], want: torch.Tensor, rule: ReferenceRule) -> list[str]:
    """Fill ``row`` with the worst of the compiled paths' gradients (path -> gradient) against eager's;
    a failing path is named in the diagnosis. Returns the failing paths."""
    filled = []
    for path, g in got.items():
        trial = replace(row)
        compare(trial, g, want, None, rule, "gradient")
        filled.append((path, trial))
    failing = [(p, r) for p, r in filled if r.status is Status.FAIL]
    path, worst = failing[0] if failing else max(filled, key=lambda pr: pr[1].max_abs_err or 0.0)
    worst.diagnosis = _words(worst, [p for p, _ in failing]) if failing else None
    row.__dict__.update(worst.__dict__)
    return [p for p, _ in failing]


def _words(row: InputReport, paths: list[str]) -> str:
    """A failing row's pattern, compiled (``paths``) against eager."""
    where = " and ".join(f"compiled {p}" for p in paths)
    noun = "output" if row.role == "output" else "gradient"
    if row.pattern is Pattern.ZERO_ANALYTICAL:
        what = "is all zeros, eager's is not"
    elif row.pattern is Pattern.ZERO_NUMERICAL:
        what = "is not zero, eager's is"
    elif row.pattern is Pattern.SIGN_FLIP:
        what = "has the opposite sign of eager's"
    elif row.pattern is Pattern.CONSTANT_RATIO and row.ratio is not None:
        what = f"is {ratio_text(row.ratio, 1e-2)} eager's"
    elif row.pattern is Pattern.SOME_ELEMENTS:
        what = f"differs from eager's in {row.mismatched} of {row.numel} elements"
    elif row.pattern is Pattern.NONFINITE:
        what = "has NaN or infinite values where eager's has none (or the reverse)"
    else:
        what = "differs from eager's"
    return f"{where}: its {noun} {what}"


def _wrong(row: InputReport) -> str:
    if row.role == "output":
        return f"{row.name}: {row.diagnosis}"
    return f"'{row.name}': {row.diagnosis}"


def _passed(right: list[InputReport], backend: str, paths: list[str]) -> str:
    grads = sum(r.role != "output" for r in right)
    outs = len(right) - grads
    parts = [f"{k} {w}{'s' * (k != 1)}" for k, w in ((grads, "gradient"), (outs, "output")) if k]
    return (
        f"{' and '.join(parts)} under torch.compile (backend {backend!r}; {', '.join(paths)}) "
        f"{'agrees' if len(right) == 1 else 'agree'} with eager"
    )


@contextmanager
def _compiling(breaks: dict[str, int]) -> Iterator[None]:
    """A fresh dynamo (no compiled code shared with another case or path) whose graph breaks are
    added to ``breaks`` (reason -> count) instead of logged; inductor compiles in this process (no
    pool of workers, which would end with the processes the code under test starts). What
    compiling changes in the process (dynamo's patch of nn.Module.__init__, inductor's recursion
    limit) is put back: it is the tool's doing, not the code under test's; dynamo's timing of its guards
    (a metric for its logs) is left out."""
    import torch._dynamo.guards as guards
    from torch._dynamo.utils import counters

    saved_env = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # read when inductor's config is first imported
    import torch._inductor.config as inductor_config

    module = torch.nn.Module
    patched = {name: vars(module).get(name, _MISSING) for name in _PATCHED}
    limit = sys.getrecursionlimit()
    loggers = {logging.getLogger(name): level for name, level in QUIET.items()}
    levels = [logger.level for logger in loggers]
    for logger, level in loggers.items():
        logger.setLevel(level)
    torch._dynamo.reset()
    counters.clear()
    profile = getattr(guards, _GUARD_PROFILE, None)  # absent from other versions of torch: nothing to leave out
    if profile is not None:
        setattr(guards, _GUARD_PROFILE, _no_guard_profile)
    try:
        with inductor_config.patch(compile_threads=1), warnings.catch_warnings():
            # AOTAutograd traces backward in anomaly mode: its "Error detected in ..." of a failure the message says
            warnings.filterwarnings("ignore", message="Error detected in", category=UserWarning)
            yield
    finally:
        if profile is not None:
            setattr(guards, _GUARD_PROFILE, profile)
        for reason, count in counters["graph_break"].items():
            breaks[str(reason)] = breaks.get(str(reason), 0) + int(count)
        torch._dynamo.reset()
        counters.clear()
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        sys.setrecursionlimit(limit)
        for name, value in patched.items():
            if value is _MISSING:
                if name in vars(module):
                    delattr(module, name)
            else:
                setattr(module, name, value)
        if saved_env is None:
            os.environ.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
        else:
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = saved_env


def _no_guard_profile(*_: Any) -> float:
    """Dynamo times each new guard for its logs (a cache flush and a run, per compiled frame): a metric that
    no verdict reads, replaced while the check compiles."""
    return 0.0


def _break_notes(breaks: dict[str, int]) -> list[str]:
    """A warning naming the graph breaks and their reasons, if any."""
    if not breaks:
        return []
    total = sum(breaks.values())
    shown = "; ".join(_short(r) for r in list(breaks)[:BREAKS_SHOWN])
    more = f"; and {len(breaks) - BREAKS_SHOWN} more" if len(breaks) > BREAKS_SHOWN else ""
    return [
        f"torch.compile broke the graph {total} time{'s' * (total != 1)} (each break runs eagerly between "
        f"compiled pieces): {shown}{more}"
    ]


def _short(text: str, limit: int = 200) -> str:
    line = " ".join(text.split()).split(" Explanation:")[0]  # dynamo's reasons go on with advice
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return _short(text.splitlines()[0] if text else type(exc).__name__, 300)


def _unavailable() -> str:
    """Why torch.compile cannot run here, or ''."""
    try:
        import torch._dynamo
    except Exception as exc:  # noqa: BLE001 - any import failure means no compile here
        return f"torch._dynamo cannot be imported ({type(exc).__name__}: {exc})"
    try:
        torch._dynamo.eval_frame.check_if_dynamo_supported()
    except RuntimeError as exc:
        return str(exc)
    return ""
