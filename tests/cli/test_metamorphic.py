"""The metamorphic harness (issue 44): relations that must hold between two ways of checking the same Function,
run over the labelled corpus (tests/corpus.py: right Functions, which must pass, and wrong ones, which must fail).
A relation compares what the maths determines (``corpus.verdict_of``: the case's status, each check's status,
each row's status and mismatch count), and each side must also give the label.

The relations and where each lives (each runs a sampled slice in the README's test command and the whole set
under ``slow``):
- one process against ``distributed: {world_size: 1}``: here (a run of this relation beside the whole suite
  once ended a case in an error, exit 3: rank 0's store could not bind the TCP port picked for it, taken by
  another process meanwhile; ranks now meet in a file, tests/unit/test_distributed.py's port test);
- a batch checked with -j 1, -j 2, ``--no-isolate`` and in the reverse order against each case alone: here;
- ``contiguous: false`` against contiguous inputs: tests/unit/test_noncontiguous.py
  (``test_contiguous_false_*``);
- a check named alone, in a list and under ``all``; ``all`` never laxer than the default:
  tests/cli/test_selection_relations.py, over every check's truth set (tests/truth_sets.py);
- a case alone and after each polluter (a case that leaves one piece of process state changed), in one
  worker, -j 2 and ``--no-isolate``: tests/cli/test_polluters.py;
- float64 maths against the same maths computed in float32 inside, over scales: tests/unit/test_precision_*;
- a shrunk case fails the same way, and no shape with zero elements is a pass:
  tests/unit/test_empty_arguments.py and tests/unit/test_shrink.py.

For the next contributor: a new way of running a check (a mode, a front end) gets a relation here against the
plain in-process run, over the whole corpus; a difference is a wrong verdict in one of the two.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import CORPUS, Case, corpus_spec, verdict_of
except ImportError:  # pragma: no cover
    from tests.corpus import CORPUS, Case, corpus_spec, verdict_of

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def _gradcheck(cwd: Path, *args: str) -> dict[str, Any]:
    """``gradcheck ARGS --format json`` in a fresh process (the corpus importable as ``corpus``), its report."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", *args, "--format", "json", "--no-shrink"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    try:  # the errors first: a report's tail may not hold them
        errors = [(r["id"], r["error"]) for r in json.loads(done.stdout)["results"] if r["error"]]
    except (ValueError, KeyError, TypeError):
        errors = []
    said = f"exit {done.returncode}\nerrors: {errors}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode in (0, 1) and done.stdout.strip(), said
    return json.loads(done.stdout)


def _by_spec(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(r["spec"]).name: r for r in report["results"]}


def _labelled(case: Case, result: dict[str, Any]) -> None:
    assert result["error"] is None, result["error"]
    assert (result["status"] == "pass") is case.correct, f"{case.name}: {result['status']} against its label"


# ------------------------------------------------------- one process against distributed: {world_size: 1}

WORST = re.compile(r" \((worst|e\.g\.) [^()]*\)")  # where a failing row's worst entry is, in the message's words


def _one_rank(result: dict[str, Any]) -> tuple[Any, list[str]]:
    """A world of one's verdict as one process's: its rows by their arguments' names (``x``, not ``x@rank0``),
    the messages without the worst entry's place. The distributed check compares each rank's gradient of one
    global objective, not the Jacobian entry by entry, so it has no output index and its worst entry is another
    (documented in docs/how-to/distributed.md); the rest must be the same."""
    verdict = json.loads(json.dumps(verdict_of(result)).replace("@rank0", ""))
    return verdict, [WORST.sub("", c["message"]) for c in result["checks"]]


# Where a world of one tells the same verdict in other words, and why (each a limit the docs state):
OTHER_WORDS: dict[str, str] = {}  # none now (backward's linearity and undefined gradients run on every rank)


def _same_alone_and_in_a_world_of_one(cases: list[Case], tmp_path: Path) -> None:
    for case in cases:
        (tmp_path / f"{case.name}.yaml").write_text(corpus_spec(case), encoding="utf-8")
        (tmp_path / f"{case.name}.ws1.yaml").write_text(
            corpus_spec(case, distributed={"world_size": 1}), encoding="utf-8"
        )
    got = _by_spec(_gradcheck(tmp_path, "."))
    differ = {}
    for case in cases:
        alone, world = got[f"{case.name}.yaml"], got[f"{case.name}.ws1.yaml"]
        _labelled(case, alone)
        _labelled(case, world)
        same = _one_rank(world) == _one_rank(alone)
        if case.name in OTHER_WORDS:  # the verdict the same, its words not (see OTHER_WORDS)
            same = _one_rank(world)[0] == _one_rank(alone)[0] and not _one_rank(world)[1] == _one_rank(alone)[1]
        if not same:
            differ[case.name] = (_one_rank(alone), _one_rank(world))
    assert not differ, "\n".join(f"{name}:\n  alone {a}\n  world {w}" for name, (a, w) in differ.items())


def test_a_world_of_one_gives_the_one_process_verdict(tmp_path: Path) -> None:
    _same_alone_and_in_a_world_of_one(CORPUS[::6], tmp_path)


@pytest.mark.slow
@pytest.mark.relations
def test_a_world_of_one_gives_the_one_process_verdict_over_the_whole_corpus(tmp_path: Path) -> None:
    _same_alone_and_in_a_world_of_one(CORPUS, tmp_path)


# ------------------------------------------------------ a batch in every mode against each case alone


def _same_in_every_mode(cases: list[Case], tmp_path: Path) -> None:
    """The cases as one batch, checked with -j 1, -j 2, in one process, and in the reverse order (a folder
    whose names sort the other way), each case's verdict the same as checked alone in a fresh process."""
    forward, backward = tmp_path / "forward", tmp_path / "backward"
    for folder in (forward, backward):
        folder.mkdir()
    for i, case in enumerate(cases):
        text = corpus_spec(case)
        (forward / f"{i:03d}.{case.name}.yaml").write_text(text, encoding="utf-8")
        (backward / f"{len(cases) - i:03d}.{case.name}.yaml").write_text(text, encoding="utf-8")
    alone: dict[str, Any] = {}
    for path in sorted(forward.iterdir()):
        (result,) = _gradcheck(tmp_path, str(path))["results"]
        alone[path.name.split(".", 1)[1]] = verdict_of(result)
    runs = {
        "-j 1": _gradcheck(tmp_path, "forward", "-j", "1"),
        "-j 2": _gradcheck(tmp_path, "forward", "-j", "2"),
        "--no-isolate": _gradcheck(tmp_path, "forward", "--no-isolate"),
        "reverse order, --no-isolate": _gradcheck(tmp_path, "backward", "--no-isolate"),
        "reverse order, -j 1": _gradcheck(tmp_path, "backward", "-j", "1"),
    }
    for mode, report in runs.items():
        got = {name.split(".", 1)[1]: verdict_of(r) for name, r in _by_spec(report).items()}
        assert got == alone, mode
    for case in cases:
        assert (alone[f"{case.name}.yaml"][0] == "pass") is case.correct, case.name


def test_a_batch_gives_each_case_its_verdict_alone_in_every_mode(tmp_path: Path) -> None:
    _same_in_every_mode(CORPUS[1::5], tmp_path)


@pytest.mark.slow
@pytest.mark.relations
def test_a_batch_of_the_whole_corpus_gives_each_case_its_verdict_alone_in_every_mode(tmp_path: Path) -> None:
    _same_in_every_mode(CORPUS, tmp_path)
