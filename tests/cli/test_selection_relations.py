"""Metamorphic relations of how a check is selected (issue 44, item 7), over every labelled truth set
(tests/truth_sets.py): a check named alone, named in a list with another, and reached through `all` gives the
same status, message and rows; the case's verdict under `all` is never laxer than under the default checks;
and under `all` each label holds (a right Function passes or skips the check, a broken one fails it).

The one difference the contract allows (section 4): a check the Function cannot support, or that finite
differences cannot judge, fails when named ("this check was named explicitly, so that fails") and skips under
`all`, with the same reason and rows (``verdict.unsupported``). Nothing wrong is ever a skip under `all`.

A sampled slice runs unmarked (an entry of each kind item 7 names); the full product is slow.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import pytest

from gradcheck_cli import spec
from gradcheck_cli.checks.parts.verdict import NAMED_FAILS
from gradcheck_cli.results import CaseResult, CheckResult, Status, to_dict
from gradcheck_cli.run import runner
from tests.truth_sets import LABELLED, SOURCES, Labelled

SAMPLE = {
    "backward-selmod.QuantiserSTE-broken",
    "backward-selmod.SharedScaleThird-broken",
    "backward-selmod.RaisesOnPositive-broken",
    "double_backward-dbmod.DetachedSquare-broken",
    "double_backward-selmod.OnceSquare-right",
}
SAMPLED = [e for e in LABELLED if e.id in SAMPLE]
REST = [e for e in LABELLED if e.id not in SAMPLE]
BAD = (Status.FAIL, Status.ERROR)

_SEEN: dict[tuple[str, str, str], CaseResult] = {}  # (function, body, checks) -> its result: a run is pure


def _runner(user_module: Callable[..., str], write_spec: Callable[..., Any]) -> Callable[[Labelled, str], CaseResult]:
    def run(entry: Labelled, checks: str) -> CaseResult:
        key = (entry.path, entry.body, checks)
        if key not in _SEEN:
            if entry.module:
                user_module(SOURCES[entry.module], entry.module)
            line = f"checks: {checks}\n" if checks else ""  # no `checks:`: the default checks
            (case,) = spec.load_file(write_spec(f"function: {entry.path}\n{line}{entry.body}\n"))
            assert not isinstance(case, spec.SpecError), case
            _SEEN[key] = runner.run_case(case, "cpu")
        return _SEEN[key]

    return run


def judged(result: CaseResult, name: str) -> dict[str, Any]:
    """What a check's verdict is: its status, message, problems and rows (not its time, nor its warnings, which
    a case shows once however many checks meet them); the rows as JSON has them (NaN a string: NaN != NaN would
    make two equal rows differ)."""
    assert result.error is None, (name, result.error)
    (found,) = [c for c in result.checks if c.check == name]
    kept = {k: v for k, v in asdict(found).items() if k not in ("duration_s", "warnings")}
    return {**kept, "inputs": [to_dict(row) for row in found.inputs]}


def as_under_all(named: dict[str, Any]) -> dict[str, Any]:
    """A named check's verdict as `all` must give it: the same, but where it fails only because it was named
    (``verdict.unsupported``: the check does not apply, or cannot judge), a skip with the same reason."""
    if named["status"] is Status.FAIL and named["message"].endswith(NAMED_FAILS):
        return {**named, "status": Status.SKIP, "message": named["message"].removesuffix(NAMED_FAILS)}
    return named


def other_than(check: str) -> str:
    return "undefined_grad" if check == "backward" else "backward"


def relations(run: Callable[[Labelled, str], CaseResult], entry: Labelled) -> None:
    alone = judged(run(entry, f"[{entry.check}]"), entry.check)
    listed = judged(run(entry, f"[{other_than(entry.check)}, {entry.check}]"), entry.check)
    every = run(entry, "all")
    assert listed == alone, "named in a list it differs from named alone"
    assert judged(every, entry.check) == as_under_all(alone), "under `all` it differs from named"
    under_all: CheckResult = next(c for c in every.checks if c.check == entry.check)
    if entry.right:
        assert under_all.status in (Status.PASS, Status.SKIP), under_all.message
    else:
        assert under_all.status is Status.FAIL, under_all.message
    default = run(entry, "")
    assert every.status in BAD or default.status not in BAD, (
        f"`all` is laxer than the default checks: {every.status} against {default.status}"
    )


@pytest.mark.parametrize("entry", SAMPLED, ids=[e.id for e in SAMPLED])
def test_named_listed_and_under_all_agree_on_a_sample(user_module, write_spec, entry):
    relations(_runner(user_module, write_spec), entry)


@pytest.mark.slow
@pytest.mark.relations
@pytest.mark.parametrize("entry", REST, ids=[e.id for e in REST])
def test_named_listed_and_under_all_agree_on_every_truth_set(user_module, write_spec, entry):
    relations(_runner(user_module, write_spec), entry)


def test_the_sample_has_each_kind_item_7_names():
    assert len(SAMPLED) == len(SAMPLE)
    assert {e.check for e in LABELLED} >= {"backward", "double_backward", "forward_ad", "undefined_grad", "compile"}
    for check in {e.check for e in LABELLED}:  # right and broken Functions for each check
        assert {e.right for e in LABELLED if e.check == check} == {True, False}, check
