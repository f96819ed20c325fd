"""Pieces of process state that take more than a getter and a setter to read and put back (``state_guard``'s guard
lists them with the rest): the saved-tensor hooks torch applies by default, the global nn.Module hooks, kernels
of existing operators overridden with torch.library, forward-AD levels left open and interval timers left
pending. Each has a reader (its value now), a writer (make it that value again, where it can be) and, where
``==`` is not the comparison, a test of sameness; the readers are cheap (the guard reads them around every
case and check)."""

from __future__ import annotations

import gc
import os
import signal
import time
from typing import Any, Callable, NamedTuple, Optional

import torch

# ---------------------------------------------------------------- saved-tensor hooks (autograd.graph)
_autograd = torch._C._autograd
_TOP_HOOKS = getattr(_autograd, "_top_saved_tensors_default_hooks", None)
_PUSH_HOOKS = getattr(_autograd, "_push_saved_tensors_default_hooks", None)
_POP_HOOKS = getattr(_autograd, "_pop_saved_tensors_default_hooks", None)
HAS_HOOK_STACK = _TOP_HOOKS is not None and _PUSH_HOOKS is not None and _POP_HOOKS is not None
DEPTH_BOUND = 1000  # levels read at most (a stack deeper than this is a runaway loop's)


def top_hooks() -> Optional[tuple[Any, Any]]:
    """The (pack, unpack) hooks on top of torch's stack of default saved-tensor hooks (what
    ``torch.autograd.graph.saved_tensors_hooks`` pushes on enter and pops on exit), None where it is empty."""
    assert _TOP_HOOKS is not None
    top = _TOP_HOOKS(True)  # True: as it is, also while a torch.compile trace is running
    return None if top is None else (top[0], top[1])


Hooks = tuple[tuple[Any, Any], ...]


def saved_hooks() -> Hooks:
    """The whole stack, bottom first. torch shows only its top, so the stack is popped and pushed back as it
    was (the same function objects, held here meanwhile); while saved-tensor hooks are disabled nothing can
    be pushed, and only the top is read."""
    assert _POP_HOOKS is not None and _PUSH_HOOKS is not None
    top = top_hooks()
    if top is None:
        return ()
    if hooks_disabled() is not None:
        return (top,)
    popped = []
    for _ in range(DEPTH_BOUND):
        if top is None:
            break
        popped.append(top)
        _POP_HOOKS()
        top = top_hooks()
    for pack, unpack in reversed(popped):
        _PUSH_HOOKS(pack, unpack)
    return tuple(reversed(popped))


def same_hooks(before: Hooks, after: Hooks) -> bool:
    """The very same pack and unpack functions at every level (``is``: hooks are compared by identity)."""
    return len(before) == len(after) and all(b[0] is a[0] and b[1] is a[1] for b, a in zip(before, after))


def put_hooks(saved: Hooks) -> None:
    """Pop what is above the levels ``saved`` shares with the stack now, and push the rest of ``saved`` again
    (what code under test popped, or an import pushed)."""
    assert _POP_HOOKS is not None and _PUSH_HOOKS is not None
    now = saved_hooks()
    common = next((k for k, (b, a) in enumerate(zip(saved, now)) if b[0] is not a[0] or b[1] is not a[1]), None)
    common = min(len(saved), len(now)) if common is None else common
    for _ in range(len(now) - common):
        _POP_HOOKS()
    for pack, unpack in saved[common:]:
        _PUSH_HOOKS(pack, unpack)


def show_hooks(before: Hooks, after: Hooks) -> str:
    return f" ({len(before)} -> {len(after)} entered)"


_DISABLED_MESSAGE = getattr(_autograd, "_saved_tensors_hooks_get_disabled_error_message", None)
HAS_HOOKS_DISABLED = _DISABLED_MESSAGE is not None


def hooks_disabled() -> Optional[str]:
    """The message ``torch.autograd.graph.disable_saved_tensors_hooks`` set (saved-tensor hooks then raise it),
    None where they are enabled."""
    assert _DISABLED_MESSAGE is not None
    message = _DISABLED_MESSAGE()
    return None if message is None else str(message)


def put_hooks_disabled(message: Optional[str]) -> None:
    if message is None:
        _autograd._saved_tensors_hooks_enable()
        return
    try:
        _autograd._saved_tensors_hooks_disable(message, False)  # False: even where hooks are on the stack
    except TypeError:  # a torch without the second argument
        _autograd._saved_tensors_hooks_disable(message)


# ---------------------------------------------------------------- global nn.Module hooks
_MODULE = torch.nn.modules.module
_FULL_BACKWARD = "_global_is_full_backward_hook"  # a flag, rebound, beside the dicts of hooks


def _hook_dicts() -> list[str]:
    """The names of torch.nn.modules.module's dicts of global hooks (``register_module_forward_hook`` and the
    rest add to them; every nn.Module's call runs them)."""
    return sorted(
        name for name, value in vars(_MODULE).items() if name.startswith("_global_") and isinstance(value, dict)
    )


def module_hooks() -> tuple[Any, ...]:
    """Every global module hook, by dict: (name, ((handle id, hook), ...)), then the full-backward flag."""
    return (
        *((name, tuple(getattr(_MODULE, name).items())) for name in _hook_dicts()),
        (_FULL_BACKWARD, getattr(_MODULE, _FULL_BACKWARD, None)),
    )


def put_module_hooks(saved: tuple[Any, ...]) -> None:
    """The same hooks again, in the same dicts (a hook's RemovableHandle holds its dict: it still removes it)."""
    for name, value in saved:
        if name == _FULL_BACKWARD:
            setattr(_MODULE, name, value)
            continue
        hooks = getattr(_MODULE, name)
        hooks.clear()
        hooks.update(value)


def show_module_hooks(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    was = dict(before)
    added = [
        f"{name.removeprefix('_global_')} {len(hooks) - len(was.get(name, ())):+d}"
        for name, hooks in after
        if name != _FULL_BACKWARD and len(hooks) != len(was.get(name, ()))
    ]
    return f" ({', '.join(added)})" if added else " (replaced)"


# ---------------------------------------------------------------- kernels overridden with torch.library
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_library = torch.library
_origin: dict[tuple[str, str], bool] = {}  # (kernel key, the dispatcher's line for it) -> registered by user code
imported: set[str] = set()  # overrides that importing a module registered: they stay (see ``seen_at_import``)


class Kernels(NamedTuple):
    """The kernels registered from Python (``torch.library``'s records: "ns/op/dispatch key" for each kernel,
    "ns::op" for each operator defined)."""

    impls: frozenset[str]
    defs: frozenset[str]


def kernels() -> Kernels:
    return Kernels(frozenset(getattr(_library, "_impls", ())), frozenset(getattr(_library, "_defs", ())))


def _operator(key: str) -> tuple[str, str]:
    """The operator ("ns::op.overload") and dispatch key of a kernel key "ns/op.overload/KEY"."""
    ns, name, dispatch = key.split("/", 2)
    return f"{ns}::{name}", dispatch


def _by_user_code(key: str) -> bool:
    """Whether the kernel now registered for ``key`` was registered from outside torch's own package (the
    dispatcher records where each kernel's Library was made: "CPU: registered at FILE:LINE ...")."""
    op, dispatch = _operator(key)
    wanted = (f"{dispatch or 'CompositeImplicitAutograd'}:", f"{dispatch or 'CompositeImplicitAutograd'}[alias]:")
    line = next((ln for ln in torch._C._dispatch_dump(op).splitlines() if ln.startswith(wanted)), "")
    if (key, line) not in _origin:
        where = line.partition(" registered at ")[2]
        # torch's own Python registrations name its files; some (torch 2.4's prims, registered lazily by
        # torch.compile) name no file at all, "/dev/null": neither is the user's
        _origin[key, line] = bool(where) and not where.startswith((_TORCH_DIR, "/dev/null"))
    return _origin[key, line]


def overrides(before: Kernels, after: Kernels) -> list[str]:
    """The kernels user code registered since ``before`` for operators that it did not define since then: a
    new kernel for aten::sin changes every later sin; the kernels of an operator of its own change nothing
    else. Torch's own registrations (its modules register kernels as they are first imported) are not these."""
    new_ops = {d.split(".")[0] for d in after.defs - before.defs}
    return sorted(
        key
        for key in after.impls - before.impls
        if _operator(key)[0].split(".")[0] not in new_ops and _by_user_code(key)
    )


def same_kernels(before: Kernels, after: Kernels) -> bool:
    return not overrides(before, after)


def show_kernels(before: Kernels, after: Kernels) -> str:
    named = [
        f"{op} for {dispatch or 'CompositeImplicitAutograd'}"
        for op, dispatch in map(_operator, overrides(before, after))
    ]
    return f" ({', '.join(named[:5])}{', ...' if len(named) > 5 else ''})"


def put_kernels(before: Kernels) -> None:
    """Unregister the overriding kernels registered since ``before``: each torch.library.Library that holds
    nothing but such kernels is destroyed (``Library._destroy``: the kernel before it is in force again).
    What another Library holds (an operator it defines too, a kernel from before), and what importing a module
    registered (``seen_at_import``), stays: the guard names it as what it could not put back."""
    found = set(overrides(before, kernels())) - imported
    if not found:
        return
    for lib in [
        obj for obj in gc.get_objects() if issubclass(type(obj), _library.Library)
    ]:  # (type: no __class__ read)
        mine = set(getattr(lib, "_op_impls", ()))
        if mine & found and mine <= found and not getattr(lib, "_op_defs", None) and getattr(lib, "m", None):
            lib._destroy()


def seen_at_import(before: Kernels, after: Kernels) -> None:
    """Importing a module overrode kernels: they are the module's and its later cases in this process need
    them, so they are not unregistered (``put_kernels``); the guard names them as what it could not put back,
    and a worker is replaced before its next case."""
    imported.update(overrides(before, after))


# ---------------------------------------------------------------- forward-AD levels
_forward_ad = torch.autograd.forward_ad


def dual_level() -> int:
    """The forward-AD level open now (``torch.autograd.forward_ad.enter_dual_level``; -1: none)."""
    return int(getattr(_forward_ad, "_current_level", -1))


def put_dual_level(saved: int) -> None:
    """Exit the levels opened above ``saved`` (their dual tensors' tangents go with them), or open levels up to
    it again (an import's)."""
    for _ in range(DEPTH_BOUND):
        now = dual_level()
        if now == saved:
            return
        if now > saved:
            _forward_ad.exit_dual_level()
        else:
            _forward_ad.enter_dual_level()


# ---------------------------------------------------------------- interval timers (signal.alarm, setitimer)
class Timer(NamedTuple):
    """An interval timer as read: seconds until it fires (0: none pending), its interval, and when it was read."""

    delay: float
    interval: float
    read_at: float


TIMERS = [
    (name, getattr(signal, name))
    for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
    if hasattr(signal, name) and hasattr(signal, "setitimer")
]


def timer(which: int) -> Callable[[], Timer]:
    def read() -> Timer:
        delay, interval = signal.getitimer(which)
        return Timer(delay, interval, time.monotonic())

    return read


def same_timer(before: Timer, after: Timer) -> bool:
    """Pending in both or in neither, with the same interval: a timer counts down, so the delays differ by the
    time between the readings."""
    return (before.delay > 0) == (after.delay > 0) and before.interval == after.interval


def put_timer(which: int) -> Callable[[Timer], None]:
    def put(saved: Timer) -> None:
        left = max(saved.delay - (time.monotonic() - saved.read_at), 1e-6) if saved.delay > 0 else 0.0
        signal.setitimer(which, left, saved.interval)

    return put


def show_timer(before: Timer, after: Timer) -> str:
    def words(t: Timer) -> str:
        return "none pending" if t.delay <= 0 else f"pending, {t.delay:.3g} s"

    return f" ({words(before)} -> {words(after)})"
