"""-V / --version with torch's version (torch not imported), TARGETS completing as file paths, Python 3.10+."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.shell_completion import ShellComplete

import gradcheck_cli
from gradcheck_cli.cli import cli

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_names_torch_and_python_without_importing_torch(flag):
    code = (
        "import sys\nfrom gradcheck_cli.cli import main\n"
        f"try:\n    main([{flag!r}])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    torch = importlib.metadata.version("torch")
    assert out.splitlines()[0] == (
        f"gradcheck-cli {gradcheck_cli.__version__} (torch {torch}, Python {platform.python_version()})"
    )
    assert out.strip().endswith("torch imported: False")


def completions(args: list[str], incomplete: str) -> list[tuple[str, str]]:
    complete = ShellComplete(cli, {}, "gradcheck", "_GRADCHECK_COMPLETE")
    return [(item.type, item.value) for item in complete.get_completions(args, incomplete)]


def test_targets_complete_as_file_paths():
    assert ("file", "sp") in completions([], "sp")  # gradcheck sp<TAB>: the default command's targets
    assert ("file", "sp") in completions(["check"], "sp")
    assert ("file", "") in completions(["check", "specs/a.yaml"], "")
    assert ("plain", "init") in completions([], "in")  # the commands still complete
    assert all(kind == "plain" for kind, _ in completions(["check"], "--fa"))  # options are not paths


def test_the_default_commands_options_and_the_check_names_complete():
    """issue 31 item 10: `gradcheck --ch<TAB>` and `--check dou<TAB>` completed nothing"""
    assert ("plain", "--check") in completions([], "--ch")  # the default command's options, at the top
    assert ("plain", "--maxfail") in completions([], "--maxf")
    assert completions(["specs/", "--check"], "dou") == [("plain", "double_backward")]
    assert ("plain", "all") in completions(["check", "--check"], "")
    assert ("plain", "batched") in completions(["check", "--check"], "")


def test_the_main_help_shows_the_default_commands_options():
    from click.testing import CliRunner

    out = CliRunner().invoke(cli, ["--help"]).output
    assert "Options of check, the default command (gradcheck TARGETS = gradcheck check TARGETS):" in out
    assert "--check NAME" in out and "--maxfail N" in out and "-x, --exitfirst, --fail-fast" in out
    assert out.index("Options of check") < out.index("Commands:")


def test_requires_python_is_torchs_and_the_readme_says_so():
    ours = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    torchs = importlib.metadata.metadata("torch")["Requires-Python"]
    oldest = tuple(int(p) for p in re.fullmatch(r">=\s*(\d+\.\d+)", torchs.strip()).group(1).split("."))
    assert ours == f">={oldest[0]}.{oldest[1]}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"Python {oldest[0]}.{oldest[1]}+" in readme
    # No older Python is named anywhere (a bare "3.9" in "13.9 minutes" is not a Python version).
    named = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"Python\s+(3\.\d+)", readme)}
    assert all(v >= oldest for v in named), named
