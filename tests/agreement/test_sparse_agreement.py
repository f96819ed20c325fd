"""Sparse inputs: gradcheck-cli and torch.autograd.gradcheck agree on a shared set of correct and broken
Functions of sparse COO and CSR inputs, on the same inputs, with masked semantics (`masked: true`, torch's
``masked=True``) and without (`masked: false`, torch's ``masked=False``).

Each case is checked by gradcheck-cli from a spec and by torch on the very sparse tensor gradcheck-cli's
target receives; the verdicts must be equal, and equal to the one the case is labelled with."""

from __future__ import annotations

import warnings

import pytest
import torch

from gradcheck_cli import spec
from gradcheck_cli.examples import sparse as ex
from gradcheck_cli.numerics.streams import Streams
from gradcheck_cli.results import Status
from gradcheck_cli.run.runner import bind_case, run_case
from gradcheck_cli.subject.loader import load

MM = "gradcheck_cli.examples.sparse:{}"
SPEC = """
function: {function}
inputs:
  - {{name: x, shape: [{shape}], layout: {layout}, {pattern}, masked: {masked}}}
{more}
"""
W = "  - {name: w, shape: [5, 3]}"

# (Function, layout, masked, pattern, extra inputs, right?): right is the verdict under those semantics
SET = [
    (ex.SparseDenseMM, "sparse_coo", True, "density: 0.4", W, True),
    (ex.SparseDenseMM, "sparse_csr", True, "density: 0.4", W, True),
    (ex.SparseDenseMM, "sparse_coo", False, "density: 0.4", W, False),  # a masked gradient, all are variables
    (ex.SparseDenseMMTransposed, "sparse_coo", True, "density: 0.4", W, False),
    (ex.SparseDenseMMTransposed, "sparse_csr", True, "indices: [[0, 1], [1, 0], [2, 4], [4, 4]]", W, False),
    (ex.SparseDenseMMDenseGrad, "sparse_coo", True, "density: 0.4", W, False),  # non-zero where no variable is
    (ex.SparseDenseMMDenseGrad, "sparse_csr", True, "density: 0.4", W, False),
    (ex.SparseDenseMMDenseGrad, "sparse_coo", False, "density: 0.4", W, True),  # torch.mm's semantics
    (ex.SparseDenseMMDenseGrad, "sparse_csr", False, "density: 0.4", W, True),
    (ex.SparseSum, "sparse_coo", True, "density: 0.5", "", True),
    (ex.SparseSum, "sparse_csr", True, "density: 0.5", "", True),
    (ex.SparseSumScaled, "sparse_coo", True, "density: 0.5", "", False),
    (ex.SparseSquare, "sparse_csr", True, "density: 0.3", "", True),
    (ex.SparseSquare, "sparse_coo", True, "indices: [[0, 0], [3, 2], [4, 1]]", "", True),
    (ex.SparseSquareNoFactor, "sparse_csr", True, "density: 0.3", "", False),
]


def _id(case: tuple) -> str:
    fn, layout, masked, pattern, _, _ = case
    return f"{fn.__name__}-{layout}-{'masked' if masked else 'unmasked'}-{pattern.split(':')[0]}"


def _case(write_spec, fn: type, layout: str, masked: bool, pattern: str, more: str) -> spec.Case:
    text = SPEC.format(
        function=MM.format(fn.__name__),
        shape="5, 5",
        layout=layout,
        pattern=pattern,
        masked=str(masked).lower(),
        more=more,
    )
    (case,) = spec.load_file(write_spec(text))
    assert isinstance(case, spec.Case), case
    return case


def _torch(case: spec.Case, fn: type, masked: bool) -> bool:
    """torch.autograd.gradcheck's verdict on the arguments gradcheck-cli's target receives."""
    target = load(case.function)
    bound = bind_case(target, case, "cpu", Streams(case.seed))
    received = bound.arguments(bound.values)
    args = tuple(a.detach().requires_grad_(b.requires_grad) for a, b in zip(received, bound.values))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # check_undefined_grad: torch's own raises NotImplementedError (eq on a SparseCPU gradient), not a verdict
        return bool(
            torch.autograd.gradcheck(fn.apply, args, masked=masked, check_undefined_grad=False, raise_exception=False)
        )


@pytest.mark.parametrize("fn, layout, masked, pattern, more, right", SET, ids=[_id(c) for c in SET])
def test_gradcheck_cli_and_torch_agree_on_sparse_inputs(write_spec, fn, layout, masked, pattern, more, right):
    case = _case(write_spec, fn, layout, masked, pattern, more)
    result = run_case(case, "cpu")
    assert result.status in (Status.PASS, Status.FAIL), result
    ours = result.status is Status.PASS
    theirs = _torch(case, fn, masked)
    assert (ours, theirs) == (right, right), (result.checks[0].message, f"torch: {theirs}")


def test_the_set_has_correct_and_broken_functions_of_both_layouts_and_semantics():
    assert {(layout, right) for _, layout, _, _, _, right in SET} == {
        (layout, right) for layout in ("sparse_coo", "sparse_csr") for right in (True, False)
    }
    assert {(masked, right) for _, _, masked, _, _, right in SET} == {
        (m, r) for m in (True, False) for r in (True, False)
    }


@pytest.mark.parametrize("masked, right", [(True, True), (False, True)])
def test_torch_s_own_sparse_ops_pass_under_their_own_semantics(write_spec, user_module, masked, right):
    """torch.sparse.mm gives a gradient at the specified elements only (masked semantics); torch.mm with a
    sparse argument one at every element (every element a variable): each passes under its own, as in torch."""
    user_module(
        """
        import torch

        def sparse_mm(x, w):
            return torch.sparse.mm(x, w)

        def mm(x, w):
            return torch.mm(x, w)
        """,
        name="torch_sparse_ops",
    )
    function = "torch_sparse_ops:sparse_mm" if masked else "torch_sparse_ops:mm"
    text = SPEC.format(
        function=function, shape="5, 5", layout="sparse_coo", pattern="density: 0.4", masked=str(masked).lower(), more=W
    )
    (case,) = spec.load_file(write_spec(text))
    assert run_case(case, "cpu").status is (Status.PASS if right else Status.FAIL)
    other = "torch_sparse_ops:mm" if masked else "torch_sparse_ops:sparse_mm"
    (swapped,) = spec.load_file(write_spec(text.replace(function, other), name="other.yaml"))
    assert run_case(swapped, "cpu").status is Status.FAIL  # the other op under these semantics: torch fails it too


class DenseGradMaskedInside(ex.SparseDenseMMDenseGrad):
    """x's gradient dense (every element a variable), but backward densifies x with the masked ``to_dense()``:
    its own derivative with respect to x's unspecified elements is zero."""

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t(), x.to_dense().t() @ grad


SECOND = [  # (Function, masked, right?)
    (ex.SparseDenseMMDenseGrad, False, True),
    (ex.SparseDenseMMDenseGrad, True, False),  # d(w's gradient)/dx is not zero where x has no variable
    (DenseGradMaskedInside, False, False),  # ... and is zero where every element is one
    (DenseGradMaskedInside, True, True),
]


@pytest.mark.parametrize("fn, masked, right", SECOND, ids=[f"{f.__name__}-{m}" for f, m, _ in SECOND])
def test_double_backward_agrees_with_gradgradcheck_on_sparse_inputs(write_spec, monkeypatch, fn, masked, right):
    """torch's gradgradcheck judges only Functions whose backward returns a dense gradient (a sparse one is
    "not supported"), so these two."""
    import sys
    import types

    module = types.ModuleType("sparse_agreement_second")
    module.DenseGradMaskedInside = DenseGradMaskedInside  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sparse_agreement_second", module)
    function = MM.format(fn.__name__) if fn is ex.SparseDenseMMDenseGrad else "sparse_agreement_second:" + fn.__name__
    text = "checks: [double_backward]\n" + SPEC.format(
        function=function, shape="5, 5", layout="sparse_coo", pattern="density: 0.4", masked=str(masked).lower(), more=W
    )
    (case,) = spec.load_file(write_spec(text))
    ours = run_case(case, "cpu")
    target = load(case.function)
    bound = bind_case(target, case, "cpu", Streams(case.seed))
    args = tuple(a.detach().requires_grad_(True) for a in bound.arguments(bound.values))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.autograd.gradgradcheck(
            fn.apply, args, masked=masked, check_undefined_grad=False, raise_exception=False
        )
    assert ours.status in (Status.PASS, Status.FAIL), ours
    assert (ours.status is Status.PASS, bool(theirs)) == (right, right), (ours.checks[0].message, f"torch: {theirs}")
