"""Project configuration: ``[tool.gradcheck]`` in the nearest pyproject.toml, and how the value of each
option of ``core.options`` is read, from text (``read_text``: the command line, the pytest plugin) and from
a typed value (``read_value``: the file, a default), with one message per kind of value (no click, no torch).

Each key is a ``Setting``: its name in the file, the ``check`` command's parameter whose default it replaces,
and a parser from the file's value to the value the command line would give; the options' keys are made of
their rows (``core.options.Option.project``), the report's (paths, specs, format, verbosity) are written
here. The front end hands ``Config.defaults`` to click as the command's default map, so the command line
wins over the file, and click records where each value came from; the pytest plugin reads ``Config.values``
the same way (its own options win).
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .checks import NAMES as CHECKS
from .core.options import FAST_PROBES, FIELDS, OPTIONS, Flag, Kind, Option, Seconds, Text, Whole
from .reporters import FORMATS as REPORTERS
from .spec.values import is_device, is_import_path, is_module_name

FILE = "pyproject.toml"
TABLE = "[tool.gradcheck]"
FORMATS = (*REPORTERS, "auto")
VERBOSITIES = ("quiet", "normal", "verbose")


class ConfigError(Exception):
    """A pyproject.toml that cannot be used: a usage error (exit 2) naming the file and the key."""


Parse = Callable[[Any, Path], Any]  # (the file's value, the file's folder) -> the parameter's value; ValueError


@dataclass(frozen=True)
class Setting:
    key: str  # its name in [tool.gradcheck]: the long option's name
    param: str  # the check command's parameter it gives the default of
    option: str  # the command-line spelling, for messages and --show-config
    parse: Parse


def _boolean(value: Any, folder: Path) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_show(value)}")
    return value


def _choice(choices: Sequence[str]) -> Parse:
    def parse(value: Any, folder: Path) -> str:
        if value not in choices or not isinstance(value, str):
            raise ValueError(f"expected one of {', '.join(map(repr, choices))}, got {_show(value)}")
        return value

    return parse


def _is_check(text: str) -> bool:
    return text in (*CHECKS, "all")


@dataclass(frozen=True)
class Rule:
    """What a ``Text`` option accepts: ``accepts(word)``, the message for a word it does not (``{got}``: the
    word as written), a list of them as a [tool.gradcheck] value, and the words to complete (if they are few)."""

    accepts: Callable[[str], bool]
    refused: str
    listed: str
    words: tuple[str, ...] = ()


RULES = {
    "check": Rule(
        _is_check,
        f"unknown check {{got}}; known checks: {', '.join(CHECKS)}, or all",
        'a list of check names or "all"',
        (*CHECKS, "all"),
    ),
    "device": Rule(is_device, "expected cpu, cuda or cuda:N, got {got}", 'a list of devices such as ["cpu"]'),
    "module": Rule(
        is_module_name,
        "expected a module name like 'my_pkg.ops', got {got}",
        'a list of module names such as ["pkg.ops"]',
    ),
    "import path": Rule(
        is_import_path, "expected an import path like 'pkg.mod:fn' or 'pkg.mod.fn', got {got}", "an import path"
    ),
}


def _expected(kind: Kind) -> str:
    """What an option of ``kind`` takes, as its messages say."""
    if isinstance(kind, Whole):
        counted = f" of {kind.unit}" if kind.unit else ""
        high = "2**64 - 1" if kind.high == 2**64 - 1 else str(kind.high)
        return f"a whole number{counted}" + (
            f", {kind.low} or more" if kind.high is None else f" from {kind.low} to {high}"
        )
    if isinstance(kind, Seconds):
        return "a number of seconds >= 0 " + ("(0 or inf: no limit)" if kind.no_limit else "(0: off)")
    return "true or false"


def _in_range(option: Option, number: Union[int, float], got: str) -> Any:
    kind = option.kind
    if isinstance(kind, Whole):
        if not isinstance(number, int) or number < kind.low or (kind.high is not None and number > kind.high):
            raise ValueError(f"expected {_expected(kind)}, got {got}")
        return number
    assert isinstance(kind, Seconds)
    if math.isnan(number) or number < 0 or (not kind.no_limit and math.isinf(number)):
        raise ValueError(f"expected {_expected(kind)}, got {got}")
    return None if kind.no_limit and number in (0, math.inf) else float(number)


def _word(option: Option, word: str, got: str) -> str:
    assert isinstance(option.kind, Text)
    rule = RULES[option.kind.rule]
    if not rule.accepts(word):
        raise ValueError(rule.refused.format(got=got))
    return word


def read_text(option: Option, text: str) -> Any:
    """The value of ``option`` as the command line (or the pytest plugin) gives it, as text; ValueError with the
    message every front end shows (one word of a repeated option: each is read on its own)."""
    kind = option.kind
    if isinstance(kind, Text):
        return _word(option, text, repr(text))
    if isinstance(kind, Whole):
        number: Union[int, float] = int(text) if re.fullmatch(r"[+-]?\d+", text.strip()) else math.nan
    else:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
    if isinstance(kind, Whole) and isinstance(number, float):
        raise ValueError(f"expected {_expected(kind)}, got {text!r}")
    return _in_range(option, number, repr(text))


def read_value(option: Option, value: Any) -> Any:
    """The value of ``option`` as [tool.gradcheck] (or a default) gives it, a typed value: a flag's true gives
    its field the flag's value (``fast = true``: probes = 3), false that field's default; ValueError."""
    kind = option.kind
    if isinstance(kind, Flag):
        return kind.const if _boolean(value, Path()) else FIELDS[option.field].default
    if isinstance(kind, Text):
        if not kind.repeat:
            return _word(option, value, _show(value)) if isinstance(value, str) else _refuse_list(option, value)
        words = [value] if isinstance(value, str) else value
        if not isinstance(words, (list, tuple)) or not words or not all(isinstance(w, str) for w in words):
            _refuse_list(option, value)
        return tuple(dict.fromkeys(_word(option, w, repr(w)) for w in words))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected {_expected(kind)}, got {_show(value)}")
    return _in_range(option, value, _show(value))


def _refuse_list(option: Option, value: Any) -> Any:
    assert isinstance(option.kind, Text)
    raise ValueError(f"expected {RULES[option.kind.rule].listed}, got {_show(value)}")


def _relative(path: str, folder: Path) -> str:
    """``path`` as written in the file (relative to the file's folder), as seen from the current directory."""
    full = folder / path
    if not full.exists():
        raise ValueError(f"{path!r} does not exist (paths are relative to the folder of {FILE}, {folder})")
    return path if Path(path).is_absolute() else os.path.relpath(full)


def _in_file(value: Any, folder: Path) -> Any:
    """Paths seen from the current directory (a path or a sequence of them), as the file writes them: relative
    to its folder (absolute ones as they are), so that --show-config's lines can be pasted into it."""
    if isinstance(value, str):
        return value if Path(value).is_absolute() else os.path.relpath(Path(value).resolve(), folder.resolve())
    return [_in_file(v, folder) for v in value]


def _paths(value: Any, folder: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p for p in value):
        raise ValueError(f'expected a list of spec files or folders, e.g. ["specs"], got {_show(value)}')
    return tuple(_relative(p, folder) for p in value)


def _folder(value: Any, folder: Path) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f'expected a folder, e.g. "specs", got {_show(value)}')
    if not (folder / value).is_dir():
        raise ValueError(f"{value!r} is not a folder (relative to the folder of {FILE}, {folder})")
    return _relative(value, folder)


def _setting(option: Option) -> Setting:
    """The [tool.gradcheck] key of ``option``, read as its kind says (seconds are handed on as text, as the
    command line would give them: click reads them again, and reads None, no limit, as "not set")."""

    def parse(value: Any, folder: Path) -> Any:
        read = read_value(option, value)
        return str(value) if isinstance(option.kind, Seconds) else read

    return Setting(option.project or option.name, option.field, "/".join((*option.flags, f"--{option.name}")), parse)


SETTINGS = (
    Setting("paths", "targets", "TARGETS", _paths),
    Setting("specs", "specs_dir", "--specs", _folder),
    Setting("format", "fmt", "--format", _choice(FORMATS)),
    Setting("verbosity", "verbosity", "-q/-v", _choice(VERBOSITIES)),
    *(_setting(option) for option in OPTIONS if option.project),
)
KEYS = {s.key: s for s in SETTINGS}
ELSEWHERE = {  # options that are no project setting, and where they belong
    "seed": "a spec's `seed:` key (each spec has its own; --seed is for replaying one run)",
    "device": "a spec's `device:` key, or --device for one run (the devices depend on the machine)",
    "no-compress": "the command line, to compare with the compressed finite differences (the same verdicts)",
    "require-device": "the command line of the CI job that has the device (--require-device)",
    "junit-xml": "the command line of the CI job that writes it (--junit-xml)",
    "shard": "the command line of each CI matrix job (--shard I/N)",
    "color": "the NO_COLOR / FORCE_COLOR environment variables or --color/--no-color",
    "no-isolate": "the command line, for one debugging run (--no-isolate)",
    "reference": "a spec's `reference:` key",
    "junit-locations": "the command line of the CI job that writes the JUnit file (--junit-locations)",
}


@dataclass(frozen=True)
class Config:
    """The settings of one pyproject.toml (or none: ``path`` None)."""

    path: Optional[Path] = None
    values: dict[str, Any] = field(default_factory=dict)  # key -> the value as written in the file
    defaults: dict[str, Any] = field(default_factory=dict)  # parameter -> value: the check command's default map

    def source(self, param: str) -> str:
        """Where the file sets ``param``: the key, as ``path [tool.gradcheck] key``."""
        keys = [s.key for s in SETTINGS if s.param == param and s.key in self.values]
        return f"{self.path} {TABLE} {', '.join(keys)}"


def _show(value: Any) -> str:
    return repr(value) if not isinstance(value, bool) else str(value).lower()


def _parse_toml(text: str) -> dict[str, Any]:
    """TOML text -> a dict; ValueError (TOMLDecodeError) when it is not TOML."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    try:  # Python 3.10: tomli, a dependency there (pyproject.toml), is what became tomllib
        tomli = importlib.import_module("tomli")
    except ModuleNotFoundError as exc:
        raise ConfigError(f"reading {FILE} on Python 3.10 needs the tomli package: pip install tomli") from exc
    table: dict[str, Any] = tomli.loads(text)
    return table


def _table(path: Path) -> Optional[Any]:
    """The [tool.gradcheck] table of ``path`` (any value: checked later), or None when it has none."""
    try:
        document = _parse_toml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{_name(path)}: cannot be read as TOML: {exc}") from exc
    tool = document.get("tool")
    return tool.get("gradcheck") if isinstance(tool, dict) else None


def find(start: Path) -> Optional[tuple[Path, Any]]:
    """The nearest pyproject.toml at or above ``start`` that has a [tool.gradcheck] table, and that
    table (as ruff and mypy pick theirs: a pyproject.toml without the table is passed over)."""
    for folder in (start, *start.parents):
        path = folder / FILE
        if path.is_file():
            table = _table(path)
            if table is not None:
                return path, table
    return None


def _name(path: Path) -> str:
    """``path`` as a message names it: relative to the current directory when below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _unknown(key: str) -> str:
    if key in ELSEWHERE:
        return f"not a project setting: it belongs in {ELSEWHERE[key]}"
    close = difflib.get_close_matches(key.replace("_", "-"), KEYS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key; {hint}known keys: {', '.join(KEYS)}"


def parse(path: Path, table: Any) -> Config:
    """Check every key of ``table`` (the [tool.gradcheck] table of ``path``) and turn it into defaults."""
    where = f"{_name(path)}: {TABLE}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table of settings (key = value lines), got {_show(table)}")
    defaults: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            raise ConfigError(f"{where} {key}: {_unknown(key)}")
        try:
            defaults[KEYS[key].param] = KEYS[key].parse(value, path.parent.resolve())
        except ValueError as exc:
            raise ConfigError(f"{where} {key}: {exc}") from exc
    if "fast" in table and "probes" in table:
        raise ConfigError(f"{where} fast, probes: set one of them (fast = true means probes = {FAST_PROBES})")
    return Config(path=path.resolve(), values=dict(table), defaults=defaults)


def load(start: Optional[Path] = None) -> Config:
    """The configuration that applies in ``start`` (default: the current directory); ConfigError when it is bad."""
    found = find((start or Path.cwd()).resolve())
    return parse(*found) if found else Config()


UNSET = {
    "targets": "none: give TARGETS on the command line",
    "jobs": "one worker per usable core",
    "checks": "each spec's own `checks`",
}


def _toml(value: Any) -> str:
    """A parameter's value as a TOML value (``inf`` for no limit)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "inf" if value == math.inf else str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


def describe(config: Config, params: Mapping[str, Any], given: Set[str]) -> str:
    """``--show-config``: each setting's effective value as a line of [tool.gradcheck] (valid TOML), and
    where it comes from. ``params`` are the check command's values, ``given`` those set on the command line."""
    order = (
        f"the command line wins over {config.path} {TABLE}, which wins over the defaults"
        if config.path
        else f"no {FILE} with {TABLE} at or above {Path.cwd()}: the command line wins over the defaults"
    )
    lines = [f"# gradcheck's settings ({order})", TABLE]
    rows: list[tuple[str, str]] = []
    for setting in SETTINGS:
        if setting.key == "fast":  # shown as probes (fast = true is probes = 3)
            continue
        value = params.get(setting.param)
        if setting.param == "timeout" and value is None:
            value = math.inf
        if setting.param == "verbosity" and value is None:
            value = "normal"
        key = "paths" if setting.param == "targets" else setting.key
        if config.path is not None and setting.param in ("targets", "specs_dir") and value not in (None, ()):
            value = _in_file(value, Path(config.path).parent)
        text = (
            f"{key} = {_toml(value)}"
            if value not in (None, ())
            else f"# {key}: not set ({UNSET.get(setting.param, 'none')})"
        )
        if setting.param in given:
            source = f"command line ({setting.option})"
        elif setting.param in config.defaults:
            source = config.source(setting.param)
        else:
            source = "default"
        rows.append((text, source))
    width = max(len(text) for text, _ in rows)
    return "\n".join(lines + [f"{text:<{width}}  # {source}" for text, source in rows]) + "\n"
