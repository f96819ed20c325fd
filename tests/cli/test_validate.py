"""``gradcheck validate FILES...``: every document of spec files (and of the spec files under folders)
checked against the rules of a run (``spec.load_file``), without importing torch or the specs'
code; one line per unusable document, ``PATH:LINE: KEY: MESSAGE``; exit 0 all valid, 3 any invalid
(the contract's "could not be checked", what a run of the same spec exits with), 2 a missing path.
And the pre-commit hook that runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

THREE_DOCS = """\
function: pkg.mod:Good
inputs: [{shape: [3]}]
---
function: pkg.mod:Second
seed: 1.5
---
function: pkg.mod:Third
inputs:
  - {shape: [3], avoid: [[1.0, -1.0]]}
"""


def test_shipped_specs_are_valid_and_nothing_is_printed(invoke, monkeypatch):
    monkeypatch.chdir(REPO)
    result = invoke("validate", "specs", "broken-specs/linear_double_bias.yaml")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "0 invalid" in result.stderr


def test_every_document_is_checked_one_line_per_error(invoke, write_spec, monkeypatch, tmp_path):
    write_spec(THREE_DOCS, "specs/multi.yaml")
    monkeypatch.chdir(tmp_path)
    result = invoke("validate", "specs/multi.yaml")
    assert result.exit_code == 3
    assert result.stdout.splitlines() == [
        "specs/multi.yaml:5: seed: expected a non-negative integer below 2**64, got 1.5",
        "specs/multi.yaml:9: inputs[0].avoid: each interval must be [lo, hi] with lo <= hi",
    ]


def test_the_messages_are_those_of_a_run(invoke, write_spec, monkeypatch, tmp_path):
    write_spec(THREE_DOCS, "multi.yaml")
    monkeypatch.chdir(tmp_path)
    from gradcheck_cli.spec import SpecError, load_file

    run = [str(item) for item in load_file("multi.yaml") if isinstance(item, SpecError)]
    assert invoke("validate", "multi.yaml").stdout.splitlines() == run


def test_folders_are_searched_recursively_and_files_may_be_mixed_in(invoke, write_spec, monkeypatch, tmp_path):
    write_spec("function: pkg.mod:A\n", "specs/a.yaml")
    write_spec("function: pkg.mod:B\ninputs: [{shape: [2], colour: red}]\n", "specs/deep/b.yml")
    write_spec("not a spec, not read\n", "specs/notes.txt")
    write_spec("function: F\n", "other.yaml")
    monkeypatch.chdir(tmp_path)
    result = invoke("validate", "specs", "other.yaml")
    assert result.exit_code == 3
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("specs/deep/b.yml:2: inputs[0].colour: unknown key; allowed keys here: name, shape")
    assert lines[1].startswith("other.yaml:1: function: expected an import path")
    assert "3 files" in result.stderr


def test_a_yaml_syntax_error_is_one_line_and_exit_3(invoke, write_spec, monkeypatch, tmp_path):
    write_spec("function: pkg.mod:A\ninputs: [{shape: [2]\n", "broken.yaml")
    monkeypatch.chdir(tmp_path)
    result = invoke("validate", "broken.yaml")
    assert result.exit_code == 3
    [line] = result.stdout.splitlines()
    assert line.startswith("broken.yaml:3: not valid YAML: ")


def test_a_missing_path_or_an_empty_folder_is_a_usage_error(invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    missing = invoke("validate", "nope.yaml")
    assert missing.exit_code == 2 and "'nope.yaml': no such file or directory" in missing.stderr
    empty = invoke("validate", "empty")
    assert empty.exit_code == 2 and "no spec files" in empty.stderr


def test_validate_imports_neither_torch_nor_the_specs_code(write_spec, tmp_path):
    write_spec(THREE_DOCS, "multi.yaml")
    write_spec("function: os:system\ninputs: [{value: touch pwned}]\n", "os.yaml")
    code = (
        "import sys\n"
        "from gradcheck_cli.cli import main\n"
        "try:\n"
        "    main(['validate', 'multi.yaml', 'os.yaml', sys.argv[1]])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, 'torch' in sys.modules, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "specs")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stderr.splitlines()[-1] == "exit 3 False", proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    assert not (tmp_path / "pwned").exists()


def test_the_pre_commit_hook_runs_validate_on_the_changed_files(tmp_path):
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}
    hook = hooks["gradcheck-validate"]
    assert hook["entry"] == "gradcheck validate" and hook["pass_filenames"] is True
    assert hook["files"] == hooks["gradcheck"]["files"]
    (tmp_path / "bad.yaml").write_text(THREE_DOCS, encoding="utf-8")
    entry = hook["entry"].split()
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", *entry[1:], str(REPO / "specs/linear.yaml"), "bad.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 3
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == ["bad.yaml", "bad.yaml"]
