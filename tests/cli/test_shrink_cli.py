"""The shrunk failing case on the command line: --shrink / --no-shrink, the line under a failure, the JSON
field, GitHub and JUnit, and the replay command's --shape NAME=DIMS (issue 33 item 5)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gradcheck_cli.results import CaseResult, Status
from gradcheck_cli.run import pool, session
from gradcheck_cli.run.plan import RunOptions
from gradcheck_cli.spec import load_file

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from procs import alive
except ImportError:  # pragma: no cover
    from tests.procs import alive


SOURCE = """
import torch

class Scale(torch.autograd.Function):  # the gradient of x is 2x the derivative, at every shape
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return 3 * x * w
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return 6 * g * w, 3 * g * x
"""
SPEC = """
function: usermod:Scale
inputs: [{shape: [6, 8]}, {name: w, shape: [8]}]
"""
LINE = (
    "  shrunk: backward still fails for 'x' (constant_ratio) at shapes x [1, 1], w [1] with zeros for x; "
    "ones for w; replay: gradcheck specs/scale.yaml -k specs/scale.yaml::default --shape x=1x1 --shape w=1 "
    "--values x=zeros --values w=ones"
)


@pytest.fixture
def scale(user_module, write_spec):
    user_module(SOURCE)
    write_spec(SPEC, "specs/scale.yaml")


def timeless(text: str) -> str:
    return re.sub(r"\d+\.\d+s", "T", text)


def results(result) -> list[dict]:
    return json.loads(result.stdout)["results"]


def test_the_line_under_a_failure_and_no_shrink_gives_the_old_output(scale, invoke):
    on = invoke("specs/scale.yaml", "--no-isolate", "--shrink", "60")
    off = invoke("specs/scale.yaml", "--no-isolate", "--no-shrink")
    assert on.exit_code == off.exit_code == 1
    lines = on.stdout.splitlines()
    assert LINE in lines
    assert lines[lines.index(LINE) - 1].startswith("  replay: gradcheck specs/scale.yaml")
    assert timeless(off.stdout).splitlines() == [line for line in timeless(on.stdout).splitlines() if line != LINE]
    assert timeless(invoke("specs/scale.yaml", "--no-isolate", "--shrink", "0").stdout) == timeless(off.stdout)


def test_json_field_present_on_a_failure_and_absent_with_no_shrink(scale, invoke):
    (on,) = results(invoke("specs/scale.yaml", "--no-isolate", "--format", "json", "--shrink", "60"))
    (off,) = results(invoke("specs/scale.yaml", "--no-isolate", "--format", "json", "--no-shrink"))
    shrunk = on.pop("shrunk")
    assert "shrunk" not in off
    for r in (on, off):
        r["duration_s"] = 0
        for c in r["checks"]:
            c["duration_s"] = 0
    assert on == off
    assert {k: shrunk[k] for k in ("check", "argument", "pattern", "shapes", "values", "seed")} == {
        "check": "backward",
        "argument": "x",
        "pattern": "constant_ratio",
        "shapes": {"x": [1, 1], "w": [1]},
        "values": {"x": "zeros", "w": "ones"},  # w zeros: x's gradient 0, right
        "seed": 0,
    }


def test_the_shrunk_replay_command_fails_at_the_shrunk_shape(scale, invoke):
    (first,) = results(invoke("specs/scale.yaml", "--no-isolate", "--format", "json", "--shrink", "60"))
    command = shlex.split(first["shrunk"]["replay"])
    assert command[0] == "gradcheck"
    replay = invoke(*command[1:], "--no-isolate", "--format", "json", "--no-shrink")
    assert replay.exit_code == 1
    (again,) = results(replay)
    rows = {row["name"]: row for row in again["checks"][0]["inputs"]}
    assert (rows["x"]["shape"], rows["x"]["status"], rows["x"]["pattern"]) == ([1, 1], "fail", "constant_ratio")
    assert rows["w"]["shape"] == [1] and rows["w"]["status"] == "pass"
    assert again["replay"] == first["shrunk"]["replay"]  # it replays itself


def test_inline_inputs_shrink_and_replay(scale, invoke):
    (first,) = results(
        invoke("usermod:Scale", "-i", "5x7", "-i", "7", "--no-isolate", "--format", "json", "--shrink", "60")
    )
    assert first["shrunk"]["replay"] == (
        "gradcheck usermod:Scale -i 5x7 -i 7 --shape x=1x1 --shape w=1 --values x=zeros --values w=ones"
    )
    replay = invoke(*shlex.split(first["shrunk"]["replay"])[1:], "--no-isolate", "--format", "json")
    (again,) = results(replay)
    assert replay.exit_code == 1 and again["checks"][0]["inputs"][0]["shape"] == [1, 1]


def test_values_the_spec_does_not_allow_say_which_it_does(user_module, write_spec, invoke):
    user_module(SOURCE)
    write_spec(SPEC.replace("{name: w, shape: [8]}", "{name: w, shape: [8], dist: positive}"), "specs/scale.yaml")
    result = invoke("specs/scale.yaml", "--no-isolate", "--values", "w=zeros")
    assert result.exit_code == 3
    assert "--values w: the spec's values of 'w' do not allow zeros (they allow: ones, integers)" in result.stdout


def test_github_junit_and_html_carry_the_line(scale, invoke, tmp_path):
    github = invoke(
        "specs/scale.yaml",
        "--no-isolate",
        "--format",
        "github",
        "--junit-xml",
        "out.xml",
        "--html",
        "out.html",
        "--shrink",
        "60",  # the search finishes on a loaded machine too
    )
    assert github.exit_code == 1
    assert "shrunk: backward still fails for 'x' (constant_ratio) at shapes x [1, 1], w [1]" in github.stdout
    assert "--shape x=1x1 --shape w=1 --values x=zeros --values w=ones" in (tmp_path / "out.xml").read_text()
    html = (tmp_path / "out.html").read_text()
    assert "shrunk: backward still fails for &#x27;x&#x27;" in html and "--values x=zeros --values w=ones" in html


def test_bad_shape_and_shrink_options_say_what_to_do(scale, invoke):
    bad = invoke("specs/scale.yaml", "--no-isolate", "--shape", "x=2by3")
    assert bad.exit_code == 2 and "--shape" in bad.output and "e.g. --shape weight=2x3" in bad.output
    unknown = invoke("specs/scale.yaml", "--no-isolate", "--shape", "y=2x3")
    assert unknown.exit_code == 3
    assert "--shape y: no tensor argument named 'y'" in unknown.stdout and "x, w" in unknown.stdout
    bad_kind = invoke("specs/scale.yaml", "--no-isolate", "--values", "x=twos")
    assert bad_kind.exit_code == 2 and "zeros, ones, integers" in bad_kind.output
    assert invoke("specs/scale.yaml", "--shrink", "-1").exit_code == 2
    assert invoke("specs/scale.yaml", "--shrink", "inf").exit_code == 2


@pytest.mark.slow  # starts a worker process
def test_in_the_worker_process(scale, invoke):
    (result,) = results(invoke("specs/scale.yaml", "-j", "1", "--format", "json", "--shrink", "60"))
    assert result["status"] == "fail" and result["shrunk"]["shapes"] == {"x": [1, 1], "w": [1]}


INTERRUPTED = """
import os, time
from pathlib import Path
import torch

HERE = Path(__file__).parent

class ShrinksSlowly(torch.autograd.Function):  # wrong; away from the spec's shape (the shrinking) it says so, hangs
    @staticmethod
    def forward(ctx, x):
        if tuple(x.shape) != (6, 8):
            (HERE / "shrinking.pid").write_text(str(os.getpid()))
            time.sleep(600)
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 6 * g

class Hangs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(600)
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 3 * g

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g
"""


def _interrupt_specs(user_module, write_spec, other: str) -> None:
    user_module(INTERRUPTED)
    write_spec("function: usermod:ShrinksSlowly\ninputs: [{shape: [6, 8]}]\n", "specs/00_slow.yaml")
    write_spec(f"function: usermod:{other}\ninputs: [{{shape: [3]}}]\n", "specs/01_other.yaml")


def _shrinking(gradcheck_argv: list[str], tmp_path: Path, jobs: str) -> tuple[subprocess.Popen[str], Path]:
    """``gradcheck specs/ -j JOBS`` started, once its failing case is being shrunk (the search wrote its pid)."""
    proc = subprocess.Popen(
        [*gradcheck_argv, "specs/", "-j", jobs, "--format", "json", "--shrink", "60"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = tmp_path / "shrinking.pid"
    _wait_for(marker)
    return proc, marker


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 300  # a bound for a broken run only: the wait ends on the event
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path.name} never appeared"


def _ends(pid: int) -> None:
    deadline = time.monotonic() + 120  # a bound for a broken run only: the wait ends on the event
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


@pytest.mark.slow  # starts worker processes
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_while_a_worker_shrinks_keeps_the_verdict(
    user_module, write_spec, tmp_path, gradcheck_argv, signum, code
):
    """-j 2: the first case failed and its worker is shrinking it, the second case hangs; the interrupt stops the
    run, the failure is reported with its verdict, the hanging case is not run, and the search ends."""
    _interrupt_specs(user_module, write_spec, "Hangs")
    proc, marker = _shrinking(gradcheck_argv, tmp_path, "2")
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=600)  # a bound for a hung run only, not a speed
    assert proc.returncode == code, stderr
    report = json.loads(stdout)
    assert [(Path(r["spec"]).stem, r["status"]) for r in report["results"]] == [("00_slow", "fail")]
    (slow,) = report["results"]
    assert slow["checks"][0]["inputs"][0]["pattern"] == "constant_ratio" and "shrunk" not in slow
    assert report["summary"]["not_run"] == 1 and report["summary"]["interrupted"] == signum.name
    assert "Traceback" not in stderr, stderr
    _ends(int(marker.read_text()))


@pytest.mark.slow  # starts worker processes
def test_an_interrupt_between_two_results_keeps_the_verdict_of_a_worker_shrinking(user_module, write_spec, monkeypatch):
    """The interrupt comes while the run files another case's result (the progress display), not while it waits
    on the workers: the verdict a worker sent before it began shrinking is reported all the same."""
    _interrupt_specs(user_module, write_spec, "Square")
    monkeypatch.setattr(pool, "usable_cores", lambda: 2)  # two workers on a one-core machine too
    seen: list[CaseResult] = []

    def on_result(result: CaseResult) -> None:
        seen.append(result)
        if "01_other" in (result.spec or ""):
            _wait_for(Path("shrinking.pid"))  # the other worker sent its verdict and is shrinking
            raise KeyboardInterrupt

    cases = [*load_file("specs/00_slow.yaml"), *load_file("specs/01_other.yaml")]
    report = session.execute(cases, RunOptions(shrink=60), session.BatchOptions(jobs=2), on_result)
    assert [(Path(r.spec).stem, r.status) for r in report.results] == [
        ("00_slow", Status.FAIL),
        ("01_other", Status.PASS),
    ]
    assert report.interrupted == "SIGINT" and report.not_run == 0
    assert [Path(r.spec).stem for r in seen] == ["01_other", "00_slow"]


@pytest.mark.parametrize(
    "dist, dims, shape",
    [("spd", "1x4", "[1, 4]"), ("spd", "3x4", "[3, 4]"), ("symmetric", "4x1", "[4, 1]"), ("spd", "4", "[4]")],
)
def test_a_shape_a_matrix_dist_cannot_draw_is_refused_not_drawn_square(
    user_module, write_spec, invoke, dist, dims, shape
):
    """dist spd at --shape a=1x4 drew a 4 x 4 matrix and checked it (the report said [4, 4]): now the case is an
    error that names the file, the option, the spec's entry and what to give instead."""
    user_module(SOURCE)
    write_spec(
        f"function: gradcheck_cli.examples.structured:Cholesky\ninputs:\n  - {{name: a, shape: [3, 3], dist: {dist}}}\n",
        "specs/chol.yaml",
    )
    result = invoke("specs/chol.yaml", "--no-isolate", "--format", "json", "--shape", f"a={dims}")
    assert result.exit_code == 3, result.output
    (case,) = results(result)
    assert case["status"] == "error" and case["error"]["kind"] == "spec" and case["checks"] == []
    said = case["error"]["message"]
    assert said.startswith("specs/chol.yaml:1: --shape a: dist ") and f"got {shape} (the spec's inputs[0])" in said
    assert "give a shape such as --shape a=4x4 (or 2x4x4 for a batch)" in said


def test_a_batch_of_square_matrices_is_drawn_as_asked(user_module, write_spec, invoke):
    user_module(SOURCE)
    write_spec("function: gradcheck_cli.examples.structured:Cholesky\ninputs: [{name: a, shape: [3, 3], dist: spd}]\n",
               "specs/chol.yaml")  # fmt: skip
    result = invoke("specs/chol.yaml", "--no-isolate", "--format", "json", "--shape", "a=2x4x4")
    assert result.exit_code == 0, result.output
    (case,) = results(result)
    assert case["checks"][0]["inputs"][0]["shape"] == [2, 4, 4]


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow  # starts worker processes
def test_a_worker_killed_while_it_shrinks_keeps_the_verdict(user_module, write_spec, tmp_path, gradcheck_argv):
    """The worker is killed (as the out-of-memory killer would) while it shrinks a failure: the case is reported
    with its verdict, the search cut short said in a warning, not as a crash; the run goes on to the next case."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs Linux's /proc to find the worker of the search")
    _interrupt_specs(user_module, write_spec, "Square")
    proc, marker = _shrinking(gradcheck_argv, tmp_path, "1")
    os.kill(_parent_of(int(marker.read_text())), signal.SIGKILL)  # the search's parent: the worker
    stdout, stderr = proc.communicate(timeout=600)  # a bound for a hung run only, not a speed
    assert proc.returncode == 1, stderr
    report = json.loads(stdout)
    assert [(Path(r["spec"]).stem, r["status"]) for r in report["results"]] == [
        ("00_slow", "fail"),
        ("01_other", "pass"),
    ]
    (warning,) = report["results"][0]["warnings"]
    assert warning.startswith("the search for a smaller failing case (--shrink) was cut short: the worker process")
    assert "killed by SIGKILL" in warning and report["results"][0]["error"] is None
    _ends(int(marker.read_text()))  # the search dies with its worker
