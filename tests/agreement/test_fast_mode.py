"""--fast against torch.autograd.gradcheck(fast_mode=True) on wrong gradients.

torch's fast mode compares v^T J u for one non-negative probe, with atol inflated by
(sum u)(sum v), about sqrt(N M): errors of both signs cancel in it, and one wrong element of a
large Jacobian is far below its tolerance. gradcheck-cli's --fast probes each argument with a
non-negative and two signed directions, each paired with a non-negative and a signed weighting of
the outputs, and a tight tolerance (a failing probe only sends the check to the
element-by-element comparison), so it catches these; and on the errors of one sign that torch's
probe is good at, it does not fall behind.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gradcheck_cli import FAST_PROBES, check
from gradcheck_cli.numerics.probes import weightings

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import Mul, one_input_function
except ImportError:  # pragma: no cover
    from tests.corpus import Mul, one_input_function


def _function(name, fwd, bwd):
    return one_input_function(fwd, bwd, name)


def _tanh_grad(x, g):
    return g * (1 - torch.tanh(x) ** 2)


def _one_element_tripled(r):
    flat = r.reshape(-1).clone()
    flat[0] = flat[0] * 3
    return flat.view_as(r)


def _two_elements_swapped(r):
    flat = r.reshape(-1).clone()
    flat[[0, 1]] = flat[[1, 0]]
    return flat.view_as(r)


SIGNS = torch.sign(torch.randn(64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64))

# wrong gradients that torch's fast mode lets pass on 64x64 inputs (checked below)
MISSED_BY_TORCH_FAST = [
    _function("sin_rolled", torch.sin, lambda x, g: torch.roll(g * torch.cos(x), 1, -1)),
    _function("sin_rows_flipped", torch.sin, lambda x, g: (g * torch.cos(x)).flip(0)),
    _function(
        "softplus_sign_pattern_1pct",
        torch.nn.functional.softplus,
        lambda x, g: g * torch.sigmoid(x) * (1 + 0.01 * SIGNS),
    ),
    _function("tanh_one_element_tripled", torch.tanh, lambda x, g: _one_element_tripled(_tanh_grad(x, g))),
    _function("tanh_two_elements_swapped", torch.tanh, lambda x, g: _two_elements_swapped(_tanh_grad(x, g))),
]
SEEDS = range(6)  # random probes catch a wrong element with a probability: over 100 seeds --fast missed
# tanh_one_element_tripled once, the others never (benchmarks/fast_catch_rates.py)
# a wrong gradient that torch's fast mode catches: errors of one sign
CAUGHT_BY_TORCH_FAST = [
    _function("tanh_minus_its_mean", torch.tanh, lambda x, g: (lambda r: r - r.mean())(_tanh_grad(x, g)))
]
CORRECT = [_function("sin", torch.sin, lambda x, g: g * torch.cos(x)), _function("tanh", torch.tanh, _tanh_grad)]


def _x(seed: int, n: int = 64) -> torch.Tensor:
    return torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _torch_fast(fn, x: torch.Tensor, seed: int) -> bool:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.autograd.gradcheck(fn.apply, (x,), fast_mode=True, raise_exception=False)


@pytest.mark.slow
@pytest.mark.parametrize("fn", MISSED_BY_TORCH_FAST, ids=lambda f: f.__name__)
def test_fast_catches_what_torch_fast_mode_misses(fn):
    caught = []
    for seed in SEEDS:
        x = _x(seed)
        assert _torch_fast(fn, x, seed), "torch's fast mode catches this one now: move it to the other list"
        if seed == 0:  # torch's slow mode says it is wrong (element by element)
            assert not torch.autograd.gradcheck(fn.apply, (x,), raise_exception=False)
        caught.append(check(fn, [x], probes=FAST_PROBES, seed=seed).status.value == "fail")
    assert sum(caught) >= 5, f"--fast caught it for {sum(caught)} of {len(caught)} seeds: {caught}"


@pytest.mark.slow
@pytest.mark.parametrize("fn", CAUGHT_BY_TORCH_FAST, ids=lambda f: f.__name__)
def test_fast_catches_what_torch_fast_mode_catches(fn):
    # 32x32: errors of one sign are caught at any size, and a failing torch fast mode explains itself with
    # both dense Jacobians (at 64x64, 4096 x 4096 entries from 8192 forwards, most of this file's time)
    for seed in range(5):
        x = _x(seed, 32)
        assert not _torch_fast(fn, x, seed)
        assert check(fn, [x], probes=FAST_PROBES, seed=seed).status.value == "fail"


@pytest.mark.parametrize("fn", CORRECT, ids=lambda f: f.__name__)
def test_fast_decides_correct_functions_with_probes_alone(fn):
    for seed in range(3):
        backward = check(fn, [_x(seed)], probes=FAST_PROBES, seed=seed).checks[0]
        assert backward.status.value == "pass" and backward.mode == "probe", backward.message


def test_a_probe_failure_escalates_to_the_element_wise_verdict():
    (fn,) = [f for f in MISSED_BY_TORCH_FAST if f.__name__ == "sin_rolled"]
    backward = check(fn, [_x(0)], probes=FAST_PROBES).checks[0]
    assert backward.mode == "elementwise" and "a random probe failed for 'x'" in " ".join(backward.warnings)
    assert backward.inputs[0].mismatched == 64 * 64  # the element-wise comparison explains it


# -- one probe is backward's contract call: autograd would have passed its values on as they are --------


def _counting(mul_backward):
    """x * y whose backward is ``mul_backward(g, x, y)``, counting its calls."""

    class CountedMul(Mul):
        calls = 0

        @staticmethod
        def backward(ctx, g):
            CountedMul.calls += 1
            x, y = ctx.saved_tensors
            return mul_backward(g, x, y)

    return CountedMul


# backward's contract in use (contract.in_use) on one output: linearity's 2 calls besides the contract's (3 where
# that call is not reused: it draws its own dense grad_output), and the undefined-gradient test (its output's
# gradient undefined, then explicit zeros: 2 calls through autograd's engine)
UNDEFINED = 2
IN_USE, IN_USE_DRAWN = 2 + UNDEFINED, 3 + UNDEFINED


def _fast_backward_calls(fn, args) -> tuple:
    fn.calls = 0
    backward = check(fn, args, probes=FAST_PROBES).checks[0]
    return backward.status.value, backward.mode, fn.calls


def test_fast_reuses_the_contracts_backward_call_as_a_probe():
    fn = _counting(lambda g, x, y: (g * y, g * x))
    # 3 calls with one grad_output (the contract: repeat 3), then one per weighting of the outputs but the reused one
    assert _fast_backward_calls(fn, [_x(0, 8), _x(1, 8)]) == ("pass", "probe", 3 + IN_USE + weightings(FAST_PROBES) - 1)


def test_fast_calls_its_own_backward_on_the_contracts_node_where_autograd_passes_the_return_on(monkeypatch):
    """Where autograd would pass backward's return on as it is, the probes' own backward is the
    contract's graph node called again, without autograd's engine (the same gradients: the wrong
    ones above are caught through it); where autograd changes the return, through the engine."""
    from gradcheck_cli.numerics import engine

    runs, grad = [], engine.grad
    monkeypatch.setattr(engine, "grad", lambda *a, **k: runs.append(1) or grad(*a, **k))
    fn = _counting(lambda g, x, y: (g * y, g * x))
    assert _fast_backward_calls(fn, [_x(0, 8), _x(1, 8)]) == ("pass", "probe", 3 + IN_USE + weightings(FAST_PROBES) - 1)
    assert len(runs) == UNDEFINED  # the probes' and linearity's calls: none through the engine
    x = _x(0, 8)
    assert _fast_backward_calls(fn, [x, x]) == ("pass", "probe", 3 + IN_USE_DRAWN + weightings(FAST_PROBES))
    assert len(runs) == UNDEFINED + IN_USE_DRAWN + weightings(FAST_PROBES)


@pytest.mark.parametrize("case", ["one tensor passed twice", "a broadcast gradient"])
def test_fast_does_not_reuse_a_return_that_autograd_changes(case):
    """Autograd sums a tensor's two gradients, and sums a broadcast gradient down to the input's
    shape: the raw return is not J^T v there. Had it been reused, its probe would fail and send
    the check element by element."""
    if case == "one tensor passed twice":
        fn, x = _counting(lambda g, x, y: (g * y, g * x)), _x(0, 8)
        args = [x, x]
    else:
        fn = _counting(lambda g, x, y: (g * y, g * x))  # y's gradient not summed over the rows it was broadcast to
        args = [_x(0, 8), _x(1, 8)[0].detach().clone().requires_grad_()]  # y: (8,)
    assert _fast_backward_calls(fn, args) == ("pass", "probe", 3 + IN_USE_DRAWN + weightings(FAST_PROBES))


# -- directions over all the arguments at once: 2 forwards per direction, not per argument ---------------


class ScaledSum(torch.autograd.Function):
    """1000 x + y (elementwise): x moves the outputs a thousand times more than y does; y's
    gradient is ``factor`` times the right one. Counts its forward calls."""

    factor = 1.0
    calls = 0

    @staticmethod
    def forward(ctx, x, y):
        ScaledSum.calls += 1
        return 1000 * x + y

    @staticmethod
    def backward(ctx, g):
        return 1000 * g, g * ScaledSum.factor


@pytest.mark.parametrize("factor, verdict", [(1.0, "pass"), (1.01, "fail"), (0.0, "fail")])
def test_a_small_arguments_error_does_not_drown_in_a_large_ones_tolerance(factor, verdict):
    """The combined directions weight each argument by its gradient's size: unweighted, x's
    contribution (1000 times y's) would make the tolerance 1000 times y's 1% error."""
    ScaledSum.factor = factor
    try:
        for seed in range(3):
            backward = check(ScaledSum, [_x(seed, 16), _x(seed + 10, 16)], probes=FAST_PROBES, seed=seed).checks[0]
            assert backward.status.value == verdict, backward.message
            if verdict == "fail":  # the probes over each argument on its own name y alone
                assert backward.mode == "probe+elementwise"
                assert {r.name: r.status.value for r in backward.inputs} == {"x": "pass", "y": "fail"}
    finally:
        ScaledSum.factor = 1.0


def test_fast_moves_all_arguments_in_each_perturbed_forward():
    """Two forwards per direction in all (torch's fast mode makes two per argument), plus backward's
    contract's forward: single calls here, as the forward counts Python calls (vmap would batch them)."""
    from gradcheck_cli.checks import backward as backward_check

    def refuses(*args):
        raise RuntimeError("vmap refuses")  # as for a forward that calls .item()

    ScaledSum.calls = 0
    args = [_x(0, 8), _x(1, 8)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backward_check.probes, "vmapped", refuses)
        backward = check(ScaledSum, args, probes=FAST_PROBES).checks[0]
    assert backward.status.value == "pass" and backward.mode == "probe", backward.message
    assert ScaledSum.calls == 1 + 2 * FAST_PROBES  # not 1 + 2 x 3 directions x 2 arguments
    reasons = {r.reason for r in backward.inputs}
    assert reasons == {"6 random probes v^T J u agree (3 directions u over all 2 arguments x 2 weightings v)"}


@pytest.mark.parametrize("wrong", ["weight", "bias"])
def test_one_wrong_argument_of_several_is_caught_and_named(wrong):
    """Linear: a 1% sign pattern in one argument's gradient. The combined probes fail, the probes of
    each argument name it, and only it is compared element by element."""
    from gradcheck_cli.examples.linear import LinearFunction

    class Wrong(LinearFunction):
        @staticmethod
        def backward(ctx, g):
            grads = list(LinearFunction.backward(ctx, g))
            k = ["input", "weight", "bias"].index(wrong)
            signs = torch.sign(
                torch.randn(grads[k].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            )
            grads[k] = grads[k] * (1 + 0.01 * signs)
            return tuple(grads)

    for seed in range(5):
        n = 32
        args = [_x(seed, n), _x(seed + 10, n), _x(seed + 20, n)[0].detach().clone().requires_grad_()]
        backward = check(Wrong, args, probes=FAST_PROBES, seed=seed).checks[0]
        assert backward.status.value == "fail" and backward.mode == "probe+elementwise", backward.message
        assert {r.name for r in backward.inputs if r.status.value == "fail"} == {wrong}
