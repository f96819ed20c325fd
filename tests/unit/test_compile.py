"""The compile check (issue 16, item 2): torch.compile's gradients (backward of the compiled callable,
and torch.compile(torch.func.vjp(...))) against eager; PyTorch issue 193279; RNG differs; graph breaks."""

from __future__ import annotations

import pytest
import torch

from gradcheck_cli import spec
from gradcheck_cli.checks import compile as compile_check
from gradcheck_cli.examples.compiled import RoundSTE, ScaledTanh
from gradcheck_cli.results import Pattern, Status
from gradcheck_cli.run import runner

COMPILED = "gradcheck_cli.examples.compiled"


def run(write_spec, text):
    (case,) = spec.load_file(write_spec(text))
    assert not isinstance(case, spec.SpecError), case
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    (found,) = [c for c in result.checks if c.check == "compile"]
    return result, found, {r.name: r for r in found.inputs}


def test_issue_193279_round_ste_is_1_eagerly_and_0_under_compiled_func_grad():
    x = torch.tensor([0.3, 1.7, -0.2, 2.5], dtype=torch.float64)

    def loss(x):
        return RoundSTE.apply(x).sum()

    assert torch.equal(torch.func.grad(loss)(x), torch.ones(4, dtype=torch.float64))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(torch.func.grad(loss), backend="aot_eager")(x)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, torch.zeros(4, dtype=torch.float64)), "torch fixed issue 193279: update the docs"


def test_the_compile_check_fails_the_straight_through_function_of_issue_193279(write_spec):
    result, found, rows = run(
        write_spec,
        f"""
        function: {COMPILED}:RoundSTE
        checks: [compile]
        inputs: [{{name: x, shape: [4], std: 2.0}}]
    """,
    )
    assert result.status is Status.FAIL and found.status is Status.FAIL
    assert found.mode == "aot_eager: backward, torch.func.vjp"
    assert rows["x"].pattern is Pattern.ZERO_ANALYTICAL and rows["x"].mismatched == 4
    assert "'x': compiled torch.func.vjp: its gradient is all zeros, eager's is not" in found.message
    assert rows["output"].status is Status.PASS  # the forward agrees: only the gradient is wrong


def test_a_function_right_under_compile_passes_and_agrees_with_eager_autograd(write_spec):
    result, found, rows = run(
        write_spec,
        f"""
        function: {COMPILED}:ScaledTanh
        checks: [compile]
        inputs: [{{name: x, shape: [3, 4]}}, {{name: a, value: 2.0}}]
    """,
    )
    assert result.status is Status.PASS, found.message
    assert (
        "1 gradient and 1 output under torch.compile (backend 'aot_eager'; backward, torch.func.vjp) agree"
        in found.message
    )
    assert rows["x"].max_abs_err is not None and rows["x"].max_abs_err < 1e-12
    assert not result.warnings, result.warnings  # compiling changed no global state that the case is blamed for
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    (eager,) = torch.autograd.grad(ScaledTanh.apply(x, 2.0).sum(), x)
    assert torch.allclose(eager, 2 * (1 - torch.tanh(x) ** 2))


def test_an_old_style_function_is_compared_through_backward_only_and_says_why(write_spec):
    result, found, _ = run(
        write_spec,
        """
        function: gradcheck_cli.examples.kernels:RoundSTE
        checks: [compile]
        inputs: [{name: x, shape: [4]}]
    """,
    )
    assert result.status is Status.PASS
    assert found.mode == "aot_eager: backward"
    assert "torch.func.vjp not compared: it cannot run eagerly" in found.message
    assert "setup_context" in found.message


def test_graph_breaks_are_a_warning_with_their_reason(write_spec):
    result, found, _ = run(
        write_spec,
        f"""
        function: {COMPILED}:log_item
        checks: [compile]
        inputs: [{{name: x, shape: [3]}}]
    """,
    )
    assert found.status is Status.PASS
    (warning,) = found.warnings
    assert "torch.compile broke the graph" in warning and "Tensor.item()" in warning


def test_a_random_forward_agrees_under_aot_eager_and_is_rng_differs_under_inductor(write_spec):
    _, same, _ = run(
        write_spec,
        f"""
        function: {COMPILED}:Dropout
        checks: [compile]
        inputs: [{{name: x, shape: [3, 4]}}]
    """,
    )
    assert same.status is Status.PASS
    _, other, rows = run(
        write_spec,
        f"""
        function: {COMPILED}:Dropout
        checks: [compile]
        compile: {{backend: inductor}}
        inputs: [{{name: x, shape: [3, 4]}}]
    """,
    )
    assert other.status is Status.SKIP and other.message.startswith("RNG differs"), other.message
    assert rows["x"].status is Status.SKIP


def test_without_torch_compile_the_check_skips(write_spec, monkeypatch):
    monkeypatch.setattr(compile_check, "_unavailable", lambda: "Python 3.99 is not supported")
    _, found, _ = run(
        write_spec,
        f"""
        function: {COMPILED}:ScaledTanh
        checks: [compile]
        inputs: [{{name: x, shape: [3]}}, {{name: a, value: 2.0}}]
    """,
    )
    assert found.status is Status.SKIP
    assert found.message == "torch.compile is not available here: Python 3.99 is not supported"


@pytest.mark.parametrize(
    "value,key,words",
    [
        ("{backend: tvm}", "compile.backend", "expected one of aot_eager, inductor, eager"),
        ("{atol: -1}", "compile.atol", "non-negative"),
        ("{fullgraph: true}", "compile.fullgraph", "allowed keys here: backend, atol, rtol"),
    ],
)
def test_a_bad_compile_key_is_a_spec_error_naming_it(write_spec, value, key, words):
    (err,) = spec.load_file(
        write_spec(f"""
        function: {COMPILED}:ScaledTanh
        compile: {value}
        inputs: [{{shape: [3]}}, {{value: 2.0}}]
    """)
    )
    assert isinstance(err, spec.SpecError)
    assert f"{key}: " in str(err) and words in str(err)


@pytest.mark.parametrize("name,extra", [("ExpInPlace", ""), ("ScaleInPlace", ", {name: a, value: 3.0}")])
@pytest.mark.parametrize("declared", [False, True])
def test_an_in_place_function_is_compiled_on_copies_made_inside_the_graph_and_agrees_with_eager(
    write_spec, name, extra, declared
):
    # a mark_dirty Function changes its argument: the check calls it on copies, and those copies are made
    # inside the compiled code, as a model calls it on a tensor its graph made (issue 28: it was "0.3333x")
    result, found, rows = run(
        write_spec,
        f"""
        function: gradcheck_cli.examples.inplace:{name}
        checks: [compile]
        clone_inputs: {str(declared).lower()}
        inputs: [{{name: x, shape: [3, 4]}}{extra}]
    """,
    )
    assert found.status is Status.PASS, found.message
    assert rows["x"].max_abs_err is not None and rows["x"].max_abs_err < 1e-12


def test_compiling_an_in_place_function_on_a_tensor_the_graph_made_gives_eagers_gradient():
    from gradcheck_cli.examples.inplace import ScaleInPlace

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    torch._dynamo.reset()
    try:
        fn = torch.compile(lambda t: ScaleInPlace.apply(t.clone(), 3.0), backend="aot_eager")
        (got,) = torch.autograd.grad(fn(x).sum(), x)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, torch.full_like(x, 3.0))


def test_the_compile_check_fails_a_module_whose_compiled_backward_reads_its_updated_buffers(write_spec):
    result, found, rows = run(
        write_spec,
        """
        function: tests.compile_truth:RunningNorm1dInPlace
        checks: [compile]
        init: {args: [4]}
        inputs: [{name: x, shape: [6, 4]}]
    """,
    )
    # torch 2.13: the compiled backward reads the running statistics as forward's lerp_ left them
    # (tests/unit/test_compile_truth.py shows it in plain torch); the message names the hazard and the fix
    assert found.status is Status.FAIL
    assert rows["weight"].status is Status.FAIL and rows["output"].status is Status.PASS
    assert "forward changes buffers 'running_mean', 'running_var' in place" in found.message
    assert "assign the new values instead (`self.running_mean = ...` under torch.no_grad())" in found.message


@pytest.mark.slow
def test_a_failing_fake_kernel_is_the_checks_message_not_torchs_traceback_on_stderr():
    """torch logged the fake kernel's failure (a traceback at ERROR) and AOTAutograd's anomaly mode warned
    "Error detected in ..." on stderr beside the check's own message: noise that reads like a crash in CI"""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradcheck_cli",
            "broken-specs/custom_op_wrong_fake.yaml",
            "--check",
            "compile",
            "--format",
            "json",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 1 and "BackendCompilerFailed" in run.stdout
    assert "fake_tensor" not in run.stderr and "Error detected in" not in run.stderr, run.stderr


def test_a_difference_only_compiled_vjp_shows_is_put_on_torch_compile_with_how_to_keep_and_avoid_it(write_spec):
    # issue 44, item 10: RoundSTE is right (eager autograd.grad, eager torch.func.vjp and compiled autograd.grad
    # agree); torch.compile(torch.func.vjp) drops its backward. The fail stays, its words say whose it is
    body = f"function: {COMPILED}:RoundSTE\nchecks: [compile]\ninputs: [{{name: x, shape: [4], std: 2.0}}]\n"
    result, found, _ = run(write_spec, body)
    assert result.status is Status.FAIL and found.status is Status.FAIL
    message = found.message
    assert "for 'x' this is torch.compile's divergence on the torch.func.vjp path, not the Function's" in message
    assert "compiled autograd.grad (what loss.backward() of a compiled model runs" in message
    assert "it is the gradient of forward's own operations" in message and "PyTorch issue 193279" in message
    assert "torch.func.grad(torch.compile(f))" in message and "torch.compiler.disable" in message
    assert "the target's own code computes otherwise" not in message  # the Function is not blamed
    # the `expect:` the message gives, pasted into the spec, keeps the check: an xfail (exit 0)
    expect = message.split("add to the spec `")[1].split("`")[0]
    assert expect.startswith("expect: {reason: ") and expect.endswith("checks: [compile], x: zero_analytical}")
    kept, found, rows = run(write_spec, body + expect + "\n")
    assert kept.status is Status.XFAIL and found.status is Status.XFAIL, found.message
    assert rows["x"].status is Status.XFAIL


def test_the_ways_the_message_gives_to_avoid_issue_193279_give_eagers_gradient():
    # the premise of the advice, in plain torch 2.13: compiled autograd.grad, the transform taken outside
    # torch.compile, and the Function called through torch.compiler.disable all give RoundSTE's gradient 1
    x = torch.tensor([0.3, 1.7, -0.2, 2.5], dtype=torch.float64)
    ones = torch.ones(4, dtype=torch.float64)
    safe = torch.compiler.disable(RoundSTE.apply)
    got = {}
    torch._dynamo.reset()
    try:
        leaf = x.clone().requires_grad_()
        (got["autograd.grad"],) = torch.autograd.grad(
            torch.compile(lambda t: RoundSTE.apply(t).sum(), backend="aot_eager")(leaf), leaf
        )
        torch._dynamo.reset()
        got["outside"] = torch.func.grad(torch.compile(lambda t: RoundSTE.apply(t).sum(), backend="aot_eager"))(x)
        torch._dynamo.reset()
        got["disable"] = torch.compile(torch.func.grad(lambda t: safe(t).sum()), backend="aot_eager")(x)
    finally:
        torch._dynamo.reset()
    assert all(torch.equal(g, ones) for g in got.values()), got


def test_the_words_of_a_torch_compile_divergence_name_the_expect_entry_of_each_argument():
    from gradcheck_cli.checks.parts import compile_blame
    from gradcheck_cli.results import InputReport

    rows = [
        InputReport(0, "x", [3], "float64", Status.FAIL, pattern=Pattern.SIGN_FLIP),
        InputReport(1, "xs[1]", [3], "float64", Status.FAIL),
    ]
    words = compile_blame.divergence(rows, False, "inductor")
    assert "for 'x', 'xs[1]' this is torch.compile's divergence on the torch.func.vjp path" in words
    assert "checks: [compile], x: sign_flip, 'xs[1]': fail}" in words
    assert "backend 'inductor'" in words and "193279" not in words  # its backward was not shown dropped
