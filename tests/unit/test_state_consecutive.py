"""Issue 18, point 2: a loop of cases reads torch's ~29,000 names twice a case instead of four times
(state.GUARD.consecutive(), a check's block starting from its case's copy, a case's end taken from its last
check's), and still catches every change, told with the case or check that made it."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from gradcheck_cli import spec
from gradcheck_cli.run import plan, runner
from gradcheck_cli.sandbox import state_guard

SPEC = "function: gradcheck_cli.examples.relu:ReLU\ninputs: [{shape: [3, 4], avoid: [[-0.01, 0.01]]}]\n"


def _first(x):
    return x


def _second(x):
    return x


def _third(x):
    return x


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A module among torch's, whose functions a case monkeypatches."""
    module = ModuleType("torch.gradcheck_consecutive_fake")
    module.first = _first
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_a_loop_of_cases_reads_torch_s_names_twice_a_case(write_spec, monkeypatch: pytest.MonkeyPatch) -> None:
    (case,) = spec.load_file(write_spec(SPEC))
    task = plan.Task(case, "cpu", plan.RunOptions())
    runner.run_task(task)  # imports and first-call costs
    reads: list[str] = []
    take, compare = state_guard._torch_namespaces, state_guard._namespaces_kept
    monkeypatch.setattr(state_guard, "_torch_namespaces", lambda: reads.append("take") or take())
    monkeypatch.setattr(state_guard, "_namespaces_kept", lambda before: reads.append("compare") or compare(before))
    with state_guard.GUARD.consecutive():
        results = [runner.run_task(task) for _ in range(4)]
    assert [r.status.value for r in results] == ["pass"] * 4 and not any(r.warnings for r in results)
    assert len(reads) <= 1 + 2 * 4, reads  # the first case's start, then the check's start and end


def test_a_change_in_one_of_consecutive_cases_is_told_with_that_case_and_put_back(fake: ModuleType) -> None:
    notes: list[list[str]] = [[], [], []]
    with state_guard.GUARD.consecutive():
        with state_guard.GUARD.preserved(notes[0]):
            fake.first = _second
        assert fake.first is _first  # put back before the next case
        with state_guard.GUARD.preserved(notes[1]):
            assert fake.first is _first
        with state_guard.GUARD.preserved(notes[2]):
            fake.first = _third
    assert [len(n) for n in notes] == [1, 0, 1], notes
    assert all("torch.gradcheck_consecutive_fake.first" in n[0] for n in (notes[0], notes[2]))
    assert fake.first is _first


def test_a_change_in_the_second_check_or_between_checks_is_told_where_it_was_made(fake: ModuleType) -> None:
    case: list[str] = []
    checks: list[list[str]] = [[], [], []]
    with state_guard.GUARD.consecutive():
        with (
            state_guard.GUARD.preserved([]),
            state_guard.GUARD.preserved([]),
        ):  # a case before: the namespaces confirmed at its end
            pass
        with state_guard.GUARD.preserved(case, ends_with_block=True):
            with state_guard.GUARD.preserved(checks[0]):
                pass
            with state_guard.GUARD.preserved(checks[1]):
                fake.first = _second  # the second check's calls
            assert fake.first is _first
            fake.first = _third  # set-up between two checks (a Function's __init__): the case's change
            with state_guard.GUARD.preserved(checks[2]):
                assert fake.first is _third  # holds for the checks after it
    assert [len(c) for c in checks] == [0, 1, 0] and len(case) == 1, (checks, case)
    assert "torch.gradcheck_consecutive_fake.first" in checks[1][0] and "first" in case[0]
    assert fake.first is _first


def test_a_change_after_the_last_check_is_caught_unless_the_caller_says_nothing_runs_there(fake: ModuleType) -> None:
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        with state_guard.GUARD.preserved([]):
            pass
        fake.first = _second
    assert len(notes) == 1 and fake.first is _first


def test_a_torch_module_imported_in_one_case_is_watched_in_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    late = ModuleType("torch.gradcheck_consecutive_late")
    late.first = _first
    notes: list[list[str]] = [[], []]
    with state_guard.GUARD.consecutive():
        with state_guard.GUARD.preserved(notes[0]):
            monkeypatch.setitem(sys.modules, late.__name__, late)  # imported by the first case
        with state_guard.GUARD.preserved(notes[1]):
            late.first = _second
    assert notes[0] == [] and len(notes[1]) == 1 and "torch.gradcheck_consecutive_late.first" in notes[1][0], notes
    assert late.first is _first


@pytest.mark.parametrize("quick", [True, False], ids=["quick reading", "full reading (no private readers)"])
def test_kept_for_call_puts_back_what_a_call_changed(quick: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Grad mode and the default dtype changed inside one user call are put back after it, whether the
    state is read the quick way or (a torch without the private stack readers) in full."""
    import torch

    if not quick:
        monkeypatch.setattr(state_guard, "_FUNCTION_STACK", None)
    assert (state_guard._per_call_quick() is not None) is quick
    before = torch.is_grad_enabled(), torch.get_default_dtype()
    with state_guard.GUARD.kept_for_call():
        torch.set_grad_enabled(not before[0])
        torch.set_default_dtype(torch.float16 if before[1] != torch.float16 else torch.float32)
    assert (torch.is_grad_enabled(), torch.get_default_dtype()) == before


def test_torch_rebinding_its_own_counters_keeps_the_quick_reading(
    fake: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile rebinds module globals of its own (counters, caches) in every compile: that took the
    guard to the full reading of ~29,000 names at every block's end; a rebound callable still does."""
    fake.counter = 0
    takes: list[int] = []
    take = state_guard._torch_namespaces
    monkeypatch.setattr(state_guard, "_torch_namespaces", lambda: takes.append(1) or take())
    notes: list[str] = []
    with state_guard.GUARD.preserved(notes):
        fake.counter = 1  # a plain value: torch's own bookkeeping, not a patch
    quiet = len(takes)
    with state_guard.GUARD.preserved(notes):
        fake.counter = 2
        fake.first = _second  # a function replaced: a patch, told and put back
    assert quiet == 1, takes  # the start's reading only: the end took the quick path
    assert len(takes) > quiet + 1  # the patch took the closer look at the end
    assert fake.first is _first and len(notes) == 1 and "gradcheck_consecutive_fake.first" in notes[0], notes


def test_a_loop_of_cases_does_not_start_from_what_a_block_before_it_found(fake: ModuleType) -> None:
    """A block that ended before the loop (another test's check, while it had torch.compile patched) left its
    reading of torch's namespaces as the loop's start: the loop's first case then 'put back' the patch and
    told a change it never made (a full-suite flake of the compressed/--no-compress report comparison)."""
    fake.first = _second  # patched outside any block (as a test's monkeypatch does)
    with state_guard.GUARD.preserved([]):  # a check run meanwhile: it finds the patch, and leaves it as it found it
        pass
    fake.first = _first  # the patch undone outside any block (as monkeypatch's undo is)
    notes: list[str] = []
    with state_guard.GUARD.consecutive():
        with state_guard.GUARD.preserved(notes):
            pass
    assert notes == [] and fake.first is _first, notes
