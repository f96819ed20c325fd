"""``gradcheck_cli.check()`` validates its arguments as the spec loader validates the same keys, in the same
words (issue 46 item 5): each of these was an internal error, or a check run with a value a spec refuses
(``eps=0`` failed torch.sin, ``atol=inf`` passed anything)."""

from __future__ import annotations

import pytest
import torch

import gradcheck_cli
from gradcheck_cli import spec
from gradcheck_cli.results import ErrorKind, Status
from gradcheck_cli.run import runner

# (the API's argument, its value, the spec's line for the same value)
REFUSED = [
    ("eps", 0.0, "tolerance: {eps: 0.0}"),
    ("atol", float("inf"), "tolerance: {atol: .inf}"),
    ("rtol", -1.0, "tolerance: {rtol: -1.0}"),
    ("nondet_tol", float("nan"), "tolerance: {nondet_tol: .nan}"),
    ("repeat", 0, "repeat: 0"),
    ("seed", 2**64, "seed: 18446744073709551616"),
    ("seed", -1, "seed: -1"),
]


def _spec_message(write_spec, line: str) -> str:
    (found,) = spec.load_file(write_spec(f"function: torch.sin\ninputs: [{{name: x, shape: [3]}}]\n{line}\n"))
    if isinstance(found, spec.SpecError):
        return str(found)
    result = runner.run_case(found, "cpu")
    assert result.error is not None, str(result)
    return result.error.message


@pytest.mark.parametrize("name, value, line", REFUSED, ids=[f"{n}={v}" for n, v, _ in REFUSED])
def test_a_value_a_spec_refuses_is_a_spec_error_in_the_spec_s_words(write_spec, name, value, line):
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, [x], **{name: value})
    assert result.status is Status.ERROR and result.error is not None, str(result)
    assert result.error.kind is ErrorKind.SPEC, result.error
    key, _, words = result.error.message.partition(": ")
    assert key == name, result.error.message
    spec_words = _spec_message(write_spec, line)
    assert spec_words.endswith(f"{name}: {words}"), (result.error.message, spec_words)  # tolerance.atol: ...


def test_negative_probes_are_a_spec_error_naming_probes():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, [x], probes=-3)
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.message == "probes: expected a non-negative integer (0: element by element), got -3"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_a_device_this_machine_lacks_is_a_skip_with_the_reason_as_a_spec_s():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, [x], device="cuda")
    assert result.status is Status.SKIP and result.error is None, str(result)
    assert [c.message for c in result.checks] == [
        "CUDA is not available on this machine (torch was built without CUDA or no GPU is visible)"
    ]


@pytest.mark.parametrize("kwargs", [{}, {"seed": 2**64 - 1, "probes": 3, "repeat": 2, "atol": 0.0}])
def test_values_a_spec_accepts_still_check(kwargs):
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert gradcheck_cli.check(torch.sin, [x], **kwargs).status is Status.PASS


@pytest.mark.parametrize("name, value", [("device", "meta"), ("devices", ["cpu", "meta"]), ("device", "nowhere")])
def test_a_device_that_holds_no_values_is_a_spec_error_naming_it(name, value):
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, [x], **{name: value})
    assert result.status is Status.ERROR and result.error is not None and result.error.kind is ErrorKind.SPEC
    assert result.error.message.startswith(f"{name}: expected cpu, cuda, cuda:N or mps"), result.error.message


def test_a_torch_device_name_device_consistency_compares_is_accepted():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(torch.sin, [x], checks=["device_consistency"], devices=["cpu:0", "cpu"])
    assert result.error is None, result.error
