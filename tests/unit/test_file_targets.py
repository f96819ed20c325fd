"""A Python file's object as a target, as pytest names a test: ``path/to/ops.py::Name``.

Split at the last ``::`` (a Windows drive's colon stays in the path), read relative to the current directory,
imported once per process under the name the rest of the user's code imports it by; a file that raises on
import is the user's error, naming the file and the line.
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest

from gradcheck_cli import spec
from gradcheck_cli.run.discovery import TargetError, files_of
from gradcheck_cli.sandbox.errors import LoadError
from gradcheck_cli.spec import SpecError, file_target, is_import_path, load_file
from gradcheck_cli.subject import loader

DOUBLE = """
    import torch


    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``write(relative path, source)`` into ``tmp_path/proj``, the current directory; sys.path is put back
    and the modules imported from tmp_path are forgotten afterwards."""
    root = tmp_path / "proj"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    before = set(sys.modules)

    def write(relative: str, source: str = DOUBLE) -> Path:
        path = tmp_path / relative[3:] if relative.startswith("../") else root / relative
        path = path.resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        importlib.invalidate_caches()
        return path

    yield write
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.mark.parametrize(
    "text, parts",
    [
        ("mykern/ops.py::MyFn", ("mykern/ops.py", "MyFn")),
        ("./ops.py::Outer.Inner", ("./ops.py", "Outer.Inner")),
        ("C:\\work\\mykern\\ops.py::MyFn", ("C:\\work\\mykern\\ops.py", "MyFn")),  # the drive's colon stays
        ("C:/a::b/ops.py::F", ("C:/a::b/ops.py", "F")),  # the last `::` splits
        ("/abs/my kern/ops.py::F", ("/abs/my kern/ops.py", "F")),
    ],
)
def test_a_file_target_splits_at_its_last_double_colon(text, parts):
    assert file_target(text) == parts
    assert is_import_path(text)


@pytest.mark.parametrize(
    "text", ["ops.py", "ops.py::", "ops.py:F", "ops::F", "ops.yaml::F", "ops.py::1F", "ops.py::F\n"]
)
def test_what_is_not_a_file_target(text):
    assert file_target(text) is None


def test_a_file_in_no_package_is_the_module_its_folder_names(project):
    project("mykern/ops.py")  # no __init__.py: named from the current directory
    target = loader.load("mykern/ops.py::Double")
    assert target.is_function and target.obj.__name__ == "Double"
    assert target.obj is importlib.import_module("mykern.ops").Double  # one module, not two copies
    assert loader.load("./mykern/ops.py::Double").obj is target.obj


def test_a_file_in_a_package_keeps_its_relative_imports(project):
    project("src/kern/__init__.py", "")
    project("src/kern/helpers.py", "FACTOR = 2\n")
    project("src/kern/ops.py", "from .helpers import FACTOR\n" + textwrap.dedent(DOUBLE))
    target = loader.load("src/kern/ops.py::Double")
    assert target.obj.__module__ == "kern.ops"  # as pytest imports it: from the folder above the top package
    assert sys.modules["kern.ops"].FACTOR == 2


def test_a_file_named_like_a_standard_module_is_imported_under_a_name_of_its_own(project):
    import random

    project("../elsewhere/random.py")  # outside the current directory: named `random`, which is taken
    obj = loader.load(str(Path("../elsewhere/random.py")) + "::Double").obj
    assert obj.__name__ == "Double" and obj.__module__.startswith("_gradcheck_file_")
    assert sys.modules["random"] is random and not hasattr(random, "Double")
    assert loader.load(str(Path("../elsewhere/random.py").resolve()) + "::Double").obj is obj  # imported once


def test_a_file_that_raises_on_import_is_the_users_error_at_its_line(project):
    project("bad.py", "import torch\n\n\ndef boom():\n    raise RuntimeError('no GPU here')\n\n\nboom()\n")
    with pytest.raises(LoadError) as info:
        loader.load("bad.py::Double")
    assert "importing 'bad.py' failed: RuntimeError: no GPU here" in str(info.value)
    assert info.value.where is not None and info.value.where.startswith("bad.py:5")
    assert "bad" not in sys.modules or not hasattr(sys.modules["bad"], "boom")


def test_a_file_that_exits_on_import_is_the_users_error(project):
    project("quits.py", "import sys\nsys.exit(2)\n")
    with pytest.raises(LoadError, match="importing 'quits.py' failed: SystemExit: 2"):
        loader.load("quits.py::F")


def test_a_missing_file_and_a_missing_name(project):
    project("ops.py")
    with pytest.raises(LoadError, match="'nope.py' .*no such file; a relative path is read from the current"):
        loader.load("nope.py::Double")
    with pytest.raises(LoadError, match="'ops.py' has no attribute 'Doubel'; did you mean 'Double'"):
        loader.load("ops.py::Doubel")


def test_a_script_is_imported_without_running_its_main(project):
    project("mykern/ops.py")
    project(
        "train.py",
        "from mykern.ops import Double\n\n\nclass Twice(Double):\n    pass\n\n\n"
        "if __name__ == '__main__':\n    raise SystemExit('main ran')\n",
    )
    assert loader.load("train.py::Twice").obj.__name__ == "Twice"


def test_a_spec_names_a_file_target(project):
    project("ops.py")
    path = project("specs/ops.yaml", "function: ops.py::Double\ninputs: [{shape: [3]}]\n")
    [case] = load_file(path)
    assert not isinstance(case, SpecError) and case.function == "ops.py::Double"
    bad = project("specs/bad.yaml", "function: 'ops.py::'\n")
    [error] = load_file(bad)
    assert isinstance(error, SpecError) and "'path/to/ops.py::MyFunction'" in str(error)


FORMS = [
    "ops.py::F",
    "a/b.py::F.G",
    "C:\\x\\ops.py::F",
    "a::b.py::F",
    "ops.py::",
    "ops.py::F\n",
    "ops.py:F",
    "x.yaml::F",
]


@pytest.mark.parametrize("text", FORMS)
def test_the_schema_reads_a_file_target_as_the_loader_does(text):
    [_, file_form] = spec.vocabulary.SCHEMA["$defs"]["function"]["anyOf"]
    assert (re.search(file_form["pattern"], text) is not None) == (file_target(text) is not None)


def test_a_bare_python_file_says_what_to_write(project):
    project(
        "mykern/ops.py",
        """
        import torch
        from torch.autograd import Function


        class Base(torch.autograd.Function):
            pass


        class Square(Base):
            pass


        class Plain(Function):
            pass


        class NotOne:
            pass


        @torch.library.custom_op("mykern::scale", mutates_args=())
        def scale(x: torch.Tensor) -> torch.Tensor:
            return 2 * x


        def helper():
            pass
        """,
    )
    with pytest.raises(TargetError) as info:
        files_of("mykern/ops.py")
    message = str(info.value)
    assert "gradcheck mykern/ops.py::Base -i 20x20" in message and "gradcheck init mykern/ops.py::Base" in message
    assert "it defines Base, Square, Plain, scale)" in message


@pytest.mark.parametrize(
    "source, said", [("def helper():\n    pass\n", "defines no autograd.Function"), ("def f(:\n", "SyntaxError")]
)
def test_a_bare_python_file_without_a_function_still_says_what_to_write(project, source, said):
    project("tools.py", source)
    with pytest.raises(TargetError, match=rf"gradcheck tools.py::NAME -i SHAPE.*{said}"):
        files_of("tools.py")
