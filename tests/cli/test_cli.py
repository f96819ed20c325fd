"""End to end through the command line: invocations, exit codes, messages, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_cli.checks import backward as backward_check

REPO = Path(__file__).resolve().parents[2]

GOOD = """
import torch

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale=1.0):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return scale * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * ctx.scale * x * g, None

class SquareTwiceTooBig(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 4 * ctx.scale * x * g, None

class Raises(Square):
    @staticmethod
    def forward(ctx, x, scale=1.0):
        raise ValueError("boom in forward")
"""


@pytest.fixture
def project(user_module, write_spec):
    """A user project: module ``usermod`` and ``specs/square.yaml`` naming its Square."""
    user_module(GOOD)
    write_spec(
        """
        function: usermod:Square
        inputs: [{shape: [3, 4]}]
        kwargs: {scale: {value: 3.0}}
    """,
        "specs/square.yaml",
    )


def test_help_and_version_answer_without_importing_torch():
    code = (
        "import sys\n"
        "from gradcheck_cli.cli import main\n"
        "for argv in (['--help'], ['--version'], ['check', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "gradcheck-cli 0.1.0" in out
    assert "Exit codes" in out
    assert out.strip().endswith("torch imported: False")


def test_python_dash_m_runs_the_same_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", str(REPO / "specs" / "relu.yaml"), "--no-color"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 result: 1 passed" in proc.stdout


XFAIL_ID = "specs/kernels.yaml#3::finite_differences[cpu]"


@pytest.mark.slow
def test_exit_0_on_the_shipped_examples(monkeypatch, invoke):
    import re

    monkeypatch.chdir(REPO)
    result = invoke("specs/", "--no-color")
    assert result.exit_code == 0, result.output
    import torch

    # each case's verdict from its line of the table (one run of specs/, not a second one for the JSON report),
    # held to the summary's counts
    rows = [m.groups() for m in re.finditer(r"^(PASS|FAIL|ERROR|SKIP|XFAIL) +(\S+) ", result.stdout, re.M)]
    status = {case: word.lower() for word, case in rows}
    count = {word: sum(s == word for s in status.values()) for word in ("pass", "skip", "xfail")}
    summary = f"{len(rows)} results: {count['pass']} passed, 0 failed, 0 errors, {count['skip']} skipped"
    assert len(status) == len(rows) and f"{summary}, {count['xfail']} xfailed in " in result.stdout, result.stdout
    # specs/devices.yaml lists cuda too: a skip on a machine without a GPU, and only there
    cuda = [case for case in status if case.endswith("[cuda]")]
    assert cuda and all(status[case] == ("pass" if torch.cuda.is_available() else "skip") for case in cuda)
    # the one expected mismatch the shipped specs document (gradient reversal under finite differences)
    assert {case for case, s in status.items() if s == "xfail"} == {XFAIL_ID}
    assert all(s == "pass" for case, s in status.items() if case not in cuda and case != XFAIL_ID)
    assert result.stdout.index("specs/linear.yaml") < result.stdout.index("specs/styles.yaml")  # sorted


def test_exit_1_on_the_broken_examples(monkeypatch, invoke):
    monkeypatch.chdir(REPO)
    result = invoke("broken-specs/", "--no-color")
    assert result.exit_code == 1
    n = len(list((REPO / "broken-specs").glob("*.yaml")))  # one case each
    assert f"{n} results: 0 passed, {n} failed" in result.stdout
    assert "analytical is 2.00x numerical" in result.stdout
    assert "sign flipped" in result.stdout
    assert "backward returned 2 gradients, but forward takes 3 inputs" in result.stdout
    assert "backward modified grad_output in place" in result.stdout


def test_function_target_finds_its_spec_in_specs(project, invoke):
    for name in ("usermod.Square", "usermod:Square"):
        result = invoke(name, "--no-color")
        assert result.exit_code == 0, result.output
        assert "specs/square.yaml::default[cpu]" in result.stdout


def test_function_target_with_inline_inputs_and_kwargs(project, invoke):
    result = invoke("usermod.SquareTwiceTooBig", "-i", "5x2", "--kwarg", "scale=0.5", "--no-color")
    assert result.exit_code == 1
    assert "analytical is 2.00x numerical" in result.stdout
    assert "[5, 2]" in result.stdout
    assert "1: scale" in result.stdout  # the keyword argument is a row too, at its position


def test_function_without_spec_or_inputs_says_how_to_get_one(project, invoke):
    result = invoke("usermod.SquareTwiceTooBig")
    assert result.exit_code == 2
    assert "no spec for 'usermod.SquareTwiceTooBig'" in result.output
    assert "gradcheck init usermod.SquareTwiceTooBig" in result.output
    assert "-i 20x20" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["does/not/exist.yaml"], "no such file or directory"),
        (["--format", "xml", "specs"], "'xml' is not one of"),
        (["usermod.Square", "-i", "3by4"], "expected a shape like 20x20"),
        (["usermod.Square", "-i", "3:float99"], "unknown dtype 'float99'"),
        (["usermod.Square", "--kwarg", "noequals"], "expected NAME=VALUE"),
        (["not an import path!"], "neither a spec file, a directory, nor an import path"),
    ],
)
def test_exit_2_on_usage_errors(project, args, message, invoke):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.output


def test_exit_3_on_an_invalid_spec_and_the_batch_goes_on(project, write_spec, invoke):
    write_spec(
        """
        function: usermod:Square
        inputs: [{shape: [3, x]}]
    """,
        "specs/bad.yaml",
    )
    result = invoke("specs/", "--no-color")
    assert result.exit_code == 3
    assert "specs/bad.yaml:3: inputs[0].shape: expected a list of non-negative ints" in result.stdout
    assert "PASS  specs/square.yaml::default[cpu]" in result.stdout  # the good spec is still checked
    assert "2 results: 1 passed, 0 failed, 1 error" in result.stdout


def test_exit_3_when_the_module_cannot_be_imported(project, write_spec, invoke):
    write_spec("function: nosuchpkg.mod:Fn\ninputs: [{shape: [2]}]\n", "specs/missing.yaml")
    result = invoke("specs/missing.yaml", "--no-color")
    assert result.exit_code == 3
    assert "no module named 'nosuchpkg'" in result.stdout


def test_exit_3_when_forward_raises_shows_the_users_line(project, invoke):
    result = invoke("usermod.Raises", "-i", "3", "--no-color")
    assert result.exit_code == 3
    assert "forward raised ValueError: boom in forward" in result.stdout
    assert "usermod.py:" in result.stdout
    assert 'raise ValueError("boom in forward")' in result.stdout


def test_error_beats_fail_for_the_exit_code(project, write_spec, invoke):
    write_spec("function: usermod:SquareTwiceTooBig\ninputs: [{shape: [2]}]\n", "specs/wrong.yaml")
    write_spec("function: usermod:Raises\ninputs: [{shape: [2]}]\n", "specs/raises.yaml")
    assert invoke("specs/wrong.yaml").exit_code == 1
    assert invoke("specs/wrong.yaml", "specs/raises.yaml").exit_code == 3


def test_exit_4_on_an_internal_error(project, monkeypatch, invoke):
    def broken_check(*args, **kwargs):
        raise ZeroDivisionError("a bug in gradcheck-cli")

    monkeypatch.setattr(backward_check, "run", broken_check)
    result = invoke("specs/square.yaml", "--no-color", "--no-isolate")  # the patch lives in this process
    assert result.exit_code == 4
    assert "internal error in gradcheck-cli: ZeroDivisionError: a bug in gradcheck-cli" in result.stdout


def test_mixed_targets_in_one_call_keep_their_order(project, write_spec, invoke):
    write_spec("function: usermod:Square\ninputs: [{shape: [2]}]\n", "more/one.yaml")
    result = invoke("more/one.yaml", "usermod.Square", "--format", "json")
    assert result.exit_code == 0, result.output
    ids = [r["id"] for r in json.loads(result.stdout)["results"]]
    assert ids == ["more/one.yaml::default[cpu]", "specs/square.yaml::default[cpu]"]


def test_json_report_follows_the_contract(project, write_spec, invoke):
    write_spec("function: usermod:SquareTwiceTooBig\nseed: 7\ninputs: [{shape: [3, 2]}]\n", "specs/wrong.yaml")
    result = invoke("specs/wrong.yaml", "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)  # stdout holds the JSON and nothing else
    assert report["schema_version"] == 1
    assert report["tool"]["name"] == "gradcheck-cli"
    assert report["summary"] == {
        "total": 1,
        "passed": 0,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
        "xfailed": 0,
        "not_run": 0,
        "interrupted": None,
        "duration_s": report["summary"]["duration_s"],
    }
    (res,) = report["results"]
    assert res["id"] == "specs/wrong.yaml::default[cpu]"
    assert (res["spec"], res["case"], res["function"], res["device"], res["seed"], res["status"]) == (
        "specs/wrong.yaml",
        "default",
        "usermod:SquareTwiceTooBig",
        "cpu",
        7,
        "fail",
    )
    assert res["error"] is None
    (check,) = res["checks"]
    assert check["check"] == "backward" and check["status"] == "fail" and check["mode"] == "elementwise"
    assert "2.00x" in check["message"]
    x = check["inputs"][0]
    assert (x["index"], x["name"], x["shape"], x["status"]) == (0, "x", [3, 2], "fail")
    assert x["mismatched"] == x["numel"] == 6
    assert isinstance(x["max_abs_err"], float) and x["max_rel_err"] == pytest.approx(1.0)
    assert len(x["worst_index"]) == 2


def test_json_error_result_has_kind_and_message(project, invoke):
    result = invoke("usermod.Raises", "-i", "3", "--format", "json")
    res = json.loads(result.stdout)["results"][0]
    assert res["status"] == "error"
    assert res["error"]["kind"] == "forward"
    assert "boom in forward" in res["error"]["message"]


def test_cuda_spec_without_a_gpu_is_a_skip(project, write_spec, invoke):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    write_spec("function: usermod:Square\ndevice: [cpu, cuda]\ninputs: [{shape: [2]}]\n", "specs/both.yaml")
    result = invoke("specs/both.yaml", "--no-color")
    assert result.exit_code == 0
    assert "2 results: 1 passed, 0 failed, 0 errors, 1 skipped" in result.stdout
    assert "CUDA is not available" in result.stdout


def test_init_writes_a_spec_that_runs(project, invoke):
    result = invoke("init", "usermod.Square", "-o", "specs/init.yaml")
    assert result.exit_code == 0, result.output
    text = Path("specs/init.yaml").read_text()
    assert "function: usermod.Square" in text and "scale: {value: 1.0}" in text
    check = invoke("specs/init.yaml", "--no-color")
    assert check.exit_code == 0, check.output
    again = invoke("init", "usermod.Square", "-o", "specs/init.yaml")
    assert again.exit_code == 2 and "--force" in again.output


def test_init_of_a_missing_function_exits_3(project, invoke):
    result = invoke("init", "usermod.Nope")
    assert result.exit_code == 3
    assert "has no attribute 'Nope'" in result.output


def test_k_selects_cases_and_a_failure_prints_a_replay_command_that_reruns_it(project, write_spec, invoke):
    write_spec(
        """
        function: usermod:SquareTwiceTooBig
        cases:
          - {name: small, inputs: [{shape: [2]}]}
          - {name: large, inputs: [{shape: [6]}]}
    """,
        "specs/wrong.yaml",
    )
    result = invoke("specs/", "--no-color", "-k", "wrong.yaml::large")
    assert result.exit_code == 1
    assert "1 result: 0 passed, 1 failed" in result.stdout
    replay = next(line for line in result.stdout.splitlines() if "replay:" in line).split("replay: ")[1]
    assert replay == "gradcheck specs/wrong.yaml -k specs/wrong.yaml::large"
    again = invoke(*replay.split()[1:], "--format", "json")
    assert [r["id"] for r in json.loads(again.stdout)["results"]] == ["specs/wrong.yaml::large[cpu]"]
    assert invoke("specs/", "-k", "square*").exit_code == 2  # glob: names start with the path, functions the module
    assert invoke("specs/", "-k", "*square*").exit_code == 1  # the function SquareTwiceTooBig, case-insensitively


def test_fast_mode_decides_with_probes_and_explains_failures_element_by_element(monkeypatch, invoke):
    monkeypatch.chdir(REPO)
    good = invoke("specs/linear.yaml", "--fast", "--no-color", "--no-isolate", "-v")  # -v: the table of a pass
    assert good.exit_code == 0
    assert (
        "backward (probe)" in good.stdout and "random probes v^T J u" not in good.stdout
    )  # a pass row's reason stays internal
    bad = invoke("broken-specs/linear_double_bias.yaml", "--fast", "--format", "json", "--no-isolate")
    assert bad.exit_code == 1
    (check,) = json.loads(bad.stdout)["results"][0]["checks"]
    assert check["mode"] == "probe+elementwise" and "2.00x" in check["message"]
    assert [w for w in check["warnings"] if "random probe failed" in w] == [
        "a random probe failed for 'bias': checked element by element to explain it"
    ]
    rows = {r["name"]: r for r in check["inputs"]}
    assert rows["bias"]["status"] == "fail" and rows["bias"]["mismatched"] == rows["bias"]["numel"]
    for name in ("input", "weight"):  # only the argument whose probe failed is compared element by element
        assert (
            rows[name]["status"] == "pass"
            and rows[name]["reason"] == "6 random probes v^T J u agree (3 directions u x 2 weightings v)"
        ), rows[name]


def test_k_takes_pytest_expressions_and_matches_the_function_too(monkeypatch, invoke):
    """issue 31 item 7: `-k LinearFunction` exited 2 (names only, case-sensitive, no and/or/not)"""
    monkeypatch.chdir(REPO)

    def ids(*k: str) -> list[str]:
        result = invoke("specs/", "--format", "json", "--no-isolate", "--check", "backward", "-k", *k)
        assert result.exit_code == 0, result.output
        return [r["id"] for r in json.loads(result.stdout)["results"]]

    linear = ids("LinearFunction")
    assert linear == ["specs/linear.yaml::with_bias[cpu]", "specs/linear.yaml::no_bias[cpu]"]
    assert ids("linearfunction") == linear  # case-insensitive, as pytest's
    assert ids("LinearFunction and not no_bias") == ["specs/linear.yaml::with_bias[cpu]"]
    assert set(ids("(linear or relu) and not bias")) == (set(ids("linear")) | set(ids("relu"))) - set(ids("bias"))
    assert "specs/relu.yaml::default[cpu]" in ids("(linear or relu) and not bias")
    assert ids("specs/linear.yaml::no_bias") == ["specs/linear.yaml::no_bias[cpu]"]  # a replay's exact name
    for bad, said in [
        ("linear and", "expected a word, `not` or `(` at the end"),
        ("(linear", "a `(` is not closed"),
        ("linear relu", "unexpected 'relu': join words with `and`, `or`, `not`"),
    ]:
        result = invoke("specs/", "-k", bad)
        assert result.exit_code == 2 and f"-k {bad}: {said}" in result.output, result.output
    nothing = invoke("specs/", "-k", "no-such-thing")
    assert nothing.exit_code == 2 and "it selects no case" in nothing.output


@pytest.mark.parametrize(
    "expression", ["(" * 250 + "linear" + ")" * 250, "not " * 1200 + "linear"], ids=["250-parentheses", "1200-nots"]
)
def test_k_nested_too_deep_is_a_usage_error_not_an_internal_one(monkeypatch, invoke, expression):
    """Both were a RecursionError (exit 4); within the bound, the same expression still selects."""
    monkeypatch.chdir(REPO)
    result = invoke("specs/", "-k", expression)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"({len(expression)} characters): nested more than 100 deep (`not`s and parentheses)" in said, said
    plain = invoke("specs/", "--format", "json", "--no-isolate", "--check", "backward", "-k", "linear")
    within = invoke(
        "specs/", "--format", "json", "--no-isolate", "--check", "backward", "-k", "(" * 50 + "linear" + ")" * 50
    )
    assert within.exit_code == plain.exit_code == 0, within.output
    assert [r["id"] for r in json.loads(within.stdout)["results"]] == [
        r["id"] for r in json.loads(plain.stdout)["results"]
    ]


def test_an_inline_target_gets_a_replay_command_that_reruns_it(monkeypatch, invoke):
    """issue 31 item 5: `gradcheck mod.Fn -i 4x5 --kwarg beta=2.0` had `replay: null`"""
    monkeypatch.chdir(REPO)
    args = [
        "gradcheck_cli.examples.broken.LinearDoubleBias",
        "-i",
        "5x4",
        "-i",
        "3x4",
        "-i",
        "3",
        "--seed",
        "3",
        "--no-isolate",
    ]
    result = invoke(*args, "--format", "json")
    (first,) = json.loads(result.stdout)["results"]
    assert first["status"] == "fail"
    assert first["replay"] == ("gradcheck gradcheck_cli.examples.broken.LinearDoubleBias -i 5x4 -i 3x4 -i 3 --seed 3")
    again = invoke(*first["replay"].split()[1:], "--format", "json", "--no-isolate")
    (second,) = json.loads(again.stdout)["results"]
    assert (second["id"], second["status"], second["seed"]) == (first["id"], "fail", 3)
    kw = invoke(
        "gradcheck_cli.examples.higher.LogSumExp",
        "-i",
        "3x4",
        "--kwarg",
        "dim=-1",
        "--check",
        "forward_ad",
        "--format",
        "json",
        "--no-isolate",
    )
    (third,) = json.loads(kw.stdout)["results"]
    assert third["replay"] == (
        "gradcheck gradcheck_cli.examples.higher.LogSumExp -i 3x4 --kwarg dim=-1 --check forward_ad"
    )


def test_too_many_probes_are_refused_before_any_work_and_the_replay_keeps_probes_and_max_memory(monkeypatch, invoke):
    """issue 30 item 4: `--probes 100000` tried to allocate 40 GB (an out_of_memory error, or exit 4); the
    replay command left out --probes and --max-memory, so it checked something else"""
    monkeypatch.chdir(REPO)
    result = invoke(
        "torch.sin", "-i", "10x10", "--probes", "100000", "--max-memory", "256", "--no-isolate", "--format", "json"
    )
    assert result.exit_code == 3, result.output
    (first,) = json.loads(result.stdout)["results"]
    assert first["error"]["kind"] == "too_large"
    assert (
        "100,000 probes per argument" in first["error"]["message"]
        and "--max-memory 256 MB" in first["error"]["message"]
    )
    assert first["replay"] == "gradcheck torch.sin -i 10x10 --max-memory 256 --probes 100000"
    again = invoke(*first["replay"].split()[1:], "--format", "json", "--no-isolate")
    assert json.loads(again.stdout)["results"][0]["error"]["kind"] == "too_large"
    fine = invoke("torch.sin", "-i", "10x10", "--probes", "64", "--no-isolate", "--format", "json")
    assert fine.exit_code == 0 and json.loads(fine.stdout)["results"][0]["status"] == "pass"


NESTED = """
import torch


def helper(x):
    return inner(x)


def inner(x):
    raise ValueError("boom in inner")


class Nested(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return helper(x)

    @staticmethod
    def backward(ctx, g):
        return g
"""


@pytest.mark.parametrize(
    "tb, shown, hidden",
    [
        (
            "short",
            [
                "traceback (your code, innermost last):",
                "nested.py:16 in forward (return helper(x))",
                "nested.py:6 in helper (return inner(x))",
                'nested.py:10 in inner (raise ValueError("boom in inner"))',
            ],
            ["def helper(x):"],
        ),
        ("long", ["nested.py:6 in helper (return inner(x))", "      def helper(x):"], []),
        ("line", ['  at nested.py:10 (raise ValueError("boom in inner"))'], ["traceback", "in helper"]),
        ("no", [], ["nested.py:", "traceback"]),
    ],
)
def test_tb_shows_the_users_frames_as_pytest_does(user_module, write_spec, invoke, tb, shown, hidden):
    """issue 31 item 4: an exception in user code showed only its innermost frame, even with -v"""
    user_module(NESTED, "nested")
    write_spec("function: nested:Nested\ninputs: [{shape: [3]}]\n", "specs/n.yaml")
    result = invoke("specs/", "--no-color", "--tb", tb, "-j", "1")
    assert result.exit_code == 3
    assert "forward error: forward raised ValueError: boom in inner" in result.stdout
    for text in shown:
        assert text in result.stdout, result.stdout
    for text in hidden:
        assert text not in result.stdout, result.stdout
    data = json.loads(invoke("specs/", "--format", "json", "-j", "1").stdout)
    assert data["results"][0]["error"]["traceback"] == [
        "nested.py:16 in forward (return helper(x))",
        "nested.py:6 in helper (return inner(x))",
        'nested.py:10 in inner (raise ValueError("boom in inner"))',
    ]


def test_the_default_max_memory_is_one_number_everywhere():
    """--max-memory's default is written once (core.options); every front end and the checks read it there."""
    import re

    from gradcheck_cli import pytest_plugin
    from gradcheck_cli.checks.parts.base import Options
    from gradcheck_cli.cli import check_cmd
    from gradcheck_cli.core.options import MB, default
    from gradcheck_cli.run.plan import RunOptions, run_options

    (option,) = [p for p in check_cmd.params if p.name == "max_memory_mb"]
    assert option.default == default("max-memory") == RunOptions().max_memory_mb == run_options().max_memory_mb
    assert Options().memory_bytes == default("max-memory") * MB
    package = Path(pytest_plugin.__file__).parent
    written = [p.name for p in package.rglob("*.py") if re.search(r"\b512\b", p.read_text(encoding="utf-8"))]
    assert written == ["options.py"], written


OWN_DEFAULTS = {  # RunOptions' defaults that are not the command line's, and why
    "timeout": "None: the library API and the plugin's in-process run set no limit of their own",
    "shrink": "0: only the command line shrinks by default (a report to read, not a test outcome)",
    "devices": "None: each spec's own devices",
    "checks": "None: each spec's own checks",
}


def test_every_option_of_the_table_is_made_of_its_row():
    """core.options' rows make the command line's options, the plugin's, the [tool.gradcheck] keys and the fields
    of RunOptions: each with the row's spellings, default and help, none written a second time."""
    import dataclasses

    from gradcheck_cli import config
    from gradcheck_cli.cli import check_cmd
    from gradcheck_cli.core.options import FIELDS, OPTIONS
    from gradcheck_cli.run.plan import RunOptions

    spellings = {flag: p for p in check_cmd.params for flag in getattr(p, "opts", [])}
    run_fields = {f.name: f.default for f in dataclasses.fields(RunOptions)}
    for row in OPTIONS:
        option = spellings[f"--{row.name}"]
        assert option.name == row.field and row.help in (option.help or ""), row.name
        assert all(spellings[flag] is option for flag in row.flags), row.name
        if FIELDS[row.field] is row:
            assert option.default == row.default, row.name
        if row.run and row.field not in OWN_DEFAULTS:
            assert run_fields[row.field] == row.default, row.name
        if row.project:
            assert config.KEYS[row.project].param == row.field, row.name
    # RunOptions has no field that no row declares, but for a replay's --shape and --values
    assert set(run_fields) - {row.field for row in OPTIONS if row.run} == {"all_checks", "shapes", "values"}
    # and no key of [tool.gradcheck] is written apart from a row but those of the report and its paths
    assert {s.key for s in config.SETTINGS} - {row.project for row in OPTIONS} == {
        "paths",
        "specs",
        "format",
        "verbosity",
    }
