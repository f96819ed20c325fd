"""Custom ops (issue 16, item 1): `import:` / --import, torch.ops.ns.op targets (packet, overload,
CustomOpDef) named from their schema, `gradcheck init` from the schema, forward_ad without a forward-AD
rule, the opcheck check, vmap's fallback warning; verdicts agree with torch.autograd.gradcheck and
torch.library.opcheck on the same inputs."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.examples import custom_ops
from gradcheck_cli.results import Status
from gradcheck_cli.sandbox.errors import LoadError
from gradcheck_cli.subject import loader
from gradcheck_cli.subject.custom_op import OpTarget

EXAMPLES = "gradcheck_cli.examples.custom_ops"
OPS = "torch.ops.gradcheck_examples"
_namespaces = itertools.count()


def unique_namespace() -> str:
    """An op namespace no other test of this process registered (an op name registers once per process)."""
    return f"gcl_test_{next(_namespaces)}_{id(_namespaces)}"


def rows(result, name):
    (found,) = [c for c in result.checks if c.check == name]
    return found, {r.name: r for r in found.inputs}


def draw(*shape, positive=False):
    g = torch.Generator().manual_seed(0)
    x = (
        torch.rand(*shape, generator=g, dtype=torch.float64)
        if positive
        else torch.randn(*shape, generator=g, dtype=torch.float64)
    )
    return x.requires_grad_()


# ------------------------------------------------------------------ targets and their parameters


@pytest.mark.parametrize("path", [f"{OPS}.scaled_linear", f"{OPS}.scaled_linear.default", f"{EXAMPLES}:scaled_linear"])
def test_an_op_packet_overload_or_custom_op_def_loads_with_the_schemas_parameters(path):
    target = loader.load(path)
    assert isinstance(target, OpTarget) and target.name == "gradcheck_examples::scaled_linear"
    params = target.parameters()
    assert [(p.name, p.annotation, p.default) for p in params] == [
        ("x", "Tensor", params[0].empty),
        ("weight", "Tensor", params[0].empty),
        ("bias", "Tensor?", None),
        ("scale", "float", 1.0),
    ]


def test_an_unregistered_op_says_to_import_the_module_that_registers_it():
    with pytest.raises(LoadError, match=r"no operator 'nowhere_ns::op' is registered.*`import: \[my_pkg.ops\]`"):
        loader.load("torch.ops.nowhere_ns.op")
    with pytest.raises(LoadError, match="has no overload 'nope'; its overloads: default"):
        loader.load(f"{OPS}.softplus.nope")


def test_rows_are_named_from_the_schema_not_args_and_kwargs(user_module, write_spec, invoke):
    write_spec(
        f"""
        function: {OPS}.scaled_linear
        import: [{EXAMPLES}]
        inputs: [{{shape: [5, 4]}}, {{shape: [3, 4]}}]
        kwargs: {{bias: {{shape: [3]}}, scale: {{value: 0.5}}}}
    """,
        "specs/op.yaml",
    )
    user_module("")  # moves into tmp_path
    report = json.loads(invoke("specs/op.yaml", "--no-isolate", "--format", "json").stdout)
    (result,) = report["results"]
    assert result["status"] == "pass", result
    assert [(r["index"], r["name"]) for r in result["checks"][0]["inputs"]] == [
        (0, "x"),
        (1, "weight"),
        (2, "bias"),
        (3, "scale"),
    ]


# ---------------------------------------------------------------------------- import: and --import


def test_import_key_and_option_import_before_the_target_is_resolved(user_module, write_spec, invoke):
    ns = unique_namespace()
    user_module(
        f"""
        import torch
        @torch.library.custom_op("{ns}::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return 2 * x
        twice.register_fake(lambda x: torch.empty_like(x))
        twice.register_autograd(lambda ctx, g: 2 * g)
    """,
        "userops",
    )
    write_spec(f"function: torch.ops.{ns}.twice\nimport: userops\ninputs: [{{shape: [3]}}]\n", "specs/twice.yaml")
    assert invoke("specs/twice.yaml", "--no-isolate").exit_code == 0
    inline = invoke(f"torch.ops.{ns}.twice", "-i", "3", "--import", "userops", "--no-isolate", "--no-color", "-v")
    assert inline.exit_code == 0, inline.output
    assert "0: x" in inline.stdout


@pytest.mark.parametrize(
    "value, key, message",
    [
        ("[no_such_module_xyz]", "import", "cannot import 'no_such_module_xyz' (listed in `import`): no module named"),
        ("'pkg.mod:fn'", "import", "expected a module name like 'my_pkg.ops'"),
        ("{a: 1}", "import", "expected a module name or a list of them"),
    ],
)
def test_bad_import_entries_are_errors_that_name_the_import_key(write_spec, invoke, monkeypatch, value, key, message):
    path = write_spec(f"function: {OPS}.softplus\nimport: {value}\ninputs: [{{shape: [3]}}]\n")
    monkeypatch.chdir(path.parent)
    result = invoke("spec.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 3
    (error,) = [r["error"] for r in json.loads(result.stdout)["results"]]
    assert f"{key}" in error["message"] and message in error["message"], error
    assert error["kind"] == ("import" if "cannot import" in message else "spec")


def test_import_option_that_cannot_be_imported_names_the_option(write_spec, invoke, monkeypatch):
    path = write_spec(f"function: {OPS}.softplus\nimport: {EXAMPLES}\ninputs: [{{shape: [3]}}]\n")
    monkeypatch.chdir(path.parent)
    result = invoke("spec.yaml", "--import", "no_such_module_xyz", "--no-isolate", "--format", "json")
    (error,) = [r["error"] for r in json.loads(result.stdout)["results"]]
    assert result.exit_code == 3 and error["kind"] == "import" and "--import: cannot import" in error["message"]
    assert invoke("spec.yaml", "--import", "pkg:fn").exit_code == 2


# ----------------------------------------------------------------------------------------- init


def test_init_writes_the_inputs_from_the_schema(tmp_path, monkeypatch, invoke):
    monkeypatch.chdir(tmp_path)
    result = invoke("init", f"{OPS}.scaled_linear", "--import", EXAMPLES, "-o", "specs/op.yaml")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "specs/op.yaml").read_text()
    assert f"import: [{EXAMPLES}]" in text
    assert "- {name: x, shape: [4, 5]}" in text and "- {name: weight, shape: [4, 5]}" in text
    assert "bias: {value: null}   # Tensor?" in text and "scale: {value: 1.0}   # float" in text
    ran = invoke("specs/op.yaml", "--no-isolate")  # valid as written: the placeholder shapes fit
    assert ran.exit_code == 0, ran.output
    missing = invoke("init", "torch.ops.nowhere_ns.op")
    assert missing.exit_code == 3 and "--import my_pkg.ops" in missing.output


# ------------------------------------------------------------------------------------- forward_ad


def test_forward_ad_says_the_op_has_no_forward_ad_rule():
    x = draw(3, 4)
    named = check(custom_ops.softplus, [x], {"beta": 2.0}, checks=["forward_ad"])
    (fwd,) = named.checks
    assert fwd.status is Status.FAIL and "has no forward-AD rule" in fwd.message
    assert "jvp does not use its tangent" not in fwd.message
    under_all = check(custom_ops.softplus, [x], {"beta": 2.0}, checks=["all"])
    assert {c.check: c.status for c in under_all.checks}["forward_ad"] is Status.SKIP


# ---------------------------------------------------------------------------------------- opcheck


def test_opcheck_of_a_function_that_is_not_an_op_skips_under_all_and_fails_when_named():
    named = check(torch.sin, [draw(3)], checks=["opcheck"])
    assert named.checks[0].status is Status.FAIL and "is not a custom op" in named.checks[0].message
    under_all = check(torch.sin, [draw(3)], checks=["all"])
    assert {c.check: c.status for c in under_all.checks}["opcheck"] is Status.SKIP


CORPUS = [  # (op, args, kwargs, gradients right, registration right)
    (custom_ops.scaled_linear, lambda: [draw(5, 4), draw(3, 4)], {"bias": draw(3), "scale": 0.5}, True, True),
    (custom_ops.softplus, lambda: [draw(4, 5)], {"beta": 2.0}, True, True),
    (custom_ops.softplus_forgets_beta, lambda: [draw(4, 5)], {"beta": 2.0}, False, True),
    (custom_ops.row_sum_wrong_fake, lambda: [draw(4, 5)], {}, True, False),
    (custom_ops.double_and_count, lambda: [draw(4, 5), torch.zeros((), dtype=torch.int64)], {}, True, False),
]


@pytest.mark.parametrize(
    "op, args, kwargs, grads_right, registration_right",
    CORPUS,
    ids=[str(c[0]).split("::")[1].rstrip(")>") for c in CORPUS],
)
def test_verdicts_agree_with_torch_gradcheck_and_opcheck_on_the_same_inputs(
    op, args, kwargs, grads_right, registration_right
):
    values = args()
    result = check(op, values, kwargs, checks=["backward", "opcheck"])
    backward, (opcheck, tests) = result.checks[0], rows(result, "opcheck")
    fresh = [v.detach().clone().requires_grad_(v.requires_grad) for v in values]
    torch_grad = torch.autograd.gradcheck(lambda *a: op(*a, **kwargs), fresh, raise_exception=False)
    again = [v.detach().clone().requires_grad_(v.requires_grad) for v in values]
    torch_op = torch.library.opcheck(op, tuple(again), kwargs, raise_exception=False)
    assert torch_grad is grads_right and (backward.status is Status.PASS) is grads_right
    assert all(v == "SUCCESS" for v in torch_op.values()) is registration_right
    assert (opcheck.status is Status.PASS) is registration_right
    assert {name: row.status is Status.PASS for name, row in tests.items()} == {
        name: outcome == "SUCCESS" for name, outcome in torch_op.items()
    }  # one row per test, the same verdicts


def test_opcheck_rows_say_what_failed_each_test_on_its_own():
    result = check(custom_ops.row_sum_wrong_fake, [draw(4, 5)], checks=["opcheck"])
    opcheck, tests = rows(result, "opcheck")
    assert list(tests) == ["test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"]
    assert tests["test_schema"].status is Status.PASS  # a failing test hides no other
    assert tests["test_faketensor"].status is Status.FAIL and "Shapes" in (tests["test_faketensor"].reason or "")
    assert "register_fake" in opcheck.message
    mutation = check(custom_ops.double_and_count, [draw(4), torch.zeros((), dtype=torch.int64)], checks=["opcheck"])
    _, tests = rows(mutation, "opcheck")
    assert "calls is not defined as mutable but was mutated" in (tests["test_schema"].reason or "")


# ----------------------------------------------------------------------------- vmap's fallback warning


def test_vmap_fallback_warnings_become_one_warning_of_the_batched_check(capfd):
    result = check(custom_ops.softplus, [draw(3, 4)], {"beta": 2.0}, checks=["backward", "batched"])
    assert result, result
    assert "performance drop" not in capfd.readouterr().err
    (batched,) = [c for c in result.checks if c.check == "batched"]
    assert len(batched.warnings) == 1 and "no batching rule for gradcheck_examples::softplus" in batched.warnings[0]
