"""Half-precision arguments under the checks beyond first order: finite differences in float16 or
bfloat16 measure rounding, so double_backward and forward_ad skip with the reason (issue 28: they
called a correct half-precision kernel wrong, "numerical is zero", after minutes of work), as
backward refuses it; float64 Functions are still judged, and a wrong one still fails."""

from __future__ import annotations

import pytest

from gradcheck_cli import spec
from gradcheck_cli.results import Status
from gradcheck_cli.run import runner

KERNELS = "gradcheck_cli.examples.kernels"


def run(write_spec, text):
    (case,) = spec.load_file(write_spec(text))
    assert not isinstance(case, spec.SpecError), case
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize(
    "check,order", [("double_backward", "the second derivative"), ("forward_ad", "the derivative")]
)
@pytest.mark.parametrize(
    "function,dtype", [("FusedGELU", "float16"), ("FusedGELU", "bfloat16"), ("GELUBf16Inside", "bfloat16")]
)
def test_a_half_precision_argument_is_a_skip_that_points_to_the_reference_check(
    write_spec, check, order, function, dtype
):
    result = run(
        write_spec,
        f"""
        function: {KERNELS}:{function}
        checks: [{check}]
        inputs: [{{name: x, shape: [4, 8], dtype: {dtype}}}]
    """,
    )
    (found,) = result.checks
    if check == "forward_ad" and found.status is Status.FAIL:  # no jvp(): named, that fails first, as before
        assert "defines no jvp()" in found.message
        return
    assert found.status is Status.SKIP, found.message
    assert f"'x' is {dtype}: finite differences in half precision measure its rounding" in found.message
    assert f"not {order}" in found.message and "reference: pkg.mod:fn" in found.message
    assert [r.reason for r in found.inputs] == ["half precision"]


def test_the_same_gelu_in_float64_is_judged_at_second_order(write_spec):
    result = run(
        write_spec,
        f"""
        function: {KERNELS}:GELUBf16Inside
        checks: [double_backward]
        inputs: [{{name: x, shape: [4, 8], dtype: float64}}]
    """,
    )
    (found,) = result.checks
    assert found.status in (Status.PASS, Status.FAIL)  # judged (bfloat16 inside: precision is another story)
    assert "half precision" not in (found.message or "")
