"""A report that cannot be written (a full disk, a closed or full stdout) is an error naming it, exit 3, after
every other report was written (issue 46 item 5): it was a traceback and exit 4, and the reports after it
were lost. /dev/full answers every write with ENOSPC, as a full disk does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = "function: torch.sin\ninputs: [{name: x, shape: [3]}]\n"
FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")


def test_a_file_report_on_a_full_disk_names_it_and_the_others_are_written(tmp_path, invoke, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SPEC)
    result = invoke("s.yaml", "--junit-xml", str(FULL), "--html", "report.html", "--format", "json")
    assert result.exit_code == 3, result.output
    assert "gradcheck: cannot write the JUnit XML report /dev/full: No space left on device" in result.stderr
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")  # written after it
    assert '"status": "pass"' in result.stdout and "Traceback" not in result.output


def test_a_report_on_a_full_stdout_names_it_and_the_files_are_written(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    with open(FULL, "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gradcheck_cli", "s.yaml", "--format", "json", "--junit-xml", "out.xml"],
            cwd=tmp_path,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    assert done.returncode == 3, done.stderr
    assert "gradcheck: cannot write the json report on stdout: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert (tmp_path / "out.xml").read_text().startswith("<?xml")


def test_a_failing_check_with_an_unwritable_report_exits_3_and_an_interrupt_keeps_130(tmp_path, invoke, monkeypatch):
    """The verdict did not reach where it was asked for: 3 over 1 (as a spec error does); the exit code
    of an interrupted run is not changed."""
    from gradcheck_cli.run import session

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(
        "function: gradcheck_cli.examples.broken:MulConstantSignFlip\ninputs: [{name: x, shape: [3]}, {name: c, value: 2.0}]\n"
    )
    assert invoke("bad.yaml", "--junit-xml", str(FULL), "--no-isolate").exit_code == 3
    real = session.execute

    def interrupted(*args, **kwargs):
        report = real(*args, **kwargs)
        report.interrupted = "SIGINT"
        return report

    monkeypatch.setattr(session, "execute", interrupted)
    assert invoke("bad.yaml", "--junit-xml", str(FULL), "--no-isolate").exit_code == 130
