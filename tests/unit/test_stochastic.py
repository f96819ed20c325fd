"""Stochastic Functions: the global RNG is forked and restored around every forward.

A dropout-like Function draws its mask from the global RNG. With the fork, the graph forward
and every finite-difference forward draw the same mask, so the correct Function passes and a
wrong backward fails; ``torch.autograd.gradcheck`` (no fork) fails even the correct one, and so
does gradcheck-cli with the fork switched off. The user's RNG is left as it was.
"""

from __future__ import annotations

import json

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.examples.stochastic import Dropout, DropoutNoMask
from gradcheck_cli.numerics.streams import RngFork
from gradcheck_cli.results import Status
from gradcheck_cli.run import runner
from gradcheck_cli.spec import load_file

STOCHASTIC = "gradcheck_cli.examples.stochastic"


def x_of(*shape: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def test_correct_stochastic_function_passes():
    result = gradcheck_cli.check(Dropout, [x_of(6, 5)], kwargs={"p": 0.3})
    assert result.status is Status.PASS, result.checks[0].message if result.checks else result.error
    assert result.checks[0].inputs[0].mismatched == 0


def test_wrong_backward_of_a_stochastic_function_fails_on_its_argument():
    result = gradcheck_cli.check(DropoutNoMask, [x_of(6, 5)], kwargs={"p": 0.3})
    assert result.status is Status.FAIL
    row = result.checks[0].inputs[0]
    assert row.name == "input" and row.status is Status.FAIL and 0 < row.mismatched < row.numel


def test_without_the_fork_the_correct_function_would_fail(monkeypatch):
    monkeypatch.setattr(RngFork, "restore", lambda self: None)
    monkeypatch.setattr(RngFork, "release", lambda self: None)
    result = gradcheck_cli.check(Dropout, [x_of(6, 5)], kwargs={"p": 0.3})
    assert result.status is Status.FAIL


def test_torch_gradcheck_fails_the_correct_one_and_agrees_once_the_rng_is_fixed():
    x = x_of(4, 3)
    # torch draws a new mask in every forward: even the correct backward fails
    assert not torch.autograd.gradcheck(lambda t: Dropout.apply(t, 0.3), (x,), raise_exception=False)

    def forked(fn):
        state = torch.get_rng_state()

        def call(t):
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(state)
                return fn.apply(t, 0.3)

        return call

    # with the RNG fixed per forward, torch and gradcheck-cli agree on both
    assert torch.autograd.gradcheck(forked(Dropout), (x,), raise_exception=False)
    assert not torch.autograd.gradcheck(forked(DropoutNoMask), (x,), raise_exception=False)
    assert gradcheck_cli.check(Dropout, [x], kwargs={"p": 0.3}).status is Status.PASS
    assert gradcheck_cli.check(DropoutNoMask, [x], kwargs={"p": 0.3}).status is Status.FAIL


@pytest.mark.parametrize("compress, forwards", [(True, 1 + 4), (False, 1 + 2 * 6)], ids=["compressed", "plain"])
def test_every_forward_of_a_check_draws_the_same_numbers(user_module, compress, forwards):
    mod = user_module(
        """
        import torch

        MASKS = []

        class Noise(torch.autograd.Function):
            \"\"\"y = x * (1 + u), u ~ U(0, 1) drawn in forward; records every u it draws.\"\"\"

            @staticmethod
            def forward(ctx, x):
                u = torch.rand(x.shape, dtype=x.dtype)
                MASKS.append(u)
                ctx.save_for_backward(u)
                return x * (1 + u)

            @staticmethod
            def backward(ctx, g):
                (u,) = ctx.saved_tensors
                return g * (1 + u)
    """,
        "noisy",
    )
    import importlib

    noisy = importlib.import_module(mod)
    result = gradcheck_cli.check(noisy.Noise, [x_of(2, 3)], compress=compress)
    assert result.status is Status.PASS
    # the graph forward and two per element, or four for the one group of elementwise columns
    assert len(noisy.MASKS) >= forwards
    assert all(torch.equal(m, noisy.MASKS[0]) for m in noisy.MASKS)


def test_the_users_global_rng_is_unchanged_by_a_check():
    torch.manual_seed(1234)
    expected_state = torch.get_rng_state()
    expected_next = torch.rand(5)
    torch.set_rng_state(expected_state)
    assert gradcheck_cli.check(Dropout, [x_of(4, 4)]).status is Status.PASS
    assert gradcheck_cli.check(DropoutNoMask, [x_of(4, 4)]).status is Status.FAIL
    assert torch.equal(torch.get_rng_state(), expected_state)
    assert torch.equal(torch.rand(5), expected_next)


def test_a_forward_that_raises_still_restores_the_rng(user_module):
    mod = user_module(
        """
        import torch

        class DrawsThenRaises(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                torch.rand(100)
                raise RuntimeError("after drawing")

            @staticmethod
            def backward(ctx, g):
                return g
    """,
        "drawsraises",
    )
    import importlib

    state = torch.get_rng_state()
    result = gradcheck_cli.check(importlib.import_module(mod).DrawsThenRaises, [x_of(3)])
    assert result.status is Status.ERROR and "after drawing" in result.error.message
    assert torch.equal(torch.get_rng_state(), state)


def test_stochastic_module_in_the_shipped_spec_passes_and_leaves_the_rng_alone():
    import pathlib

    spec = pathlib.Path(__file__).resolve().parents[2] / "specs" / "modules.yaml"
    cases = [c for c in load_file(spec) if "Dropout" in c.function]
    assert len(cases) == 2
    state = torch.get_rng_state()
    for case in cases:
        result = runner.run_case(case, "cpu")
        assert result.status is Status.PASS, (result.error, [c.message for c in result.checks])
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("name, code, status", [("Dropout", 0, "pass"), ("DropoutNoMask", 1, "fail")])
def test_cli_end_to_end(write_spec, name, code, status, invoke):
    path = write_spec(f"""
        function: {STOCHASTIC}:{name}
        inputs: [{{name: input, shape: [6, 5]}}]
        kwargs: {{p: {{value: 0.3}}}}
    """)
    result = invoke(str(path), "--no-isolate", "--format", "json")
    assert result.exit_code == code, result.output
    (entry,) = json.loads(result.stdout)["results"]
    assert entry["status"] == status
    rows = entry["checks"][0]["inputs"]
    assert (rows[0]["name"], rows[0]["status"]) == ("input", status)
    assert (rows[1]["name"], rows[1]["status"]) == ("p", "skip")


def test_dropout_has_no_jvp_so_forward_ad_named_is_a_fail_not_a_pass(write_spec, invoke):
    """forward_ad of a stochastic Function needs a jvp; examples.stochastic.Dropout defines none
    (named explicitly, the check fails; under `checks: all` it would skip)."""
    path = write_spec(f"""
        function: {STOCHASTIC}:Dropout
        inputs: [{{name: input, shape: [6, 5]}}]
        kwargs: {{p: {{value: 0.3}}}}
        checks: [forward_ad]
    """)
    result = invoke(str(path), "--no-isolate", "--format", "json")
    (check,) = json.loads(result.stdout)["results"][0]["checks"]
    assert (check["check"], check["status"]) == ("forward_ad", "fail") and "defines no jvp()" in check["message"]
    assert result.exit_code == 1


BATCHED_DROPOUTS = """
    import torch
    from gradcheck_cli.examples.stochastic import Dropout

    class DropoutCopiesIntoItsOwnBuffer(Dropout):
        \"\"\"Deliberately not batchable: backward copies grad_output into a buffer made from the
        (unbatched) mask, which vmap refuses.\"\"\"

        @staticmethod
        def backward(ctx, grad_output):
            (mask,) = ctx.saved_tensors
            return torch.zeros_like(mask).copy_(grad_output) * mask, None
"""


@pytest.mark.parametrize("name, status", [("Dropout", "pass"), ("DropoutCopiesIntoItsOwnBuffer", "fail")])
def test_batched_check_of_a_dropout_function(write_spec, user_module, name, status, invoke):
    mod = user_module(BATCHED_DROPOUTS, "batched_dropouts")
    path = write_spec(f"""
        function: {mod}:{name}
        inputs: [{{name: input, shape: [6, 5]}}]
        kwargs: {{p: {{value: 0.3}}}}
        checks: [batched]
    """)
    result = invoke(str(path), "--no-isolate", "--format", "json")
    (entry,) = json.loads(result.stdout)["results"]
    (check,) = entry["checks"]
    assert (check["check"], check["status"]) == ("batched", status), check["message"]
    assert check["inputs"][1]["status"] == "skip"  # p is not a tensor
    if status == "fail":
        assert "vmap" in check["message"] and "in place into a tensor it created itself" in check["message"]
    else:
        assert check["inputs"][0]["status"] == "pass" and check["inputs"][0]["mismatched"] == 0
    # torch's own batched-grad test agrees, once the RNG is fixed per forward as the fork does
    import importlib

    fn = getattr(importlib.import_module(mod), name)
    state = torch.get_rng_state()

    def forked(t):
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            return fn.apply(t, 0.3)

    ok = torch.autograd.gradcheck(forked, (x_of(6, 5),), check_batched_grad=True, raise_exception=False)
    assert ok is (status == "pass")
