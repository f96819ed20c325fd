"""The reference check through the command line (issue 15): the shipped kernel specs, a large
bfloat16 case, --reference, modules with a reference module, and every bad input's message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcheck_cli import schemas

REPO = Path(__file__).resolve().parents[2]
KERNELS = "gradcheck_cli.examples.kernels"

MODULES = """
import torch


class FusedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return (x.float() * w.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g.float() * w.float()).to(x.dtype), (g.float() * x.float()).sum(0).to(w.dtype) * {factor}


class Kernel(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        return FusedScale.apply(x, self.weight)


class Plain(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))  # replaced by the target's values

    def forward(self, x):
        return x * self.weight


class OtherNames(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return x * self.scale
"""


def json_report(result) -> dict:
    report = json.loads(result.stdout)
    import jsonschema

    jsonschema.validate(report, schemas.load("report"))
    return report


def test_the_shipped_kernel_specs_pass_and_the_broken_ones_fail_with_per_argument_rows(monkeypatch, invoke):
    monkeypatch.chdir(REPO)
    good = invoke("specs/kernels.yaml", "--format", "json")
    assert good.exit_code == 0, good.output
    statuses = {r["case"]: r["status"] for r in json_report(good)["results"]}
    assert statuses == {
        "bfloat16": "pass",
        "float16": "pass",
        "computes_in_bfloat16_inside": "pass",
        "default": "pass",
        "intended_gradient": "pass",
        "finite_differences": "xfail",
    }
    bad = invoke(
        "broken-specs/kernels_gelu_grad_4pct.yaml", "broken-specs/kernels_ste_clipped.yaml", "--format", "json"
    )
    assert bad.exit_code == 1, bad.output
    gelu, ste = json_report(bad)["results"]
    rows = {r["name"]: r for r in gelu["checks"][0]["inputs"]}
    assert rows["x"]["status"] == "fail" and rows["x"]["pattern"] == "constant_ratio"
    assert rows["x"]["baseline_err"] > 0 and rows["x"]["factor"] == 2.0 and rows["x"]["role"] == "argument"
    assert rows["output"]["status"] == "pass" and rows["output"]["role"] == "output"
    assert ste["checks"][0]["inputs"][0]["pattern"] == "some_elements"


def test_the_table_names_the_target_and_the_reference(monkeypatch, invoke):
    monkeypatch.chdir(REPO)
    result = invoke("broken-specs/kernels_gelu_grad_4pct.yaml", "--no-color")
    assert result.exit_code == 1
    assert "target / reference" in result.stdout and "2x ref. error" in result.stdout
    assert "the target's gradient is 1.04x the reference's" in result.stdout


@pytest.mark.slow
def test_a_kernel_sized_bfloat16_case_runs_through_the_cli(write_spec, invoke):
    path = write_spec(f"""
        function: {KERNELS}:FusedGELU
        dtype: bfloat16
        reference: {KERNELS}:gelu_reference
        inputs: [{{name: x, shape: [2, 4096, 1024]}}]
    """)
    result = invoke(str(path), "--format", "json", "--no-isolate")
    assert result.exit_code == 0, result.output
    check = json_report(result)["results"][0]["checks"][0]
    assert check["check"] == "reference" and check["status"] == "pass"
    assert [r["numel"] for r in check["inputs"]] == [2 * 4096 * 1024] * 2


def test_reference_on_the_command_line_runs_the_reference_check(invoke):
    result = invoke(
        f"{KERNELS}.FusedGELU",
        "-i",
        "4x8:bfloat16",
        "--reference",
        f"{KERNELS}:gelu_reference",
        "--format",
        "json",
        "--no-isolate",
    )
    assert result.exit_code == 0, result.output
    assert [c["check"] for c in json.loads(result.stdout)["results"][0]["checks"]] == ["reference"]
    without = invoke(f"{KERNELS}.FusedGELU", "-i", "4x8:bfloat16", "--no-isolate")
    assert without.exit_code == 3
    assert "forward fails in float64" in without.stdout and "--reference pkg.mod:fn" in without.stdout


def test_reference_must_be_an_import_path(invoke):
    result = invoke(f"{KERNELS}.FusedGELU", "-i", "4:bfloat16", "--reference", "not a path")
    assert result.exit_code == 2 and "--reference" in result.output and "import path" in result.output


@pytest.mark.parametrize("factor, verdict", [(1, 0), (1.05, 1)])
def test_a_module_is_compared_with_a_reference_module_parameters_included(
    user_module, write_spec, invoke, factor, verdict
):
    mod = user_module(MODULES.replace("{factor}", str(factor)))
    write_spec(
        f"""
        function: {mod}:Kernel
        dtype: bfloat16
        init: {{args: [16]}}
        reference: {mod}:Plain
        inputs: [{{name: x, shape: [32, 16]}}]
    """,
        "specs/module.yaml",
    )
    result = invoke("specs/module.yaml", "--format", "json", "--no-isolate")
    assert result.exit_code == verdict, result.output
    rows = {r["name"]: r["status"] for r in json.loads(result.stdout)["results"][0]["checks"][0]["inputs"]}
    assert rows == {"x": "pass", "weight": "fail" if verdict else "pass", "output": "pass"}


@pytest.mark.parametrize(
    "spec, said",
    [
        (
            "reference: {mod}:OtherNames\ninit: {{args: [4]}}\nfunction: {mod}:Kernel",
            "reference: the parameters of '{mod}:OtherNames' (scale) are not those of '{mod}:Kernel' (weight)",
        ),
        (
            "reference: {mod}:Plain\nfunction: {mod}:FusedScale\ninputs: [{{shape: [4]}}, {{shape: [4]}}]",
            "reference: '{mod}:Plain' is an nn.Module class but '{mod}:FusedScale' is not",
        ),
        (
            "reference: {mod}:nothing_here\nfunction: {mod}:FusedScale\ninputs: [{{shape: [4]}}, {{shape: [4]}}]",
            "reference: '{mod}' has no attribute 'nothing_here'",
        ),
        (
            "reference_backward: {mod}:Plain\nfunction: {mod}:FusedScale\ninputs: [{{shape: [4]}}, {{shape: [4]}}]",
            "reference_backward: '{mod}:Plain' is a class",
        ),
        (
            "checks: [reference]\nfunction: {mod}:FusedScale\ninputs: [{{shape: [4]}}, {{shape: [4]}}]",
            "checks: the reference check needs a reference",
        ),
    ],
)
def test_a_reference_that_cannot_be_used_is_a_spec_error_naming_the_key(user_module, write_spec, invoke, spec, said):
    mod = user_module(MODULES.replace("{factor}", "1"))
    write_spec(spec.format(mod=mod) + "\ninputs: [{shape: [2, 4]}]\n" * ("inputs" not in spec), "specs/bad.yaml")
    result = invoke("specs/bad.yaml", "--format", "json", "--no-isolate")
    assert result.exit_code == 3, result.output
    assert said.format(mod=mod) in json.loads(result.stdout)["results"][0]["error"]["message"]


@pytest.mark.parametrize(
    "text, key, said",
    [
        ("reference_dtype: int64", "reference_dtype", "expected a floating dtype"),
        (
            "tolerance: {reference: {rule: relative, rtol: 0.1}}",
            "tolerance.reference.rtol",
            "does not apply to rule relative",
        ),
        ("tolerance: {reference: {rule: nearly}}", "tolerance.reference.rule", "unknown rule 'nearly'"),
        ("tolerance: {reference: {factor: 0}}", "tolerance.reference.factor", "positive"),
        ("tolerance: {reference: {factor: 2, rtol: 0.1}}", "tolerance.reference", "give `rule:`"),
        ("reference: not a path", "reference", "expected an import path"),
    ],
)
def test_bad_reference_keys_are_spec_errors(write_spec, invoke, text, key, said):
    path = write_spec(f"function: {KERNELS}:FusedGELU\n{text}\ninputs: [{{shape: [4]}}]\n")
    result = invoke(str(path), "--format", "json", "--no-isolate")
    assert result.exit_code == 3, result.output
    message = json.loads(result.stdout)["results"][0]["error"]["message"]
    assert f": {key}: " in message and said in message
