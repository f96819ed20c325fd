"""``gradcheck --watch``: check, then, round after round until Ctrl-C, re-check the cases that a saved
spec file or Python file affects, in one worker process that keeps torch and the user's modules loaded.

Changes are found by polling modification times (no dependency on inotify or watchdog). A case
depends on its spec document and on the project files its modules import (``depends``); a changed
module, and the project modules that import it, are imported afresh before the round
(``watch_worker``); where that is not safe, a fresh worker checks the round. No torch here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TextIO, Union

from .results import CaseResult, ErrorKind, ExitCode, Report
from .run import depends, plan
from .run.discovery import SPEC_SUFFIXES, TargetError
from .run.plan import RunOptions, Task
from .run.session import Terminated
from .run.watch_worker import Worker
from .spec import Case, SpecError

INTERVAL = 0.1  # seconds between two looks at the files' modification times
SETTLE = 0.02  # after a change, wait this long for the editor to finish writing (a save in several steps)
LIST_EVERY = 10  # looks between two listings of the spec folders (spec files added or removed)
CLEAR = "\x1b[2J\x1b[H"  # clear the terminal, cursor home

Item = Union[Case, SpecError]
Planned = Union[Task, SpecError]


@dataclass
class Entry:
    """The latest round's word on one task (or one unusable spec document)."""

    planned: Planned
    result: CaseResult
    files: frozenset[str] = frozenset()  # the project's Python files it depends on


@dataclass
class Hooks:
    """For tests and the benchmark: ``rounds`` ends the watch after that many rounds; ``on_round`` sees
    each round's report; ``on_poll(n)`` runs at the n-th look at the files since the last round and
    ends the watch by returning True."""

    rounds: Optional[int] = None
    on_round: Optional[Callable[[int, Report], None]] = None
    on_poll: Optional[Callable[[int], bool]] = None


@dataclass
class Settings:
    timeout: Optional[float] = None  # --timeout, per case
    threads: int = 1  # torch threads of the worker
    clear: bool = False  # clear the terminal before each round (else a separator line)
    interval: float = INTERVAL
    err: TextIO = field(default_factory=lambda: sys.stderr)  # round headers and the status line
    out: TextIO = field(default_factory=lambda: sys.stdout)  # where the report goes (cleared before each round)


class Watch:
    """The watch loop: ``collect()`` reads the targets' spec cases (TargetError: none usable now),
    ``listing()`` names the spec files the targets cover, ``show(report, planned)`` prints a round's report."""

    def __init__(
        self,
        collect: Callable[[], list[Item]],
        listing: Callable[[], Iterable[str]],
        opts: RunOptions,
        show: Callable[[Report, list[Planned]], None],
        settings: Optional[Settings] = None,
        hooks: Optional[Hooks] = None,
    ) -> None:
        self.collect, self.listing, self.opts, self.show = collect, listing, opts, show
        self.settings, self.hooks = settings or Settings(), hooks or Hooks()
        self.entries: dict[str, Entry] = {}
        self.items: list[Item] = []
        self.stamps: dict[str, Optional[tuple[int, int]]] = {}  # watched file -> (mtime, size); None: missing
        self.specs: frozenset[str] = frozenset()  # the spec files of the targets, resolved
        self.worker: Optional[Worker] = None
        self.spare: Optional[Worker] = None  # started ahead where a fresh worker will be needed
        self.rounds = 0

    def run(self) -> ExitCode:
        """Watch until Ctrl-C (or SIGTERM). Exit code: interrupted during a round, 130 (143 for SIGTERM), as
        any interrupted run; between rounds, the code a run of every watched case would give now."""
        try:
            interrupted = self._round(frozenset(), first=True)
            while interrupted is None and not self._done():
                changed = self._wait()
                if changed is None:
                    break
                interrupted = self._round(changed)
            if interrupted is not None:
                return ExitCode.TERMINATED if interrupted == "SIGTERM" else ExitCode.INTERRUPTED
        except (KeyboardInterrupt, Terminated):
            pass
        finally:
            for worker in (self.worker, self.spare):
                if worker is not None:
                    worker.stop(force=True)
        code = self.state().exit_code()
        self._say(f"stopped watching: {self._counts()}; exit code {int(code)}")
        return code

    def state(self) -> Report:
        """The latest result of every watched case."""
        return Report([e.result for e in self.entries.values()])

    def _done(self) -> bool:
        return self.hooks.rounds is not None and self.rounds >= self.hooks.rounds

    # -- finding changes

    def _track(self, files: Iterable[str]) -> None:
        """Watch exactly ``files`` from now on (new ones are stamped as they are now)."""
        wanted = set(files)
        self.stamps = {f: self.stamps[f] if f in self.stamps else _stamp(f) for f in wanted}

    def _wait(self) -> Optional[frozenset[str]]:
        """Look at the files until one changed (the changed files), or a hook ends the watch (None)."""
        polls = 0
        while True:
            time.sleep(self.settings.interval)
            polls += 1
            if self.hooks.on_poll and self.hooks.on_poll(polls):
                return None
            changed = self._changed(listing=polls % LIST_EVERY == 0)
            if changed:
                time.sleep(SETTLE)
                return changed | self._changed(listing=False)

    def _changed(self, listing: bool) -> frozenset[str]:
        changed = {f for f, was in self.stamps.items() if _stamp(f) != was}
        if listing:
            changed |= set(_resolved(self.listing())) ^ self.specs  # spec files added or removed
        for f in changed:
            self.stamps[f] = _stamp(f)
        return frozenset(changed)

    # -- one round

    def _round(self, changed: frozenset[str], first: bool = False) -> Optional[str]:
        """Re-check what ``changed`` affects and show it; the signal's name if one stopped the round."""
        start = time.perf_counter()
        depends.refresh()
        code = frozenset(f for f in changed if not f.endswith(SPEC_SUFFIXES))
        if first or changed & self.specs or len(code) < len(changed):
            try:
                self.items = self.collect()
            except TargetError as exc:
                self._say(f"gradcheck: {exc}; waiting for a change")
        planned = plan.expand(self.items, self.opts)
        files = {_key(p): _files(p) for p in planned}
        due = [p for p in planned if first or self._due(p, files[_key(p)], changed, code)]
        stale = depends.dependents(code, self._loaded()) | code
        kept = {_key(p) for p in planned}
        dropped = [k for k in self.entries if k not in kept]
        self.specs = frozenset(_resolved(self.listing())) | frozenset(_resolved(_key_path(p) for p in planned))
        self._track(self.specs | frozenset(f for fs in files.values() for f in fs) | self._loaded().keys())
        if not due and not dropped:
            if self.worker is not None:
                self.worker.forget(stale)
            return None
        fresh = self._prepare(stale, bool([p for p in due if isinstance(p, Task)]))
        self.rounds += 1
        self._header(changed, due, len(planned), fresh, first)
        results, interrupted = self._check(due, files)
        self.entries = {k: e for k, e in self.entries.items() if k in kept}
        report = Report(results, time.perf_counter() - start, not_run=len(due) - len(results), interrupted=interrupted)
        self.show(report, due)
        self._track(self.specs | self._loaded().keys() | {f for e in self.entries.values() for f in e.files})
        self._say(f"watching {self._counts()}; Ctrl-C to stop")
        if self.hooks.on_round:
            self.hooks.on_round(self.rounds, report)
        return interrupted

    def _due(self, p: Planned, files: frozenset[str], changed: frozenset[str], code: frozenset[str]) -> bool:
        old = self.entries.get(_key(p))
        if old is None:
            return True
        if isinstance(p, SpecError):
            return _resolved1(p.path) in changed
        if old.planned != p or (files | old.files) & code:
            return True
        error = old.result.error
        return bool(code) and error is not None and error.kind is ErrorKind.IMPORT  # it may import a changed file

    def _prepare(self, stale: frozenset[str], tasks: bool) -> Optional[str]:
        """Forget the stale modules in the worker, or replace it where that is not safe; why it was replaced."""
        worker = self.worker
        reasons = [why for f, why in (worker.loaded.items() if worker else []) if f in stale and why]
        if worker is not None and not worker.dead and not reasons:
            worker.forget(stale)
            return None
        if worker is not None:
            worker.stop(force=True)
        self.worker = None
        if tasks:
            self.worker, self.spare = self.spare or self._spawn(), None
        return reasons[0] if reasons else None

    def _spawn(self) -> Worker:
        return Worker(self.settings.threads)

    def _check(self, due: list[Planned], files: dict[str, frozenset[str]]) -> tuple[list[CaseResult], Optional[str]]:
        results: list[CaseResult] = []
        try:
            for p in due:
                if isinstance(p, SpecError):
                    result, found = plan.spec_error_result(p), frozenset[str]()
                else:
                    if self.worker is None or self.worker.dead:
                        self.worker, self.spare = self.spare or self._spawn(), None
                    outcome = self.worker.check(p, self.settings.timeout)
                    if outcome.retire:
                        self.worker.stop(force=True)
                    result, found = outcome.result, outcome.new
                results.append(result)
                old = self.entries.get(_key(p))
                # a module that no longer imports (moved away, renamed): its file is still watched, so that
                # its return (or a syntax error in it) is a round
                kept = (
                    old.files
                    if old is not None and result.error is not None and result.error.kind is ErrorKind.IMPORT
                    else frozenset()
                )
                self.entries[_key(p)] = Entry(p, result, files[_key(p)] | found | kept)
        except (KeyboardInterrupt, Terminated) as exc:
            if self.worker is not None:
                self.worker.stop(force=True)
            return results, "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        if self.spare is None and self.worker is not None and any(self.worker.loaded.values()):
            self.spare = self._spawn()  # the next change of an unsafe module costs no start-up
        return results, None

    def _loaded(self) -> dict[str, Optional[str]]:
        return dict(self.worker.loaded) if self.worker is not None and not self.worker.dead else {}

    # -- what the user sees

    def _header(
        self, changed: frozenset[str], due: list[Planned], total: int, fresh: Optional[str], first: bool
    ) -> None:
        if self.settings.clear:
            self.settings.out.write(CLEAR)
            self.settings.out.flush()
        what = "" if first else " (changed: " + ", ".join(sorted(_shown(f) for f in changed)) + ")"
        note = f"; a fresh worker, as {fresh}" if fresh else ""
        line = f"round {self.rounds}{what}: checking {len(due)} of {total} case{'s' * (total != 1)}{note}"
        self._say(line if self.settings.clear else f"{'─' * 8} {line} {'─' * 8}")

    def _counts(self) -> str:
        s = self.state().summary()
        words = {
            "passed": "passed",
            "failed": "failed",
            "errors": "error" + "s" * (s["errors"] != 1),
            "skipped": "skipped",
        }
        parts = ", ".join(f"{s[k]} {word}" for k, word in words.items() if s[k])
        modules = len({f for e in self.entries.values() for f in e.files})
        specs = len({e.result.spec for e in self.entries.values()})
        return (
            f"{len(self.entries)} case{'s' * (len(self.entries) != 1)}{f' ({parts})' if parts else ''} in "
            f"{specs} spec file{'s' * (specs != 1)}, {modules} module{'s' * (modules != 1)}"
        )

    def _say(self, line: str) -> None:
        self.settings.out.flush()
        print(line, file=self.settings.err, flush=True)


def _key(p: Planned) -> str:
    return plan.task_id(p) if isinstance(p, Task) else plan.spec_error_result(p).id


def _key_path(p: Planned) -> str:
    return p.case.path if isinstance(p, Task) else p.path


def _files(p: Planned) -> frozenset[str]:
    return depends.closure(depends.named_modules(p)) if isinstance(p, Task) else frozenset()


def _stamp(file: str) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _resolved1(path: str) -> str:
    return str(Path(path).resolve())


def _resolved(paths: Iterable[str]) -> list[str]:
    return [_resolved1(p) for p in paths if not p.startswith("<")]  # "<command line>": an inline case


def _shown(file: str) -> str:
    try:
        return os.path.relpath(file)
    except ValueError:
        return file


def watch_targets(
    collect: Callable[[], list[Item]],
    targets: Iterable[str],
    specs_dir: Path,
    opts: RunOptions,
    show: Callable[[Report, list[Planned]], None],
    timeout: Optional[float] = None,
    hooks: Optional[Hooks] = None,
) -> ExitCode:
    """The front end's call: watch the command line's targets (spec files, folders, import paths whose
    specs are in ``specs_dir``) until Ctrl-C; the terminal is cleared before each round when stdout is one."""
    from .run.pool import usable_cores

    settings = Settings(timeout=timeout, threads=usable_cores(), clear=sys.stdout.isatty())
    return Watch(collect, lambda: spec_files_of(targets, specs_dir), opts, show, settings, hooks).run()


def spec_files_of(targets: Iterable[str], specs_dir: Path) -> list[str]:
    """The spec files the targets cover now: a file, the files under a folder, the spec folder for an
    import path (any spec there may come to name it)."""
    from .run.discovery import files_of, looks_like_path, spec_files

    found: list[str] = []
    for target in targets:
        try:
            if Path(target).exists() or looks_like_path(target):
                found += files_of(target)
            elif specs_dir.is_dir():
                found += [str(f) for f in spec_files(specs_dir)]
        except TargetError:  # a file removed meanwhile: its return is a change like any other
            found += [target]
    return found
