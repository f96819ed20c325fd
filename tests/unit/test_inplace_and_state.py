"""In-place Functions (issue 16, item 3: ctx.mark_dirty, `clone_inputs`) and modules whose forward
updates buffers (item 4: running statistics, `init.mode`): checked like any other target, verdicts
agreeing with torch.autograd.gradcheck where it can call them."""

from __future__ import annotations

import pytest
import torch

from gradcheck_cli import spec
from gradcheck_cli.examples.inplace import ExpInPlace, ScaleInPlace, ScaleInPlaceForgetsFactor
from gradcheck_cli.examples.stateful import RunningNorm1d
from gradcheck_cli.numerics.streams import Streams
from gradcheck_cli.results import Pattern, Status
from gradcheck_cli.run import runner

INPLACE = "gradcheck_cli.examples.inplace"
STATEFUL = "gradcheck_cli.examples.stateful"
IN_PLACE_WARNING = "forward changes an argument in place and returns it (ctx.mark_dirty)"


def run(write_spec, text):
    (case,) = spec.load_file(write_spec(text))
    assert not isinstance(case, spec.SpecError), case
    return runner.run_case(case, "cpu")


def rows_of(result, check="backward"):
    (found,) = [c for c in result.checks if c.check == check]
    return found, {r.name: r for r in found.inputs}


# ------------------------------------------------------------------------------------- in place


@pytest.mark.parametrize("declared", [False, True])
def test_an_in_place_function_is_checked_on_copies_found_or_declared(write_spec, declared):
    result = run(
        write_spec,
        f"""
        function: {INPLACE}:ExpInPlace
        checks: [backward, double_backward, batched, undefined_grad]
        clone_inputs: {str(declared).lower()}
        inputs: [{{name: x, shape: [3, 4]}}]
    """,
    )
    assert result.error is None, result.error
    assert result.status is Status.PASS, [c.message for c in result.checks]
    assert any(IN_PLACE_WARNING in w for w in result.warnings) is not declared  # found: said once; declared: quiet


def test_an_in_place_function_with_a_wrong_backward_fails_with_its_ratio(write_spec):
    result = run(
        write_spec,
        f"""
        function: {INPLACE}:ScaleInPlaceForgetsFactor
        inputs: [{{name: x, shape: [3, 4]}}, {{name: a, value: 3.0}}]
    """,
    )
    found, rows = rows_of(result)
    assert result.error is None and found.status is Status.FAIL
    assert rows["x"].pattern is Pattern.CONSTANT_RATIO and rows["x"].ratio == pytest.approx(1 / 3, rel=1e-6)


@pytest.mark.parametrize("fn,correct", [(ExpInPlace, True), (ScaleInPlace, True), (ScaleInPlaceForgetsFactor, False)])
def test_in_place_verdicts_agree_with_torch_gradcheck_on_copies(write_spec, fn, correct):
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    extra = () if fn is ExpInPlace else (3.0,)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        fn.apply(x, *extra)  # what every tool meets when it calls the Function on its leaves
    assert torch.autograd.gradcheck(lambda t: fn.apply(t.clone(), *extra), (x,), raise_exception=False) is correct
    inputs = "[{name: x, shape: [3, 4]}" + (", {name: a, value: 3.0}]" if extra else "]")
    result = run(write_spec, f"function: {INPLACE}:{fn.__name__}\ninputs: {inputs}\n")
    assert result.error is None and (result.status is Status.PASS) is correct


def test_an_undeclared_in_place_change_still_breaks_the_contract(write_spec, user_module):
    user_module("""
        import torch

        class Sneaky(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                x.mul_(2)  # changes its input, neither marked dirty nor returned
                return x * 3

            @staticmethod
            def backward(ctx, g):
                return 3 * g
    """)
    result = run(write_spec, "function: usermod:Sneaky\ninputs: [{name: x, shape: [3]}]\n")
    found, _ = rows_of(result)
    assert found.status is Status.FAIL and "forward modified 'x' in place without ctx.mark_dirty" in found.message
    assert not any(IN_PLACE_WARNING in w for w in result.warnings)


def test_clone_inputs_must_be_a_boolean(write_spec):
    (err,) = spec.load_file(write_spec(f"function: {INPLACE}:ExpInPlace\nclone_inputs: yes please\ninputs: []\n"))
    assert isinstance(err, spec.SpecError) and "clone_inputs: expected true or false" in str(err)


# ------------------------------------------------------------------------------ modules with state


def test_a_module_that_updates_the_running_statistics_it_uses_passes_with_one_warning(write_spec):
    result = run(
        write_spec,
        f"""
        function: {STATEFUL}:RunningNorm1d
        init: {{args: [4]}}
        checks: [backward, double_backward]
        inputs: [{{name: x, shape: [6, 4]}}]
    """,
    )
    assert result.error is None and result.status is Status.PASS, [c.message for c in result.checks]
    (warning,) = [w for w in result.warnings if "buffer" in w]
    assert warning.startswith("forward mutates buffers 'running_mean', 'running_var'")


def test_eval_mode_does_not_update_the_buffers_and_says_nothing(write_spec):
    result = run(
        write_spec,
        f"""
        function: {STATEFUL}:RunningNorm1d
        init: {{args: [4], mode: eval}}
        inputs: [{{name: x, shape: [6, 4]}}]
    """,
    )
    assert result.status is Status.PASS and not [w for w in result.warnings if "buffer" in w]


def test_a_wrong_gradient_of_a_stateful_module_still_fails(write_spec):
    result = run(
        write_spec,
        f"""
        function: {STATEFUL}:RunningNorm1dDetachedWeight
        init: {{args: [4]}}
        inputs: [{{name: x, shape: [6, 4]}}]
    """,
    )
    found, rows = rows_of(result)
    assert found.status is Status.FAIL
    assert rows["weight"].pattern is Pattern.ZERO_ANALYTICAL
    assert rows["x"].status is Status.PASS and rows["bias"].status is Status.PASS


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_norm_in_train_and_eval_mode_agrees_with_torch_gradcheck(write_spec, mode):
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    bn = torch.nn.BatchNorm1d(4).double().train(mode == "train")
    assert torch.autograd.gradcheck(bn, (x,), raise_exception=False)
    result = run(
        write_spec,
        f"""
        function: torch.nn.BatchNorm1d
        init: {{args: [4], mode: {mode}}}
        inputs: [{{name: input, shape: [6, 4]}}]
    """,
    )
    assert result.status is Status.PASS, [c.message for c in result.checks]


def test_torch_gradcheck_fails_the_running_norm_in_train_mode_where_buffers_move():
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    module = RunningNorm1d(4).double()
    assert not torch.autograd.gradcheck(module, (x,), raise_exception=False)  # what the user saw before
    fresh = RunningNorm1d(4).double()
    state = {k: v.clone() for k, v in fresh.named_buffers()}

    def one_call(t):
        for k, v in state.items():
            setattr(fresh, k, v.clone())  # the buffers as built, for every call
        return fresh(t)

    assert torch.autograd.gradcheck(one_call, (x,), raise_exception=False)  # with the buffers put back: right


def test_the_module_buffers_are_as_built_after_the_check(write_spec):
    (case,) = spec.load_file(
        write_spec(f"""
        function: {STATEFUL}:RunningNorm1d
        init: {{args: [4]}}
        inputs: [{{name: x, shape: [6, 4]}}]
    """)
    )
    target = runner.loader.load(case.function)
    streams = Streams(case.seed)
    runner.init_target(target, case.init_args, dict(case.init_kwargs), streams, case.dtype, "cpu", case.init_mode)
    before = {k: v.clone() for k, v in target.module.named_buffers()}
    bound = runner.bind_case(target, case, "cpu", streams)
    for _ in range(2):
        runner.checks.parts.base.call_forward(target, bound, bound.values)
    assert all(torch.equal(before[k], v) for k, v in target.module.named_buffers())
    assert target.notes() and "'running_mean'" in target.notes()[0]


@pytest.mark.parametrize(
    "text,words",
    [
        (
            "function: torch.nn.BatchNorm1d\ninit: {args: [4], mode: test}\ninputs: [{shape: [6, 4]}]\n",
            "init.mode: expected train or eval",
        )
    ],
)
def test_a_bad_init_mode_is_a_spec_error(write_spec, text, words):
    (err,) = spec.load_file(write_spec(text))
    assert isinstance(err, spec.SpecError) and words in str(err)


def test_init_mode_on_a_function_says_it_applies_to_modules_only(write_spec):
    result = run(write_spec, f"function: {INPLACE}:ExpInPlace\ninit: {{mode: eval}}\ninputs: [{{shape: [3]}}]\n")
    assert result.status is Status.ERROR
    assert "init.mode" in result.error.message and "applies to modules only" in result.error.message
