"""``--lf``: the cases that failed last time, kept in ``.gradcheck_cache/lastfailed.json`` as pytest keeps
its own (``.pytest_cache``): after every run a case that failed or could not be checked is added, one that
passed, skipped or failed as expected is removed, and a case that did not run is left as it was.

A case is known by its spec file's absolute path and its id after the path (``#doc::case[device]``), so a
run from another folder finds the same entries. The cache folder holds a ``.gitignore`` of ``*`` and a
``CACHEDIR.TAG`` (backup tools skip it). Reading or writing it never stops a run: a cache that cannot be
read counts as empty (a warning), one that cannot be written is a warning."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from ..results import CaseResult, Status
from ..spec import Case, SpecError

FOLDER = ".gradcheck_cache"
FILE = "lastfailed.json"
FAILED = (Status.FAIL, Status.ERROR)
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# a cache directory of gradcheck-cli: https://bford.info/cachedir/spec.html\n"


def _key(spec: str, ident: str) -> str:
    """A result's or a case's key: ``ident`` with its spec path made absolute where it names a file."""
    if spec and ident.startswith(spec) and os.path.isfile(spec):
        return os.path.abspath(spec) + ident[len(spec) :]
    return ident


MAX_BYTES = 64 * 2**20  # a cache larger than this is not ours (ours holds one short key per failed case)


def read(root: Path) -> tuple[set[str], Optional[str]]:
    """The keys that failed last time, and a warning where the cache exists but cannot be read (then none):
    a file that is not a regular file (a FIFO, a device, a link to /dev/zero) is never opened, one larger
    than MAX_BYTES never read, and JSON nested too deep to parse counts as unreadable."""
    path = root / FOLDER / FILE
    try:
        facts = path.stat()
    except OSError:  # none yet
        return set(), None
    why = ""
    if not stat.S_ISREG(facts.st_mode):
        why = "not a regular file"
    elif facts.st_size > MAX_BYTES:
        why = f"{facts.st_size} bytes, more than a cache of failures holds"
    else:
        try:
            found = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError, MemoryError) as exc:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            if isinstance(found, dict):
                return {k for k in found if isinstance(k, str)}, None
            why = "not a JSON object"
    return set(), f"--lf's cache {path} cannot be read ({why}): it counts as empty and is written anew after this run"


def select(items: Sequence[Union[Case, SpecError]], failed: set[str]) -> tuple[list[Union[Case, SpecError]], str]:
    """The items to check again, and what to say about it: the cases with a recorded failure (on any
    device) and every spec that cannot be read; all of them where none of the cases failed last time."""
    again = [i for i in items if isinstance(i, Case) and any(k.startswith(_key(i.path, i.name) + "[") for k in failed)]
    cases = sum(isinstance(i, Case) for i in items)
    if not again:
        return list(items), f"--lf: no failure recorded for these {cases} cases; checking all of them"
    kept = [i for i in items if isinstance(i, SpecError) or i in again]
    return kept, f"--lf: checking the {len(again)} of {cases} cases that failed last time"


def update(root: Path, results: Sequence[CaseResult]) -> Optional[str]:
    """Record this run's results in the cache; a warning where it cannot be written, else None (one that cannot
    be read is written anew; what is not a regular file is replaced, never written through)."""
    failed, _ = read(root)
    for result in results:
        key = _key(result.spec or "", result.id)
        if result.status in FAILED:
            failed.add(key)
        else:
            failed.discard(key)
    folder = root / FOLDER
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / ".gitignore").write_text("# created by gradcheck-cli\n*\n", encoding="utf-8")
            (folder / "CACHEDIR.TAG").write_text(_TAG, encoding="utf-8")
        _write_atomically(folder / FILE, dict.fromkeys(sorted(failed), True))
    except OSError as exc:
        return f"--lf's cache {folder} cannot be written ({exc.strerror or exc}): the next --lf checks every case"
    return None


def clear(root: Path) -> None:
    """Forget every recorded failure (``--cache-clear``)."""
    try:
        (root / FOLDER / FILE).unlink()
    except OSError:  # none, or not ours to remove: the next update writes what this run finds
        pass


def _write_atomically(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, never half written (two runs at once: the last one's file wins whole)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
