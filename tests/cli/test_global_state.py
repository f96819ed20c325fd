"""Issue 14, item 1: global state a case changes is put back after it, whatever runs the cases.

Before this, a reused worker (``-j 1``), ``--no-isolate`` and the pytest plugin carried a case's
``torch.set_grad_enabled(False)``, monkeypatches and ``os.chdir`` into the cases after it, and a
correct Function failed or errored after an unrelated one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import warnings
from types import ModuleType

import pytest
import torch

from gradcheck_cli.sandbox import state_guard

SOURCE = """
import os
import signal
import sys
import tempfile

import torch


class Sin(torch.autograd.Function):  # correct, and uses torch.sin and grad mode
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


def scaled(x):  # correct, and reads a file relative to the working directory
    with open("scale.txt") as f:
        return x * float(f.read())


def disables_grad(x):
    y = x * 3
    torch.set_grad_enabled(False)
    return y


def patches_sin(x):
    torch.sin = lambda t: t * 0
    return x * 3


def changes_directory(x):
    os.chdir(tempfile.gettempdir())
    return x * 3


def sets_deterministic(x):
    torch.use_deterministic_algorithms(True)
    return x * 3
"""

SPEC = """\
function: usermod:{changer}
inputs: [{{shape: [3]}}]
cases:
  - name: changer
  - name: victim
    function: usermod:{victim}
"""


@pytest.mark.parametrize(
    "changer, victim, said",
    [
        ("disables_grad", "Sin", "torch.set_grad_enabled (True -> False)"),
        ("patches_sin", "Sin", "torch.sin"),
        ("changes_directory", "scaled", "the working directory"),
        ("sets_deterministic", "Sin", "torch.use_deterministic_algorithms"),
    ],
)
@pytest.mark.parametrize("mode", [["--no-isolate"], ["-j", "1"]])
def test_a_case_that_changes_global_state_changes_no_other_case(
    user_module, write_spec, invoke, tmp_path, changer, victim, said, mode
):
    user_module(SOURCE)
    (tmp_path / "scale.txt").write_text("2.0")
    write_spec(SPEC.format(changer=changer, victim=victim), "specs/s.yaml")
    result = invoke("specs/s.yaml", "--format", "json", *mode)
    results = {r["case"]: r for r in json.loads(result.stdout)["results"]}
    assert results["victim"]["status"] == "pass", results["victim"]
    assert any(said in w and "put it back" in w for w in results["changer"]["warnings"]), results["changer"]
    assert os.getcwd() == str(tmp_path) and torch.is_grad_enabled() and torch.sin(torch.zeros(1)).item() == 0


IMPORT_TIME = """
import torch

torch.set_default_dtype(torch.float64)  # at import: every case of this module sees it, as in a fresh process


def scratch(x):  # right only when the default dtype is float64
    return torch.empty(x.shape).copy_(x) ** 2
"""

PLAIN = """
import torch


def default_dtype_name(x):
    assert torch.get_default_dtype() is torch.float32, torch.get_default_dtype()
    return x * 2
"""


@pytest.mark.parametrize("order", [("a", "plain", "b"), ("plain", "a", "b"), ("a", "b", "plain")])
def test_state_set_by_importing_a_module_holds_for_each_of_its_cases_and_no_other(
    user_module, write_spec, invoke, order
):
    user_module(IMPORT_TIME, "importtime")
    user_module(PLAIN, "plain")
    entries = {"a": "importtime:scratch", "b": "importtime:scratch", "plain": "plain:default_dtype_name"}
    cases = "".join(f"  - name: {name}\n    function: {entries[name]}\n" for name in order)
    write_spec(f"function: {entries[order[0]]}\ninputs: [{{shape: [3]}}]\ncases:\n" + cases, "specs/s.yaml")
    result = invoke("specs/s.yaml", "--format", "json", "-j", "1")
    statuses = {r["case"]: r["status"] for r in json.loads(result.stdout)["results"]}
    assert statuses == {"a": "pass", "b": "pass", "plain": "pass"}, result.stdout


@pytest.mark.parametrize(
    "change, restored",
    [
        (lambda: torch.set_grad_enabled(False), torch.is_grad_enabled),
        (lambda: torch.set_default_dtype(torch.float64), lambda: torch.get_default_dtype() is torch.float32),
        (lambda: torch.autograd.set_detect_anomaly(True), lambda: not torch.is_anomaly_enabled()),
        (
            lambda: torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2),
            lambda: torch.get_num_threads() == THREADS,
        ),
        (lambda: setattr(torch.Tensor, "sum", lambda self: 0), lambda: "sum" not in vars(torch.Tensor)),
        (lambda: setattr(torch.nn.functional, "relu", None), lambda: callable(torch.nn.functional.relu)),
        (lambda: os.environ.__setitem__("GRADCHECK_STATE_TEST", "1"), lambda: "GRADCHECK_STATE_TEST" not in os.environ),
        (lambda: warnings.simplefilter("error"), lambda: warnings.filters[0][0] != "error"),
        (lambda: torch.rand(5), lambda: torch.equal(torch.get_rng_state(), RNG)),
    ],
)
def test_preserved_puts_back_what_the_body_changed(change, restored):
    global THREADS, RNG
    THREADS, RNG = torch.get_num_threads(), torch.get_rng_state()
    tainted = state_guard.GUARD.tainted()
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        change()
    assert restored()
    assert state_guard.GUARD.tainted() == tainted


THREADS = 0
RNG = torch.empty(0)


def test_what_cannot_be_put_back_is_named_and_taints_the_process(monkeypatch):
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])
    stop = threading.Event()
    notes: list[str] = []
    try:
        with state_guard.GUARD.preserved(notes):
            threading.Thread(target=stop.wait, name="left-behind", daemon=True).start()
    finally:
        stop.set()
    assert any("cannot be put back" in n and "left-behind" in n for n in notes), notes
    assert state_guard.GUARD.tainted() == ["Python threads left running (left-behind)"]


def test_the_random_state_is_put_back_without_a_word():
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        torch.rand(3)
    assert notes == []


def _device_context():
    return getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)


@pytest.mark.parametrize("kind", ["call", "case"])
def test_a_default_device_set_by_user_code_is_put_back_to_none_set_not_to_cpu_set(kind):
    """No default device set is not "cpu" set: a set device is a DeviceContext every torch call goes
    through (and the quick state reading stands down under it for the rest of the process)."""
    from gradcheck_cli.results import ErrorKind
    from gradcheck_cli.sandbox.errors import guarded

    assert _device_context() is None
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        if kind == "call":
            guarded(ErrorKind.FORWARD, "forward", torch.set_default_device, "meta")
        else:  # outside any single call: the case's restore puts it back
            torch.set_default_device("meta")
    assert _device_context() is None and torch.get_default_device().type == "cpu"
    assert len(notes) == 1 and "torch.set_default_device (none set -> meta)" in notes[0], notes


def test_a_default_device_the_user_had_set_is_kept():
    from gradcheck_cli.results import ErrorKind
    from gradcheck_cli.sandbox.errors import guarded

    torch.set_default_device("cpu")
    try:
        notes: list[str] = []
        with state_guard.GUARD.preserved(notes):
            guarded(ErrorKind.FORWARD, "forward", torch.set_default_device, None)
            assert _device_context() is not None
        assert _device_context() is not None and notes and "(cpu -> none set)" in notes[0], notes
    finally:
        torch.set_default_device(None)


def test_a_call_that_changes_the_default_device_is_put_back_and_told_once():
    from gradcheck_cli.results import ErrorKind
    from gradcheck_cli.sandbox.errors import guarded

    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        guarded(ErrorKind.FORWARD, "forward", torch.set_default_device, "meta")
        assert torch.empty(1).device.type == "cpu"  # put back at once: the next step of the check works
    assert len(notes) == 1 and "torch.set_default_device" in notes[0]
    guarded(ErrorKind.FORWARD, "forward", torch.set_default_device, "meta")  # outside any case: nothing kept
    assert torch.empty(1).device.type == "cpu"
    with state_guard.GUARD.preserved(notes):
        pass
    assert len(notes) == 1


# ------------------------------------------------------------------ the quick test of torch's namespaces
# preserved() takes torch's namespaces (~770 owners, ~29,000 names) as two flat lists and, after the body, asks
# first whether every name is still bound to the very same object; these are the changes that quick test must
# not let through (each one is told, attributed to the block it happened in, and put back).


class _EqualToAll:
    """A replacement that claims to equal anything: only ``is`` tells it from the original."""

    def __call__(self, *args: object) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def _rename_last(fake):  # same objects in the same places, one name different
    last = fake.third
    del fake.third
    fake.renamed = last


def _swap(fake):  # same names, same objects in the same places, but each name bound to the other's object
    first, second = fake.first, fake.second
    del fake.first, fake.second, fake.third
    fake.second, fake.first, fake.third = first, second, _third


def _first(x):
    return x


def _second(x):
    return x


def _third(x):
    return x


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda fake: setattr(fake, "first", lambda x: x * 0), ["first"]),
        (lambda fake: delattr(fake, "second"), ["second"]),
        (_rename_last, ["third"]),
        (_swap, ["first", "second"]),
        (lambda fake: setattr(fake, "first", _EqualToAll()), ["first"]),
    ],
)
def test_every_kind_of_monkeypatch_is_caught_told_and_put_back(monkeypatch, change, said):
    fake = ModuleType("torch.gradcheck_state_fake")
    fake.first, fake.second, fake.third = _first, _second, _third
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    quiet: list[str] = []
    with state_guard.GUARD.preserved(quiet):
        pass
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        change(fake)
    assert quiet == [] and len(notes) == 1, notes
    assert all(f"torch.gradcheck_state_fake.{name}" in notes[0] for name in said), notes
    assert (fake.first, fake.second, fake.third) == (_first, _second, _third)


def test_a_change_between_two_blocks_belongs_to_the_block_around_them(monkeypatch):
    fake = ModuleType("torch.gradcheck_state_fake")
    fake.first = _first
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    outer: list[str] = []
    inner: list[str] = []
    with state_guard.GUARD.preserved(outer):
        with state_guard.GUARD.preserved(inner):
            pass
        fake.first = _second  # as a Function's __init__ would, between two checks
        with state_guard.GUARD.preserved(inner):
            assert fake.first is _second  # the change holds for the checks after it
    assert inner == [] and len(outer) == 1 and "torch.gradcheck_state_fake.first" in outer[0], (inner, outer)
    assert fake.first is _first


@pytest.mark.parametrize("last", [False, True])
def test_a_change_before_the_last_block_holds_in_it_and_is_told_once_and_put_back(monkeypatch, last):
    """A case's last check (``last``) starts from the case's copy of torch's namespaces without reading
    them: a change the set-up made before it still holds in it, and is told once and put back, at its
    end rather than the case's."""
    fake = ModuleType("torch.gradcheck_state_fake")
    fake.first = _first
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    reads = []
    kept = state_guard._namespaces_kept
    monkeypatch.setattr(state_guard, "_namespaces_kept", lambda before: reads.append(1) or kept(before))
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes, ends_with_block=True):
        fake.first = _second  # as a Module's __init__ would, before the checks
        before = len(reads)
        with state_guard.GUARD.preserved(notes, last=last):
            assert fake.first is _second
            started = len(reads) - before
        assert (fake.first is _first) is last  # put back at the end of the last block
    assert fake.first is _first
    assert len(notes) == 1 and "torch.gradcheck_state_fake.first" in notes[0], notes
    assert started == (0 if last else 1)


def test_the_last_block_reads_torch_namespaces_once_for_a_case_that_changes_nothing(monkeypatch):
    reads = []
    kept = state_guard._namespaces_kept
    monkeypatch.setattr(state_guard, "_namespaces_kept", lambda before: reads.append("kept") or kept(before))
    with state_guard.GUARD.consecutive():
        for _ in range(3):  # cases of a worker, one check each
            notes: list[str] = []
            with state_guard.GUARD.preserved(notes, ends_with_block=True):
                with state_guard.GUARD.preserved(notes, last=True):
                    pass
            assert notes == []
    assert reads == ["kept"] * 3  # one look per case, at its check's end


PATCHING_MODULE = """
import torch


class Patching(torch.nn.Module):  # its __init__ patches torch (the case's set-up); its forward needs the patch
    def __init__(self):
        super().__init__()
        torch.sinc = lambda t: 2 * t

    def forward(self, x):
        assert torch.sinc(torch.ones(1)).item() == 2.0
        return torch.sinc(x).sin()


def plain(x):
    assert torch.sinc(torch.zeros(1)).item() == 1.0
    return x.sin()
"""


@pytest.mark.parametrize("checks", ["[backward]", "[backward, double_backward, forward_ad]"])
@pytest.mark.parametrize("mode", [["--no-isolate"], ["-j", "1"]])
def test_a_patch_made_by_a_cases_set_up_holds_for_every_check_and_is_told_once(
    user_module, write_spec, invoke, checks, mode
):
    user_module(PATCHING_MODULE, "patching")
    # the module imported by the case before (a new module makes the checks read torch's namespaces anew)
    write_spec(
        f"function: patching:Patching\ninputs: [{{shape: [3]}}]\nchecks: {checks}\ncases:\n"
        "  - name: before\n    function: patching:plain\n  - name: patching\n"
        "  - name: after\n    function: patching:plain\n",
        "specs/s.yaml",
    )
    result = invoke("specs/s.yaml", "--format", "json", *mode)
    results = {r["case"]: r for r in json.loads(result.stdout)["results"]}
    assert [r["status"] for r in results.values()] == ["pass"] * 3, results
    told = [w for w in results["patching"]["warnings"] if "torch.sinc" in w]
    assert len(told) == 1 and "put it back" in told[0], results["patching"]["warnings"]
    assert torch.sinc(torch.zeros(1)).item() == 1.0


def test_a_default_device_whose_mode_a_transform_dropped_is_told_as_it_was_set():
    """torch.set_default_device inside a vmapped backward leaves the device context set with its function mode
    gone; torch.get_default_device then says "cpu". The warning names the device that was set."""
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        torch.set_default_device("meta")
        torch._C._pop_torch_function_stack()  # as the transform's exit leaves it
        assert _device_context() is not None and torch.get_default_device().type == "cpu"
    assert _device_context() is None
    assert len(notes) == 1 and "torch.set_default_device (none set -> meta)" in notes[0], notes


SUBNORMAL_SOURCE = """
import torch


class ThroughSubnormals(torch.autograd.Function):  # correct: y = x, computed through subnormal values
    @staticmethod
    def forward(ctx, x):
        return (x * 1e-308) * 1e308

    @staticmethod
    def backward(ctx, g):
        return g * 1.0


def flushes(x):
    torch.set_flush_denormal(True)
    return x * 3


def prints_short(x):
    torch.set_printoptions(precision=2, linewidth=40)
    return x * 3
"""


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU cannot flush subnormals")
@pytest.mark.parametrize(
    "changer, said",
    [
        ("flushes", "torch.set_flush_denormal (False -> True)"),
        ("prints_short", "torch.set_printoptions (precision 4 -> 2, linewidth 80 -> 40)"),
    ],
)
@pytest.mark.parametrize("mode", [["--no-isolate"], ["-j", "1"]])
def test_flush_denormal_and_print_options_set_by_a_case_are_put_back_and_named(
    user_module, write_spec, invoke, changer, said, mode
):
    """Issue 27, item 6: a case's torch.set_flush_denormal(True) made the next correct Function, whose
    arithmetic passes through subnormals, FAIL in the same worker."""
    user_module(SUBNORMAL_SOURCE)
    write_spec(SPEC.format(changer=changer, victim="ThroughSubnormals"), "specs/s.yaml")
    result = invoke("specs/s.yaml", "--format", "json", *mode)
    results = {r["case"]: r for r in json.loads(result.stdout)["results"]}
    assert results["victim"]["status"] == "pass", results["victim"]
    assert results["changer"]["status"] == "pass", results["changer"]
    assert any(said in w and "put it back" in w for w in results["changer"]["warnings"]), results["changer"]
    assert result.exit_code == 0, result.output
    assert torch.tensor([1e-310], dtype=torch.float64).mul(1).item() != 0.0  # nor in this process
    assert torch._tensor_str.PRINT_OPTS.precision == 4


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda: torch.set_flush_denormal(True), "torch.set_flush_denormal (False -> True)"),
        (lambda: torch.set_printoptions(sci_mode=True), "torch.set_printoptions (sci_mode None -> True)"),
    ],
)
def test_flush_denormal_and_print_options_are_read_without_a_getter(change, said):
    if "flush" in said and not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals")
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        change()
    assert any(said in n for n in notes), notes
    assert torch.tensor([1e-310], dtype=torch.float64).mul(1).item() != 0.0
    assert torch.tensor([1e-40], dtype=torch.float32).mul(1).item() != 0.0
    assert torch._tensor_str.PRINT_OPTS.sci_mode is None


# ------------------------------------------------------------------ issue 44, item 6: the pieces added to the guard
def _pack(t):
    return t * 1.01


def _unpack(t):
    return t


def _enter_hooks():
    torch.autograd.graph.saved_tensors_hooks(_pack, _unpack).__enter__()


def _register_forward_hook():
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out * 0)


def _open_dual_level():
    torch.autograd.forward_ad.enter_dual_level()


def _top_hooks():
    return torch._C._autograd._top_saved_tensors_default_hooks(True)


LIBRARIES: list = []
LEFT: list = []  # context managers entered and never exited (their generators not collected meanwhile)


def _left_entered(manager):
    LEFT.append(manager)
    manager.__enter__()


def _override_sin():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("sin", lambda t: torch.ops.aten.cos.default(t), "CPU")
    LIBRARIES.append(lib)  # held, as a user's module holds it: only the guard unregisters it


def _sin_is_sin():
    return torch.sin(torch.zeros(1)).item() == 0.0


@pytest.mark.parametrize(
    "change, restored, said",
    [
        (_enter_hooks, lambda: _top_hooks() is None, "torch.autograd.graph.saved_tensors_hooks left entered"),
        (
            lambda: _left_entered(torch.autograd.graph.disable_saved_tensors_hooks("no hooks here")),
            lambda: torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() is None,
            "torch.autograd.graph.disable_saved_tensors_hooks (None -> no hooks here)",
        ),
        (
            _register_forward_hook,
            lambda: not torch.nn.modules.module._global_forward_hooks,
            "global nn.Module hooks (torch.nn.modules.module.register_module_*_hook) (forward_hooks +1)",
        ),
        (_override_sin, _sin_is_sin, "an operator's kernel overridden with torch.library (aten::sin for CPU)"),
        (
            _open_dual_level,
            lambda: torch.autograd.forward_ad._current_level == -1,
            "a forward-AD dual level left open (-1 -> 0)",
        ),
        (
            lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN),
            lambda: signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL,
            "the SIGCHLD handler (SIG_DFL -> SIG_IGN)",
        ),
        (
            lambda: signal.signal(signal.SIGALRM, signal.SIG_IGN),
            lambda: signal.getsignal(signal.SIGALRM) is signal.SIG_DFL,
            "the SIGALRM handler (SIG_DFL -> SIG_IGN)",
        ),
        (
            lambda: signal.alarm(600),
            lambda: signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0),
            "signal.alarm / signal.setitimer (none pending -> pending",
        ),
        (
            lambda: _left_entered(torch.autograd.set_multithreading_enabled(False)),
            torch._C._is_multithreading_enabled,
            "torch.autograd.set_multithreading_enabled (True -> False)",
        ),
    ],
)
def test_preserved_puts_back_the_hooks_kernels_levels_signals_and_timers_a_body_left(
    monkeypatch, change, restored, said
):
    """Issue 44, item 6: each of these, left by one case, changed the next case's verdict in the same worker."""
    if not hasattr(signal, "SIGCHLD"):
        pytest.skip("no POSIX signals here")
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])
    notes: list[str] = []
    try:
        with state_guard.GUARD.preserved(notes):
            change()
        assert restored()
        assert len(notes) == 1 and said in notes[0] and "put it back" in notes[0], notes
        assert state_guard.GUARD.tainted() == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_a_pending_timer_that_was_there_before_is_kept_counting_down(monkeypatch):
    """An alarm pending before the block (pytest-timeout's, a caller's watchdog) is not the body's change: it
    stays, and one the body cancelled is set again for what was left of it."""
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])
    signal.setitimer(signal.ITIMER_REAL, 600)
    try:
        quiet: list[str] = []
        with state_guard.GUARD.preserved(quiet):
            pass
        assert quiet == [] and 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
        notes: list[str] = []
        with state_guard.GUARD.preserved(notes):
            signal.alarm(0)
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
        assert len(notes) == 1 and "(pending, " in notes[0] and "-> none pending)" in notes[0], notes
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_hooks_entered_before_the_block_stay_and_hooks_it_popped_are_pushed_again():
    outer = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
    with outer:
        notes: list[str] = []
        with state_guard.GUARD.preserved(notes):
            _enter_hooks()
            _enter_hooks()
        assert _top_hooks() == (_pack, _unpack) and len(notes) == 1
        with state_guard.GUARD.preserved(notes):
            torch._C._autograd._pop_saved_tensors_default_hooks()
        assert _top_hooks() == (_pack, _unpack)
    assert _top_hooks() is None


def test_kernels_torch_registers_and_operators_user_code_defines_are_not_overrides(monkeypatch):
    """A module of torch imported during a case registers kernels of its own (torch._dynamo's hundreds), and a
    user's own operator has its own kernels: neither changes another case, and neither is unregistered."""
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        lib = torch.library.Library("gradcheck_state_test", "FRAGMENT")
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda t: t * 2, "CPU")
    try:
        assert notes == [] and torch.ops.gradcheck_state_test.twice(torch.ones(1)).item() == 2.0
        before = state_guard.torch_state.kernels()
        torch_kernel = next(k for k in before.impls if k.startswith("aten/"))  # one torch registered itself
        after = state_guard.torch_state.Kernels(before.impls, before.defs)
        assert state_guard.torch_state.overrides(before._replace(impls=before.impls - {torch_kernel}), after) == []
    finally:
        lib._destroy()


@pytest.mark.parametrize(
    "where, users",
    [
        ("/home/me/project/ops.py:12", True),
        (state_guard.torch_state._TORCH_DIR + "_prims/__init__.py:40", False),
        ("/dev/null:168", False),  # torch 2.4's prims kernels, registered by torch.compile: no file named
    ],
)
def test_a_kernel_is_the_user_s_where_the_dispatcher_names_a_file_outside_torch(monkeypatch, where, users):
    """Under torch 2.4 every compile case warned "an operator's kernel overridden with torch.library ()": the
    prims kernels torch.compile registers on first use are recorded at /dev/null, which is not a user's file."""
    monkeypatch.setattr(state_guard.torch_state, "_origin", {})
    dump = f"name: prims::fake\nCPU: registered at {where} :: (none) [ boxed ]\n"
    monkeypatch.setattr(torch._C, "_dispatch_dump", lambda op: dump)
    assert state_guard.torch_state._by_user_code("prims/fake/CPU") is users


def test_a_kernel_override_made_by_an_import_stays_and_taints_the_process(monkeypatch):
    """What importing a module overrode cannot be registered again for the module's later cases (as every other
    import-time change is, runner._import_effects): it stays, named, and a worker is replaced before its next
    case, so that no other module's case sees it."""
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])
    monkeypatch.setattr(state_guard.torch_state, "imported", set())
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        before = state_guard.snapshot()
        _override_sin()  # as a module's top level would, while the runner imports it
        assert state_guard.changes(before) == []  # nothing to set again: it is not undone
    try:
        assert not _sin_is_sin()
        assert len(notes) == 1 and "cannot be put back" in notes[0] and "aten::sin for CPU" in notes[0], notes
        assert state_guard.GUARD.tainted() == ["an operator's kernel overridden with torch.library (aten::sin for CPU)"]
    finally:
        LIBRARIES.pop()._destroy()
    assert _sin_is_sin()


def test_a_call_that_leaves_a_dual_level_open_is_put_back_before_the_tool_opens_its_own():
    """The forward_ad check opens a dual level of its own after calling forward; torch allows one at a time, so
    one a call left open made the check an internal error (exit 4)."""
    from gradcheck_cli.results import ErrorKind
    from gradcheck_cli.sandbox.errors import guarded

    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        guarded(ErrorKind.FORWARD, "forward", _open_dual_level)
        assert torch.autograd.forward_ad._current_level == -1
        with torch.autograd.forward_ad.dual_level():
            pass
    assert len(notes) == 1 and "a forward-AD dual level left open (-1 -> 0)" in notes[0], notes


def test_torch_storage_follows_the_default_dtype_and_is_no_monkeypatch():
    """torch.set_default_dtype rebinds torch.Storage; a module's import-time default dtype, set again for its
    second case in the same worker, was told as "torch's functions (monkeypatched) (torch.Storage)"."""
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes, ends_with_block=True):
        torch.set_default_dtype(torch.float64)
        with state_guard.GUARD.preserved(notes, last=True):
            pass
    assert len(notes) == 1 and "monkeypatched" not in notes[0] and "torch.set_default_dtype" in notes[0], notes
    assert torch.Storage is torch.FloatStorage


def test_the_trust_model_page_lists_every_piece_the_guard_covers():
    """docs/explanation/trust-model.md names each piece of process state as the guard's warnings name it."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "explanation" / "trust-model.md").read_text()
    text = " ".join(page.split())  # the page's lines wrap
    missing = []
    for switch in state_guard._switches():
        name = switch.name
        if name.startswith("the SIG") and name.endswith(" handler"):
            name = name.removeprefix("the ").removesuffix(" handler")  # listed together: "the handlers of ..."
        elif name.startswith("signal.alarm / signal.setitimer("):
            name = "signal.alarm / signal.setitimer"
        elif "random" in name:
            name = "random states"
        if name not in text:
            missing.append(switch.name)
    assert missing == []
