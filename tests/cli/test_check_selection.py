"""Issue 44, item 7: a verdict does not depend on how a check was selected. A case's verdict is the worst of
its checks; `--check all` runs every applicable check and judges each as when it is named; a check that cannot
run is a skip with its reason and hides no other check's fail; a silently wrong higher derivative fails; a
backward that raises on valid inputs is a fail (forward raising stays an error). Each test fails on the code
before the fix (the message it quotes). The Functions are tests/truth_sets.py's SELECTION set."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from tests.truth_sets import NEGATIVE_AND_POSITIVE, SELECTION, SHARED_INPUTS, SOURCES, STE_INPUTS, X44


def checked(user_module, write_spec, invoke, function: str, body: str, *options: str) -> tuple[int, dict[str, Any]]:
    """The exit code and the one result of `gradcheck specs/s.yaml OPTIONS --format json`, for ``function``
    of the SELECTION set (or ``dbmod:NAME``, of the not-differentiable one)."""
    module, _, name = function.rpartition(":")
    user_module(SOURCES[module or "selmod"], module or "selmod")
    write_spec(f"function: {module or 'selmod'}:{name}\n{body}\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json", *options)
    (res,) = json.loads(result.stdout)["results"]
    return result.exit_code, res


def line_of(text: str) -> int:
    """The line of the SELECTION module that holds ``text``, as the ``user_module`` fixture writes it."""
    return next(n for n, line in enumerate(textwrap.dedent(SELECTION).split("\n"), 1) if text in line)


def by_check(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in res["checks"]}


def test_all_fails_a_straight_through_quantiser_as_the_default_does(user_module, write_spec, invoke):
    """`--check all` passed it ("forward's precision: no verdict", a skip) where the default failed it"""
    default_code, default = checked(user_module, write_spec, invoke, "QuantiserSTE", STE_INPUTS)
    all_code, every = checked(user_module, write_spec, invoke, "QuantiserSTE", STE_INPUTS, "--check", "all")
    assert (default_code, all_code) == (1, 1)
    named, under_all = by_check(default)["backward"], by_check(every)["backward"]
    assert under_all["status"] == "fail" and under_all["inputs"][0]["status"] == "fail"
    assert (under_all["message"], under_all["inputs"]) == (named["message"], named["inputs"])
    # the words: the steps of a quantiser are named, with what declares the gradient it intends
    assert "a step function such as a quantiser" in named["message"], named["message"]
    assert "a straight-through estimator's backward is not its derivative" in named["message"]
    assert "`reference_backward:`" in named["message"]


def test_all_keeps_a_first_order_fail_where_double_backward_cannot_run(user_module, write_spec, invoke):
    """a batch-shared parameter given 1/3 of its gradient by a backward that writes in place: `--check all`
    was a case error (exit 3, "backward, differentiated, raised"), the first-order rows and the bug gone"""
    code, res = checked(user_module, write_spec, invoke, "SharedScaleThird", SHARED_INPUTS, "--check", "all")
    assert code == 1 and res["error"] is None and res["status"] == "fail"
    found = by_check(res)
    assert found["backward"]["status"] == "fail"
    assert found["backward"]["message"] == "gradient of 'w': analytical is 0.33333x numerical; 'x' is right"
    double = found["double_backward"]
    assert double["status"] == "skip" and double["message"].startswith(
        "backward cannot be differentiated: differentiating its graph, backward, differentiated, raised RuntimeError: "
        "one of the variables needed for gradient computation has been modified by an inplace operation"
    )
    assert "mark it @once_differentiable (that one decorator is the fix)" in double["message"]
    assert {r["status"] for r in double["inputs"]} == {"skip"}
    named_code, named = checked(
        user_module, write_spec, invoke, "SharedScaleThird", SHARED_INPUTS, "--check", "double_backward"
    )
    assert named_code == 1 and named["error"] is None
    assert by_check(named)["double_backward"]["message"] == double["message"] + (
        "; this check was named explicitly, so that fails (`checks: all` skips it)"
    )


def test_a_silently_non_differentiable_backward_fails_under_all_as_named(user_module, write_spec, invoke):
    """PyTorch issue 104040: its Hessian-vector products come out zero; `--check all` passed it with a warning"""
    all_code, every = checked(user_module, write_spec, invoke, "dbmod:DetachedSquare", X44, "--check", "all")
    named_code, named = checked(
        user_module, write_spec, invoke, "dbmod:DetachedSquare", X44, "--check", "double_backward"
    )
    assert (all_code, named_code) == (1, 1)
    under_all, alone = by_check(every)["double_backward"], by_check(named)["double_backward"]
    assert under_all["status"] == alone["status"] == "fail"
    assert (under_all["message"], under_all["inputs"]) == (alone["message"], alone["inputs"])
    assert under_all["message"].startswith(
        "backward is not differentiable with respect to 'x' and not marked @once_differentiable: second "
        "derivatives through it (double backward, Hessian-vector products, gradient penalties) come out silently "
        "zero or partial; if double backward is not wanted, mark backward @once_differentiable (that one "
        "decorator is the fix"
    ), under_all["message"]
    assert by_check(every)["backward"]["status"] == "pass"


def test_a_backward_marked_once_differentiable_skips_under_all(user_module, write_spec, invoke):
    """it raises in real use, as it should: no second derivative to check, and no fail under `all`"""
    code, every = checked(user_module, write_spec, invoke, "OnceSquare", X44, "--check", "all")
    assert code == 0, every
    double = by_check(every)["double_backward"]
    assert double["status"] == "skip" and double["message"].startswith("backward is marked @once_differentiable")
    named_code, named = checked(user_module, write_spec, invoke, "OnceSquare", X44, "--check", "double_backward")
    assert named_code == 1 and by_check(named)["double_backward"]["message"].endswith("(`checks: all` skips it)")


CALLS_BACKWARD = ["backward", "double_backward", "batched", "undefined_grad", "noncontiguous"]


@pytest.mark.parametrize("check", CALLS_BACKWARD + [pytest.param("compile", marks=pytest.mark.slow)])
def test_a_backward_that_raises_on_valid_inputs_fails_under_every_check(user_module, write_spec, invoke, check):
    """it was a case error (exit 3, "a spec could not be checked") under `backward` and the others that call
    backward with these inputs"""
    code, res = checked(user_module, write_spec, invoke, "RaisesOnPositive", NEGATIVE_AND_POSITIVE, "--check", check)
    assert code == 1 and res["error"] is None and res["status"] == "fail"
    (found,) = res["checks"]
    assert found["status"] == "fail"
    at = line_of('raise ValueError("backward')
    assert found["message"] == (
        f"backward raised ValueError: backward cannot handle a positive x at selmod.py:{at} "
        '(raise ValueError("backward cannot handle a positive x")): backward raises on inputs that forward '
        "accepts, so autograd (loss.backward(), torch.autograd.grad) raises there too; make backward handle "
        "every input forward accepts"
    )
    assert [(r["status"], r["reason"]) for r in found["inputs"]] == [("skip", "backward raised (see the message)")]


def test_under_all_every_check_that_calls_backward_fails_alike_and_forward_raising_stays_an_error(
    user_module, write_spec, invoke
):
    code, res = checked(user_module, write_spec, invoke, "RaisesOnPositive", NEGATIVE_AND_POSITIVE, "--check", "all")
    assert code == 1 and res["error"] is None
    failed = {c["check"] for c in res["checks"] if c["status"] == "fail"}
    assert failed >= set(CALLS_BACKWARD)
    assert len({c["message"] for c in res["checks"] if c["status"] == "fail"}) == 1
    assert all(c["status"] == "skip" for c in res["checks"] if c["check"] not in failed)
    forward_code, forward = checked(user_module, write_spec, invoke, "ForwardRaises", X44, "--check", "all")
    assert forward_code == 3 and forward["error"]["kind"] == "forward" and forward["checks"] == []
    assert "forward cannot handle any x" in forward["error"]["message"]
