"""[tool.gradcheck] in pyproject.toml: every key, the command line over the file, bad values, --show-config."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import corpus
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

SQUARE = corpus.module_source(corpus.Square)


@pytest.fixture
def project(user_module, write_spec, tmp_path):
    """A project in tmp_path (the current directory): module usermod, specs/square.yaml, and a function
    ``pyproject(text)`` that writes pyproject.toml (a [project] table, then ``text``)."""
    user_module(SQUARE)
    write_spec("function: usermod:Square\ninputs: [{shape: [3]}]\n", "specs/square.yaml")

    def pyproject(text: str, folder: Path = tmp_path) -> Path:
        path = folder / "pyproject.toml"
        path.write_text('[project]\nname = "demo"\n\n' + textwrap.dedent(text), encoding="utf-8")
        return path

    return pyproject


def shown(result) -> tuple[dict, dict[str, str]]:
    """--show-config's output: the settings (parsed as TOML) and each key's source comment."""
    assert result.exit_code == 0, result.output
    settings = tomllib.loads(result.stdout)["tool"]["gradcheck"]
    sources = {}
    for line in result.stdout.splitlines():
        if line.startswith("#") and ": not set" not in line or line.startswith("["):
            continue
        key = line.lstrip("# ").split(" ")[0].rstrip(":")
        sources[key] = line.rsplit("  # ", 1)[1]
    return settings, sources


EVERY_KEY = """
    [tool.gradcheck]
    paths = ["specs"]
    specs = "specs"
    checks = ["backward", "double_backward"]
    import = ["json"]
    format = "json"
    verbosity = "quiet"
    jobs = 3
    timeout = 12.5
    max-memory = 64
    probes = 5
    strict = true
    trials = 2
    fail-fast = true
    maxfail = 3
"""


def test_show_config_without_a_file_shows_the_defaults(project, invoke):
    settings, sources = shown(invoke("--show-config"))
    assert settings == {
        "specs": "specs",
        "format": "table",
        "verbosity": "normal",
        "timeout": 300,
        "max-memory": 512,
        "probes": 0,
        "strict": False,
        "trials": 1,
        "fail-fast": False,
        "maxfail": 0,
    }
    assert set(sources.values()) == {"default"} and {"paths", "jobs", "checks"} <= set(sources)


def test_every_key_of_the_file_is_the_default_and_show_config_names_the_file(project, invoke):
    path = project(EVERY_KEY)
    settings, sources = shown(invoke("--show-config"))
    assert settings == {
        "paths": ["specs"],
        "specs": "specs",
        "checks": ["backward", "double_backward"],
        "import": ["json"],
        "format": "json",
        "verbosity": "quiet",
        "jobs": 3,
        "timeout": 12.5,
        "max-memory": 64,
        "probes": 5,
        "strict": True,
        "trials": 2,
        "fail-fast": True,
        "maxfail": 3,
    }
    for key in settings:
        assert sources[key] == f"{path} [tool.gradcheck] {key}"


def test_the_command_line_wins_over_the_file(project, invoke):
    project(EVERY_KEY.replace("probes = 5", "fast = true"))
    result = invoke(
        "--show-config",
        "specs/square.yaml",
        "-j",
        "1",
        "--timeout",
        "0",
        "--probes",
        "2",
        "-v",
        "--check",
        "backward",
        "--format",
        "table",
        "--trials",
        "4",
        "--max-memory",
        "8",
    )
    settings, sources = shown(result)
    assert settings["paths"] == ["specs/square.yaml"] and sources["paths"] == "command line (TARGETS)"
    assert (settings["jobs"], settings["timeout"], settings["probes"], settings["verbosity"]) == (
        1,
        float("inf"),
        2,
        "verbose",
    )
    assert (settings["checks"], settings["format"], settings["trials"], settings["max-memory"]) == (
        ["backward"],
        "table",
        4,
        8,
    )
    assert sources["probes"] == "command line (--probes)" and sources["jobs"] == "command line (-j/--jobs)"
    assert sources["strict"].endswith("[tool.gradcheck] strict")  # not given: still the file's


def test_fast_in_the_file_is_three_probes_and_the_file_is_used_by_a_real_run(project, invoke):
    project("""
        [tool.gradcheck]
        paths = ["specs"]
        fast = true
        format = "json"
    """)
    result = invoke("--no-isolate")  # no TARGETS: the file's paths
    assert result.exit_code == 0, result.output
    (res,) = json.loads(result.stdout)["results"]  # the file's format
    assert res["id"] == "specs/square.yaml::default[cpu]" and res["checks"][0]["mode"] == "probe"
    assert (
        json.loads(invoke("--no-isolate", "--probes", "0").stdout)["results"][0]["checks"][0]["mode"] == "elementwise"
    )


def test_the_nearest_pyproject_with_the_table_is_used_from_a_subfolder(project, invoke, tmp_path, monkeypatch):
    root = project('[tool.gradcheck]\npaths = ["specs"]\nformat = "json"\n')
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    (tmp_path / "src" / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n", encoding="utf-8")
    monkeypatch.chdir(sub)
    settings, sources = shown(invoke("--show-config"))
    # as the file writes them (relative to its folder), so that the lines paste into it (issue 31 item 6: they
    # were relative to the current folder, "../../specs")
    assert settings["paths"] == ["specs"] and sources["paths"] == f"{root} [tool.gradcheck] paths"
    settings, sources = shown(invoke("../../specs", "--show-config"))
    assert settings["paths"] == ["specs"] and sources["paths"] == "command line (TARGETS)"
    result = invoke("--no-isolate")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["id"] == "../../specs/square.yaml::default[cpu]"


def test_without_targets_or_configured_paths_it_says_how_to_give_them(project, invoke):
    project("[tool.gradcheck]\njobs = 1\n")
    result = invoke()
    assert result.exit_code == 2
    assert "no TARGETS" in result.output and 'paths = ["specs"]' in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("jobs = 0", "[tool.gradcheck] jobs: expected a whole number, 1 or more, got 0"),
        ("jobs = true", "[tool.gradcheck] jobs: expected a whole number, 1 or more, got true"),
        ("max_memory = 64", "[tool.gradcheck] max_memory: unknown key; did you mean 'max-memory'? known keys: paths,"),
        ("colour = true", "[tool.gradcheck] colour: unknown key; known keys: paths, specs"),
        ("seed = 1", "[tool.gradcheck] seed: not a project setting: it belongs in a spec's `seed:` key"),
        ("device = ['cuda']", "[tool.gradcheck] device: not a project setting: it belongs in a spec's `device:` key"),
        ('checks = ["backwrd"]', "[tool.gradcheck] checks: unknown check 'backwrd'; known checks: backward,"),
        ("checks = []", '[tool.gradcheck] checks: expected a list of check names or "all", got []'),
        ('paths = "specs"', "[tool.gradcheck] paths: expected a list of spec files or folders"),
        ('paths = ["nope"]', "[tool.gradcheck] paths: 'nope' does not exist (paths are relative to the folder of"),
        ('specs = "specs/square.yaml"', "[tool.gradcheck] specs: 'specs/square.yaml' is not a folder"),
        (
            'timeout = "long"',
            "[tool.gradcheck] timeout: expected a number of seconds >= 0 (0 or inf: no limit), got 'long'",
        ),
        ("timeout = -1", "[tool.gradcheck] timeout: expected a number of seconds >= 0"),
        ('format = "xml"', "[tool.gradcheck] format: expected one of 'table', 'json', 'github', 'auto', got 'xml'"),
        ('verbosity = "loud"', "[tool.gradcheck] verbosity: expected one of 'quiet', 'normal', 'verbose', got 'loud'"),
        ("fast = 1", "[tool.gradcheck] fast: expected true or false, got 1"),
        ("fast = true\nprobes = 4", "[tool.gradcheck] fast, probes: set one of them (fast = true means probes = 3)"),
        ("probes = -1", "[tool.gradcheck] probes: expected a whole number, 0 or more, got -1"),
        ('strict = "yes"', "[tool.gradcheck] strict: expected true or false, got 'yes'"),
        ("trials = 0", "[tool.gradcheck] trials: expected a whole number, 1 or more, got 0"),
        ("fail-fast = 0", "[tool.gradcheck] fail-fast: expected true or false, got 0"),
        ('import = ["my ops"]', "[tool.gradcheck] import: expected a module name like 'my_pkg.ops', got 'my ops'"),
        (
            "junit-locations = true",
            "[tool.gradcheck] junit-locations: not a project setting: it belongs in the command",
        ),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_the_file_and_key(project, invoke, text, message):
    project(f"[tool.gradcheck]\n{text}\n")
    result = invoke("specs/square.yaml")  # bad even where the command line would override it
    assert result.exit_code == 2, result.output
    assert f"Error: pyproject.toml: {message}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tool.gradcheck\n", "pyproject.toml: cannot be read as TOML: "),
        ("[tool]\ngradcheck = 3\n", "pyproject.toml: [tool.gradcheck]: expected a table of settings"),
    ],
)
def test_a_pyproject_that_is_not_usable_is_a_usage_error(tmp_path, monkeypatch, invoke, text, message):
    (tmp_path / "pyproject.toml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = invoke("--show-config")
    assert result.exit_code == 2 and message in result.output, result.output


def test_reading_the_configuration_imports_no_torch(project, tmp_path):
    project(EVERY_KEY)
    code = (
        "import sys\nfrom gradcheck_cli.cli import main\n"
        "try:\n    main(['--show-config'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "jobs = 3" in out and out.strip().endswith("torch imported: False")
