"""Wrong verdicts found while restructuring, each with the test that failed before its fix."""
from __future__ import annotations

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
