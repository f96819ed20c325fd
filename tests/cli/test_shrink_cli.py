"""The shrunk failing case on the command line: --shrink / --no-shrink, the line under a failure, the JSON
field, GitHub and JUnit, and the replay command's --shape NAME=DIMS (issue 33 item 5)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

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
