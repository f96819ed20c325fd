"""The reference check's lean path (base 86d652d): the reference in ``reference_dtype`` runs on
copies of every tensor argument, integer ones too, as it did before ``side(..., copied=True)``: a reference
that changes an argument in place changes its own copy, never the arguments that the target, the reference
in the target's dtype (the relative rule's bar) and the other checks are given, nor the caller's tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Status


class Shift(torch.autograd.Function):
    """``2.5 x + shift`` (``shift`` an integer tensor), its backward right."""

    SCALE = 2.5

    @classmethod
    def forward(cls, ctx: Any, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return x * cls.SCALE + shift

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2.5, None


class WrongOutput(Shift):
    """``3 x + shift``: its output 1.2x the reference's (its backward is 2.5, right for the reference)."""

    SCALE = 3.0


def shifting(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The reference, ``2.5 x + shift``, which then adds 1 to its integer argument in place (``shift += 1``)."""
    out = x * 2.5 + shift
    shift += 1
    return out


def arguments(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return x, torch.zeros(64, dtype=torch.int64)


def statuses(fn: type, dtype: torch.dtype) -> tuple[Status, list[tuple[str, Status]], torch.Tensor]:
    x, shift = arguments(dtype)
    result = check(fn, [x, shift], reference=shifting)
    (ref,) = [c for c in result.checks if c.check == "reference"]
    return result.status, [(r.name, r.status) for r in ref.inputs if r.status is not Status.SKIP], shift


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_reference_changing_an_integer_argument_in_place_still_fails_a_wrong_output(dtype):
    # the relative rule's bar is the reference's own error in the target's dtype: run on a shift the reference
    # in float64 had changed, it was 1 (not the rounding's ~0.04) and passed an output 1.2x the reference's
    status, rows, shift = statuses(WrongOutput, dtype)
    assert status is Status.FAIL
    assert rows == [("x", Status.PASS), ("output", Status.FAIL)]
    assert torch.equal(shift, torch.zeros(64, dtype=torch.int64))  # the caller's tensor as given


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_a_reference_changing_an_integer_argument_in_place_passes_a_right_function(dtype):
    status, rows, shift = statuses(Shift, dtype)
    assert status is Status.PASS and rows == [("x", Status.PASS), ("output", Status.PASS)]
    assert torch.equal(shift, torch.zeros(64, dtype=torch.int64))


def test_the_integer_argument_is_the_same_for_every_run_of_the_reference():
    # each run of the reference (in float64, then in the target's dtype) sees the shift as given: 0
    seen: list[list[int]] = []

    def recording(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        seen.append(shift[:3].tolist())
        return shifting(x, shift)

    x, shift = arguments(torch.bfloat16)
    assert check(Shift, [x, shift], reference=recording).status is Status.PASS
    assert len(seen) == 2 and all(s == [0, 0, 0] for s in seen), seen
