"""JUnit from the command line: the same classname and name as pytest's --junitxml gives the
plugin's items, --junit-locations, and durations that do not carry a worker's warm-up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gradcheck_cli import spec
from gradcheck_cli.run import plan, pool

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


def _keys(path: Path) -> list[tuple[str, str]]:
    return sorted((c.get("classname"), c.get("name")) for c in ET.parse(path).getroot().iter("testcase"))


def test_cli_and_pytest_plugin_name_each_case_alike(tmp_path):
    for name in ("linear.yaml", "max_pool.yaml"):
        (tmp_path / "specs").mkdir(exist_ok=True)
        shutil.copy(REPO / "specs" / name, tmp_path / "specs" / name)
    (tmp_path / "specs" / "bad.yaml").write_text("function: gradcheck_cli.examples.relu:ReLU\ncolour: red\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--gradcheck",
            "specs",
            "--junitxml",
            "plugin.xml",
            "-q",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=600,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs", "--junit-xml", "cli.xml", "-j", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    plugin, cli = _keys(tmp_path / "plugin.xml"), _keys(tmp_path / "cli.xml")
    assert ("specs.max_pool.yaml.#2", "default[cpu]") in cli and ("specs.linear.yaml", "no_bias[cpu]") in cli
    assert ("specs.bad.yaml", "spec_error[line 2]") in cli
    assert cli == plugin


def test_junit_locations_option(write_spec, invoke, tmp_path, monkeypatch):
    xmlschema = pytest.importorskip("xmlschema")
    monkeypatch.chdir(tmp_path)
    write_spec(
        "function: gradcheck_cli.examples.relu:ReLU\ninputs: [{shape: [4], avoid: [[-0.01, 0.01]]}]\n",
        "specs/relu.yaml",
    )
    result = invoke("specs", "--no-isolate", "--junit-xml", "plain.xml")
    assert result.exit_code == 0, result.output
    case = ET.parse(tmp_path / "plain.xml").getroot().find("testsuite/testcase")
    assert case.get("file") is None  # off by default: the Jenkins schema rejects them
    xmlschema.XMLSchema(str(DATA / "junit-10.xsd")).validate(str(tmp_path / "plain.xml"))

    result = invoke("specs", "--no-isolate", "--junit-xml", "located.xml", "--junit-locations")
    assert result.exit_code == 0, result.output
    case = ET.parse(tmp_path / "located.xml").getroot().find("testsuite/testcase")
    assert (case.get("file"), case.get("line")) == ("specs/relu.yaml", "1")
    xmlschema.XMLSchema(str(DATA / "junit-10-locations.xsd")).validate(str(tmp_path / "located.xml"))

    result = invoke("specs", "--junit-locations")
    assert result.exit_code == 2 and "--junit-locations: give --junit-xml PATH too" in result.output


RECORDS = """
import json, os, sys
import torch

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        path = os.environ["GC_MODULES_SEEN"]
        if not os.path.exists(path):  # the worker's first case: what it had loaded before it
            with open(path, "w") as f:
                json.dump(sorted(sys.modules), f)
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g
"""

LAZY = """
import json, sys
import torch
before = set(sys.modules)
from gradcheck_cli.numerics.engine import grad  # how the checks call backward
x = torch.ones(2, dtype=torch.float64, requires_grad=True)
y = x * x
torch.func.vmap(lambda v: grad(y, x, v, retain_graph=True))(torch.eye(2, dtype=torch.float64))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_workers_first_case_does_not_carry_its_warm_up(user_module, write_spec, tmp_path, monkeypatch):
    """What the checks' backward calls load on their first vmap (functorch), and the checks' modules, are
    loaded before the worker says it started its first case, from which the case's duration and timeout count."""
    lazy = json.loads(subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=300).stdout)
    assert lazy  # what there is to warm up
    user_module(RECORDS, name="recorder")
    path = write_spec("function: recorder:Square\ninputs: [{shape: [3]}]\n", "specs/square.yaml")
    seen = tmp_path / "seen.json"
    monkeypatch.setenv("GC_MODULES_SEEN", str(seen))
    (case,) = spec.load_file(path)
    ((_, result),) = list(pool.run([plan.Task(case, "cpu")], jobs=1))
    assert result.status.value == "pass", result
    modules = set(json.loads(seen.read_text()))
    assert set(lazy) <= modules
    assert "gradcheck_cli.checks.batched" in modules  # every check's module, not just this case's
