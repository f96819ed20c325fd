"""Text from user code that no encoding can write (lone surrogates: in an exception message, in
names a spec gives with YAML's "\\udcff" escape, in a file name that is not valid UTF-8) never
crashes a reporter: every format writes it as an escape and exits with the verdict's code."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from gradcheck_cli import check, reporters
from gradcheck_cli.core.printable import printable
from gradcheck_cli.reporters import junit
from gradcheck_cli.results import Report

ROOT = Path(__file__).resolve().parents[2]
USER = """
import torch

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g

class Twice(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 4 * x * g

class Slightly(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2.0005 * x * g

class Raises(Square):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("lone \\udcff and \\ud800 in a message")
"""
FAILS = 'function: usermod:Twice\ninputs: [{name: "x\\udcff", shape: [3]}]\ncases: [{name: "c\\ud801"}]\n'
WARNS = 'function: usermod:Slightly\ninputs: [{name: "w\\ud802", shape: [3]}]\n'
RAISES = "function: usermod:Raises\ninputs: [{shape: [3]}]\n"
BROKEN = "function: usermod:Square\ninputs: [{shape: [x]}]\n"
# what the reports must show instead (a byte of a file name as \xff, other surrogates as \udNNN)
SHOWN = ["bad\\xff.yaml", "x\\xff", "c\\ud801", "w\\ud802", "lone \\xff and \\ud800", "broken\\xfe.yaml", "sub\\xfd"]


@pytest.fixture
def batch(user_module, write_spec, tmp_path, monkeypatch):
    """A directory of specs whose names, messages and warnings hold lone surrogates; a user module
    in a folder whose name is not UTF-8, so the error's `where` holds one too."""
    folder = os.fsdecode(bytes(tmp_path) + b"/sub\xfd")
    os.mkdir(folder)
    Path(folder, "usermod.py").write_text(USER, encoding="utf-8")
    monkeypatch.syspath_prepend(folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([folder, str(ROOT)]))  # for isolated workers and subprocesses
    (tmp_path / "specs").mkdir()
    for name, text in (
        (b"bad\xff.yaml", FAILS),
        (b"warns.yaml", WARNS),
        (b"raises.yaml", RAISES),
        (b"broken\xfe.yaml", BROKEN),
    ):
        (tmp_path / "specs" / os.fsdecode(name)).write_text(text, encoding="utf-8")
    return tmp_path


def assert_shown(text: str) -> None:
    for piece in SHOWN:
        assert piece in text, (piece, text)


def strings(value: object) -> list[str]:
    """Every string in a parsed JSON value."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [s for v in items for s in strings(v)]


@pytest.mark.parametrize("fmt", ["table", "json", "github"])
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_every_format_writes_surrogates_as_escapes_and_exits_with_the_verdict(batch, invoke, fmt, isolate):
    # was: exit 4 (UnicodeEncodeError) from the table and github formats, the report lost
    result = invoke("specs/", "--format", fmt, "--junit-xml", "out.xml", *(() if isolate else ("--no-isolate",)))
    assert result.exit_code == 3, result.output  # errors (the raising forward, the broken spec) beat the failure
    text = result.stdout_bytes.decode("utf-8")  # strictly: no surrogate reached the stream
    if fmt == "json":
        report = json.loads(text)
        assert_shown("\n".join(strings(report)))
        assert report["summary"] == {
            **report["summary"],
            "total": 4,
            "passed": 1,
            "failed": 1,
            "errors": 2,
            "skipped": 0,
        }
        assert sorted(r["spec"] for r in report["results"]) == [
            "specs/bad\\xff.yaml",
            "specs/broken\\xfe.yaml",
            "specs/raises.yaml",
            "specs/warns.yaml",
        ]
    else:
        assert_shown(text)
    xml = (batch / "out.xml").read_bytes().decode("utf-8")
    ET.fromstring(xml.split("\n", 1)[1])
    assert_shown(xml)


def test_the_github_annotations_carry_the_escapes(batch, invoke):
    lines = invoke("specs/", "--format", "github", "--no-isolate").stdout.splitlines()
    errors = [line for line in lines if line.startswith("::error file=specs/bad\\xff.yaml")]
    assert errors and "x\\xff" in errors[0]
    assert any(line.startswith("::warning ") and "w\\ud802" in line for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["table", "json", "github"])
def test_a_real_process_writes_every_format(batch, fmt):
    # the console script's stdout is strict UTF-8 when piped (click's test runner's too, checked above)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs", "--format", fmt, "-j", "1"],
        cwd=batch,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr.decode("utf-8", "replace")
    text = proc.stdout.decode("utf-8")
    assert_shown("\n".join(strings(json.loads(text))) if fmt == "json" else text)


def test_a_function_name_with_a_surrogate_reaches_every_reporter():
    def square(x):
        return x * x

    square.__qualname__ = "sq\udcfe\ud803"
    result = check(square, (torch.ones(2, dtype=torch.float64, requires_grad=True),))
    assert "sq\udcfe\ud803" in result.function
    report = Report([result])
    for fmt in reporters.FORMATS:
        stream = io.StringIO()
        reporters.get(fmt)(report, stream, True)
        text = stream.getvalue().encode("utf-8").decode("utf-8")
        assert "sq\\xfe\\ud803" in ("\n".join(strings(json.loads(text))) if fmt == "json" else text), fmt
    stream = io.StringIO()
    junit.render(report, stream)
    assert "sq\\xfe\\ud803" in stream.getvalue().encode("utf-8").decode("utf-8")
    assert "sq\\xfe\\ud803" in str(result) and "sq\\xfe\\ud803" in repr(result)
    str(result).encode("utf-8")


def test_printable_escapes_only_surrogates_and_keeps_everything_else():
    assert printable("bad\udcff \ud800 é ✓ \x00") == "bad\\xff \\ud800 é ✓ \x00"
    assert printable("plain") == "plain"
    report = Report([])
    assert printable(report) is report  # nothing to escape: the same object, no copy


@pytest.mark.parametrize("encoding", ["ascii", "cp1252", "latin-1"])
@pytest.mark.parametrize("fmt", ["table", "json", "github"])
def test_a_stream_whose_encoding_cannot_hold_a_name_gets_escapes(encoding, fmt):
    # was: UnicodeEncodeError (exit 4) for a name like 'é中' with PYTHONIOENCODING=ascii or a cp1252 log file
    def square(x):
        return x * x

    square.__qualname__ = "sq\u00e9\u4e2d\udcff"
    report = Report([check(square, (torch.ones(2, dtype=torch.float64, requires_grad=True),))])
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding)
    reporters.get(fmt)(report, stream, False)
    stream.flush()
    text = raw.getvalue().decode(encoding)
    if fmt == "json":  # ASCII with JSON's own escapes: the reader gets the name back
        assert "sq\u00e9\u4e2d\\xff" in strings(json.loads(text))[3]
    else:
        e_acute = "\\xe9" if encoding == "ascii" else "\u00e9"  # cp1252 and latin-1 hold it
        assert f"sq{e_acute}\\u4e2d\\xff" in text and "0: x" in text, text


@pytest.mark.slow
def test_a_real_process_with_an_ascii_stdout_writes_the_table(batch):
    (batch / "specs" / "accents.yaml").write_text(
        'function: usermod:Square\ninputs: [{name: "é中", shape: [3]}]\n', encoding="utf-8"
    )
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs", "-j", "1", "-v"],  # -v: the passing table too
        cwd=batch,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr.decode("ascii", "replace")
    text = proc.stdout.decode("ascii")
    assert "0: \\xe9\\u4e2d" in text and "bad\\xff.yaml" in text
