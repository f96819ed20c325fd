"""Wrong verdicts found while restructuring, each with the test that failed before its fix."""

from __future__ import annotations

import json

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Status


def test_an_output_that_is_a_view_of_the_input_is_read_moved_at_a_kink():
    # relu at 0 sends the element to the kink examination, whose one-sided steps read the outputs;
    # the first output is a view of x, so it must be read while x is moved (it was read after x was
    # put back: "one-sided derivatives 0 and 0, backward gives 1", a correct gradient called wrong)
    x = torch.tensor([0.5, 0.0, -1.0], dtype=torch.float64, requires_grad=True)
    result = check(lambda x: (x.view(3), torch.relu(x)), [x])
    assert result.status is Status.PASS, result.checks[0].message
    row = result.checks[0].inputs[0]
    assert row.at_kinks == 1 and row.mismatched == 0


RETURNS = """
import torch


def returns_none(x):
    y = x * 2


def returns_int(x):
    return 3


def returns_dict(x):
    return {"y": x * 2}


def returns_floats(x):
    return [float(x.sum()), 2.0]


def returns_list_of_tensors(x):
    return [x * 2, x.sin()]


class NoReturn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 5  # wrong, and never called when forward returns nothing
"""


@pytest.mark.parametrize(
    "name, said",
    [
        ("returns_none", "forward returned None"),
        ("returns_int", "forward returned an int (3)"),
        ("returns_dict", "forward returned a dict"),
        ("returns_floats", "forward returned a list of 2 floats"),
        ("NoReturn", "forward returned None"),
    ],
)
def test_a_forward_that_returns_no_tensor_is_an_error_that_says_what_it_returned(
    user_module, write_spec, invoke, name, said
):
    # it used to pass ("1 argument checked, all within tolerance") with backward never called
    user_module(RETURNS)
    write_spec(f"function: usermod:{name}\ninputs: [{{shape: [3]}}]\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout)["results"][0]["error"]
    assert (
        error["kind"] == "forward" and said in error["message"] and "tensor or a tuple of tensors" in error["message"]
    )


def test_a_list_of_tensors_is_a_fine_return(user_module, write_spec, invoke):
    user_module(RETURNS)
    write_spec("function: usermod:returns_list_of_tensors\ninputs: [{shape: [3]}]\n", "specs/s.yaml")
    assert invoke("specs/s.yaml", "--no-isolate").exit_code == 0


@pytest.mark.parametrize(
    "function, value",
    [("os:system", "touch pwned"), ("builtins:eval", "open('pwned', 'w')"), ("pathlib:Path.touch", "pwned")],
)
def test_a_spec_with_no_argument_that_requires_grad_never_calls_its_target(
    write_spec, invoke, tmp_path, monkeypatch, function, value
):
    # it used to run the command, report SKIP and exit 0
    monkeypatch.chdir(tmp_path)
    write_spec(f"function: {function}\ninputs: [{{value: {json.dumps(value)}}}]\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 3, result.output
    assert not (tmp_path / "pwned").exists()
    error = json.loads(result.stdout)["results"][0]["error"]
    assert error["kind"] == "spec" and "was not called" in error["message"] and "requires grad" in error["message"]


def test_a_tensor_that_does_not_require_grad_is_not_enough(write_spec, invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_spec(
        "function: gradcheck_cli.examples.relu:ReLU\ninputs: [{shape: [3], requires_grad: false}]\n", "specs/s.yaml"
    )
    result = invoke("specs/s.yaml", "--no-isolate")
    assert result.exit_code == 3 and "no argument is a tensor that requires grad" in result.stdout


@pytest.mark.parametrize(
    "checks, options, code, status",
    [
        ("[backward, forward_ad]", [], 1, "fail"),  # named in the spec: asked for, so it fails (was a skip, exit 0)
        ("all", [], 0, "skip"),  # every applicable check: not applicable is a skip
        ("[backward]", ["--check", "forward_ad"], 1, "fail"),  # named on the command line
        ("[backward]", ["--check", "all"], 0, "skip"),
    ],
)
def test_a_check_the_function_cannot_support_fails_when_named_and_skips_under_all(
    write_spec, invoke, tmp_path, monkeypatch, checks, options, code, status
):
    monkeypatch.chdir(tmp_path)  # corpus.Sin: first order only, no jvp
    write_spec(f"function: corpus:Sin\nchecks: {checks}\ninputs: [{{shape: [3]}}]\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json", *options)
    assert result.exit_code == code, result.output
    (res,) = json.loads(result.stdout)["results"]
    forward_ad = next(c for c in res["checks"] if c["check"] == "forward_ad")
    assert forward_ad["status"] == status and "defines no jvp()" in forward_ad["message"]
    if options:  # the replay command repeats what was asked: `--check all` stays `all`
        assert res["replay"].endswith(" ".join(options))


IN_PLACE = """
import torch


class ScalesInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)  # in place, without ctx.mark_dirty
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


class Mul2Wrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3  # wrong: 3x instead of 2x


class Mul2WrongBeside(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3, None  # wrong: 3x instead of 2x
"""


def test_forward_that_modifies_its_input_is_named_as_forward_not_backward(user_module, write_spec, invoke):
    # the snapshot was taken before forward: "backward modified input 'x' in place" was the message
    user_module(IN_PLACE)
    write_spec("function: usermod:ScalesInput\ninputs: [{name: x, shape: [3]}]\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    message = json.loads(result.stdout)["results"][0]["checks"][0]["message"]
    assert "forward modified 'x' in place without ctx.mark_dirty" in message
    assert "backward modified" not in message


def test_an_input_holding_nan_is_not_called_modified_and_the_wrong_gradient_is_still_reported(
    user_module, write_spec, invoke
):
    # torch.equal calls NaN unequal to itself: "backward modified input 'x' in place" (fatal) hid a wrong gradient
    user_module(IN_PLACE)
    # (NaN in an input that requires grad is a spec error since issue 27: here it sits in one that does not)
    write_spec(
        "function: usermod:Mul2WrongBeside\ninputs: [{name: x, data: [0.0, 1.0, 2.0]}, "
        "{name: m, data: [.nan, 1.0, 2.0], requires_grad: false}]\n",
        "specs/s.yaml",
    )
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    (check,) = json.loads(result.stdout)["results"][0]["checks"]
    assert "in place" not in check["message"]
    row = check["inputs"][0]
    assert (
        row["status"] == "fail" and row["analytical"] == pytest.approx(3.0) and row["numerical"] == pytest.approx(2.0)
    )


NUMPY_BACKWARD = """
import torch


class NumpyBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):  # right at first order, but not differentiable (NumPy)
        (x,) = ctx.saved_tensors
        return torch.from_numpy(g.numpy() * x.cos().numpy())


class AlwaysRaises(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("broken backward")
"""


def test_a_backward_that_cannot_be_differentiated_fails_double_backward_and_the_other_checks_run(
    user_module, write_spec, invoke
):
    # it was an error of the whole case (exit 3), and the checks after it never ran
    user_module(NUMPY_BACKWARD)
    write_spec(
        "function: usermod:NumpyBackward\nchecks: [backward, double_backward, undefined_grad]\n"
        "inputs: [{shape: [3]}]\n",
        "specs/s.yaml",
    )
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    (res,) = json.loads(result.stdout)["results"]
    assert res["error"] is None
    status = {c["check"]: c["status"] for c in res["checks"]}
    assert status == {"backward": "pass", "double_backward": "fail", "undefined_grad": "pass"}
    message = next(c["message"] for c in res["checks"] if c["check"] == "double_backward")
    assert message.startswith("backward cannot be differentiated") and "numpy()" in message


def test_a_backward_that_always_raises_is_a_fail_of_kind_backward(user_module, write_spec, invoke):
    """issue 44: it was an error of the case (exit 3, "a spec could not be checked"); forward ran and backward
    raised on what it gave, so the Function is wrong (exit 1)"""
    user_module(NUMPY_BACKWARD)
    write_spec("function: usermod:AlwaysRaises\nchecks: [double_backward]\ninputs: [{shape: [3]}]\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    (res,) = json.loads(result.stdout)["results"]
    assert res["error"] is None and res["status"] == "fail"
    (check,) = res["checks"]
    assert check["message"].startswith("backward raised ValueError: broken backward at usermod.py:"), check["message"]


def test_batched_on_a_64_dimensional_tensor_is_unsupported_not_a_wrong_gradient():
    # vmap's extra dimension made 65: torch's internal assert read as "batched backward failed", a
    # correct Function failed under `checks: all`
    x = torch.rand([1] * 64, dtype=torch.float64, requires_grad=True)
    every = check(lambda x: x * 2, [x], checks=["all"])
    assert every.status is Status.PASS, [(c.check, c.message) for c in every.checks]
    batched = next(c for c in every.checks if c.check == "batched")
    assert batched.status is Status.SKIP and "at most 64" in batched.message
    named = check(lambda x: x * 2, [x], checks=["batched"])
    assert named.status is Status.FAIL and "named explicitly" in named.checks[0].message


@pytest.mark.parametrize(
    "numerical, said", [(0.0, "zero_numerical"), (1e-10, "zero_numerical"), (2e-8, "some_elements")]
)
def test_a_numerical_gradient_at_rounding_level_is_zero_for_the_diagnosis(numerical, said):
    """Batched forwards round each batch row in their own way: an input the outputs do not depend on gets
    differences of about 1e-10, which the diagnosis takes as zero (below atol / 1000), and nothing larger."""
    from gradcheck_cli.checks.parts.diagnosis import describe
    from gradcheck_cli.numerics import ArgumentComparison

    entry = ArgumentComparison(65, atol=1e-5, rtol=1e-3)
    entry.sum_aa, entry.sum_nn, entry.sum_an = 9e-10, 65 * numerical**2, 3e-5 * numerical
    found = describe(entry, mismatched=1, numel=65)
    assert found is not None and found.pattern.value == said, found


COUPLING = 9e-5  # below float32's atol (1e-4), well above float64's (1e-5)


class Coupled(torch.autograd.Function):
    """y = x * w + COUPLING * sum(w), in w's dtype."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.to(w.dtype) * w + COUPLING * w.sum()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g * w).to(x.dtype), g * x.to(w.dtype) + COUPLING * g.sum()


class CouplingForgotten(Coupled):
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g * w).to(x.dtype), g * x.to(w.dtype)  # forgets COUPLING * sum(g) in w's gradient


def _coupled_args(x_dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # 16 elements: at 6, --fast's probes miss this coupling at some seeds (a probe's rtol |v^T J u| covers it)
    x = torch.randn(16, generator=g, dtype=torch.float64).to(x_dtype).requires_grad_()
    return [x, torch.randn(16, generator=g, dtype=torch.float64).requires_grad_()]


@pytest.mark.parametrize("probes", [0, 4])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16, torch.float64])
def test_a_low_precision_argument_leaves_the_float64_ones_their_own_tolerance(x_dtype, probes):
    # one float32 argument moved every argument to float32's tolerance (atol 1e-4), so the forgotten 9e-5
    # coupling in float64 'w' passed; with 'x' in float64 the same backward failed
    args = _coupled_args(x_dtype)
    wrong = check(CouplingForgotten, args, probes=probes)
    assert wrong.status is Status.FAIL, wrong.checks[0].message
    x_row, w_row = wrong.checks[0].inputs
    assert (w_row.status, w_row.atol, w_row.rtol) == (Status.FAIL, 1e-5, 1e-3)
    low = {torch.float32: (1e-4, 1e-3), torch.float16: (1e-2, 1e-2), torch.float64: (1e-5, 1e-3)}[x_dtype]
    assert (x_row.status, x_row.atol, x_row.rtol) == (Status.PASS, *low)
    right = check(Coupled, args, probes=probes)
    assert right.status is Status.PASS, right.checks[0].message
    assert [(r.atol, r.rtol) for r in right.checks[0].inputs] == [low, (1e-5, 1e-3)]
    float64 = [a.detach().double().requires_grad_() for a in args]
    assert not torch.autograd.gradcheck(CouplingForgotten.apply, float64, raise_exception=False)
    assert torch.autograd.gradcheck(Coupled.apply, float64)


def test_a_low_precision_argument_says_the_others_keep_their_tolerance():
    (note,) = check(Coupled, _coupled_args(torch.float32)).checks[0].warnings
    assert note == (
        "'x' is float32: the numerical gradient comes from forward run in float64 (the reference), with "
        "tolerances for float32: atol 0.0001, rtol 0.001 (the other arguments keep atol 1e-05, rtol "
        "0.001: each is judged by its own dtype's)"
    )


class Float32Kernel(torch.autograd.Function):
    """x @ w with x in float32 only (a float32 kernel: forward raises on float64 x); w float64, cast to x's dtype."""

    @staticmethod
    def forward(ctx, x, w):
        if x.dtype != torch.float32:
            raise TypeError("x must be float32")
        ctx.save_for_backward(x, w)
        return x @ w.to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.to(x.dtype).T, (x.T @ g).to(w.dtype)


def test_when_forward_fails_in_float64_every_argument_gets_the_low_dtypes_step_and_tolerance():
    # the differences are then taken through forward's float32 outputs: a float64 argument's carry their
    # rounding too, so it shares x's eps (1e-3) and tolerance, and the warning says so
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g).requires_grad_()
    w = torch.randn(4, 2, generator=g, dtype=torch.float64).requires_grad_()
    result = check(Float32Kernel, [x, w])
    assert result.status is Status.PASS, result.checks[0].message
    assert [(r.atol, r.rtol) for r in result.checks[0].inputs] == [(1e-4, 1e-3), (1e-4, 1e-3)]
    (note,) = [w for w in result.checks[0].warnings if "forward fails in float64" in w]
    assert "taken in float32 with eps 0.001 and atol 0.0001, rtol 0.001 for every argument" in note
