"""Kinks, ties, domain edges, ``resample`` and ``repeat``, end to end (CLI, run_case, check()).

Every Function is written into a user module with a backward that is right or deliberately
wrong, and every input that sits on a kink is given literally (``data:``), so the expected
verdicts come from derivatives worked out by hand: relu, abs and clamp have one-sided
derivatives 0 and 1 (or -1 and 1) at their corners, any value between them is a valid
subgradient (the central difference itself gives their mean, which sign(0) = 0 matches for abs);
the max of a row with tied maxima has one-sided derivatives 0 and 1 for each tied
element; sqrt and log at x = 1e-7 < eps have only a right derivative (x - eps < 0 gives NaN).
``torch.autograd.gradcheck`` on the same inputs fails every correct Function at a kink: our
verdict differs from torch's exactly there, and agrees everywhere else.
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

import jsonschema
import pytest
import torch
import yaml

import gradcheck_cli
from gradcheck_cli import schemas
from gradcheck_cli.results import Status
from gradcheck_cli.run import replay, runner
from gradcheck_cli.run.plan import Task
from gradcheck_cli.spec import load_file

USER = """
import torch


def fn(name, forward, backward):
    def fwd(ctx, x):
        ctx.save_for_backward(x)
        return forward(x)

    def bwd(ctx, g):
        (x,) = ctx.saved_tensors
        return backward(x, g)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


ReLU = fn("ReLU", torch.relu, lambda x, g: g * (x > 0))
ReLUTwoAtKink = fn("ReLUTwoAtKink", torch.relu, lambda x, g: g * torch.where(x == 0, 2.0, (x > 0).double()))
ReLUDouble = fn("ReLUDouble", torch.relu, lambda x, g: 2 * g * (x > 0))
Abs = fn("Abs", torch.abs, lambda x, g: g * torch.where(x >= 0, 1.0, -1.0))  # 1 at 0: a subgradient
AbsSign = fn("AbsSign", torch.abs, lambda x, g: g * torch.sign(x))  # 0 at 0: what the central difference gives
Clamp = fn("Clamp", lambda x: x.clamp(-1.0, 1.0), lambda x, g: g * ((x >= -1) & (x <= 1)))
Sqrt = fn("Sqrt", torch.sqrt, lambda x, g: g * 0.5 / x.sqrt())
SqrtDouble = fn("SqrtDouble", torch.sqrt, lambda x, g: g / x.sqrt())
Log = fn("Log", torch.log, lambda x, g: g / x)
LogDouble = fn("LogDouble", torch.log, lambda x, g: 2 * g / x)


class RowMax(torch.autograd.Function):
    # the max of each row; the whole gradient goes to the one maximum that max() picked
    @staticmethod
    def forward(ctx, x):
        values, index = x.max(dim=1)
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return values

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return torch.zeros(ctx.shape, dtype=g.dtype).scatter(1, index[:, None], g[:, None])


class WindowMaxEvery(torch.autograd.Function):
    # the max of each row; the whole gradient goes to EVERY tied maximum: a tie counted twice or more (wrong)
    @staticmethod
    def forward(ctx, x):
        values = x.max(dim=1).values
        ctx.save_for_backward(x, values)
        return values

    @staticmethod
    def backward(ctx, g):
        x, values = ctx.saved_tensors
        return (x == values[:, None]).to(g.dtype) * g[:, None]


class WindowMaxSplit(torch.autograd.Function):
    # the same, the gradient shared equally among the tied maxima (right)
    forward = WindowMaxEvery.forward

    @staticmethod
    def backward(ctx, g):
        x, values = ctx.saved_tensors
        tied = (x == values[:, None]).to(g.dtype)
        return tied / tied.sum(1, keepdim=True) * g[:, None]


CALLS = [0]


class Noisy(torch.autograd.Function):
    # backward of 3x, plus 1e-10 times the number of backward calls so far: a tiny drift
    @staticmethod
    def forward(ctx, x):
        return 3 * x

    @staticmethod
    def backward(ctx, g):
        CALLS[0] += 1
        return 3 * g + 1e-10 * CALLS[0]


def noisy(x):
    # a plain callable: no contract inspection, only the determinism step sees the drift
    return Noisy.apply(x)
"""

AT_X = [1e-7, 0.5, 2.0]  # 1e-7 < eps: x - eps leaves the domain of sqrt and log
# name, function, data, status, at_kinks, torch.autograd.gradcheck's verdict
TABLE: list[tuple[str, str, Any, Status, int, bool]] = [
    ("relu_at_0", "ReLU", [-1.0, 0.0, 2.0, 0.0], Status.PASS, 2, False),
    ("abs_at_0", "Abs", [0.0, 1.5, -0.5], Status.PASS, 1, False),
    ("abs_sign_at_0", "AbsSign", [0.0, 1.5, -0.5], Status.PASS, 0, True),  # no mismatch: nothing to explain
    ("clamp_at_corners", "Clamp", [-1.0, 0.3, 1.0, 2.0], Status.PASS, 2, False),
    ("max_with_ties", "RowMax", [[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], Status.PASS, 4, False),
    ("sqrt_at_edge", "Sqrt", AT_X, Status.PASS, 1, False),
    ("log_at_edge", "Log", AT_X, Status.PASS, 1, False),
    ("relu_away", "ReLU", [-1.0, 0.5, 2.0], Status.PASS, 0, True),
    ("relu_two_at_kink", "ReLUTwoAtKink", [-1.0, 0.0, 2.0], Status.FAIL, 0, False),
    ("relu_double_away", "ReLUDouble", [-1.0, 0.5, 2.0], Status.FAIL, 0, False),
    ("relu_double_with_kink", "ReLUDouble", [-1.0, 0.0, 2.0], Status.FAIL, 1, False),
    ("sqrt_double_at_edge", "SqrtDouble", AT_X, Status.FAIL, 0, False),
    ("log_double_at_edge", "LogDouble", AT_X, Status.FAIL, 0, False),
]
AT_KINK_BUT_RIGHT = {name for name, _, _, status, kinks, _ in TABLE if status is Status.PASS and kinks}


@pytest.fixture
def run_json(invoke):
    """A function ``run_json(*args) -> (exit code, report)``: ``gradcheck ARGS --no-isolate --format json``."""

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        result = invoke(*args, "--no-isolate", "--format", "json")
        return result.exit_code, json.loads(result.stdout)

    return run


def by_case(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["case"]: r for r in report["results"]}


@pytest.fixture
def usermod(user_module):
    """The user module, imported (its Functions are used directly for torch's verdicts)."""
    return importlib.import_module(user_module(USER))


@pytest.fixture
def table_spec(usermod, write_spec):
    """One spec, one case per row of TABLE; returns its path relative to the current directory."""
    cases = [
        {"name": name, "function": f"usermod:{fn}", "inputs": [{"name": "x", "data": data}]}
        for name, fn, data, *_ in TABLE
    ]
    write_spec(yaml.safe_dump({"function": "usermod:ReLU", "cases": cases}), "specs/kinks.yaml")
    return "specs/kinks.yaml"


@pytest.fixture(scope="module")
def report_validator() -> jsonschema.Draft202012Validator:
    schema = schemas.load("report")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(validator: jsonschema.Draft202012Validator, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


# ------------------------------------------------------------------------ kinks, ties, domain edges


def check_table_entry(res: dict[str, Any], name: str, status: Status, at_kinks: int) -> None:
    (check,) = res["checks"]
    (row,) = check["inputs"]
    assert res["status"] == status.value, (name, check["message"])
    assert row["at_kinks"] == at_kinks, (name, row)
    assert row["unreliable"] == 0, (name, row)  # kinks and domain edges keep their stories: not cancellation
    assert not any("cancellation" in w for w in check["warnings"]) and "cancellation" not in check["message"]
    warned = [w for w in check["warnings"] if "kink, tie or domain edge" in w]
    if status is Status.PASS and at_kinks:
        assert row["status"] == "pass" and row["mismatched"] == 0
        assert len(warned) == 1 and warned[0].startswith("'x': ") and f"{at_kinks} element" in warned[0], warned
        assert "avoid: [[" in warned[0] and "resample: true" in warned[0]
        kind = "edge of the domain" if name.endswith("_edge") else ("kink or tie" if "max" in name else "kink")
        assert kind in warned[0]
    else:
        assert warned == [], (name, warned)  # a pass away from kinks, or a fail, says nothing about kinks
    if status is Status.FAIL:
        assert row["status"] == "fail" and row["mismatched"] >= 1
        assert check["message"].startswith("gradient of 'x': ")


def test_cli_judges_kinks_ties_and_domain_edges(table_spec, report_validator, run_json):
    code, report = run_json(table_spec)
    assert code == 1  # some cases are wrong
    assert schema_errors(report_validator, report) == []
    results = by_case(report)
    assert list(results) == [name for name, *_ in TABLE]
    for name, _, _, status, at_kinks, _ in TABLE:
        check_table_entry(results[name], name, status, at_kinks)
        assert results[name]["checks"][0]["mode"] == "elementwise"


def test_cli_diagnoses_name_the_kink_or_the_domain_edge(table_spec, run_json):
    _, report = run_json(table_spec)
    results = by_case(report)

    def row(name: str) -> dict[str, Any]:
        return results[name]["checks"][0]["inputs"][0]

    two = row("relu_two_at_kink")
    assert two["mismatched"] == 1 and two["worst_index"] == [1]  # only x[1] = 0 is wrong
    assert "x[1] = 0 is a kink or tie" in two["diagnosis"]
    assert "one-sided derivatives 0 and 1, backward gives 2" in two["diagnosis"]
    assert "kink" in results["relu_two_at_kink"]["checks"][0]["message"]
    # away from the kink: the plain ratio, no kink story
    double = row("relu_double_away")
    assert double["mismatched"] == 2 and "2.00x" in double["diagnosis"] and "kink" not in double["diagnosis"]
    # both: x[1] = 0 is explained (backward's 0 is a subgradient), x[2] = 2 is counted as wrong
    mixed = row("relu_double_with_kink")
    assert mixed["mismatched"] == 1 and mixed["at_kinks"] == 1 and mixed["worst_index"] == [2]
    for name in ("sqrt_double_at_edge", "log_double_at_edge"):
        edge = row(name)
        assert edge["mismatched"] == 3, (name, edge)  # the edge element too: 2x its one-sided derivative
        assert "x[0] = 1e-07 is at the edge of the domain: f(x - eps) is not finite" in edge["diagnosis"], edge


def test_a_row_with_a_kink_and_a_wrong_element_counts_only_the_wrong_one(table_spec, run_json):
    """relu backward 2x on [-1, 0, 2]: x[1] = 0 is explained (0 is a subgradient), only x[2] is wrong.

    The row says mismatched 1 and at_kinks 1, so its diagnosis (and the check's message) must count
    1 wrong element, not the 2 mismatches found before the kink was explained.
    """
    _, report = run_json(table_spec)
    check = by_case(report)["relu_double_with_kink"]["checks"][0]
    row = check["inputs"][0]
    assert row["mismatched"] == 1 and row["at_kinks"] == 1
    assert row["diagnosis"].startswith("1 of 3 elements are wrong"), row["diagnosis"]
    assert "2 of 3" not in check["message"], check["message"]


def test_fast_mode_falls_back_to_elementwise_and_gives_the_same_verdicts(table_spec, run_json):
    _, slow = run_json(table_spec)
    code, fast = run_json(table_spec, "--fast")
    assert code == 1
    slow_r, fast_r = by_case(slow), by_case(fast)
    for name, _, _, status, at_kinks, _ in TABLE:
        check = fast_r[name]["checks"][0]
        assert fast_r[name]["status"] == slow_r[name]["status"] == status.value, (name, check["message"])
        if check["mode"] == "probe":  # probes decided: every probe agreed, so nothing was wrong
            assert status is Status.PASS, name
        else:
            assert any("a random probe failed for 'x'" in w for w in check["warnings"]), name
            check_table_entry(fast_r[name], name, status, at_kinks)
    # a correct Function at a kink makes the probes fail, and the element-wise pass explains it
    for name in ("relu_at_0", "abs_at_0", "sqrt_at_edge", "log_at_edge"):
        assert fast_r[name]["checks"][0]["mode"] == "elementwise", name
    assert fast_r["relu_away"]["checks"][0]["mode"] == "probe"


def torch_verdict(function: Any, data: Any) -> bool:
    x = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    return torch.autograd.gradcheck(function.apply, (x,), raise_exception=False)


def test_torch_gradcheck_differs_exactly_at_the_correct_kinks(usermod):
    """check() on the same tensors; torch's verdict differs exactly where a kink explains the mismatch."""
    differ = set()
    for name, fn, data, status, at_kinks, torch_ok in TABLE:
        function = getattr(usermod, fn)
        assert torch_verdict(function, data) is torch_ok, name
        x = torch.tensor(data, dtype=torch.float64, requires_grad=True)
        result = gradcheck_cli.check(function, [x])
        assert result.status is status, (name, result.checks[0].message)
        assert result.checks[0].inputs[0].at_kinks == at_kinks, name
        if (result.status is Status.PASS) != torch_ok:
            differ.add(name)
    assert (
        differ
        == AT_KINK_BUT_RIGHT
        == {"relu_at_0", "abs_at_0", "clamp_at_corners", "max_with_ties", "sqrt_at_edge", "log_at_edge"}
    )


# ------------------------------------------------------------------------ resample


TIES_SPEC = """
function: usermod:WindowMaxEvery
inputs:
  - {name: x, shape: [8, 4], dist: randint, low: 0, high: 3, dtype: float64}
cases:
  - name: every
  - {name: split, function: usermod:WindowMaxSplit}
  - {name: one_hot, function: usermod:RowMax}
"""


def test_cli_fails_a_tie_counted_twice_on_integer_inputs(usermod, write_spec, report_validator, run_json):
    # quantised activations (integers): the rows' maxima are tied; each tied element alone has one-sided
    # derivatives 0 and 1, so giving every one of them the whole gradient passed element by element
    write_spec(TIES_SPEC, "specs/ties.yaml")
    code, report = run_json("specs/ties.yaml")
    assert code == 1 and schema_errors(report_validator, report) == []
    results = by_case(report)
    assert results["split"]["status"] == results["one_hot"]["status"] == "pass"
    assert any("kink or tie" in w for w in results["one_hot"]["checks"][0]["warnings"])
    every = results["every"]
    (check,) = every["checks"]
    (row,) = check["inputs"]
    assert every["status"] == row["status"] == "fail" and row["pattern"] == "kink"
    assert re.search(r"x\[\d+, \d+\], x\[\d+, \d+\].* \(= \d\) are tied \(output 0 \[\d+\]\)", row["diagnosis"])
    assert "must sum to 1; they sum to" in row["diagnosis"] and "counted" in row["diagnosis"]
    assert check["message"].startswith("gradient of 'x': ")
    assert (every.get("shrunk") or {"pattern": "kink"})["pattern"] == "kink"  # a shrunk case fails alike
    x = torch.randint(0, 3, (8, 4), generator=torch.Generator().manual_seed(every["seed"])).double()
    assert not torch.autograd.gradcheck(usermod.WindowMaxEvery.apply, (x.requires_grad_(),), raise_exception=False)


RESAMPLE_SPEC = """
function: usermod:ReLU
seed: {seed}
resample: {resample}
inputs: [{{name: x, shape: [3], dist: randint, low: -1, high: 2, dtype: float64}}]
"""


def drawn_zero(case) -> bool:
    """Whether the first draw of ``case`` (with resample off) holds a zero of relu."""
    result = runner.run_case(case, "cpu")
    assert result.status is Status.PASS, result.checks[0].message  # ReLU is right: a zero is only a kink
    return result.checks[0].inputs[0].at_kinks > 0


def seed_with_zero_then_clean(write_spec) -> tuple[int, int]:
    """A seed whose draw has a zero and whose redraw (with resample: true) has none; and that redraw's seed."""
    for seed in range(200):
        (plain,) = load_file(write_spec(RESAMPLE_SPEC.format(seed=seed, resample="false"), "specs/probe.yaml"))
        if not drawn_zero(plain):
            continue
        (case,) = load_file(write_spec(RESAMPLE_SPEC.format(seed=seed, resample="true"), "specs/probe.yaml"))
        result = runner.run_case(case, "cpu")
        if result.checks[0].inputs[0].at_kinks == 0:
            return seed, result.seed
    raise AssertionError("no seed in 0..199 draws a zero and then a clean redraw")


def test_resample_draws_again_and_the_replay_command_reproduces_it(usermod, write_spec, report_validator, run_json):
    seed, new_seed = seed_with_zero_then_clean(write_spec)
    assert new_seed != seed

    write_spec(RESAMPLE_SPEC.format(seed=seed, resample="false"), "specs/off.yaml")
    code, off = run_json("specs/off.yaml")
    (res,) = off["results"]
    assert code == 0 and res["seed"] == seed and res["status"] == "pass"
    assert res["checks"][0]["inputs"][0]["at_kinks"] > 0
    assert not any("drew again" in w for w in res["warnings"])
    assert any("kink, tie or domain edge" in w and "resample: true" in w for w in res["checks"][0]["warnings"])

    write_spec(RESAMPLE_SPEC.format(seed=seed, resample="true"), "specs/on.yaml")
    code, on = run_json("specs/on.yaml")
    assert schema_errors(report_validator, on) == []
    (res,) = on["results"]
    assert code == 0 and res["status"] == "pass" and res["seed"] == new_seed
    assert res["checks"][0]["inputs"][0]["at_kinks"] == 0
    notes = [w for w in res["warnings"] if "drew again with seed" in w]
    assert notes and notes[0].startswith(f"seed {seed} put 'x' on a kink, tie or domain edge")
    assert f"drew again with seed {new_seed}" in notes[-1]
    assert res["replay"].endswith(f"--seed {new_seed}") and res["replay"].startswith("gradcheck specs/on.yaml -k ")

    code, again = run_json(*res["replay"].split()[1:])
    (rep,) = again["results"]
    assert code == 0 and rep["seed"] == new_seed and rep["replay"] == res["replay"]
    assert rep["checks"][0]["inputs"] == res["checks"][0]["inputs"]
    assert rep["status"] == res["status"] and rep["checks"][0]["message"] == res["checks"][0]["message"]


def test_resample_does_not_redraw_literal_data(usermod, write_spec):
    write_spec(
        """
        function: usermod:ReLU
        seed: 7
        resample: true
        inputs: [{name: x, data: [0.0, 1.0, -2.0]}]
    """,
        "specs/data.yaml",
    )
    (case,) = load_file("specs/data.yaml")
    result = runner.run_case(case, "cpu")
    assert result.status is Status.PASS and result.seed == 7
    assert result.checks[0].inputs[0].at_kinks == 1
    assert not any("drew again" in w for w in result.warnings)
    replayed = replay.command(Task(case, "cpu"), result.seed)  # made at the edge (CLI, plugin)
    assert replayed == "gradcheck specs/data.yaml -k specs/data.yaml::default"  # no --seed: unchanged


def test_resample_keeps_a_wrong_gradient_wrong(usermod, write_spec, run_json):
    seed, _ = seed_with_zero_then_clean(write_spec)
    write_spec(RESAMPLE_SPEC.format(seed=seed, resample="true").replace("ReLU", "ReLUDouble"), "specs/bad.yaml")
    code, report = run_json("specs/bad.yaml")
    (res,) = report["results"]
    assert code == 1 and res["status"] == "fail"
    assert "2.00x" in res["checks"][0]["message"]


# ------------------------------------------------------------------------ repeat


REPEAT_SPEC = """
function: usermod:{fn}
repeat: {repeat}
tolerance: {{nondet_tol: {nondet_tol}}}
inputs: [{{name: x, shape: [4]}}]
"""


@pytest.mark.parametrize("fn", ["Noisy", "noisy"])
@pytest.mark.parametrize("repeat", [3, 7])
def test_repeat_calls_backward_r_times_and_reports_drift(usermod, write_spec, fn, repeat, run_json):
    write_spec(REPEAT_SPEC.format(fn=fn, repeat=repeat, nondet_tol=0), "specs/noisy.yaml")
    code, report = run_json("specs/noisy.yaml")
    (res,) = report["results"]
    assert code == 1 and res["status"] == "fail"
    message = res["checks"][0]["message"]
    row = res["checks"][0]["inputs"][0]
    assert row["mismatched"] == 0  # the Jacobian itself is right (the drift is far below atol)
    if fn == "Noisy":  # a Function: the contract's R direct calls differ, and name the argument
        found = re.search(
            r"backward returned different values for 'x' when called (\d+) times with the same "
            r"grad_output \(max difference ([0-9.e+-]+)\)",
            message,
        )
        assert row["status"] == "fail"
        assert "not deterministic" not in message  # said once, not twice
    else:  # a plain callable: the determinism step calls backward R times through the engine
        found = re.search(
            r"backward is not deterministic for 'x': (\d+) calls with the same grad_output "
            r"differ by up to ([0-9.e+-]+)",
            message,
        )
        # its drift also makes backward's result non-zero with every output's gradient undefined (zero),
        # which the default check's undefined-gradient step fails the row for, beside the determinism message
        assert row["status"] == "fail" and "with every output's gradient undefined" in message
    assert found, message
    assert int(found.group(1)) == repeat
    assert 0 < float(found.group(2)) < 1e-8  # the drift: 1e-10 per call
    assert "nondet_tol" in message


@pytest.mark.parametrize("fn", ["Noisy", "noisy"])
def test_nondet_tol_above_the_noise_passes(usermod, write_spec, fn, run_json):
    write_spec(REPEAT_SPEC.format(fn=fn, repeat=10, nondet_tol=1e-6), "specs/noisy.yaml")
    code, report = run_json("specs/noisy.yaml")
    assert code == 0, report["results"][0]["checks"][0]["message"]


def test_deterministic_backward_passes_with_many_repeats(usermod, write_spec, run_json):
    write_spec(REPEAT_SPEC.format(fn="ReLU", repeat=1000, nondet_tol=0), "specs/relu.yaml")
    code, report = run_json("specs/relu.yaml")
    assert code == 0, report["results"][0]["checks"][0]["message"]


@pytest.mark.parametrize(
    "key,value",
    [
        ("repeat", "1"),
        ("repeat", "true"),
        ("repeat", "1001"),
        ("repeat", "2.5"),
        ("resample", "3"),
        ("resample", "yes please"),
    ],
)
def test_bad_repeat_or_resample_is_a_spec_error_naming_the_key(usermod, write_spec, key, value, run_json):
    write_spec(
        f"""
        function: usermod:ReLU
        {key}: {value}
        inputs: [{{shape: [3]}}]
    """,
        "specs/bad.yaml",
    )
    code, report = run_json("specs/bad.yaml")
    (res,) = report["results"]
    assert code == 3 and res["status"] == "error" and res["error"]["kind"] == "spec"
    assert f": {key}: expected " in res["error"]["message"], res["error"]["message"]
    assert "specs/bad.yaml:3" in res["error"]["message"]


def test_repeat_and_resample_in_a_case_override_the_top_level(usermod, write_spec, run_json):
    write_spec(
        """
        function: usermod:noisy
        repeat: 4
        inputs: [{name: x, shape: [4]}]
        cases:
          - {name: top}
          - {name: more, repeat: 9}
    """,
        "specs/cases.yaml",
    )
    _, report = run_json("specs/cases.yaml")
    results = by_case(report)
    assert "4 calls" in results["top"]["checks"][0]["message"]
    assert "9 calls" in results["more"]["checks"][0]["message"]


# ------------------------------------------------------------------------ schemas


@pytest.fixture(scope="module")
def spec_validator() -> jsonschema.Draft202012Validator:
    schema = schemas.load("spec")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_spec_schema_accepts_repeat_and_resample_where_spec_py_does(spec_validator, tmp_path):
    base = {"function": "m:F", "inputs": [{"shape": [3]}]}
    good = [
        {"repeat": 2},
        {"repeat": 1000},
        {"resample": True},
        {"resample": False, "repeat": 5},
        {"cases": [{"name": "c", "repeat": 7, "resample": True}]},
    ]
    bad = [
        {"repeat": 1},
        {"repeat": 1001},
        {"repeat": True},
        {"repeat": 2.5},
        {"resample": 3},
        {"cases": [{"name": "c", "resample": "yes"}]},
    ]
    for extra in good + bad:
        doc = {**base, **extra}
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        loader_ok = all(not isinstance(item, Exception) for item in load_file(path))
        assert (schema_errors(spec_validator, doc) == []) is loader_ok is (extra in good), extra


def test_json_report_with_kinks_resample_and_repeat_validates(table_spec, write_spec, report_validator, run_json):
    write_spec(REPEAT_SPEC.format(fn="Noisy", repeat=3, nondet_tol=0), "specs/noisy.yaml")
    write_spec(RESAMPLE_SPEC.format(seed=0, resample="true"), "specs/drawn.yaml")
    code, report = run_json("specs/")
    assert code == 1
    assert schema_errors(report_validator, report) == []
    rows = [row for r in report["results"] for c in r["checks"] for row in c["inputs"]]
    assert any(row["at_kinks"] > 0 for row in rows)
    assert all(isinstance(row["at_kinks"], int) and row["at_kinks"] >= 0 for row in rows)
