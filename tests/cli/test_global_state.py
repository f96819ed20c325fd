"""Issue 14, item 1: global state a case changes is put back after it, whatever runs the cases.

Before this, a reused worker (``-j 1``), ``--no-isolate`` and the pytest plugin carried a case's
``torch.set_grad_enabled(False)``, monkeypatches and ``os.chdir`` into the cases after it, and a
correct Function failed or errored after an unrelated one.
"""
from __future__ import annotations

import json
import os
import threading
import warnings

import pytest
import torch

from gradcheck_cli import state

SOURCE = '''
import os
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
'''

SPEC = """\
function: usermod:{changer}
inputs: [{{shape: [3]}}]
cases:
  - name: changer
  - name: victim
    function: usermod:{victim}
"""


@pytest.mark.parametrize("changer, victim, said", [
    ("disables_grad", "Sin", "torch.set_grad_enabled (True -> False)"),
    ("patches_sin", "Sin", "torch.sin"),
    ("changes_directory", "scaled", "the working directory"),
    ("sets_deterministic", "Sin", "torch.use_deterministic_algorithms"),
])
@pytest.mark.parametrize("mode", [["--no-isolate"], ["-j", "1"]])
def test_a_case_that_changes_global_state_changes_no_other_case(user_module, write_spec, invoke, tmp_path,
                                                               changer, victim, said, mode):
    user_module(SOURCE)
    (tmp_path / "scale.txt").write_text("2.0")
    write_spec(SPEC.format(changer=changer, victim=victim), "specs/s.yaml")
    result = invoke("specs/s.yaml", "--format", "json", *mode)
    results = {r["case"]: r for r in json.loads(result.stdout)["results"]}
    assert results["victim"]["status"] == "pass", results["victim"]
    assert any(said in w and "put it back" in w for w in results["changer"]["warnings"]), results["changer"]
    assert os.getcwd() == str(tmp_path) and torch.is_grad_enabled() and torch.sin(torch.zeros(1)).item() == 0


IMPORT_TIME = '''
import torch

torch.set_default_dtype(torch.float64)  # at import: every case of this module sees it, as in a fresh process


def scratch(x):  # right only when the default dtype is float64
    return torch.empty(x.shape).copy_(x) ** 2
'''

PLAIN = '''
import torch


def default_dtype_name(x):
    assert torch.get_default_dtype() is torch.float32, torch.get_default_dtype()
    return x * 2
'''


@pytest.mark.parametrize("order", [("a", "plain", "b"), ("plain", "a", "b"), ("a", "b", "plain")])
def test_state_set_by_importing_a_module_holds_for_each_of_its_cases_and_no_other(user_module, write_spec, invoke,
                                                                                  order):
    user_module(IMPORT_TIME, "importtime")
    user_module(PLAIN, "plain")
    entries = {"a": "importtime:scratch", "b": "importtime:scratch", "plain": "plain:default_dtype_name"}
    cases = "".join(f"  - name: {name}\n    function: {entries[name]}\n" for name in order)
    write_spec(f"function: {entries[order[0]]}\ninputs: [{{shape: [3]}}]\ncases:\n" + cases, "specs/s.yaml")
    result = invoke("specs/s.yaml", "--format", "json", "-j", "1")
    statuses = {r["case"]: r["status"] for r in json.loads(result.stdout)["results"]}
    assert statuses == {"a": "pass", "b": "pass", "plain": "pass"}, result.stdout


@pytest.mark.parametrize("change, restored", [
    (lambda: torch.set_grad_enabled(False), torch.is_grad_enabled),
    (lambda: torch.set_default_dtype(torch.float64), lambda: torch.get_default_dtype() is torch.float32),
    (lambda: torch.autograd.set_detect_anomaly(True), lambda: not torch.is_anomaly_enabled()),
    (lambda: torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2), lambda: torch.get_num_threads() == THREADS),
    (lambda: setattr(torch.Tensor, "sum", lambda self: 0), lambda: "sum" not in vars(torch.Tensor)),
    (lambda: setattr(torch.nn.functional, "relu", None), lambda: callable(torch.nn.functional.relu)),
    (lambda: os.environ.__setitem__("GRADCHECK_STATE_TEST", "1"), lambda: "GRADCHECK_STATE_TEST" not in os.environ),
    (lambda: warnings.simplefilter("error"), lambda: warnings.filters[0][0] != "error"),
    (lambda: torch.rand(5), lambda: torch.equal(torch.get_rng_state(), RNG)),
])
def test_preserved_puts_back_what_the_body_changed(change, restored):
    global THREADS, RNG
    THREADS, RNG = torch.get_num_threads(), torch.get_rng_state()
    tainted = state.tainted()
    notes: list[str] = []
    with state.preserved(notes):
        change()
    assert restored()
    assert state.tainted() == tainted


THREADS = 0
RNG = torch.empty(0)


def test_what_cannot_be_put_back_is_named_and_taints_the_process(monkeypatch):
    monkeypatch.setattr(state, "_tainted", [])
    stop = threading.Event()
    notes: list[str] = []
    try:
        with state.preserved(notes):
            threading.Thread(target=stop.wait, name="left-behind", daemon=True).start()
    finally:
        stop.set()
    assert any("cannot be put back" in n and "left-behind" in n for n in notes), notes
    assert state.tainted() == ["Python threads left running (left-behind)"]


def test_the_random_state_is_put_back_without_a_word():
    notes: list[str] = []
    with state.preserved(notes):
        torch.rand(3)
    assert notes == []


def test_a_call_that_changes_the_default_device_is_put_back_and_told_once():
    from gradcheck_cli.errors import guarded
    from gradcheck_cli.results import ErrorKind

    notes: list[str] = []
    with state.preserved(notes):
        guarded(ErrorKind.FORWARD, "forward", torch.set_default_device, "meta")
        assert torch.empty(1).device.type == "cpu"  # put back at once: the next step of the check works
    assert len(notes) == 1 and "torch.set_default_device" in notes[0]
    guarded(ErrorKind.FORWARD, "forward", torch.set_default_device, "meta")  # outside any case: nothing kept
    assert torch.empty(1).device.type == "cpu"
    with state.preserved(notes):
        pass
    assert len(notes) == 1
