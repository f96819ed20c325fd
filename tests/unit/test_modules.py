"""nn.Module targets: built from the spec's ``init``, parameters checked like named arguments.

A correct module (LinearModule wrapping the tutorial's LinearFunction) passes, a module whose
Function doubles the weight gradient fails on ``weight`` alone, nested modules name their
parameters ``hidden.weight``, constructor errors name ``init``, and the verdicts agree with
``torch.autograd.gradcheck`` on the module's functional form.
"""

from __future__ import annotations

import json

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.checks import backward
from gradcheck_cli.checks.parts.base import CheckContext, Options
from gradcheck_cli.numerics.streams import Streams
from gradcheck_cli.results import Status
from gradcheck_cli.run import runner
from gradcheck_cli.spec import Tolerance, load_file
from gradcheck_cli.subject import loader
from gradcheck_cli.subject.binding import bind
from gradcheck_cli.subject.nn_module import init_target
from gradcheck_cli.subject.target import Target

MODULES = "gradcheck_cli.examples.modules"

USER = """
    import torch

    class Raises(torch.nn.Module):
        def __init__(self, size):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(size))
            raise RuntimeError("cannot build the layer")

        def forward(self, x):
            return x * self.weight

    class ForwardRaises(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            raise ValueError("bad shape in forward")

    class Scaled(torch.nn.Module):
        \"\"\"y = scale * x * weight + shift, with a frozen parameter and a buffer.\"\"\"

        def __init__(self, size=3, *, init_scale=1.0):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(size) * init_scale)
            self.shift = torch.nn.Parameter(torch.randn(size), requires_grad=False)
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

        def forward(self, x, scale=1.0):
            return scale * x * self.weight + self.shift + self.count

    class Tied(torch.nn.Module):
        \"\"\"One Parameter registered twice (tied weights): y = x * a + x * inner.w, with inner.w is a.\"\"\"

        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(3))
            self.inner = torch.nn.Module()
            self.inner.w = self.a

        def forward(self, x):
            return x * self.a + 3 * x * self.inner.w
"""


@pytest.fixture
def user(user_module) -> str:
    return user_module(USER, "usermods")


def check_spec(write_spec, text: str, device: str = "cpu"):
    """Run the single case of a spec text through the runner."""
    (case,) = load_file(write_spec(text))
    return runner.run_case(case, device)


def rows(result) -> dict:
    return {r.name: r for r in result.checks[0].inputs}


def built(path: str, *args, seed: int = 0, dtype: str = "float64", **kwargs) -> Target:
    target = loader.load(path)
    init_target(target, args, kwargs, Streams(seed), dtype, "cpu")
    return target


# ----------------------------------------------------------------------- verdicts


LINEAR = f"""
    function: {MODULES}:LinearModule
    init: {{args: [4, 3]}}
    inputs: [{{name: input, shape: [5, 4]}}]
"""


def test_correct_module_passes_with_rows_named_after_its_parameters(write_spec):
    result = check_spec(write_spec, LINEAR)
    assert result.status is Status.PASS, result.error
    got = [(r.index, r.name, r.shape, r.status) for r in result.checks[0].inputs]
    assert got == [(0, "input", [5, 4], Status.PASS), (1, "weight", [3, 4], Status.PASS), (2, "bias", [3], Status.PASS)]


def test_broken_parameter_gradient_is_named(write_spec):
    result = check_spec(write_spec, LINEAR.replace(":LinearModule", ":LinearModuleWrongWeight"))
    assert result.status is Status.FAIL
    by = rows(result)
    assert by["weight"].status is Status.FAIL and by["weight"].mismatched == 12
    assert by["input"].status is Status.PASS and by["bias"].status is Status.PASS
    assert "gradient of 'weight'" in result.checks[0].message and "2.00x" in result.checks[0].message


def test_kwargs_in_init_reach_the_constructor(write_spec):
    result = check_spec(
        write_spec, LINEAR.replace("{args: [4, 3]}", "{args: [4], kwargs: {out_features: 2, bias: false}}")
    )
    assert result.status is Status.PASS, result.error
    assert [(r.name, r.shape) for r in result.checks[0].inputs] == [("input", [5, 4]), ("weight", [2, 4])]


def test_nested_modules_name_parameters_by_their_path(write_spec):
    text = f"""
        function: {MODULES}:MLP
        init: {{kwargs: {{sizes: [4, 5, 3], wrong_out: %s}}}}
        inputs: [{{shape: [3, 4]}}]
    """
    good = check_spec(write_spec, text % "false")
    assert good.status is Status.PASS, good.error
    assert [r.name for r in good.checks[0].inputs] == [
        "input",
        "hidden.weight",
        "hidden.bias",
        "out.weight",
        "out.bias",
    ]
    assert [r.index for r in good.checks[0].inputs] == [0, 1, 2, 3, 4]
    bad = check_spec(write_spec, text % "true")
    assert bad.status is Status.FAIL
    assert [r.name for r in bad.checks[0].inputs if r.status is Status.FAIL] == ["out.weight"]


def test_frozen_parameter_is_skipped_and_indices_follow_forwards_parameters(user, write_spec):
    result = check_spec(
        write_spec,
        f"""
        function: {user}:Scaled
        init: {{kwargs: {{size: 4}}}}
        inputs: [{{shape: [4]}}]
        kwargs: {{scale: {{value: 2.0}}}}
    """,
    )
    assert result.status is Status.PASS, result.error
    got = [(r.index, r.name, r.status) for r in result.checks[0].inputs]
    # forward(x, scale): parameters are numbered after both, even though scale is not a tensor
    assert got == [
        (0, "x", Status.PASS),
        (1, "scale", Status.SKIP),
        (2, "weight", Status.PASS),
        (3, "shift", Status.SKIP),
    ]
    assert rows(result)["shift"].reason == "requires_grad is false"


def test_tied_parameters_are_one_argument_replaced_everywhere(user):
    target = built(f"{user}:Tied")
    x = torch.randn(3, dtype=torch.float64)
    bound = bind(target, [(None, x)], [])
    assert bound.names == ["x", "a"]
    a = bound.values[1].detach().clone().requires_grad_()
    out = target.call([x, a], 1, [])
    reference = torch.func.functional_call(target.module, {"a": a}, (x,))
    assert torch.equal(out, reference)
    (grad,) = torch.autograd.grad(out.sum(), a)
    assert torch.allclose(grad, 4 * x)  # both uses see the replacement
    assert target.module.a is target.module.inner.w and target.module.a is not a  # restored after the call


def test_module_and_its_parameters_are_left_unchanged_by_a_check(write_spec):
    (case,) = load_file(write_spec(LINEAR))
    target = loader.load(case.function)
    init_target(target, case.init_args, dict(case.init_kwargs), Streams(0), "float64", "cpu")
    before = {n: p.detach().clone() for n, p in target.module.named_parameters()}
    bound = bind(target, [(None, torch.randn(5, 4, dtype=torch.float64, requires_grad=True))], [])
    assert backward.run(CheckContext(target, bound, options=Options(Tolerance()))).status is Status.PASS
    for n, p in target.module.named_parameters():
        assert isinstance(p, torch.nn.Parameter) and torch.equal(p, before[n]) and p.grad is None


# ----------------------------------------------------------------------- construction


def test_parameters_are_deterministic_from_the_seed_and_leave_the_global_rng_alone():
    state = torch.get_rng_state()
    a = built(f"{MODULES}:LinearModule", 4, 3, seed=7).module
    b = built(f"{MODULES}:LinearModule", 4, 3, seed=7).module
    c = built(f"{MODULES}:LinearModule", 4, 3, seed=8).module
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert not torch.equal(a.weight, c.weight)


def test_dtype_and_device_of_the_case(write_spec):
    target = built(f"{MODULES}:LinearModule", 4, 3, dtype="float32")
    assert target.module.weight.dtype == torch.float32 and target.module.weight.device.type == "cpu"
    result = check_spec(write_spec, LINEAR + "    dtype: float64\n")
    assert {r.dtype for r in result.checks[0].inputs} == {"float64"}
    result32 = check_spec(write_spec, LINEAR.replace("inputs:", "dtype: float32\n    inputs:"))
    assert {r.dtype for r in result32.checks[0].inputs} == {"float32"}
    assert result32.status.value == "pass", result32.checks[0].message  # against a float64 reference
    assert any("float32" in w and "reference" in w for w in result32.checks[0].warnings)


def test_module_is_copied_once_per_other_device(user):
    target = built(f"{user}:Scaled", 3)
    assert target.on(None)[0] is target.module and target.on("cpu")[0] is target.module
    meta = target.on("meta")[0]
    assert meta is not target.module and meta.weight.device.type == "meta" and target.on("meta")[0] is meta
    assert target.module.weight.device.type == "cpu"


@pytest.mark.cuda
def test_module_on_cuda_and_device_consistency(write_spec):
    result = check_spec(
        write_spec, LINEAR + "    device: [cpu, cuda]\n    checks: [backward, device_consistency]\n", device="cuda"
    )
    assert result.status is Status.PASS, result.error
    assert [r.name for r in result.checks[1].inputs] == ["input", "weight", "bias"]


def test_constructor_that_raises_names_init_and_the_users_line(user, write_spec):
    result = check_spec(
        write_spec,
        f"""
        function: {user}:Raises
        init: {{args: [3]}}
        inputs: [{{shape: [3]}}]
    """,
    )
    assert result.status is Status.ERROR
    assert result.error.kind == "init"
    assert "init: Raises(3) raised RuntimeError: cannot build the layer" in result.error.message
    assert result.error.where.startswith(f"{user}.py:8") and "raise RuntimeError" in result.error.where


@pytest.mark.parametrize(
    "init, key, words",
    [
        ("{kwargs: {in_feature: 4, out_features: 3}}", "init.kwargs.in_feature", ["did you mean 'in_features'"]),
        (
            "{args: [4, 3, true, 9]}",
            "init.args",
            ["too many positional", "LinearModule(in_features, out_features, bias=True)"],
        ),
        ("{args: [4]}", "init", ["missing a required argument: 'out_features'"]),
        ("{args: [4], kwargs: {in_features: 4}}", "init", ["multiple values for argument 'in_features'"]),
    ],
)
def test_wrong_init_arguments_are_spec_errors_naming_the_key(write_spec, init, key, words):
    result = check_spec(write_spec, LINEAR.replace("{args: [4, 3]}", init))
    assert result.status is Status.ERROR and result.error.kind == "spec"
    assert f": {key}: " in result.error.message
    for w in words:
        assert w in result.error.message


def test_init_for_a_function_is_a_spec_error(write_spec):
    result = check_spec(
        write_spec,
        """
        function: gradcheck_cli.examples.linear:LinearFunction
        init: {args: [4, 3]}
        inputs: [{shape: [5, 4]}, {shape: [3, 4]}]
    """,
    )
    assert result.status is Status.ERROR and result.error.kind == "spec"
    assert "init: " in result.error.message and "not an nn.Module" in result.error.message


def test_forward_that_raises_is_a_forward_error_with_the_users_line(user, write_spec):
    result = check_spec(
        write_spec,
        f"""
        function: {user}:ForwardRaises
        inputs: [{{shape: [3]}}]
    """,
    )
    assert result.status is Status.ERROR and result.error.kind == "forward"
    assert "ValueError: bad shape in forward" in result.error.message
    assert result.error.where.startswith(f"{user}.py:19")


# ----------------------------------------------------------------------- agreement with torch


def functional(target: Target):
    """The module as a function of (input, *parameters), for torch.autograd.gradcheck."""
    names = target.param_names
    return lambda x, *params: torch.func.functional_call(target.module, dict(zip(names, params)), (x,))


@pytest.mark.parametrize(
    "name, init, correct",
    [("LinearModule", (4, 3), True), ("LinearModuleWrongWeight", (4, 3), False), ("MLP", ((4, 5, 3),), True)],
)
def test_verdicts_agree_with_torch_on_the_functional_form(name, init, correct):
    target = built(f"{MODULES}:{name}", *init)
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in target.module.parameters()]
    torch_says = torch.autograd.gradcheck(functional(target), (x, *params), raise_exception=False)
    ours = gradcheck_cli.check(functional(target), [x, *params])
    as_module = backward.run(CheckContext(target, bind(target, [(None, x)], []), options=Options(Tolerance())))
    assert torch_says is correct
    assert (ours.status is Status.PASS) is correct, ours.checks[0].message
    assert (as_module.status is Status.PASS) is correct, as_module.message


def test_broken_example_is_wrong_for_the_weight_only_according_to_torch():
    target = built(f"{MODULES}:LinearModuleWrongWeight", 4, 3)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w, b = (p.detach().clone() for p in target.module.parameters())
    fn = functional(target)
    assert torch.autograd.gradcheck(lambda x: fn(x, w, b), (x,), raise_exception=False)
    assert torch.autograd.gradcheck(lambda b: fn(x.detach(), w, b), (b.requires_grad_(),), raise_exception=False)
    assert not torch.autograd.gradcheck(
        lambda w: fn(x.detach(), w, b.detach()), (w.requires_grad_(),), raise_exception=False
    )


# ----------------------------------------------------------------------- command line


def test_cli_json_rows_are_named_weight_and_bias(write_spec, invoke):
    path = write_spec(LINEAR.replace(":LinearModule", ":LinearModuleWrongWeight"))
    result = invoke(str(path), "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    (entry,) = json.loads(result.stdout)["results"]
    (check,) = entry["checks"]
    got = [(r["index"], r["name"], r["shape"], r["status"]) for r in check["inputs"]]
    assert got == [(0, "input", [5, 4], "pass"), (1, "weight", [3, 4], "fail"), (2, "bias", [3], "pass")]
    assert "'weight'" in check["message"]


def test_cli_init_error_exits_3_and_names_init(user, write_spec, invoke):
    path = write_spec(f"""
        function: {user}:Raises
        init: {{args: [3]}}
        inputs: [{{shape: [3]}}]
    """)
    result = invoke(str(path), "--no-isolate", "--format", "json")
    assert result.exit_code == 3
    (entry,) = json.loads(result.stdout)["results"]
    assert entry["error"]["kind"] == "init" and entry["error"]["where"].startswith(f"{user}.py:8")


def test_cli_inline_inputs_for_a_module_without_init_args(invoke):
    result = invoke(f"{MODULES}.MLP", "-i", "2x4", "--no-isolate", "--format", "json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)["results"]
    assert [r["name"] for r in entry["checks"][0]["inputs"]] == [
        "input",
        "hidden.weight",
        "hidden.bias",
        "out.weight",
        "out.bias",
    ]


def test_cli_inline_inputs_for_a_module_that_needs_init_args_says_so(invoke):
    result = invoke(f"{MODULES}.LinearModule", "-i", "5x4", "--no-isolate", "--format", "json")
    assert result.exit_code == 3
    (entry,) = json.loads(result.stdout)["results"]
    assert "init" in entry["error"]["message"] and "in_features" in entry["error"]["message"]


def test_init_command_writes_the_constructor_arguments_of_a_module(tmp_path, monkeypatch, invoke):
    monkeypatch.chdir(tmp_path)
    result = invoke("init", f"{MODULES}.LinearModule", "-o", "specs/linear_module.yaml")
    assert result.exit_code == 0, result.output
    path = tmp_path / "specs" / "linear_module.yaml"
    text = path.read_text()
    assert "# in_features: ...   # required" in text and "    bias: true" in text
    assert "  - name: input" in text and "self" not in text
    unset = invoke(str(path), "--no-isolate", "--format", "json")
    assert unset.exit_code == 3 and "missing a required argument: 'in_features'" in unset.stdout
    text = text.replace("# in_features: ...", "in_features: 5").replace("# out_features: ...", "out_features: 2")
    path.write_text(text)
    done = invoke(str(path), "--no-isolate", "--format", "json")
    assert done.exit_code == 0, done.output
    names = [r["name"] for r in json.loads(done.stdout)["results"][0]["checks"][0]["inputs"]]
    assert names == ["input", "weight", "bias"]
