"""--fast against torch.autograd.gradcheck(fast_mode=True) on wrong gradients.

torch's fast mode compares v^T J u for one non-negative probe, with atol inflated by
(sum u)(sum v), about sqrt(N M): errors of both signs cancel in it, and one wrong element of a
large Jacobian is far below its tolerance. gradcheck-cli's --fast probes each argument with a
non-negative and two signed directions and a tight tolerance (a failing probe only sends the
check to the element-by-element comparison), so it catches these; and on the errors of one
sign that torch's probe is good at, it does not fall behind.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from gradcheck_cli import FAST_PROBES, check


try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import one_input_function
except ImportError:  # pragma: no cover
    from tests.corpus import one_input_function


def _function(name, fwd, bwd):
    return one_input_function(fwd, bwd, name)


def _tanh_grad(x, g):
    return g * (1 - torch.tanh(x) ** 2)


def _one_element_tripled(r):
    flat = r.reshape(-1).clone()
    flat[0] = flat[0] * 3
    return flat.view_as(r)


SIGNS = torch.sign(torch.randn(64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64))

# wrong gradients that torch's fast mode lets pass on 64x64 inputs (checked below)
MISSED_BY_TORCH_FAST = [
    _function("sin_rolled", torch.sin, lambda x, g: torch.roll(g * torch.cos(x), 1, -1)),
    _function("sin_rows_flipped", torch.sin, lambda x, g: (g * torch.cos(x)).flip(0)),
    _function("softplus_sign_pattern_1pct", torch.nn.functional.softplus,
              lambda x, g: g * torch.sigmoid(x) * (1 + 0.01 * SIGNS)),
    _function("tanh_one_element_tripled", torch.tanh, lambda x, g: _one_element_tripled(_tanh_grad(x, g))),
]
# a wrong gradient that torch's fast mode catches: errors of one sign
CAUGHT_BY_TORCH_FAST = [
    _function("tanh_minus_its_mean", torch.tanh, lambda x, g: (lambda r: r - r.mean())(_tanh_grad(x, g))),
]
CORRECT = [
    _function("sin", torch.sin, lambda x, g: g * torch.cos(x)),
    _function("tanh", torch.tanh, _tanh_grad),
]


def _x(seed: int, n: int = 64) -> torch.Tensor:
    return torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _torch_fast(fn, x: torch.Tensor, seed: int) -> bool:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.autograd.gradcheck(fn.apply, (x,), fast_mode=True, raise_exception=False)


@pytest.mark.parametrize("fn", MISSED_BY_TORCH_FAST, ids=lambda f: f.__name__)
def test_fast_catches_what_torch_fast_mode_misses(fn):
    for seed in range(3):
        x = _x(seed)
        assert _torch_fast(fn, x, seed), "torch's fast mode catches this one now: move it to the other list"
        if seed == 0:  # torch's slow mode says it is wrong (element by element)
            assert not torch.autograd.gradcheck(fn.apply, (x,), raise_exception=False)
        result = check(fn, [x], probes=FAST_PROBES, seed=seed)
        assert result.status.value == "fail", f"seed {seed}: {result.checks[0].message}"


@pytest.mark.parametrize("fn", CAUGHT_BY_TORCH_FAST, ids=lambda f: f.__name__)
def test_fast_catches_what_torch_fast_mode_catches(fn):
    for seed in range(5):
        x = _x(seed)
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
