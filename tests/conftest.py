"""Shared fixtures for gradcheck-cli's tests.

``write_spec``  writes YAML text into ``tmp_path`` and returns the file's path.
``user_module`` writes a Python module (a user's Function) into ``tmp_path`` and makes it
                importable, the way a user runs ``gradcheck`` from their project root.
``invoke``      runs the ``gradcheck`` command line in this process (click's CliRunner).

Under CI=true the hypothesis tests draw the same examples every run (profile "ci").

``write_spec`` and ``user_module`` take source text that may be indented (it is dedented), so
tests can write it inline.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from click.testing import Result

# CI (CI=true, as .ci/run sets) replays the same fuzzed examples every run, so a merge is judged
# by the change and not by a new draw; runs elsewhere keep drawing new ones and find new bugs
# (no deadline and no too-slow check anywhere: on a busy 2-core machine an example's time says nothing
# about the code)
settings.register_profile("local", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "local")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's torch gets its share of the cores.

    torch starts one intra-op thread per core in every process; with two workers on two cores
    their threads wait on each other and the numerics-heavy tests get many times slower, so that
    ``-n auto`` lost to a serial run. Workers x threads <= cores, as gradcheck's own worker pool
    does (pool.py). A serial run keeps torch's default.
    """
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``cuda`` skips, with the reason, where torch sees no CUDA GPU (CI never has one)."""
    cuda = [item for item in items if item.get_closest_marker("cuda")]
    if cuda:
        import torch

        if not torch.cuda.is_available():
            for item in cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(autouse=True)
def no_default_device_left_set() -> Iterator[None]:
    """No test leaves torch.set_default_device set: every later test in its worker would run under that
    device context (a gradcheck-cli that put a user's default device back as "cpu" set, not none set,
    did that)."""
    yield
    torch = sys.modules.get("torch")
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    if context is not None:
        torch.set_default_device(None)  # type: ignore[union-attr]
        pytest.fail(
            f"the test left a default device set ({context.device}): put it back with torch.set_default_device(None)"
        )


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """A function ``write_spec(text, name="spec.yaml") -> Path``.

    Writes ``textwrap.dedent(text)`` (UTF-8) to ``tmp_path / name`` and returns that absolute
    path. ``name`` may contain folders (``"specs/linear.yaml"``); they are created. Call it
    several times for several files. To get messages with a relative path such as
    ``specs/linear.yaml``, also ``monkeypatch.chdir(tmp_path)`` (the ``user_module`` fixture
    does that) and pass the relative name on.

    Example::

        def test_x(write_spec):
            path = write_spec('''
                function: mymod:Double
                inputs: [{shape: [3]}]
            ''')
    """

    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """A function ``user_module(source, name="usermod") -> str`` that returns the module name.

    Writes ``textwrap.dedent(source)`` to ``tmp_path/<name>.py``. A dotted ``name`` such as
    ``"pkg.sub.mod"`` writes ``tmp_path/pkg/sub/mod.py`` and creates the missing
    ``__init__.py`` files, so ``"pkg.sub.mod:MyFunction"`` can be loaded. Call it several times
    for several modules (with different names).

    Also, for the duration of the test: ``tmp_path`` is first on ``sys.path``, the current
    directory is ``tmp_path`` (so relative paths in messages, e.g. ``usermod.py:3``, are short
    and ``gradcheck`` finds ``./specs``), and no bytecode is written (a rewritten module is never
    read from a stale ``.pyc``). Afterwards every module imported from the written names
    (the top-level package and all its submodules) is removed from ``sys.modules``, so the
    next test can reuse the same name with different source.

    Example::

        def test_x(user_module):
            mod = user_module('''
                import torch
                class Double(torch.autograd.Function):
                    @staticmethod
                    def forward(ctx, x):
                        return 2 * x
                    @staticmethod
                    def backward(ctx, g):
                        return 2 * g
            ''')
            target = loader.load(f"{mod}:Double")
    """
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    tops: set[str] = set()

    def write(source: str, name: str = "usermod") -> str:
        parts = name.split(".")
        folder = tmp_path
        for part in parts[:-1]:
            folder = folder / part
            folder.mkdir(exist_ok=True)
            init = folder / "__init__.py"
            if not init.exists():
                init.write_text("", encoding="utf-8")
        (folder / f"{parts[-1]}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        tops.add(parts[0])
        importlib.invalidate_caches()
        _forget(tops)  # a module of this name imported earlier in this test must not be reused
        return name

    yield write
    _forget(tops)


@pytest.fixture
def invoke() -> Callable[..., Result]:
    """A function ``invoke(*args: str) -> click.testing.Result``: ``gradcheck ARGS``, in process.

    Runs the click group ``gradcheck_cli.cli.cli`` (what the console script's ``main`` wraps)
    with a fresh ``CliRunner`` per call, so nothing carries over from one call to the next.
    ``catch_exceptions=False``: an exception that escapes the command is not turned into exit
    code 1 but fails the test with its own traceback. ``result.stdout`` is standard output alone
    (the report: valid JSON with ``--format json``), ``result.stderr`` the progress and
    diagnostics, ``result.output`` both as a terminal shows them, ``result.exit_code`` the exit
    status. The current directory is not changed: ``user_module`` moves into ``tmp_path``, or
    use ``monkeypatch.chdir``, for relative paths such as ``specs/``. A check command gets ``--no-shrink``
    unless it says ``--shrink`` or ``--no-shrink`` itself: shrinking a failure costs seconds, and only the
    tests of shrinking (tests/cli/test_shrink_cli.py) need it.

    Example::

        def test_x(user_module, write_spec, invoke):
            user_module(SOURCE)
            write_spec('''
                function: usermod:Double
                inputs: [{shape: [3]}]
            ''', "specs/double.yaml")
            result = invoke("specs/", "--no-isolate", "--format", "json")
            assert result.exit_code == 0, result.output
    """
    from click.testing import CliRunner

    from gradcheck_cli.cli import cli

    def run(*args: str) -> Result:
        argv = list(args)
        checks = not argv or argv[0] == "check" or argv[0] not in cli.commands
        if checks and not {"--shrink", "--no-shrink"} & set(argv):
            argv.append("--no-shrink")  # a failure is shrunk only where a test asks for it (--shrink N): time
        return CliRunner().invoke(cli, argv, catch_exceptions=False)

    return run


def _forget(tops: set[str]) -> None:
    for mod in list(sys.modules):
        if mod.split(".")[0] in tops:
            del sys.modules[mod]


@pytest.fixture
def gradcheck_argv() -> list[str]:
    """The command that runs gradcheck in a child process where Ctrl-C (SIGINT) reaches it as in a terminal.
    A job that a non-interactive shell starts in the background ignores SIGINT, exec keeps that, and Python
    then installs no handler: a test that sends SIGINT would wait forever. The child puts Python's handler
    back before it runs gradcheck's ``__main__``."""
    code = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'gradcheck'; runpy.run_module('gradcheck_cli', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", code]
