"""``gradcheck path/to/ops.py::Name`` end to end: a Python file's Function checked as pytest names a test,
a bare ``ops.py`` answered with what to write, a file that raises on import an exit 3 naming its line."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

SOURCE = """
    import torch


    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g


    class Wrong(Square):
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * g
"""


@pytest.fixture
def kern(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``mykern/ops.py`` (a folder without __init__.py) in ``tmp_path``, the current directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    before = set(sys.modules)
    path = tmp_path / "mykern" / "ops.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(SOURCE), encoding="utf-8")
    yield path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_a_bare_python_file_says_what_to_write(kern, invoke):
    result = invoke("mykern/ops.py")
    assert result.exit_code == 2
    assert "'mykern/ops.py' is a Python file, not a spec" in result.output
    assert "gradcheck mykern/ops.py::Square -i 20x20" in result.output and "defines Square, Wrong" in result.output
    assert "YAML" not in result.output


def test_a_file_target_is_checked_in_the_workers(kern, invoke):
    result = invoke("mykern/ops.py::Square", "-i", "3x2", "--format", "json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["results"]
    assert row["status"] == "pass" and row["function"] == "mykern/ops.py::Square"
    assert row["replay"] == "gradcheck mykern/ops.py::Square -i 3x2"


def test_a_wrong_gradient_in_a_file_fails(kern, invoke):
    assert invoke("./mykern/ops.py::Wrong", "-i", "3", "--no-isolate").exit_code == 1


def test_a_spec_naming_a_file_target_is_found_by_it(kern, invoke):
    specs = kern.parent.parent / "specs"
    specs.mkdir()
    (specs / "square.yaml").write_text("function: mykern/ops.py::Square\ninputs: [{shape: [4]}]\n", encoding="utf-8")
    for target in ("mykern/ops.py::Square", "./mykern/ops.py::Square", str(kern) + "::Square", "specs/"):
        result = invoke(target, "--no-isolate", "--format", "json")
        assert result.exit_code == 0, (target, result.output)
        assert [r["id"] for r in json.loads(result.stdout)["results"]] == ["specs/square.yaml::default[cpu]"]


def test_a_file_that_raises_on_import_is_exit_3_at_its_line(kern, invoke):
    kern.write_text("import torch\n\nraise ImportError('needs triton')\n", encoding="utf-8")
    result = invoke("mykern/ops.py::Square", "-i", "3", "--format", "json")
    assert result.exit_code == 3, result.output
    [row] = json.loads(result.stdout)["results"]
    assert row["error"]["kind"] == "import"
    assert "importing 'mykern/ops.py' failed: ImportError: needs triton" in row["error"]["message"]
    assert row["error"]["where"].startswith("mykern/ops.py:3")


def test_a_missing_file_is_a_usage_error(kern, invoke):
    result = invoke("mykern/nope.py::Square", "-i", "3")
    assert result.exit_code == 2
    assert "no such file 'mykern/nope.py'" in result.output
