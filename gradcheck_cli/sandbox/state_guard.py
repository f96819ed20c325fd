"""The process-wide state a case can change, saved before it and put back after it.

Workers are reused and the pytest plugin and ``--no-isolate`` check in one process, so a Function
that calls ``torch.set_grad_enabled(False)`` (or sets the default dtype, changes the working
directory, monkeypatches ``torch.nn.functional.relu``, ...) would change the verdicts of the
cases after it. The process's one ``GUARD`` does it: ``GUARD.preserved()`` saves what torch and
Python expose (``snapshot``: every piece listed once, in ``_switches``), restores it afterwards and
says what the case changed; what cannot be put back is named too, and marks this process as
``GUARD.tainted()`` so that a pool worker is replaced before its next case.
"""

from __future__ import annotations

import operator
import os
import random
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from types import ModuleType
from typing import Any, Callable, Optional, Union

import torch

from . import processes, torch_state


def _same(a: Any, b: Any) -> bool:
    """Equal values, tensors and arrays included (a NaN-free comparison is enough for these states)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        equal = a == b
        return bool(equal.all()) if hasattr(equal, "all") else bool(equal)
    except Exception:  # noqa: BLE001 - values that cannot be compared: only the very same object is the same
        return a is b


@dataclass(frozen=True)
class Switch:
    """One piece of global state: how to read it, how to put it back (None: it cannot be), how to compare."""

    name: str
    get: Callable[[], Any]
    put: Optional[Callable[[Any], Any]]
    quiet: bool = False  # restored without a word: changing it is normal (random number generators)
    same: Callable[[Any, Any], bool] = _same
    show: Callable[[Any, Any], str] = lambda before, after: f" ({before} -> {after})"
    kept: Optional[Callable[[Any], bool]] = None  # a quick "still exactly ``before``", without reading it anew
    # what importing a module changed cannot be set again for its later cases: told this instead of recorded
    imported: Optional[Callable[[Any, Any], None]] = None


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _anomaly() -> tuple[bool, bool]:
    return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()


def _default_device() -> Optional[torch.device]:
    """The device torch.set_default_device set, None where none is set: not the same as "cpu" set, which is a
    device context every torch call goes through (torch.set_default_device(None) takes it away). Read from
    that context itself, not through torch.get_default_device, which looks at the function mode stack
    first: a vmap around the call can leave the context set with its mode gone, and then says "cpu"."""
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if context is None else getattr(context, "device", None)


def _device_name(device: Optional[torch.device]) -> str:
    return "none set" if device is None else str(device)


# A subnormal times one, and two normal numbers whose product is subnormal: 0.0 when the calling thread's
# floating-point unit treats subnormal inputs as zero (DAZ) or flushes subnormal results to zero (FTZ), the two
# flags torch.set_flush_denormal sets (Python's own float arithmetic runs on that unit, with those flags).
_SUBNORMAL, _ONE, _SMALL, _TINY = 1e-310, 1.0, 1e-300, 1e-10


def _flush_denormal() -> bool:
    """Whether torch.set_flush_denormal(True) (or any other setter of the same flags) holds for this thread:
    torch has no getter, so two multiplications tell."""
    return _SUBNORMAL * _ONE == 0.0 or _SMALL * _TINY == 0.0


_PRINT_FIELDS = ("precision", "threshold", "edgeitems", "linewidth", "sci_mode")
_PRINT_OPTS = torch._tensor_str.PRINT_OPTS  # torch.set_printoptions sets its fields; the object stays
_print_fields = operator.attrgetter(*_PRINT_FIELDS)


def _print_options() -> tuple[Any, ...]:
    return tuple(_print_fields(_PRINT_OPTS))


def _put_print_options(saved: tuple[Any, ...]) -> None:
    for field, value in zip(_PRINT_FIELDS, saved):
        setattr(_PRINT_OPTS, field, value)


def _show_print_options(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    return (
        " ("
        + ", ".join(f"{field} {old} -> {new}" for field, old, new in zip(_PRINT_FIELDS, before, after) if old != new)
        + ")"
    )


def _cudnn() -> tuple[bool, bool, bool, bool]:
    cudnn = torch.backends.cudnn
    return cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32


def _put_cudnn(saved: tuple[bool, bool, bool, bool]) -> None:
    cudnn = torch.backends.cudnn
    cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = saved


def _put_environ(saved: dict[str, str]) -> None:
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)


def _put_warnings(saved: list[Any]) -> None:
    warnings.filters[:] = saved  # type: ignore[index]  # a list at run time
    warnings._filters_mutated()  # type: ignore[attr-defined]  # what warnings.catch_warnings itself calls


def _pop_to(length: Callable[[], int], pop: Callable[[], Any]) -> Callable[[int], None]:
    def put(saved: int) -> None:
        while length() > saved:
            pop()

    return put


_CLASSES = {
    "torch.Tensor": torch.Tensor,
    "torch.nn.Module": torch.nn.Module,
    "torch.autograd.Function": torch.autograd.Function,
}


@dataclass(frozen=True)
class _Namespaces:
    """The namespaces of torch's modules and main classes as they were: the owners, how many names each
    held, then all their names and all the objects bound to them, flat. Two flat lists are quicker to take
    and to compare than ~770 dict copies, and give the garbage collector two objects instead of ~770."""

    owners: tuple[str, ...]
    sizes: list[int]
    names: list[Any]
    objects: list[Any]
    modules: int = 0  # len(sys.modules) then: equal now, no torch module was imported since (none is missing here)

    def by_owner(self) -> dict[str, dict[str, Any]]:
        out, start = {}, 0
        for owner, size in zip(self.owners, self.sizes):
            out[owner] = dict(zip(self.names[start : start + size], self.objects[start : start + size]))
            start += size
        return out


_values = operator.methodcaller("values")  # of a module's dict and of a class's mappingproxy alike


def _torch_namespaces() -> _Namespaces:
    """The namespace of torch's modules and main classes, by owner: what monkeypatching changes."""
    modules = list(sys.modules.items())
    owners: dict[str, Any] = {
        name: module
        for name, module in modules
        if (name == "torch" or name.startswith("torch.")) and module is not None
    }
    owners.update(_CLASSES)
    spaces = [vars(obj) for obj in owners.values()]
    return _Namespaces(
        tuple(owners),
        list(map(len, spaces)),
        list(chain.from_iterable(spaces)),
        list(chain.from_iterable(map(_values, spaces))),
        len(modules),
    )


def _namespaces_kept(before: _Namespaces) -> bool:
    """Every owner of ``before`` still holds the same names, in the same order, bound to the very same objects
    (``is``), or objects no user patches (torch's own counters and caches, which torch.compile rebinds as it
    works): then ``_replaced_names`` finds nothing, and no new copy of ~29,000 names is needed to say so
    (passes in C over the live namespaces; name by name only in an owner whose objects changed). False says
    only that a closer look is needed."""
    everything = {**sys.modules, **_CLASSES}
    try:
        spaces = [vars(everything[owner]) for owner in before.owners]
    except (KeyError, TypeError):  # an owner gone from sys.modules, or no longer a module
        return False
    if list(map(len, spaces)) != before.sizes or list(chain.from_iterable(spaces)) != before.names:
        return False
    if all(map(operator.is_, chain.from_iterable(map(_values, spaces)), before.objects)):
        return True
    start = 0
    for owner, space, size in zip(before.owners, spaces, before.sizes):
        objects = before.objects[start : start + size]
        if not all(map(operator.is_, space.values(), objects)):
            for name, old, new in zip(before.names[start : start + size], objects, space.values()):
                if new is not old and _patchable(owner, name, old) and not _wraps(new, old):
                    return False
        start += size
    return True


# names torch itself rebinds when a setting that has its own switch changes: torch.set_default_dtype (and
# torch.set_default_tensor_type) make torch.Storage the storage class of the new default dtype
_FOLLOWERS = frozenset({("torch", "Storage")})


def _patchable(owner: str, name: str, value: Any) -> bool:
    """A function a user could monkeypatch; torch keeps caches and flags of its own in the other names
    (private module globals, plain data, _FOLLOWERS), which change as torch works."""
    return (
        (owner in _CLASSES or not name.startswith("_"))
        and callable(value)
        and not isinstance(value, ModuleType)
        and (owner, name) not in _FOLLOWERS
    )


def _replaced_names(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Functions replaced in torch's namespaces, and functions added to its classes (they shadow inherited ones)."""
    missing = object()
    replaced = [
        (owner, name)
        for owner, names in before.items()
        if not _same_namespace(names, after.get(owner))
        for name, value in names.items()
        if not _wraps(after.get(owner, {}).get(name, missing), value) and _patchable(owner, name, value)
    ]
    added = [
        (owner, name)
        for owner in _CLASSES
        for name, value in after[owner].items()
        if name not in before[owner] and _patchable(owner, name, value)
    ]
    return replaced + added


def _same_namespace(before: dict[str, Any], after: Optional[dict[str, Any]]) -> bool:
    """The very same names bound to the very same objects, in the same order: nothing of this owner was
    replaced (the quick answer for nearly every owner, without a Python loop over its names; any difference
    is looked at name by name)."""
    return (
        after is not None
        and len(before) == len(after)
        and all(map(operator.is_, before, after))
        and all(map(operator.is_, before.values(), after.values()))
    )


def _wraps(new: Any, old: Any) -> bool:
    """``new`` is ``old`` or a decorated ``old`` (functools.wraps): torch wraps some of its own functions
    when a module of it is first imported (torch._dynamo wraps torch.manual_seed)."""
    for _ in range(8):
        if new is old:
            return True
        new = getattr(new, "__wrapped__", None)
        if new is None:
            return False
    return False


def _put_namespaces(namespaces: _Namespaces) -> None:
    saved = namespaces.by_owner()
    for owner, name in _replaced_names(saved, _torch_namespaces().by_owner()):
        obj = _CLASSES.get(owner) or sys.modules[owner]
        if name in saved[owner]:
            setattr(obj, name, saved[owner][name])
        else:
            delattr(obj, name)


def _same_namespaces(before: _Namespaces, after: _Namespaces) -> bool:
    return not _replaced_names(before.by_owner(), after.by_owner())


def _show_replaced(before: _Namespaces, after: _Namespaces) -> str:
    names = [f"{owner}.{name}" for owner, name in _replaced_names(before.by_owner(), after.by_owner())]
    return f" ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"


_NAMESPACES = "torch's functions (monkeypatched)"  # the switch that is costly to read: ~29,000 names


def _new_threads(before: set[Any], after: set[Any]) -> bool:
    return after <= before


def _handler(number: signal.Signals) -> Switch:
    return Switch(
        f"the {number.name} handler",
        lambda: signal.getsignal(number),
        lambda handler: signal.signal(number, handler),
        show=lambda before, after: f" ({_handler_name(before)} -> {_handler_name(after)})",
    )


def _handler_name(handler: Any) -> str:
    """SIG_DFL, SIG_IGN, a function's name, or "set outside Python" (what signal.getsignal's None means)."""
    if handler is None:
        return "set outside Python"
    return str(getattr(handler, "name", None) or getattr(handler, "__qualname__", None) or handler)


# the signals whose handling a case may change and a later case depends on: SIGINT and SIGTERM end a run,
# SIGCHLD set to be ignored reaps children before they can be waited for (the shrinker's, the probes'), and
# the others end the process by default (a pending alarm with its default handler kills the next case)
_SIGNALS = (
    "SIGINT",
    "SIGTERM",
    "SIGCHLD",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGHUP",
    "SIGUSR1",
    "SIGUSR2",
    "SIGPIPE",
)


def _signal_switches() -> list[Switch]:
    """The handlers of _SIGNALS (that this system has) and the interval timers: read in any thread, set only in
    the main thread (where cases run but under the pytest plugin's threads)."""
    if threading.current_thread() is not threading.main_thread():
        return []
    out = [_handler(getattr(signal, name)) for name in _SIGNALS if hasattr(signal, name)]
    out += [
        Switch(
            "signal.alarm / signal.setitimer" + ("" if name == "ITIMER_REAL" else f"({name})"),
            torch_state.timer(which),
            torch_state.put_timer(which),
            same=torch_state.same_timer,
            show=torch_state.show_timer,
        )
        for name, which in torch_state.TIMERS
    ]
    return out


def _autograd_switches() -> list[Switch]:
    """Autograd's hooks and levels: saved-tensor hooks left entered or disabled, global module hooks, forward-AD
    levels left open, forward grad and autograd's worker threads turned off (where this torch has them)."""
    c = torch._C
    out = []
    if torch_state.HAS_HOOK_STACK:
        out.append(
            Switch(
                "torch.autograd.graph.saved_tensors_hooks left entered",
                torch_state.saved_hooks,
                torch_state.put_hooks,
                same=torch_state.same_hooks,
                show=torch_state.show_hooks,
            )
        )
    if torch_state.HAS_HOOKS_DISABLED:
        out.append(
            Switch(
                "torch.autograd.graph.disable_saved_tensors_hooks",
                torch_state.hooks_disabled,
                torch_state.put_hooks_disabled,
            )
        )
    out += [
        Switch(
            "global nn.Module hooks (torch.nn.modules.module.register_module_*_hook)",
            torch_state.module_hooks,
            torch_state.put_module_hooks,
            show=torch_state.show_module_hooks,
        ),
        Switch("a forward-AD dual level left open", torch_state.dual_level, torch_state.put_dual_level),
    ]
    if hasattr(c, "_is_fwd_grad_enabled") and hasattr(c, "_set_fwd_grad_enabled"):
        out.append(
            Switch(
                "forward AD enabled (torch._C._set_fwd_grad_enabled)", c._is_fwd_grad_enabled, c._set_fwd_grad_enabled
            )
        )
    if hasattr(c, "_is_multithreading_enabled") and hasattr(c, "_set_multithreading_enabled"):
        out.append(
            Switch(
                "torch.autograd.set_multithreading_enabled", c._is_multithreading_enabled, c._set_multithreading_enabled
            )
        )
    return out


def _numpy_random() -> Optional[ModuleType]:
    numpy = sys.modules.get("numpy")
    return getattr(numpy, "random", None)


def _switches(only: Optional[tuple[str, ...]] = None) -> list[Switch]:
    c = torch._C
    out = [
        Switch("torch.set_grad_enabled", torch.is_grad_enabled, torch._C._set_grad_enabled),
        Switch("torch.inference_mode", torch.is_inference_mode_enabled, None),
        Switch("torch.set_default_dtype", torch.get_default_dtype, torch.set_default_dtype),
        Switch(
            "torch.set_default_device",
            _default_device,
            torch.set_default_device,
            show=lambda before, after: f" ({_device_name(before)} -> {_device_name(after)})",
        ),
        Switch(
            "torch.use_deterministic_algorithms",
            _deterministic,
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
        ),
        Switch("torch.autograd.set_detect_anomaly", _anomaly, lambda v: torch.autograd.set_detect_anomaly(*v)),
        Switch("torch.set_num_threads", torch.get_num_threads, torch.set_num_threads),
        Switch(
            "torch.set_float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision
        ),
        Switch("torch.set_warn_always", torch.is_warn_always_enabled, torch.set_warn_always),
        Switch("torch.set_flush_denormal", _flush_denormal, torch.set_flush_denormal),
        Switch("torch.set_printoptions", _print_options, _put_print_options, show=_show_print_options),
        Switch(
            "torch.set_autocast_enabled('cpu')",
            lambda: torch.is_autocast_enabled("cpu"),
            lambda v: torch.set_autocast_enabled("cpu", v),
        ),
        Switch("torch.backends.cudnn's flags", _cudnn, _put_cudnn),
        Switch(
            "torch.backends.cuda.matmul.allow_tf32",
            lambda: torch.backends.cuda.matmul.allow_tf32,
            lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v),
        ),
        Switch(
            "a torch function mode left active",
            c._len_torch_function_stack,
            _pop_to(c._len_torch_function_stack, c._pop_torch_function_stack),
        ),
        Switch(
            "a torch dispatch mode left active",
            c._len_torch_dispatch_stack,
            _pop_to(c._len_torch_dispatch_stack, lambda: c._pop_torch_dispatch_stack(None)),
        ),  # None: any key
        Switch(
            _NAMESPACES,
            _torch_namespaces,
            _put_namespaces,
            same=_same_namespaces,
            show=_show_replaced,
            kept=_namespaces_kept,
        ),
        Switch("the working directory", os.getcwd, os.chdir),
        # torch's own modules set variables and filters when first imported: these two are put back quietly
        Switch("os.environ", lambda: dict(os.environ), _put_environ, quiet=True),
        Switch("the warning filters", lambda: list(warnings.filters), _put_warnings, quiet=True),
        Switch(
            "sys.path", lambda: list(sys.path), lambda v: sys.path.__setitem__(slice(None), v), quiet=True
        ),  # the loader puts the working directory on it
        Switch("the recursion limit", sys.getrecursionlimit, sys.setrecursionlimit),
        Switch(
            "Python threads left running",
            lambda: set(threading.enumerate()),
            None,
            same=_new_threads,
            show=lambda b, a: f" ({', '.join(sorted(t.name for t in a - b))})",
        ),
        Switch(
            "processes left running",
            processes.started,
            lambda before: processes.end(processes.started() - before),
            same=lambda before, after: after <= before,
            show=lambda before, after: f" (pid {', '.join(map(str, sorted(after - before)))})",
        ),
        Switch("torch's global random state", torch.get_rng_state, torch.set_rng_state, quiet=True),
        Switch("random's global state", random.getstate, random.setstate, quiet=True, same=operator.eq),
        Switch(
            "an operator's kernel overridden with torch.library",
            torch_state.kernels,
            torch_state.put_kernels,
            same=torch_state.same_kernels,
            show=torch_state.show_kernels,
            imported=torch_state.seen_at_import,
        ),
        *_autograd_switches(),
        *_signal_switches(),
    ]
    numpy_random = _numpy_random()
    if numpy_random is not None:
        out.append(Switch("numpy's global random state", numpy_random.get_state, numpy_random.set_state, quiet=True))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.append(
            Switch("torch.cuda's random states", torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all, quiet=True)
        )
    return out if only is None else [s for s in out if s.name in only]


_UNREADABLE = object()


def _read(switch: Switch) -> Any:
    try:
        return switch.get()
    except Exception:  # noqa: BLE001 - e.g. the working directory was deleted
        return _UNREADABLE


def _unchanged(switch: Switch, before: Any, after: Any) -> bool:
    if before is _UNREADABLE or after is _UNREADABLE:
        return before is after
    return switch.same(before, after)


def _kept(switch: Switch, before: Any) -> bool:
    """The switch's quick test says the state is still ``before`` (without one, or when unsure: False, read it)."""
    if switch.kept is None or before is _UNREADABLE:
        return False
    try:
        return switch.kept(before)
    except Exception:  # noqa: BLE001 - a closer look (reading and comparing) decides
        return False


Snapshot = list[tuple[Switch, Any]]

# What a single call into user code may not leave changed, because gradcheck-cli's own computation
# right after it depends on it (a default device of "meta" breaks the comparison): cheap to read,
# put back after every call, and told once in the case's warnings.
_PER_CALL = (
    "torch.set_grad_enabled",
    "torch.set_default_dtype",
    "torch.set_default_device",
    "a torch function mode left active",
    "a torch dispatch mode left active",
    "a forward-AD dual level left open",  # the forward_ad check opens its own: torch allows one at a time
)
_FUNCTION_STACK = getattr(torch._C, "_len_torch_function_stack", None)
_DISPATCH_STACK = getattr(torch._C, "_len_torch_dispatch_stack", None)


def _per_call_quick() -> Optional[tuple[Any, ...]]:
    """The values of _PER_CALL's switches, in their order, where they can be read quickly: no torch
    function mode is active and no default device is set (reading the default device through
    torch.get_default_device takes longer than the rest together). None otherwise."""
    context = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if (
        _FUNCTION_STACK is None
        or _DISPATCH_STACK is None
        or context is None
        or getattr(context, "device_context", None) is not None
        or _FUNCTION_STACK()
    ):
        return None  # (another torch, without these private readers: the full reading)
    return torch.is_grad_enabled(), torch.get_default_dtype(), None, 0, _DISPATCH_STACK(), torch_state.dual_level()


def snapshot() -> Snapshot:
    """The global state now."""
    return [(switch, _read(switch)) for switch in _switches()]


def changes(since: Snapshot) -> Snapshot:
    """What changed since ``since``, as the new values (``apply`` sets them again). A change that cannot be
    made again (a kernel override: its kernel cannot be registered anew) is told to its switch's ``imported``
    instead (the guard then leaves it in place and names it as what it could not put back)."""
    out = []
    for switch, before in since:
        if _kept(switch, before):
            continue
        after = _read(switch)
        if _unchanged(switch, before, after) or switch.put is None or after is _UNREADABLE:
            continue
        if switch.imported is not None:
            switch.imported(before, after)
        else:
            out.append((switch, after))
    return out


def apply(values: Snapshot) -> None:
    """Set the values of an earlier ``changes`` again."""
    for switch, value in values:
        assert switch.put is not None
        switch.put(value)


CHANGED = "the code under test changed global state"  # how the guard's notes begin (``told``)


class GlobalStateWarning(UserWarning):
    """A guard's note shown as a Python warning where results' warnings are not shown (the pytest plugin's
    passing items)."""


def told(notes: list[str]) -> list[str]:
    """The guard's notes among a result's warnings: what the code under test changed of the process."""
    return [note for note in notes if note.startswith(CHANGED)]


def _note(notes: list[str], text: str) -> None:
    if text not in notes:  # a check's note, and the same again from its case
        notes.append(text)


class Guard:
    """The process's guard of its global state (``GUARD``): it saves what ``snapshot`` lists before a
    block of code under test, compares after it, puts back what changed and names it
    (``preserved``), puts back after each single call what gradcheck-cli's next step relies on
    (``kept_for_call``), and remembers what could not be put back (``tainted``). Reading torch's
    ~29,000 names is what costs: ``consecutive`` and ``preserved``'s ``ends_with_block``/``last``
    let it reuse a reading that is known to be still exact."""

    def __init__(self) -> None:
        self._tainted: list[str] = []  # what this process could not restore, ever
        self._noticed: list[str] = []  # what kept_for_call put back, told by the block being run
        self._per_call: list[Switch] = []  # the switches of _PER_CALL, made once
        self._open: list[int] = []  # one entry per preserved() block being run
        self._outer: list[Any] = []  # torch's namespaces as each preserved() block being run found them
        # torch's namespaces as the last preserved() block to end found them again (none when it found them
        # changed), while no block has begun since; and how many consecutive() scopes are open
        self._confirmed: list[_Namespaces] = []
        self._consecutive: list[bool] = []

    def tainted(self) -> list[str]:
        """What earlier cases changed in this process and could not be restored."""
        return list(self._tainted)

    def taint(self, why: str) -> None:
        """Say that this process cannot be put back as it was (``why``): a worker is replaced before its
        next case."""
        self._tainted.append(why)

    def kept_for_call(self) -> _KeptForCall:
        """Around one call into user code (``with GUARD.kept_for_call():``): put back the state
        gradcheck-cli's next step relies on."""
        if not self._per_call:  # in _PER_CALL's order, as _per_call_quick reads them
            self._per_call.extend(sorted(_switches(_PER_CALL), key=lambda s: _PER_CALL.index(s.name)))
        return _KeptForCall(self)

    def _put_back(self, saved: Snapshot) -> None:
        """Put back what a call changed of ``saved`` (see ``kept_for_call``)."""
        for switch, before in saved:
            after = _read(switch)
            if not _unchanged(switch, before, after) and switch.put is not None and before is not _UNREADABLE:
                try:
                    switch.put(before)
                except Exception:  # noqa: BLE001 - the case-level restore names what is left
                    continue
                if self._open:  # told in the warnings of the case (or check) being preserved
                    self._noticed.append(switch.name + switch.show(before, after))

    @contextmanager
    def consecutive(self) -> Iterator[None]:
        """Around a loop of cases with nothing but gradcheck-cli's own code between them (a worker's, or
        --no-isolate's): each case's ``preserved()`` starts from torch's namespaces as the case before it
        left them and found them, instead of reading ~29,000 names again. A change made between two cases
        is then told with (and put back after) the case after it, as it is not there when that case begins."""
        self._consecutive.append(True)
        self._confirmed.clear()  # what a block before this scope found is no start for its first case
        try:
            yield
        finally:
            self._consecutive.pop()
            self._confirmed.clear()

    def _namespaces_at_start(self, confirmed: Optional[_Namespaces], last: bool) -> Any:
        """Torch's namespaces as a block begins: ``confirmed`` (what the block before it found at its end)
        inside ``consecutive()``; the enclosing block's copy when they are still exactly that (a check after
        the case's set-up changed none of them), or without looking for a ``last`` block (see
        ``preserved``); else read anew. A torch module imported since a copy rules the copy out."""
        if confirmed is not None and self._consecutive and not self._outer and confirmed.modules == len(sys.modules):
            return confirmed
        enclosing = self._outer[-1] if self._outer else None
        if (
            isinstance(enclosing, _Namespaces)
            and enclosing.modules == len(sys.modules)
            and (last or _namespaces_kept(enclosing))
        ):
            return enclosing
        return _read(_switches((_NAMESPACES,))[0])

    def _start(self, last: bool) -> Snapshot:
        confirmed = self._confirmed.pop() if self._confirmed else None
        return [
            (s, self._namespaces_at_start(confirmed, last) if s.name == _NAMESPACES else _read(s)) for s in _switches()
        ]

    @contextmanager
    def preserved(self, notes: list[str], ends_with_block: bool = False, last: bool = False) -> Iterator[None]:
        """Save the global state, run the body, put the state back; append to ``notes`` what the body
        changed (it is restored) and what could not be put back (this process is then ``tainted()``).

        ``ends_with_block``: the caller's word that no code under test runs in the body after its last
        nested ``preserved()`` block: when that block found torch's namespaces as this one began, they are
        not read again. ``last``: the caller's word that this block is the last one nested in its enclosing
        block (a case's last check) and that both tell ``notes`` alike: nothing after it needs what the
        enclosing block's body changed of torch's namespaces before it (a case's set-up), so it starts from
        the enclosing block's copy of them without reading them, and a change made before it is told and put
        back at its end."""
        saved = self._start(last)
        self._open.append(len(self._noticed))
        self._outer.append(next((before for switch, before in saved if switch.name == _NAMESPACES), None))
        try:
            yield
        finally:
            self._end(notes, saved, ends_with_block)

    def _end(self, notes: list[str], saved: Snapshot, ends_with_block: bool) -> None:
        """``preserved``'s end: put back what changed of ``saved`` and tell ``notes``."""
        mark = self._open.pop()
        namespaces = self._outer.pop()
        confirmed = ends_with_block and bool(self._confirmed) and self._confirmed[-1] is namespaces
        self._confirmed.clear()
        changed, stuck = list(dict.fromkeys(self._noticed[mark:])), []
        del self._noticed[mark:]
        for switch, before in saved:
            if switch.name == _NAMESPACES and (confirmed or _kept(switch, before)):
                self._confirmed.append(before)
                continue
            if _kept(switch, before):
                continue
            after = _read(switch)
            if _unchanged(switch, before, after):
                continue
            if switch.put is not None and before is not _UNREADABLE:
                try:
                    switch.put(before)
                except Exception:  # noqa: BLE001 - judged below: what is still different is stuck
                    pass
            words = switch.name + ("" if after is _UNREADABLE else switch.show(before, after))
            if not _unchanged(switch, before, _read(switch)):
                stuck.append(words)
            elif not switch.quiet and words not in changed:  # (a single call's put-back may have told it already)
                changed.append(words)
        if changed:
            _note(
                notes,
                f"{CHANGED} and left it changed: {'; '.join(changed)}. "
                "gradcheck-cli put it back after the case, so other cases do not see it; a Function "
                "should restore what it changes (use the context-manager forms)",
            )
        if stuck:
            self._tainted.extend(stuck)
            _note(
                notes,
                f"{CHANGED} that cannot be put back: {'; '.join(stuck)}. "
                "Cases checked after it in the same process may be affected (isolated workers are "
                "replaced before their next case)",
            )


class _KeptForCall:
    """``Guard.kept_for_call``'s context (a class: a generator's context costs more than the quick reading)."""

    __slots__ = ("guard", "quick", "saved")

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def __enter__(self) -> None:
        self.quick = _per_call_quick()
        self.saved = None if self.quick is not None else [(s, _read(s)) for s in self.guard._per_call]

    def __exit__(self, *exc: object) -> None:
        quick, saved = self.quick, self.saved
        if quick is None or _per_call_quick() != quick:
            self.guard._put_back(saved if saved is not None else list(zip(self.guard._per_call, quick or ())))


GUARD = Guard()  # global state is the process's: one guard for it


_Shown = tuple[str, type, str, int]  # a warning's text, category, file and line


@contextmanager
def warnings_once() -> Iterator[None]:
    """Around a case (``runner.run_task``): each warning is shown once, however many checks call the code that
    issues it. Python shows a warning once per place only until the warning filters change, and the checks
    change them and put them back (``warnings.catch_warnings``: gradcheck-cli's, torch's, the guard's restore of
    the filters), so without this a Function's own ``warnings.warn`` reached stderr once per check. What the
    filters decide still holds: an ignored warning stays unshown, an "error" one raises, an "always" one is
    shown every time."""
    shown: set[_Shown] = set()
    before = warnings.showwarning

    def show(
        message: Union[Warning, str],
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: Optional[str] = None,
    ) -> None:
        key = (str(message), category, filename, lineno)
        if key in shown and not _always(*key):
            return
        shown.add(key)
        before(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:  # (code under test that set its own keeps it: the guard does not track it)
            warnings.showwarning = before


def _always(text: str, category: type, filename: str, lineno: int) -> bool:
    """Whether the warning filters say "always" for this warning (the first filter that matches decides, as in
    ``warnings.warn_explicit``; a filter's module pattern is matched against the module of ``filename``)."""
    for action, message, kind, module, line in warnings.filters:
        if (
            (message is None or message.match(text))
            and issubclass(category, kind)
            and (module is None or module.match(_module_of(filename)))
            and (line == 0 or line == lineno)
        ):
            return bool(action == "always")
    return bool(getattr(warnings, "defaultaction", "default") == "always")


def _module_of(filename: str) -> str:
    """The name of the module loaded from ``filename`` (what ``warnings.warn`` matches filters against), else
    the file's name without ``.py`` (what ``warnings.warn_explicit`` falls back to)."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return filename[:-3] if filename.lower().endswith(".py") else filename
