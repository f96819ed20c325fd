"""torch's performance notes about non-contiguous tensors, provoked by gradcheck's own layouts (the noncontiguous
check, `contiguous: false`), are not printed raw to stderr: ``torch.searchsorted`` on a transposed or strided
tensor says it copies it first, which is about speed and nothing for the user to fix; the verdict stands."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

import gradcheck_cli
from gradcheck_cli import spec
from gradcheck_cli.results import Status
from gradcheck_cli.run.runner import run_case

SPEC = """
function: gradcheck_cli.examples.structured:Interp
checks: [{check}]
inputs:
  - {{name: x, shape: [6], dist: uniform, low: 0.05, high: 0.95{extra}}}
  - {{name: knots, shape: [5], dist: sorted, requires_grad: false{extra}}}
  - {{name: values, shape: [5]}}
"""


@contextlib.contextmanager
def shown() -> Iterator[list[str]]:
    """The messages of the warnings that reach the warnings module's output inside, every time (torch notes a
    copy once per program unless set_warn_always: a test before this one may have had it)."""
    always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    messages: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield messages
            messages += [str(w.message) for w in caught]
    finally:
        torch.set_warn_always(always)


def _run(write_spec, check: str, extra: str = "") -> Status:
    (case,) = spec.load_file(write_spec(SPEC.format(check=check, extra=extra)))
    return run_case(case, "cpu").status


def test_the_noncontiguous_check_of_searchsorted_prints_no_copy_note(write_spec):
    with shown() as messages:
        status = _run(write_spec, "noncontiguous")
    assert status is Status.PASS
    assert not [m for m in messages if "non-contiguous" in m]


def test_contiguous_false_prints_no_copy_note_in_any_check(write_spec):
    with shown() as messages:
        status = _run(write_spec, "backward", ", contiguous: false")
    assert status is Status.PASS
    assert not [m for m in messages if "non-contiguous" in m]


class Warns(torch.autograd.Function):
    """searchsorted in forward, and a warning of its own."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, knots: torch.Tensor) -> torch.Tensor:
        warnings.warn("Warns: the user's own warning", stacklevel=2)
        return x * torch.searchsorted(knots, x.detach())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[None, None]:
        return None, None


def test_the_users_own_warnings_still_show():
    """Only torch's notes on layouts are quiet: what the user's code warns of shows as before."""
    x, knots = torch.rand(3, 4, dtype=torch.float64, requires_grad=True), torch.linspace(0, 1, 5).double()
    with shown() as messages:
        gradcheck_cli.check(Warns, [x, knots], checks=["noncontiguous"])
    assert "Warns: the user's own warning" in messages
    assert not [m for m in messages if "non-contiguous" in m]
