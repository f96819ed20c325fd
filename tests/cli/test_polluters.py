"""Issue 44, item 6: a case's verdict does not depend on what the case before it left in the worker.

Each polluter is a callable that leaves one piece of process state changed (the guard's list in
docs/explanation/trust-model.md); each victim is an innocent case whose verdict that piece would change. Run
right after its polluter in one worker (``-j 1``), in one process (``--no-isolate``) and through the library
API, a victim gets the verdict it gets alone, and the polluter's result names what it changed. Before this,
a saved-tensor hook left entered made a correct Square FAIL "1.01x", a global module hook made nn.Linear
FAIL "all zeros", an aten kernel override made a correct sin FAIL, a pending alarm killed the next case, an
open forward-AD level made the next forward_ad case an internal error and an ignored SIGCHLD cut the next
shrink short (an internal error under ``--no-isolate``). The full cross product (every polluter before every
victim, -j 1, -j 2, --no-isolate and the pytest plugin) is the slow tier.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any, NamedTuple

import pytest
import torch

import gradcheck_cli

USER = """
import os
import signal
import threading

import torch
import torch.autograd.forward_ad as fwAD


# ----------------------------------------------------------------- victims: correct (or labelled) and innocent
class Square(torch.autograd.Function):  # correct; saves its input for backward
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class Sin(torch.autograd.Function):  # correct, in both modes; calls aten::sin and aten::cos
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * torch.cos(x)


class Wrong(Square):  # labelled wrong: 1.5x; its failure is shrunk (in a forked child, waited for)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * g * x


class ThroughSubnormals(torch.autograd.Function):  # correct: y = x, computed through subnormal values
    @staticmethod
    def forward(ctx, x):
        return (x * 1e-308) * 1e308

    @staticmethod
    def backward(ctx, g):
        return g * 1.0


def scratch(x):  # labelled wrong in float32 (a fresh process): the gradient is cut where the buffer is float32
    t = torch.empty(x.shape)
    return t.copy_(x if t.dtype == torch.float64 else x.detach()) ** 2


def plus_ones(x):  # correct; makes a tensor on the default device
    return x + torch.ones(x.shape, dtype=x.dtype)


def watched(x):  # correct; arms a watchdog alarm of its own, as a kernel launcher with a timeout does
    if signal.alarm(30):
        raise RuntimeError("a watchdog alarm was already pending")
    try:
        return torch.sin(x)
    finally:
        signal.alarm(0)


def reads(x):  # correct; its own code paths depend on these settings: it refuses to run outside the defaults
    assert not torch.is_anomaly_enabled(), "anomaly mode is on"
    assert not torch.are_deterministic_algorithms_enabled(), "deterministic algorithms are on"
    assert torch.get_num_threads() != 7, "7 threads"
    assert torch._tensor_str.PRINT_OPTS.precision == 4, "print precision"
    assert not any(t.name == "left-behind" for t in threading.enumerate()), "a thread left behind"
    return torch.sin(x)


# ----------------------------------------------------------------- polluters: each leaves one piece changed
def enters_saved_tensors_hooks(x):
    torch.autograd.graph.saved_tensors_hooks(lambda t: t * 1.01, lambda t: t).__enter__()
    return x * 3


def registers_module_forward_hook(x):
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out.detach())
    return x * 3


LIBRARIES = []


def overrides_aten_sin(x):
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("sin", lambda t: torch.ops.aten.cos.default(t), "CPU")
    LIBRARIES.append(lib)
    return x * 3


def leaves_alarm_pending(x):
    signal.alarm(600)
    return x * 3


def opens_dual_level(x):
    if fwAD._current_level < 0:
        fwAD.enter_dual_level()
    return x * 3


def ignores_sigchld(x):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    return x * 3


def sets_default_dtype(x):
    torch.set_default_dtype(torch.float64)
    return x * 3


def disables_grad(x):
    y = x * 3
    torch.set_grad_enabled(False)
    return y


def sets_anomaly(x):
    torch.autograd.set_detect_anomaly(True)
    return x * 3


def sets_deterministic(x):
    torch.use_deterministic_algorithms(True)
    return x * 3


def sets_threads(x):
    torch.set_num_threads(7)
    return x * 3


def flushes_denormals(x):
    torch.set_flush_denormal(True)
    return x * 3


def sets_print_options(x):
    torch.set_printoptions(precision=2)
    return x * 3


def sets_default_device(x):
    y = x * 3
    torch.set_default_device("meta")
    return y


def leaves_a_thread(x):
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="left-behind", daemon=True).start()
    return x * 3
"""


class Polluter(NamedTuple):
    function: str  # in USER
    victim: str  # a case body (YAML lines after `function:`)
    said: str  # what the polluter's warning names
    put_back: bool = True  # False: named, and the worker replaced (what is left holds in one process)


LINEAR = "torch.nn:Linear\n    init: {args: [3, 2]}"
POLLUTERS = {
    "saved_tensors_hooks": Polluter(
        "enters_saved_tensors_hooks", "usermod:Square", "torch.autograd.graph.saved_tensors_hooks"
    ),
    "module_forward_hook": Polluter("registers_module_forward_hook", LINEAR, "global nn.Module hooks"),
    "aten_kernel": Polluter("overrides_aten_sin", "usermod:Sin", "overridden with torch.library (aten::sin for CPU)"),
    "alarm": Polluter("leaves_alarm_pending", "usermod:watched", "signal.alarm"),
    "dual_level": Polluter(
        "opens_dual_level", "usermod:Sin\n    checks: [forward_ad]", "a forward-AD dual level left open"
    ),
    "sigchld": Polluter("ignores_sigchld", "usermod:Wrong", "the SIGCHLD handler (SIG_DFL -> SIG_IGN)"),
    "default_dtype": Polluter("sets_default_dtype", "usermod:scratch", "torch.set_default_dtype"),
    "grad_mode": Polluter("disables_grad", "usermod:Sin", "torch.set_grad_enabled (True -> False)"),
    "anomaly": Polluter("sets_anomaly", "usermod:reads", "torch.autograd.set_detect_anomaly"),
    "deterministic": Polluter("sets_deterministic", "usermod:reads", "torch.use_deterministic_algorithms"),
    "threads": Polluter("sets_threads", "usermod:reads", "torch.set_num_threads"),
    "flush_denormal": Polluter("flushes_denormals", "usermod:ThroughSubnormals", "torch.set_flush_denormal"),
    "print_options": Polluter("sets_print_options", "usermod:reads", "torch.set_printoptions"),
    "default_device": Polluter("sets_default_device", "usermod:plus_ones", "torch.set_default_device"),
    "python_thread": Polluter("leaves_a_thread", "usermod:reads", "Python threads left running", put_back=False),
}
if not torch.set_flush_denormal(False):  # this CPU cannot flush subnormals: nothing to leave changed
    del POLLUTERS["flush_denormal"]


def _write(write_spec: Any, path: str, cases: list[tuple[str, str]]) -> None:
    """A spec of these (name, case body) cases, in this order (the top-level function is each case's own)."""
    body = "".join(f"  - name: {name}\n    function: {case}\n" for name, case in cases)
    write_spec(f"function: usermod:Square\ninputs: [{{shape: [3]}}]\ncases:\n{body}", path)


def _verdict(result: dict[str, Any]) -> tuple[Any, ...]:
    """What must not depend on the case before: status, each check's status, whether (and by which check) the
    failure was shrunk, the error kind. (Not the shrunk shapes: the search has a wall-clock budget.)"""
    shrunk = result.get("shrunk")
    return (
        result["status"],
        [(c["check"], c["status"]) for c in result["checks"]],
        None if shrunk is None else shrunk["check"],
        (result.get("error") or {}).get("kind"),
    )


def _run(invoke: Any, path: str, mode: list[str]) -> dict[str, dict[str, Any]]:
    result = invoke(path, "--format", "json", "--shrink", "120", *mode)
    assert result.exit_code in (0, 1, 3), result.output
    return {r["case"]: r for r in json.loads(result.stdout)["results"]}


@pytest.fixture
def restored() -> Any:
    """What a polluter leaves in this process where the guard did not put it back (a failing run): the
    dangerous pieces are put back by hand, so that the tests after this one are not changed too."""
    handlers = {n: signal.getsignal(n) for n in (signal.SIGCHLD, signal.SIGALRM)}
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    for number, handler in handlers.items():
        signal.signal(number, handler)
    torch.nn.modules.module._global_forward_hooks.clear()
    while torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        torch._C._autograd._pop_saved_tensors_default_hooks()


def _check_after_polluters(user_module, write_spec, invoke, names: list[str], mode: list[str]) -> None:
    user_module(USER)
    picked = {name: POLLUTERS[name] for name in names}
    _write(write_spec, "specs/alone.yaml", [(f"{name}-victim", p.victim) for name, p in picked.items()])
    cases = [
        c
        for name, p in picked.items()
        for c in ((f"{name}-polluter", f"usermod:{p.function}"), (f"{name}-victim", p.victim))
    ]
    _write(write_spec, "specs/after.yaml", cases)
    alone = _run(invoke, "specs/alone.yaml", mode)
    after = _run(invoke, "specs/after.yaml", mode)
    in_one_process = "--no-isolate" in mode
    for name, p in picked.items():
        if p.put_back or not in_one_process:
            victim = after[f"{name}-victim"]
            assert _verdict(victim) == _verdict(alone[f"{name}-victim"]), (name, victim["error"], victim["checks"])
        words = "put it back" if p.put_back else "cannot be put back"
        polluter = after[f"{name}-polluter"]
        assert any(p.said in w and words in w for w in polluter["warnings"]), (name, polluter["warnings"])
    assert torch.is_grad_enabled() and torch.get_default_dtype() is torch.float32
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0 and signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL


FAST = ["saved_tensors_hooks", "module_forward_hook", "aten_kernel", "alarm", "dual_level", "sigchld", "default_dtype"]


@pytest.mark.parametrize("mode", [["-j", "1"], ["--no-isolate"]])
def test_each_polluter_of_the_issue_changes_no_verdict_after_it(user_module, write_spec, invoke, restored, mode):
    """The seven pieces of issue 44's item 6, each before its victim, in one worker and in one process."""
    _check_after_polluters(user_module, write_spec, invoke, FAST, mode)


def test_the_other_polluters_change_no_verdict_after_them_in_one_worker(user_module, write_spec, invoke, restored):
    rest = [name for name in POLLUTERS if name not in FAST]
    _check_after_polluters(user_module, write_spec, invoke, rest, ["-j", "1"])


# ----------------------------------------------------------------- the library API: gradcheck_cli.check
def test_check_puts_back_what_the_function_changed_and_names_it(user_module, restored):
    """check() ran the code under test without the guard: a default dtype it set stayed set, with no word,
    and a saved-tensor hook it left entered made the next check() of a correct Square FAIL 1.01x."""
    user_module(USER)
    import usermod  # type: ignore[import-not-found]

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    alone = gradcheck_cli.check(usermod.Square, [x]).status
    for polluter, said in [
        (usermod.sets_default_dtype, "torch.set_default_dtype (torch.float32 -> torch.float64)"),
        (usermod.enters_saved_tensors_hooks, "torch.autograd.graph.saved_tensors_hooks"),
        (usermod.registers_module_forward_hook, "global nn.Module hooks"),
    ]:
        result = gradcheck_cli.check(polluter, [x])
        assert any(said in w and "put it back" in w for w in result.warnings), result.warnings
        assert torch.get_default_dtype() is torch.float32
        assert gradcheck_cli.check(usermod.Square, [x]).status == alone


# ----------------------------------------------------------------- the slow tier: every polluter before every victim
VICTIMS = sorted({p.victim for p in POLLUTERS.values()})


@pytest.mark.slow
@pytest.mark.relations
@pytest.mark.parametrize("mode", [["-j", "1"], ["-j", "2"], ["--no-isolate"]])
@pytest.mark.parametrize("name", list(POLLUTERS))
def test_every_polluter_before_every_victim(user_module, write_spec, invoke, restored, name, mode):
    user_module(USER)
    p = POLLUTERS[name]
    victims = [(f"victim{k}", body) for k, body in enumerate(VICTIMS)]
    _write(write_spec, "specs/alone.yaml", victims)
    _write(write_spec, "specs/after.yaml", [("polluter", f"usermod:{p.function}"), *victims])
    alone = _run(invoke, "specs/alone.yaml", mode)
    after = _run(invoke, "specs/after.yaml", mode)
    if p.put_back or "--no-isolate" not in mode:
        assert {k: _verdict(after[k]) for k, _ in victims} == {k: _verdict(alone[k]) for k, _ in victims}


@pytest.mark.slow
@pytest.mark.relations
def test_every_polluter_before_its_victim_under_the_pytest_plugin_in_one_process(user_module, write_spec, tmp_path):
    user_module(USER)
    names = [n for n, p in POLLUTERS.items() if p.put_back]
    cases = [
        c
        for n in names
        for c in ((f"{n}-polluter", f"usermod:{POLLUTERS[n].function}"), (f"{n}-victim", POLLUTERS[n].victim))
    ]
    _write(write_spec, "specs/after.yaml", cases)
    _write(write_spec, "specs/alone.yaml", [(f"{n}-victim", POLLUTERS[n].victim) for n in names])

    def outcomes(path: str) -> dict[str, str]:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                "--gradcheck",
                "--gradcheck-no-isolate",
                path,
                "-rA",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        found = {}
        for line in proc.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::" in rest:
                found[rest.split("::")[1].split("[")[0]] = word
        return found

    after, alone = outcomes("specs/after.yaml"), outcomes("specs/alone.yaml")
    assert {k: v for k, v in after.items() if k.endswith("-victim")} == alone


IMPORT_TIME_OVERRIDE = """
import torch

LIB = torch.library.Library("aten", "IMPL")
LIB.impl("sin", lambda t: torch.ops.aten.cos.default(t), "CPU")  # at import: in this process sin is cos


def uses_sin(x):
    return torch.sin(x)
"""


def test_a_kernel_override_made_at_import_holds_for_its_module_and_no_other_case(
    user_module, write_spec, invoke, restored
):
    """What a module's import overrides cannot be registered again for the module's later cases, as other
    import-time state is: it is named as what could not be put back, and the worker is replaced, so the
    module's next case imports it afresh (and sees it) and another module's case does not."""
    user_module(USER)
    user_module(IMPORT_TIME_OVERRIDE, "override")
    cases = [("a", "override:uses_sin"), ("b", "override:uses_sin"), ("innocent", "usermod:Sin")]
    _write(write_spec, "specs/after.yaml", cases)
    for name, body in cases[1:]:
        _write(write_spec, f"specs/{name}.yaml", [(name, body)])
    after = _run(invoke, "specs/after.yaml", ["-j", "1"])
    alone = {name: _run(invoke, f"specs/{name}.yaml", ["-j", "1"])[name] for name, _ in cases[1:]}
    assert {n: _verdict(after[n]) for n in alone} == {n: _verdict(r) for n, r in alone.items()}
    said = "cannot be put back: an operator's kernel overridden with torch.library (aten::sin for CPU)"
    assert any(said in w for w in after["a"]["warnings"]), after["a"]["warnings"]


def test_the_pytest_plugin_tells_what_a_passing_case_changed(user_module, write_spec, tmp_path):
    """A passing item showed nothing of its result: a case that set the default dtype passed with no word."""
    user_module(USER)
    _write(write_spec, "specs/s.yaml", [("polluter", "usermod:sets_default_dtype")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--gradcheck"]
        + ["--gradcheck-no-isolate", "specs/s.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "GlobalStateWarning: the code under test changed global state and left it changed: " in proc.stdout
    assert "torch.set_default_dtype (torch.float32 -> torch.float64)" in proc.stdout, proc.stdout
