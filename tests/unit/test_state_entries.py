"""Every piece of global state the guard keeps, one test each (issue 29 item 3).

``state.snapshot()`` lists what a case may change: each entry here changes it inside ``preserved()``
and finds it put back after, named in the case's notes (or put back without a word where changing it
is normal, as for the random generators), or named as what cannot be put back. A new entry in
``state`` without a line here fails ``test_every_entry_has_its_test``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import warnings
from typing import Any, Callable

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gradcheck_cli.sandbox import state_guard

PUT_BACK, QUIET, STUCK = "put back and named", "put back quietly", "cannot be put back"
SAID_AS = {  # where torch keeps one setting behind two names, the guard names the one it reads
    "torch.backends.cuda.matmul.allow_tf32": "torch.set_float32_matmul_precision"
}
_undo: list[Callable[[], Any]] = []  # what a STUCK change leaves, undone after its test


def _leave_entered(cm: Any, undo: bool = True) -> None:
    """Enter ``cm`` and leave it entered (held: a context of a generator that is collected exits); ``undo``:
    exit it after the test (what the guard cannot put back)."""
    cm.__enter__()
    _held.append(cm)
    if undo:
        _undo.append(lambda: cm.__exit__(None, None, None))


_held: list[Any] = []


def _pack(t: torch.Tensor) -> torch.Tensor:
    return t * 1.01


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _override_kernel() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("sin", lambda t: torch.ops.aten.cos.default(t), "CPU")
    _held.append(lib)  # held, as a user's module holds it: only the guard unregisters it


def _leave_mode(mode: Any) -> None:
    mode.__enter__()  # left active: the guard pops it off torch's mode stack


def _thread() -> None:
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="left-behind", daemon=True).start()
    _undo.append(stop.set)


def _process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    _undo.append(lambda: (child.kill(), child.wait()))


def _flip_cudnn() -> None:
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark


def _numpy_seed() -> None:
    import numpy

    numpy.random.seed(7)


ENTRIES: dict[str, tuple[Callable[[], Any], str]] = {
    "torch.set_grad_enabled": (lambda: torch.set_grad_enabled(False), PUT_BACK),
    "torch.inference_mode": (lambda: _leave_entered(torch.inference_mode()), STUCK),
    "torch.set_default_dtype": (lambda: torch.set_default_dtype(torch.float64), PUT_BACK),
    "torch.set_default_device": (lambda: torch.set_default_device("meta"), PUT_BACK),
    "torch.use_deterministic_algorithms": (lambda: torch.use_deterministic_algorithms(True, warn_only=True), PUT_BACK),
    "torch.autograd.set_detect_anomaly": (lambda: torch.autograd.set_detect_anomaly(True), PUT_BACK),
    "torch.set_num_threads": (lambda: torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2), PUT_BACK),
    "torch.set_float32_matmul_precision": (lambda: torch.set_float32_matmul_precision("medium"), PUT_BACK),
    "torch.set_warn_always": (lambda: torch.set_warn_always(not torch.is_warn_always_enabled()), PUT_BACK),
    "torch.set_flush_denormal": (lambda: torch.set_flush_denormal(True), PUT_BACK),
    "torch.set_printoptions": (lambda: torch.set_printoptions(precision=2), PUT_BACK),
    "torch.set_autocast_enabled('cpu')": (lambda: torch.set_autocast_enabled("cpu", True), PUT_BACK),
    "torch.backends.cudnn's flags": (_flip_cudnn, PUT_BACK),
    "torch.backends.cuda.matmul.allow_tf32": (
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", not torch.backends.cuda.matmul.allow_tf32),
        PUT_BACK,
    ),
    "a torch function mode left active": (lambda: _leave_mode(TorchFunctionMode()), PUT_BACK),
    "a torch dispatch mode left active": (lambda: _leave_mode(TorchDispatchMode()), PUT_BACK),
    "torch's functions (monkeypatched)": (lambda: setattr(torch.nn.functional, "relu", None), PUT_BACK),
    "the working directory": (lambda: os.chdir(os.path.dirname(os.getcwd()) or "/"), PUT_BACK),
    "os.environ": (lambda: os.environ.__setitem__("GRADCHECK_STATE_ENTRY", "1"), QUIET),
    "the warning filters": (lambda: warnings.simplefilter("error"), QUIET),
    "sys.path": (lambda: sys.path.append("/nonexistent-gradcheck-entry"), QUIET),
    "the recursion limit": (lambda: sys.setrecursionlimit(sys.getrecursionlimit() + 100), PUT_BACK),
    "Python threads left running": (_thread, STUCK),
    "processes left running": (_process, PUT_BACK),
    "torch's global random state": (lambda: torch.rand(3), QUIET),
    "random's global state": (lambda: random.random(), QUIET),
    "the SIGINT handler": (lambda: signal.signal(signal.SIGINT, lambda *_: None), PUT_BACK),
    "the SIGTERM handler": (lambda: signal.signal(signal.SIGTERM, lambda *_: None), PUT_BACK),
    "numpy's global random state": (_numpy_seed, QUIET),
    # issue 44, item 6
    "an operator's kernel overridden with torch.library": (_override_kernel, PUT_BACK),
    "torch.autograd.graph.saved_tensors_hooks left entered": (
        lambda: _leave_entered(torch.autograd.graph.saved_tensors_hooks(_pack, _unpack), undo=False),
        PUT_BACK,
    ),
    "torch.autograd.graph.disable_saved_tensors_hooks": (
        lambda: _leave_entered(torch.autograd.graph.disable_saved_tensors_hooks("off"), undo=False),
        PUT_BACK,
    ),
    "global nn.Module hooks (torch.nn.modules.module.register_module_*_hook)": (
        lambda: torch.nn.modules.module.register_module_full_backward_hook(lambda *_: None),
        PUT_BACK,
    ),
    "a forward-AD dual level left open": (torch.autograd.forward_ad.enter_dual_level, PUT_BACK),
    "forward AD enabled (torch._C._set_fwd_grad_enabled)": (lambda: torch._C._set_fwd_grad_enabled(False), PUT_BACK),
    "torch.autograd.set_multithreading_enabled": (
        lambda: _leave_entered(torch.autograd.set_multithreading_enabled(False), undo=False),
        PUT_BACK,
    ),
    **{
        f"the {name} handler": (lambda name=name: signal.signal(getattr(signal, name), lambda *_: None), PUT_BACK)
        for name in ("SIGCHLD", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGPIPE")
        if hasattr(signal, name)
    },
    **{
        "signal.alarm / signal.setitimer" + ("" if which == "ITIMER_REAL" else f"({which})"): (
            lambda which=which: signal.setitimer(getattr(signal, which), 600),
            PUT_BACK,
        )
        for which in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
        if hasattr(signal, which)
    },
    "torch.cuda's random states": (lambda: torch.cuda.manual_seed_all(7), QUIET),
}


def _entries() -> dict[str, Any]:
    return {switch.name: (switch, value) for switch, value in state_guard.snapshot()}


def test_every_entry_has_its_test():
    pytest.importorskip("numpy")  # numpy's entry is there once numpy is imported
    names = set(_entries())
    missing = names - set(ENTRIES)
    assert not missing, f"state keeps {sorted(missing)}: add each to ENTRIES with the change that tests it"
    assert set(ENTRIES) - names <= {"torch.cuda's random states"}  # only where CUDA is initialised


@pytest.mark.parametrize("name", ENTRIES)
def test_each_entry_is_put_back_and_told_as_it_says(name, monkeypatch):
    if name == "numpy's global random state":
        pytest.importorskip("numpy")
    if name == "torch.cuda's random states" and not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        pytest.skip("needs CUDA (initialised)")
    change, kind = ENTRIES[name]
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])
    switch, before = _entries()[name]
    notes: list[str] = []
    try:
        with state_guard.GUARD.preserved(notes):
            change()
        after = _entries()[name][1]
        said = " ".join(notes)
        if kind == STUCK:
            assert "cannot be put back" in said and name in said, notes
            assert any(t.startswith(name) for t in state_guard.GUARD.tainted()), state_guard.GUARD.tainted()
            return
        assert switch.same(before, after), (before, after)
        assert state_guard.GUARD.tainted() == []
        if kind == PUT_BACK:
            assert "left it changed" in said and SAID_AS.get(name, name) in said, notes
        else:
            assert name not in said, notes
    finally:
        while _undo:
            _undo.pop()()
