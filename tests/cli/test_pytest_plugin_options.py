"""The pytest plugin's marker, ini options (gradcheck_paths, gradcheck_pattern) and the command
line's options that matter in pytest (--gradcheck-fast, -strict, -check, -seed, -trials, -device).

Collection runs only (no torch) except one run that checks a broken spec with every option."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradcheck_cli import FAST_PROBES
from gradcheck_cli.run import plan
from tests.cli.test_pytest_plugin import RECORDER, REPO, pytest_in
from tests.truth_sets import NOT_DIFFERENTIABLE_MODULE

SHOW_OPTIONS = textwrap.dedent("""\
    from gradcheck_cli.pytest_plugin import run_options

    def pytest_collection_finish(session):
        print("OPTIONS", repr(run_options(session.config)))
    """)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "specs").mkdir()
    shutil.copy(REPO / "specs/relu.yaml", tmp_path / "specs/relu.yaml")
    shutil.copy(REPO / "specs/linear.yaml", tmp_path / "specs/linear.yml")
    shutil.copy(REPO / "broken-specs/linear_double_bias.yaml", tmp_path / "specs/double_bias.yaml")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/model.yaml").write_text("layers: 4\nwidth: 128\n")  # not a spec
    (tmp_path / "record_outcomes.py").write_text(RECORDER)
    (tmp_path / "show_options.py").write_text(SHOW_OPTIONS)
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


SPEC_IDS = [
    "specs/double_bias.yaml::default[cpu]",
    "specs/linear.yml::with_bias[cpu]",
    "specs/linear.yml::no_bias[cpu]",
    "specs/relu.yaml::default[cpu]",
]


def test_gradcheck_marker_selects_and_deselects_the_spec_items(project):
    everything = pytest_in(project, "--gradcheck", "specs", "test_plain.py", "--collect-only", "-q")
    assert sorted(everything.collected()) == sorted(SPEC_IDS + ["test_plain.py::test_plain"])
    r = pytest_in(project, "--gradcheck", "specs", "test_plain.py", "--collect-only", "-q", "-m", "gradcheck")
    assert sorted(r.collected()) == sorted(SPEC_IDS)
    r = pytest_in(project, "--gradcheck", "specs", "test_plain.py", "--collect-only", "-q", "-m", "not gradcheck")
    assert r.collected() == ["test_plain.py::test_plain"]
    r = pytest_in(project, "--gradcheck", "specs", "--collect-only", "-q", "--strict-markers", "-m", "gradcheck")
    assert r.ret == 0, r.stdout  # the marker is registered
    assert "gradcheck: a gradcheck-cli spec case" in pytest_in(project, "--markers").stdout
    # a spec that cannot be read is marked too
    (project / "specs/bad.yaml").write_text("function: pkg.mod:F\ncolour: red\n")
    r = pytest_in(project, "--gradcheck", "specs", "--collect-only", "-q", "-m", "gradcheck")
    assert "specs/bad.yaml::spec_error[line 2]" in r.collected()


def test_gradcheck_paths_keeps_other_yaml_out(project):
    (project / "pytest.ini").write_text("[pytest]\naddopts = --gradcheck\ntestpaths = specs configs\n")
    r = pytest_in(project, "--collect-only", "-q")
    # a YAML file that names no `function:` is no spec: a model config beside the specs is not collected (issue
    # 31 item 9: it was a failing test, spec_error[line 1]); a broken spec still is
    assert sorted(r.collected()) == sorted(SPEC_IDS)
    (project / "configs/typo.yaml").write_text("function: pkg.mod:F\nshpe: [3]\n")
    (project / "configs/cases_only.yaml").write_text("cases: [{name: a, function: pkg.mod:F}]\ncolour: 1\n")
    (project / "configs/not_yaml.yaml").write_text("function: [unclosed\n")
    r = pytest_in(project, "--collect-only", "-q")
    assert sorted(c for c in r.collected() if c.startswith("configs/")) == [
        "configs/cases_only.yaml::spec_error[line 2]",
        "configs/not_yaml.yaml::spec_error[line 2]",
        "configs/typo.yaml::spec_error[line 2]",
    ]
    for name in ("typo", "cases_only", "not_yaml"):
        (project / f"configs/{name}.yaml").unlink()
    (project / "pytest.ini").write_text(
        "[pytest]\naddopts = --gradcheck\ntestpaths = specs configs\ngradcheck_paths = specs\n"
    )
    r = pytest_in(project, "--collect-only", "-q")
    assert sorted(r.collected()) == sorted(SPEC_IDS)
    # named on the command line, a file outside gradcheck_paths is collected all the same
    r = pytest_in(project, "--collect-only", "-q", "configs/model.yaml")
    assert r.collected() == ["configs/model.yaml::spec_error[line 1]"]


def test_gradcheck_pattern_chooses_the_spec_files(project):
    (project / "pytest.ini").write_text("[pytest]\ngradcheck_pattern = *.yml\n")
    r = pytest_in(project, "--gradcheck", "specs", "--collect-only", "-q")
    assert sorted(r.collected()) == ["specs/linear.yml::no_bias[cpu]", "specs/linear.yml::with_bias[cpu]"]
    (project / "pytest.ini").write_text("[pytest]\ngradcheck_pattern = relu.* double_*.yaml\n")
    r = pytest_in(project, "--gradcheck", "specs", "--collect-only", "-q")
    assert sorted(r.collected()) == ["specs/double_bias.yaml::default[cpu]", "specs/relu.yaml::default[cpu]"]


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], plan.run_options(max_memory_mb=512, timeout=300)),
        (
            [
                "--gradcheck-fast",
                "--gradcheck-strict",
                "--gradcheck-seed",
                "7",
                "--gradcheck-trials",
                "3",
                "--gradcheck-check",
                "backward",
                "--gradcheck-check",
                "forward_ad",
                "--gradcheck-check",
                "backward",
                "--gradcheck-device",
                "cpu",
                "--gradcheck-device",
                "cuda:1",
                "--gradcheck-max-memory",
                "64",
            ],
            plan.run_options(
                max_memory_mb=64,
                seed=7,
                trials=3,
                devices=("cpu", "cuda:1"),
                checks=("backward", "forward_ad"),
                probes=FAST_PROBES,
                strict=True,
                timeout=300,
            ),
        ),
        (["--gradcheck-check", "all"], plan.run_options(max_memory_mb=512, checks=("all",), timeout=300)),
    ],
)
def test_plugin_options_map_to_run_options_as_the_command_line_does(project, args, expected):
    r = pytest_in(project, "-p", "show_options", "--gradcheck", "specs", "--collect-only", "-q", *args)
    assert f"OPTIONS {expected!r}" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gradcheck-check", "hessian"], "--gradcheck-check: unknown check 'hessian'; known checks: backward"),
        (["--gradcheck-device", "gpu"], "--gradcheck-device: expected cpu, cuda or cuda:N, got 'gpu'"),
        (["--gradcheck-seed", "-1"], "--gradcheck-seed: expected a whole number from 0 to 2**64 - 1, got '-1'"),
        (["--gradcheck-trials", "0"], "--gradcheck-trials: expected a whole number, 1 or more, got '0'"),
    ],
)
def test_bad_plugin_options_are_usage_errors(project, args, message):
    r = pytest_in(project, "--gradcheck", "specs", "--collect-only", "-q", *args)
    assert r.ret == pytest.ExitCode.USAGE_ERROR and message in r.stdout, r.stdout


def test_device_option_makes_the_items(project):
    r = pytest_in(
        project,
        "--gradcheck",
        "specs/relu.yaml",
        "--collect-only",
        "-q",
        "--gradcheck-device",
        "cpu",
        "--gradcheck-device",
        "cuda:99",
    )
    assert r.collected() == ["specs/relu.yaml::default[cpu]", "specs/relu.yaml::default[cuda:99]"]


def test_options_reach_the_checks(project):
    r = pytest_in(
        project,
        "--gradcheck",
        "specs/double_bias.yaml",
        "specs/relu.yaml",
        "--gradcheck-fast",
        "--gradcheck-strict",
        "--gradcheck-seed",
        "5",
        "--gradcheck-check",
        "backward",
        "--gradcheck-device",
        "cuda:99",
        "--gradcheck-device",
        "cpu",
        "-rs",
    )
    assert r.outcomes["specs/relu.yaml::default[cpu]"] == "passed"
    assert r.outcomes["specs/relu.yaml::default[cuda:99]"] == "skipped"
    text = r.failure("specs/double_bias.yaml::default[cpu]")
    assert "seed 5" in text.splitlines()[3]  # the case's head line (after the diagnosis and the id)
    assert "backward (probe+elementwise)" in text  # --gradcheck-fast: probes first
    assert "double_backward" not in text
    assert "--seed 5 --device cpu --check backward --probes 3 --strict" in text  # the command line's replay


def test_tool_gradcheck_reaches_the_plugin_and_its_own_options_win(project):
    """Issue 46 item 3: [tool.gradcheck] is one configuration for both front ends; it set checks the command line
    honoured and the plugin ignored (a detached second derivative: gradcheck failed it, pytest passed it)."""
    (project / "detached.py").write_text(NOT_DIFFERENTIABLE_MODULE)  # its DetachedSquare: backward detaches x
    (project / "specs/detached.yaml").write_text("function: detached:DetachedSquare\ninputs: [{shape: [3]}]\n")
    (project / "pyproject.toml").write_text('[tool.gradcheck]\nchecks = ["backward", "double_backward"]\ntrials = 2\n')
    cli = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs/detached.yaml", "--format", "json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cli.returncode == 1, cli.stdout + cli.stderr
    r = pytest_in(project, "--gradcheck", "specs/detached.yaml")
    assert "double_backward" in r.failure("specs/detached.yaml::default[cpu]")
    shown = pytest_in(project, "-p", "show_options", "--gradcheck", "specs/detached.yaml", "--collect-only", "-q")
    assert "checks=('backward', 'double_backward')" in shown.stdout and "trials=2" in shown.stdout, shown.stdout
    # the plugin's option wins over the file, as the command line's does
    r = pytest_in(project, "--gradcheck", "specs/detached.yaml", "--gradcheck-check", "backward")
    assert r.outcomes == {"specs/detached.yaml::default[cpu]": "passed"}, r.stdout
    # a bad value in the file is a usage error naming the file and the key
    (project / "pyproject.toml").write_text("[tool.gradcheck]\ntrials = 0\n")
    r = pytest_in(project, "--gradcheck", "specs/detached.yaml")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "[tool.gradcheck] trials: expected a whole number, 1 or more, got 0" in r.stdout
