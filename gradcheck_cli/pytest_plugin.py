"""pytest plugin (entry point ``pytest11``): ``pytest --gradcheck specs/`` collects specs as tests.

Inert unless ``--gradcheck`` is given. Every spec file (``*.yaml``, ``*.yml``) under the paths
given to pytest becomes a File node, and each (case, device) one test item, e.g.
``specs/linear.yaml::with_bias[cpu]``; in a file of several YAML documents, the cases of each
document sit under a node ``#N`` (``specs/max_pool.yaml::#2::default[cpu]``), as ``Case.name``
numbers them. A spec document that cannot be read is one failing item (``spec_error``), never
a collection error that hides the other specs.

Importing this module, and collecting, read YAML only; torch is imported when a test runs.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import pytest

from .checks import NAMES as CHECKS
from .core.options import FIELDS, OPTIONS, Flag, Option, Text
from .core.options import shown as shown_default

if TYPE_CHECKING:
    from .results import CaseResult
    from .run.plan import RunOptions
    from .run.pool import Pool
    from .spec import Case, SpecError

SPEC_SUFFIXES = (".yaml", ".yml")
DEFAULT_PATTERN = ("*.yaml", "*.yml")
_POOL = pytest.StashKey["Pool"]()
_STARTED = pytest.StashKey[float]()  # seconds the worker took to start, before the first case
_CHOSEN = pytest.StashKey[dict[str, Any]]()  # the options by field (``chosen``)
_UNSET = object()  # an option left out of pytest's command line


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradcheck", "gradcheck-cli")
    group.addoption(
        "--gradcheck",
        action="store_true",
        default=False,
        help="collect gradcheck-cli spec files (*.yaml, *.yml) given as arguments as tests",
    )
    group.addoption(
        "--gradcheck-no-isolate",
        action="store_true",
        default=False,
        help="check in pytest's own process (for a debugger); by default each case runs in a worker "
        "process, so a crash or a hang in it fails that item alone",
    )
    for option in OPTIONS:  # the options of the run that the plugin offers, made of core.options' rows
        if option.pytest:
            _add(group, option)
    parser.addini(
        "gradcheck_paths",
        type="paths",
        default=[],
        help="gradcheck: the folders whose spec files are tests (default: every folder pytest walks); "
        "YAML elsewhere is not collected unless named on the command line",
    )
    parser.addini(
        "gradcheck_pattern",
        type="args",
        default=list(DEFAULT_PATTERN),
        help="gradcheck: glob patterns of spec file names (default: *.yaml *.yml)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gradcheck: a gradcheck-cli spec case (select with -m gradcheck)")
    if config.getoption("gradcheck"):
        chosen(config)  # a bad [tool.gradcheck] or option is a usage error before collection


def _add(group: Any, option: Option) -> None:
    """``--gradcheck-NAME`` of the row ``option``, setting ``gradcheck_FIELD``; left out, it is ``_UNSET`` (a
    repeated one None): [tool.gradcheck] or the row's default decides (``chosen``)."""
    kind = option.kind
    shown = f"; default: {option.default}" if shown_default(option) else ""
    names = f" Names: {', '.join((*CHECKS, 'all'))}." if isinstance(kind, Text) and kind.rule == "check" else ""
    common: dict[str, Any] = {
        "dest": f"gradcheck_{option.field}",
        "help": f"{option.help}{names} (as gradcheck --{option.name}{shown})".replace("%", "%%"),
    }
    if isinstance(kind, Flag):
        group.addoption(f"--gradcheck-{option.name}", action="store_const", const=kind.const, default=_UNSET, **common)
        return
    repeat = isinstance(kind, Text) and kind.repeat
    group.addoption(
        f"--gradcheck-{option.name}",
        action="append" if repeat else "store",
        type=_reader(option),
        default=None if repeat else _UNSET,
        metavar=option.metavar,
        **common,
    )


def _reader(option: Option) -> Callable[[str], Any]:
    """argparse's type of ``option``: read as the command line reads it (``config.read_text``: one message)."""

    def read(text: str) -> Any:
        from .config import read_text

        try:
            return read_text(option, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    read.__name__ = option.name  # what argparse calls the value when it cannot read it
    return read


def chosen(config: pytest.Config) -> dict[str, Any]:
    """The plugin's options by field: as given to pytest, else as [tool.gradcheck] of the nearest pyproject.toml
    (seen from where pytest was started, as the command line sees it) sets them, else the rows' defaults."""
    values = config.stash.get(_CHOSEN, None)
    if values is None:
        from .config import ConfigError, load, read_value

        try:
            project = load(config.invocation_params.dir)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from exc
        values = {}
        for option in OPTIONS:
            if not option.pytest:
                continue
            given = config.getoption(f"gradcheck_{option.field}")
            if given is not _UNSET and given is not None:
                values[option.field] = tuple(given) if isinstance(given, list) else given
            elif option.project in project.values and option.field not in values:
                try:
                    values[option.field] = read_value(option, project.values[option.project])
                except ValueError as exc:
                    raise pytest.UsageError(f"{project.path} [tool.gradcheck] {option.project}: {exc}") from exc
        for option in OPTIONS:
            if option.pytest:
                values.setdefault(option.field, FIELDS[option.field].default)
        config.stash[_CHOSEN] = values
    return values


def run_options(config: pytest.Config) -> RunOptions:
    """The plugin's options as the checks' RunOptions, mapped as the command line maps its own."""
    from .run.plan import run_options as options

    return options(**chosen(config))


def _pool(config: pytest.Config) -> Pool:
    """This pytest process's worker (one; under pytest-xdist, one per xdist worker, sharing the cores)."""
    pool = config.stash.get(_POOL, None)
    if pool is None:
        from .run.pool import Pool, usable_cores

        share = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
        pool = config.stash[_POOL] = Pool(
            1,
            run_options(config).timeout,
            threads=max(1, usable_cores() // max(1, share)),
            timeout_option="--gradcheck-timeout",
        )
    return pool


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the worker before the first spec case runs, so that its start-up (torch's import, about 10 s
    on a busy machine) is not counted in that case's time; the terminal summary says how long it took."""
    config = session.config
    if (
        config.getoption("collectonly")
        or config.getoption("gradcheck_no_isolate")
        or not any(isinstance(item, CaseItem) for item in session.items)
    ):
        return
    config.stash[_STARTED] = _pool(config).warm()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    seconds = config.stash.get(_STARTED, None)
    if seconds is not None:
        terminalreporter.write_line(
            f"gradcheck: the worker started in {seconds:.1f} s, before the first spec case (not counted in its time)"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = config.stash.get(_POOL, None)
    if pool is not None:
        pool.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[pytest.Collector]:
    """Spec files become SpecFile nodes, only with --gradcheck.

    A file pytest finds while walking a directory is a spec when its name matches ``gradcheck_pattern``,
    it lies under one of ``gradcheck_paths`` (when that is set), it is not a dot-file
    (``.pre-commit-config.yaml``) and it names a ``function:`` (a model config is no spec). A YAML file
    named on the command line is collected anyway.
    """
    config = parent.config
    if not config.getoption("gradcheck"):
        return None
    if _named_explicitly(config, file_path):
        return SpecFile.from_parent(parent, path=file_path) if file_path.suffix in SPEC_SUFFIXES else None
    patterns = config.getini("gradcheck_pattern") or DEFAULT_PATTERN
    if file_path.name.startswith(".") or not any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return None
    folders = config.getini("gradcheck_paths")
    if folders and not any(file_path.resolve().is_relative_to(Path(f).resolve()) for f in folders):
        return None
    return SpecFile.from_parent(parent, path=file_path) if _names_a_function(file_path) else None


def _names_a_function(file_path: Path) -> bool:
    """Whether a YAML file found by walking is a spec: a document names a `function:` (at its top or in a
    case); a model or CI config beside the specs is not collected. A file that is no valid YAML (or cannot
    be read) is, so that its error is reported."""
    import yaml

    try:
        docs = list(yaml.safe_load_all(file_path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True
    for doc in docs:
        if isinstance(doc, dict):
            cases = doc.get("cases")
            if "function" in doc or (
                isinstance(cases, list) and any(isinstance(c, dict) and "function" in c for c in cases)
            ):
                return True
    return False


def _named_explicitly(config: pytest.Config, file_path: Path) -> bool:
    base = config.invocation_params.dir
    return any((base / arg.split("::")[0]).resolve() == file_path.resolve() for arg in config.args)


def _display(path: Path, base: Path) -> str:
    """The path as the user would type it (relative to where pytest was started), so replay commands work."""
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


class SpecFile(pytest.File):
    """One spec file: its cases (grouped by document when there are several) and its spec errors."""

    def collect(self) -> Iterator[Union[pytest.Item, pytest.Collector]]:
        from .spec import Case, load_file  # YAML only, no torch

        entries = load_file(_display(self.path, self.config.invocation_params.dir))
        docs: dict[int, list[Case]] = {}
        errors: list[SpecError] = []
        n_docs = 1
        for entry in entries:
            if isinstance(entry, Case):
                docs.setdefault(entry.doc, []).append(entry)
                n_docs = entry.n_docs
            else:
                errors.append(entry)
        for doc, cases in docs.items():  # documents in file order
            if n_docs > 1:
                yield SpecDocument.from_parent(self, name=f"#{doc}", cases=cases)
            else:
                yield from _case_items(self, cases)
        seen: set[str] = set()
        for error in errors:
            name = f"spec_error[line {error.line}]" if error.line else "spec_error"
            if name in seen:
                name = f"{name}-{len(seen)}"
            seen.add(name)
            item = SpecErrorItem.from_parent(self, name=name, nodeid=_child_id(self, name), error=error)
            item.add_marker("gradcheck")
            yield item


class SpecDocument(pytest.Collector):
    """The cases of one YAML document in a file that holds several (node name ``#N``)."""

    def __init__(self, *, cases: list[Case], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cases = cases

    def collect(self) -> Iterator[pytest.Item]:
        return _case_items(self, self.cases)


def _case_items(parent: pytest.Collector, cases: list[Case]) -> Iterator[pytest.Item]:
    override = run_options(parent.config).devices  # --gradcheck-device
    for case in cases:
        for device in override or case.devices:
            name = f"{case.label}[{device}]"
            item = CaseItem.from_parent(parent, name=name, nodeid=_child_id(parent, name), case=case, device=device)
            item.add_marker("gradcheck")
            yield item


def _child_id(parent: pytest.Collector, name: str) -> str:
    """The node id as a string: pytest 9 parses ``[...]`` in it as parameters, as it does when
    reading ids back (``--lf``, ids on the command line); an id built from the name would not be."""
    return f"{parent.nodeid}::{name}"


class CheckFailed(Exception):
    """A case that failed (a gradient is wrong) or could not be checked; carries its result."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__(result.id)
        self.result = result


def _tell_state_notes(notes: list[str]) -> None:
    """What the case changed of the process (the guard's notes) as warnings of the item, in pytest's warnings
    summary: a passing item shows nothing else of its result, and under --gradcheck-no-isolate the process
    changed is this one."""
    import warnings

    from .sandbox.state_guard import GlobalStateWarning, told

    for note in told(notes):
        warnings.warn(note, GlobalStateWarning, stacklevel=2)


class CaseItem(pytest.Item):
    """One (case, device): checked in this process's worker (or in-process with --gradcheck-no-isolate);
    its status mapped onto pytest's outcomes."""

    def __init__(self, *, case: Case, device: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.device = case, device
        self.result: Optional[CaseResult] = None
        # -k matches the function too (`-k LinearFunction`), as `gradcheck -k` does
        self.extra_keyword_matches.update({case.function, case.function.replace(":", ".").rsplit(".", 1)[-1]})

    def runtest(self) -> None:
        from .results import Status, expected_reason
        from .run import replay
        from .run.plan import Task, expand

        # the case as the options change it (checks, strict, devices), as the command line plans it
        (task,) = [
            t for t in expand([self.case], run_options(self.config)) if isinstance(t, Task) and t.device == self.device
        ]
        if self.config.getoption("gradcheck_no_isolate"):
            from .run.runner import run_task

            result = run_task(task)
        else:
            finished = _pool(self.config).run([task])
            try:
                ((_, result),) = list(finished)
            finally:
                finished.close()  # an interrupt ends the worker and what it started
        self.result = result
        result.replay = replay.command(task, result.seed)
        _tell_state_notes(result.warnings)
        if result.status is Status.SKIP:
            reasons = dict.fromkeys(c.message for c in result.checks if c.message)
            self._skip("; ".join(reasons) or "no check applies")
        if result.status in (Status.FAIL, Status.ERROR):
            raise CheckFailed(result)
        if result.status is Status.XFAIL:  # shown as x, as pytest shows its own expected failures
            pytest.xfail(expected_reason(result))

    def _skip(self, reason: str) -> None:
        """Skip, reported at the case's line in the spec (``-rs``), not at this line of the plugin."""
        if self.case.line:
            try:
                raise pytest.skip.Exception(reason, _use_item_location=True)
            except TypeError:  # a pytest without that (private) argument
                pass
        pytest.skip(reason)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            result = excinfo.value.result
            head = "gradient check failed" if result.error is None else "could not be checked (status error)"
            return (
                f"{headline(result)}\n{head}: {result.id}\n\n{render_text(result)}\n"
                f"  rerun in pytest: pytest --gradcheck '{self.nodeid}'"
            )
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, Optional[int], str]:
        # the domain (failure headline) is the command line's id; not a suffix of the node id, which
        # pytest -v would rewrite ('.' -> '::')
        line = self.case.line - 1 if self.case.line else None
        return self.path, line, f"gradcheck {self.case.name}[{self.device}]"


class SpecErrorItem(pytest.Item):
    """A spec document that cannot be used: always fails, with the spec error's message."""

    def __init__(self, *, error: SpecError, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        from .spec import SpecError

        if isinstance(excinfo.value, SpecError):
            return f"invalid spec (status error): {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, Optional[int], str]:
        line = self.error.line - 1 if self.error.line else None
        return self.path, line, f"gradcheck {self.error.path}: spec error"


def headline(result: CaseResult) -> str:
    """The result in one line, first in its failure text: pytest's short summary (``FAILED ID - LINE``) shows it.
    The first failing check and argument with the pattern in words, and how many more failed."""
    from .results import Status

    if result.error is not None:
        return f"could not be checked: {result.error.kind} error: {result.error.message.splitlines()[0]}"
    failed = [check for check in result.checks if check.status is Status.FAIL]
    if not failed:
        return "gradient check failed"
    check, more = failed[0], len(failed) - 1
    rows = [row for row in check.inputs if row.status is Status.FAIL]
    if rows:
        row = rows[0]
        counted = f"{row.mismatched} of {row.numel} elements out of tolerance" if row.mismatched is not None else ""
        text = f"{check.check}: gradient of {row.name!r}: {row.diagnosis or counted or row.reason or 'wrong'}"
        text += f" (and {len(rows) - 1} more argument{'s' * (len(rows) > 2)})" if len(rows) > 1 else ""
    else:
        text = f"{check.check}: {(check.message or 'failed').splitlines()[0]}"
    return text + (f"; {more} more check{'s' * (more > 1)} failed" if more else "")


def render_text(result: CaseResult) -> str:
    """The command line's table report of one case, without colour and never wrapped."""
    from rich.console import Console

    from .reporters.table import render_case

    buffer = io.StringIO()
    render_case(
        result, Console(file=buffer, no_color=True, highlight=False, soft_wrap=False, width=1000, color_system=None)
    )
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")
