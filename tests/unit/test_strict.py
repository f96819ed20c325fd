"""--strict / `strict: true` / check(strict=True): a gradient off by a constant factor within the
tolerance (1.001x everywhere) fails when that is well beyond the finite differences' own error;
by default it passes with a warning, as torch.autograd.gradcheck passes it (issue 14, item 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Pattern, Status

try:
    from corpus import CORPUS
except ImportError:  # run from the repository root
    from tests.corpus import CORPUS

ROOT = Path(__file__).resolve().parents[2]

USER = """
import torch


def one_input(name, forward, backward):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return backward(x, g)

    F.__name__ = F.__qualname__ = name
    return F


Off = one_input("Off", torch.sin, lambda x, g: 1.001 * g * torch.cos(x))
Sin = one_input("Sin", torch.sin, lambda x, g: g * torch.cos(x))
Exp = one_input("Exp", torch.exp, lambda x, g: g * torch.exp(x))
"""


@pytest.fixture
def usermod(user_module):
    import importlib

    return importlib.import_module(user_module(USER))


@pytest.fixture
def x():
    return torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)


def test_a_factor_within_tolerance_is_a_warning_by_default_and_a_fail_under_strict(usermod, x):
    default = check(usermod.Off, (x,))
    assert default.status is Status.PASS
    assert any("1.001x" in w for w in default.checks[0].warnings)

    strict = check(usermod.Off, (x,), strict=True)
    assert strict.status is Status.FAIL
    (row,) = strict.checks[0].inputs
    assert row.status is Status.FAIL and row.pattern is Pattern.SYSTEMATIC and row.ratio == pytest.approx(1.001)
    message = strict.checks[0].message
    assert "1.001x" in message and "own error is only about" in message, message


def test_strict_never_fails_a_correct_function_whose_finite_differences_are_coarse(usermod, x):
    """exp at eps=0.1: central differences are 1.0017x too large (eps**2 / 6), a 'systematic factor'
    the warning names, but it is the finite differences' own error: strict lets it pass."""
    loose = {"eps": 0.1, "atol": 1e-2, "rtol": 1e-2}
    assert check(usermod.Exp, (x,), **loose).checks[0].inputs[0].pattern is Pattern.SYSTEMATIC
    result = check(usermod.Exp, (x,), strict=True, **loose)
    assert result.status is Status.PASS, result.checks[0].message
    assert any("could explain that" in w for w in result.checks[0].warnings)


@pytest.mark.parametrize("case", [c for c in CORPUS if c.correct], ids=lambda c: c.name)
def test_strict_passes_every_correct_function_of_the_corpus(case):
    args = case.make_args(torch.Generator().manual_seed(0))
    result = check(case.fn, args, kwargs=case.kwargs, strict=True)
    assert result.status is Status.PASS, [(c.message, c.warnings) for c in result.checks]


@pytest.mark.parametrize("case", [c for c in CORPUS if not c.correct], ids=lambda c: c.name)
def test_strict_fails_every_wrong_function_of_the_corpus(case):
    args = case.make_args(torch.Generator().manual_seed(0))
    assert check(case.fn, args, kwargs=case.kwargs, strict=True).status is Status.FAIL


SPEC = """
function: usermod:{fn}
{strict}inputs: [{{name: x, shape: [3, 4]}}]
"""


@pytest.mark.parametrize(
    ("fn", "strict", "flag", "code"),
    [
        ("Off", "", False, 0),
        ("Off", "strict: true\n", False, 1),
        ("Off", "", True, 1),
        ("Off", "strict: false\n", True, 1),  # the command line wins
        ("Sin", "strict: true\n", False, 0),
        ("Sin", "", True, 0),
    ],
)
def test_exit_codes_of_the_spec_key_and_the_flag(usermod, write_spec, invoke, fn, strict, flag, code):
    write_spec(SPEC.format(fn=fn, strict=strict), "specs/off.yaml")
    result = invoke("specs/off.yaml", "--no-isolate", "--format", "json", *(["--strict"] if flag else []))
    assert result.exit_code == code, result.output
    (case,) = json.loads(result.stdout)["results"]
    if code:
        assert "strict fails it" in case["checks"][0]["message"]
        assert (case["replay"].endswith("--strict")) == flag


def test_a_case_may_set_strict(usermod, write_spec, invoke):
    write_spec(
        """
        function: usermod:Off
        inputs: [{name: x, shape: [3, 4]}]
        cases: [{name: lenient}, {name: strict, strict: true}]
        """,
        "specs/off.yaml",
    )
    result = invoke("specs/off.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1
    assert {r["case"]: r["status"] for r in json.loads(result.stdout)["results"]} == {
        "lenient": "pass",
        "strict": "fail",
    }


def test_strict_must_be_a_boolean(usermod, write_spec, invoke):
    write_spec(SPEC.format(fn="Off", strict="strict: yes please\n"), "specs/off.yaml")
    result = invoke("specs/off.yaml", "--no-isolate")
    assert result.exit_code == 3
    assert "specs/off.yaml:3: strict: expected true or false" in result.output


def test_the_shipped_specs_pass_under_strict(invoke, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke("specs", "--strict", "--no-isolate", "--format", "json")
    assert result.exit_code == 0, [
        (r["id"], [c["message"] for c in r["checks"]])
        for r in json.loads(result.stdout)["results"]
        if r["status"] != "pass"
    ]
