"""The development guide's (docs/development.md) "a new check is one module and one registry line" example
runs as written: put in
the package with one registry line, it passes a Function whose two computations agree and fails one
whose computations differ."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

import gradcheck_cli
from gradcheck_cli import checks
from gradcheck_cli.checks.parts.base import CheckContext
from gradcheck_cli.results import Status

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "development.md"


def _example() -> str:
    text = GUIDE.read_text()
    blocks = re.findall(r"```python\n(# gradcheck_cli/checks/my_check\.py\n.*?)```", text, re.S)
    assert len(blocks) == 1, "the development guide's new-check example is gone or doubled"
    module = blocks[0].split("# gradcheck_cli/checks/__init__.py")[0]
    assert "got, want = ..., ..." in module
    return module


@pytest.fixture
def my_check(tmp_path, monkeypatch):
    """The guide's module with its placeholder filled: ``got`` is the gradient, ``want`` what the
    test module's ``WANT`` makes of it."""
    source = _example().replace(
        "got, want = ..., ...", "got = ctx.bound.values[i].detach().clone()[None]; want = WANT(got)"
    )
    path = tmp_path / "my_check.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("gradcheck_cli.checks.my_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gradcheck_cli.checks.my_check", module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(checks.REGISTRY, "my_check", "my_check")  # the one registry line
    monkeypatch.setattr(checks, "NAMES", tuple(checks.REGISTRY))
    return module


@pytest.mark.parametrize(
    ("want", "status"),
    [(lambda got: got.clone(), Status.PASS), (lambda got: got * 1.01, Status.FAIL)],
    ids=["agree", "differ"],
)
def test_the_guides_new_check_runs_as_written(my_check, want, status):
    my_check.WANT = want
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, (x,), checks=["my_check"])
    (check,) = result.checks
    assert check.check == "my_check" and check.status is status, check.message
    assert result.status is status


def test_the_guides_new_check_reads_its_own_setting(my_check):
    assert my_check.Settings.of(CheckContext(None, None)).samples == 2  # type: ignore[arg-type]
    given = CheckContext(None, None, settings={"my_check": {"samples": 5}})  # type: ignore[arg-type]
    assert my_check.Settings.of(given).samples == 5
