"""--lf / --last-failed and --cache-clear: the cases that failed last time, kept in .gradcheck_cache/ as
pytest keeps its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SOURCE = """
import torch

class Scaled(torch.autograd.Function):
    FACTOR = {factor}

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return Scaled.FACTOR * g
"""
SPEC = """
function: usermod:Scaled
inputs: [{shape: [3]}]
"""


def _ids(result) -> list[str]:
    return [r["id"] for r in json.loads(result.stdout)["results"]]


def _setup(user_module, write_spec, factor: float = 2.0) -> None:
    user_module(SOURCE.format(factor=factor))
    write_spec(SPEC, "specs/a_good.yaml")
    write_spec(SPEC.replace("[3]", "[4]"), "specs/b_other.yaml")


def _cache(root: Path) -> dict[str, bool]:
    return json.loads((root / ".gradcheck_cache" / "lastfailed.json").read_text())


def test_lf_reruns_only_what_failed_and_forgets_it_once_it_passes(user_module, write_spec, invoke, tmp_path):
    _setup(user_module, write_spec, factor=3.0)  # both cases fail (backward 1.5x)
    first = invoke("specs/", "--no-isolate", "--format", "json", "-k", "a_good")
    assert first.exit_code == 1 and _ids(first) == ["specs/a_good.yaml::default[cpu]"]
    assert _cache(tmp_path) == {str(tmp_path / "specs/a_good.yaml") + "::default[cpu]": True}
    assert (tmp_path / ".gradcheck_cache/.gitignore").read_text().endswith("*\n")
    assert (tmp_path / ".gradcheck_cache/CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f")

    again = invoke("specs/", "--no-isolate", "--format", "json", "--lf")
    assert again.exit_code == 1 and _ids(again) == ["specs/a_good.yaml::default[cpu]"]
    assert "--lf: checking the 1 of 2 cases that failed last time" in again.stderr

    _setup(user_module, write_spec, factor=2.0)  # fixed
    fixed = invoke("specs/", "--no-isolate", "--format", "json", "--last-failed")
    assert fixed.exit_code == 0 and _ids(fixed) == ["specs/a_good.yaml::default[cpu]"]
    assert _cache(tmp_path) == {}
    everything = invoke("specs/", "--no-isolate", "--format", "json", "--lf")
    assert everything.exit_code == 0 and len(_ids(everything)) == 2
    assert "--lf: no failure recorded for these 2 cases; checking all of them" in everything.stderr


def test_a_case_that_did_not_run_keeps_its_failure(user_module, write_spec, invoke, tmp_path):
    _setup(user_module, write_spec, factor=3.0)
    assert invoke("specs/", "--no-isolate", "--format", "json").exit_code == 1
    assert len(_cache(tmp_path)) == 2
    _setup(user_module, write_spec, factor=2.0)
    assert invoke("specs/", "--no-isolate", "--format", "json", "-k", "b_other").exit_code == 0
    assert list(_cache(tmp_path)) == [str(tmp_path / "specs/a_good.yaml") + "::default[cpu]"]
    assert _ids(invoke("specs/", "--no-isolate", "--format", "json", "--lf")) == ["specs/a_good.yaml::default[cpu]"]


def test_the_cache_is_beside_pyproject_and_found_from_a_subfolder(
    user_module, write_spec, invoke, tmp_path, monkeypatch
):
    _setup(user_module, write_spec, factor=3.0)
    (tmp_path / "pyproject.toml").write_text("[tool.gradcheck]\nmaxfail = 0\n")
    assert invoke("specs/a_good.yaml", "--no-isolate", "--format", "json").exit_code == 1
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    again = invoke("../specs", "--no-isolate", "--format", "json", "--lf")
    assert _ids(again) == ["../specs/a_good.yaml::default[cpu]"], again.stderr
    assert not (tmp_path / "sub" / ".gradcheck_cache").exists()


def test_cache_clear_forgets_and_a_broken_cache_is_no_error(user_module, write_spec, invoke, tmp_path):
    _setup(user_module, write_spec, factor=3.0)
    invoke("specs/a_good.yaml", "--no-isolate", "--format", "json")
    cleared = invoke("specs/", "--no-isolate", "--format", "json", "--lf", "--cache-clear", "-k", "b_other")
    assert "no failure recorded" in cleared.stderr and _ids(cleared) == ["specs/b_other.yaml::default[cpu]"]
    (tmp_path / ".gradcheck_cache" / "lastfailed.json").write_text("{not json")
    broken = invoke("specs/", "--no-isolate", "--format", "json", "--lf")
    assert broken.exit_code == 1 and len(_ids(broken)) == 2 and "Traceback" not in broken.output


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_failure(user_module, write_spec, invoke, tmp_path):
    _setup(user_module, write_spec, factor=2.0)
    (tmp_path / ".gradcheck_cache").write_text("a file where the folder would be")
    result = invoke("specs/", "--no-isolate", "--format", "json")
    assert result.exit_code == 0 and len(_ids(result)) == 2
    assert "warning: --lf's cache" in result.stderr and "cannot be written" in result.stderr


def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)  # json's parser recurses once per level


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # opened for reading, it would wait for a writer forever


def _zeros(path: Path) -> None:
    path.symlink_to("/dev/zero")  # read whole, it never ends (MemoryError)


@pytest.mark.parametrize(
    "make, why",
    [(_deep, "RecursionError"), (_fifo, "not a regular file"), (_zeros, "not a regular file")],
    ids=["nested-100000-deep", "fifo", "link-to-dev-zero"],
)
def test_a_cache_that_cannot_be_read_counts_as_empty_with_a_warning(
    user_module, write_spec, invoke, tmp_path, make, why
):
    """Each of these was exit 4 after the report on every later run, a MemoryError, or a run that hung."""
    _setup(user_module, write_spec, factor=3.0)
    (tmp_path / ".gradcheck_cache").mkdir()
    make(tmp_path / ".gradcheck_cache" / "lastfailed.json")
    first = invoke("specs/", "--no-isolate", "--format", "json", "--lf")
    assert first.exit_code == 1 and len(_ids(first)) == 2, first.output
    said = " ".join(first.stderr.split())
    assert f"warning: --lf's cache {tmp_path / '.gradcheck_cache' / 'lastfailed.json'} cannot be read ({why}" in said
    assert "it counts as empty" in said and "Traceback" not in first.output
    assert len(_cache(tmp_path)) == 2  # written anew, as a regular file (the FIFO or link replaced)
    again = invoke("specs/", "--no-isolate", "--format", "json", "--lf", "-k", "a_good")
    assert again.exit_code == 1 and "cannot be read" not in again.stderr
