"""Sparse inputs (`layout: sparse_coo | sparse_csr`): the spec entry and its bad-input messages, the specified
elements drawn from the seed, what the target receives in every call, rows in dense indices, masked and
unmasked semantics, and the checks that cannot take a sparse input skipping with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from gradcheck_cli import spec
from gradcheck_cli.numerics.streams import Streams
from gradcheck_cli.results import Status
from gradcheck_cli.run.runner import bind_case, run_case
from gradcheck_cli.subject.loader import load

SPEC = """\
function: gradcheck_cli.examples.sparse:{function}
checks: {checks}
inputs:
  - {{name: x, shape: [5, 5], {x}}}
  - {{name: w, shape: [5, 3]}}
"""


def _load(write_spec, x: str, function: str = "SparseDenseMM", checks: str = "[backward]") -> spec.Case:
    (case,) = spec.load_file(write_spec(SPEC.format(function=function, checks=checks, x=x)))
    assert isinstance(case, spec.Case), case
    return case


def _error(write_spec, x: str) -> str:
    (err,) = spec.load_file(write_spec(SPEC.format(function="SparseDenseMM", checks="[backward]", x=x)))
    assert isinstance(err, spec.SpecError), err
    return str(err)


# ------------------------------------------------------------------------------------------ the spec entry


def test_a_sparse_entry_is_read_with_its_layout_pattern_and_semantics(write_spec):
    case = _load(write_spec, "layout: sparse_csr, indices: [[0, 1], [4, 4]], masked: false")
    x = case.inputs[0]
    assert isinstance(x, spec.TensorArg)
    assert x.sparse == spec.Sparse("sparse_csr", None, ((0, 1), (4, 4)), masked=False)
    assert _load(write_spec, "layout: sparse_coo").inputs[0].sparse == spec.Sparse("sparse_coo", 0.5)  # type: ignore[union-attr]
    assert _load(write_spec, "layout: strided").inputs[0].sparse is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "x, message",
    [
        ("layout: banana", "inputs[0].layout: unknown layout 'banana'; use sparse_coo or sparse_csr"),
        (
            "layout: sparse_coo, density: 1.5",
            "inputs[0].density: expected the fraction of the elements that are "
            "specified, in (0, 1] (e.g. 0.3), got 1.5",
        ),
        ("layout: sparse_coo, density: 0", "inputs[0].density: expected the fraction"),
        ("layout: sparse_coo, indices: [[0, 1], [2, 5]]", "inputs[0].indices[1]: [2, 5] is outside shape [5, 5]"),
        ("layout: sparse_coo, indices: [[0, 1], [0, 1]]", "inputs[0].indices[1]: [0, 1] is given twice"),
        ("layout: sparse_coo, indices: [[0]]", "inputs[0].indices[0]: expected 2 ints (one per dimension"),
        ("layout: sparse_coo, indices: []", "inputs[0].indices: expected a non-empty list of element indices"),
        (
            "layout: sparse_coo, dtype: int64",
            "inputs[0].dtype: a sparse input's values are differentiated: it needs a floating dtype",
        ),
        ("layout: sparse_coo, dist: randint", "inputs[0].dist: a sparse input's values are differentiated"),
        ("density: 0.3", "inputs[0].density: `density` is for a sparse input: add `layout: sparse_coo`"),
        (
            "layout: sparse_coo, density: 0.3, indices: [[0, 1]]",
            "inputs[0].indices: give the specified elements one way",
        ),
        ("layout: sparse_coo, masked: 'yes'", "inputs[0].masked: expected true"),
        (
            "layout: sparse_coo, contiguous: false",
            "inputs[0].contiguous: `contiguous` with layout sparse_coo: a sparse tensor has no strides",
        ),
        ("layout: sparse_coo, dist: spd", "inputs[0].dist: dist spd is perturbed along the symmetric matrices"),
    ],
)
def test_bad_sparse_entries_are_spec_errors_naming_file_line_and_key(write_spec, x, message):
    text = _error(write_spec, x)
    assert "spec.yaml:4: " + message in text, text


def test_sparse_csr_needs_a_matrix_and_sparse_a_tensor_entry(write_spec):
    (err,) = spec.load_file(
        write_spec("function: a.b:C\ninputs:\n  - {shape: [2, 3, 4], layout: sparse_csr}\n", name="csr.yaml")
    )
    assert (
        "csr.yaml:3: inputs[0].shape: sparse_csr is for matrices (two dimensions: rows, columns), got shape "
        "[2, 3, 4]; use sparse_coo" in str(err)
    )
    (err,) = spec.load_file(
        write_spec("function: a.b:C\ninputs:\n  - {list: [{shape: [3]}], layout: sparse_coo}\n", name="list.yaml")
    )
    assert (
        "list.yaml:3: inputs[0].layout: unknown key for a list entry: `layout` is for a tensor entry (shape or "
        "data): give it to each tensor inside" in str(err)
    )
    (err,) = spec.load_file(write_spec("function: a.b:C\ninputs:\n  - {value: 3, layout: sparse_coo}\n", name="v.yaml"))
    assert "v.yaml:3: inputs[0].layout: unknown key for a value entry" in str(err)


def test_indices_outside_literal_data_are_an_error_naming_the_key(write_spec):
    text = (
        "function: gradcheck_cli.examples.sparse:SparseSum\n"
        "inputs:\n  - {data: [[1.0, 2.0], [3.0, 4.0]], layout: sparse_coo, indices: [[0, 2]]}\n"
    )
    (case,) = spec.load_file(write_spec(text))
    result = run_case(case, "cpu")
    assert result.status is Status.ERROR
    assert "inputs[0].indices: [0, 2] is outside shape [2, 2]: give indices within the data's shape" in str(
        result.error
    )


# ------------------------------------------------------------------------------- what the target receives


def _received(case: spec.Case, seed: int = 0) -> torch.Tensor:
    target = load(case.function)
    bound = bind_case(target, case, "cpu", Streams(seed))
    return bound.arguments(bound.values)[0]


def test_density_draws_the_specified_elements_from_the_seed(write_spec):
    case = _load(write_spec, "layout: sparse_coo, density: 0.4")
    x = _received(case)
    assert x.layout is torch.sparse_coo and x.shape == (5, 5) and x._nnz() == 10
    assert torch.equal(_received(case).to_dense(), x.to_dense())  # same seed, same elements and values
    other = _received(case, seed=1)
    assert not torch.equal(other.to_dense() != 0, x.to_dense() != 0)


def test_indices_are_the_specified_elements_and_csr_is_csr(write_spec):
    case = _load(write_spec, "layout: sparse_csr, indices: [[0, 1], [4, 4], [2, 0]]")
    x = _received(case)
    assert x.layout is torch.sparse_csr
    dense = x.to_dense()
    assert {tuple(i) for i in (dense != 0).nonzero().tolist()} == {(0, 1), (4, 4), (2, 0)}


def test_literal_data_specifies_its_non_zero_elements(write_spec):
    text = (
        "function: gradcheck_cli.examples.sparse:SparseSum\n"
        "inputs:\n  - {data: [[0.0, 2.0], [3.0, 0.0]], layout: sparse_coo}\n"
    )
    (case,) = spec.load_file(write_spec(text))
    x = _received(case)
    assert x._nnz() == 2 and torch.equal(x.to_dense(), torch.tensor([[0.0, 2.0], [3.0, 0.0]], dtype=torch.float64))
    assert run_case(case, "cpu").status is Status.PASS


class Layouts(torch.autograd.Function):
    """Records the layout of x in every forward (the finite differences' too)."""

    seen: list[torch.layout] = []

    @staticmethod
    def forward(ctx, x, w):
        Layouts.seen.append(x.layout)
        ctx.save_for_backward(x, w)
        return x.to_dense() @ w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        coo = x.detach().to_sparse_coo().coalesce()
        g = torch.sparse_coo_tensor(
            coo.indices(), (grad @ w.t())[tuple(coo.indices())], x.shape, check_invariants=False
        )
        return (g if x.layout is torch.sparse_coo else g.to_sparse_csr()), x.to_dense().t() @ grad


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_the_target_gets_the_sparse_tensor_in_every_call(write_spec, monkeypatch, layout):
    import sys
    import types

    module = types.ModuleType("test_sparse_seen")
    module.Layouts = Layouts  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "test_sparse_seen", module)
    text = SPEC.format(function="X", checks="[backward]", x=f"layout: {layout}, density: 0.4").replace(
        "gradcheck_cli.examples.sparse:X", "test_sparse_seen:Layouts"
    )
    (case,) = spec.load_file(write_spec(text))
    Layouts.seen.clear()
    result = run_case(case, "cpu")
    assert result.status is Status.PASS, result.checks[0].message
    assert len(Layouts.seen) > 20 and set(Layouts.seen) == {getattr(torch, layout)}


# ---------------------------------------------------------------------------------------- verdicts and rows


def test_rows_name_the_dense_shape_and_dense_indices(write_spec):
    case = _load(write_spec, "layout: sparse_coo, density: 0.4", function="SparseDenseMMTransposed")
    result = run_case(case, "cpu")
    assert result.status is Status.FAIL
    row = result.checks[0].inputs[0]
    assert row.shape == [5, 5] and row.numel == 25 and row.status is Status.FAIL
    assert row.worst_index is not None and len(row.worst_index) == 2  # x[i, j], not values[k]
    assert row.via == "sparse_coo, 10 of 25 elements specified; only they are variables"
    assert "x[" in result.checks[0].message


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_a_gradient_outside_the_specified_elements_fails_with_masked_semantics_only(write_spec, layout):
    masked = run_case(_load(write_spec, f"layout: {layout}, density: 0.4", function="SparseDenseMMDenseGrad"), "cpu")
    assert masked.status is Status.FAIL
    row = masked.checks[0].inputs[0]
    assert row.mismatched == 15  # the 25 - 10 unspecified elements, and only they
    assert "non-zero at 15 elements the outputs do not depend on" in masked.checks[0].message
    assert (
        "'x' is sparse with masked semantics: its unspecified elements are no variables, so their gradient must "
        "be zero" in masked.checks[0].message
    )
    assert "or write `masked: false` if every element is a variable" in masked.checks[0].message
    every = _load(write_spec, f"layout: {layout}, density: 0.4, masked: false", function="SparseDenseMMDenseGrad")
    assert run_case(every, "cpu").status is Status.PASS
    masked_op = _load(write_spec, f"layout: {layout}, density: 0.4, masked: false")  # a masked gradient
    result = run_case(masked_op, "cpu")
    assert result.status is Status.FAIL and result.checks[0].inputs[0].mismatched == 15


def test_a_sparse_input_that_does_not_require_grad_is_passed_as_it_is(write_spec):
    case = _load(write_spec, "layout: sparse_coo, density: 0.4, requires_grad: false")
    result = run_case(case, "cpu")
    assert result.status is Status.PASS
    assert result.checks[0].inputs[0].status is Status.SKIP


# ---------------------------------------------------------------------------------------------- the checks


@pytest.mark.slow
def test_every_check_passes_or_skips_with_the_reason_on_a_correct_sparse_function(write_spec):
    case = _load(write_spec, "layout: sparse_coo, density: 0.4", checks="all")
    result = run_case(case, "cpu")
    statuses = {c.check: c.status for c in result.checks}
    assert result.status is Status.PASS, [(c.check, c.status, c.message) for c in result.checks]
    for name in ("forward_ad", "forward_over_reverse", "batched_forward", "batched"):
        check = next(c for c in result.checks if c.check == name)
        assert check.status is Status.SKIP and "sparse input (layout: sparse_coo, 'x')" in check.message
    assert statuses["backward"] is Status.PASS and statuses["noncontiguous"] is Status.PASS


def test_a_forward_mode_check_named_explicitly_skips_with_a_sparse_input(write_spec):
    result = run_case(_load(write_spec, "layout: sparse_csr, density: 0.4", checks="[backward, forward_ad]"), "cpu")
    forward = result.checks[1]
    assert (forward.check, forward.status) == ("forward_ad", Status.SKIP)
    assert "forward-mode AD with a sparse input (layout: sparse_csr, 'x') is not checked yet" in forward.message


def test_noncontiguous_leaves_the_sparse_input_alone_and_judges_the_rest(write_spec):
    result = run_case(_load(write_spec, "layout: sparse_csr, density: 0.4", checks="[noncontiguous]"), "cpu")
    assert result.status is Status.PASS, result.checks[0].message


class SquareDetached(torch.autograd.Function):
    """Row sums of squares whose backward detaches x: its first derivative is right, its second zero."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x.to_dense() ** 2).sum(1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        coo = x.detach().to_sparse_coo().coalesce()
        full = 2 * grad[:, None] * x.detach().to_dense()  # BUG for double backward: x detached
        return torch.sparse_coo_tensor(coo.indices(), full[tuple(coo.indices())], x.shape, check_invariants=False)


@pytest.mark.parametrize(
    "function, right",
    [("gradcheck_cli.examples.sparse:SparseSquare", True), ("test_sparse_square:SquareDetached", False)],
)
def test_double_backward_judges_the_second_derivative_through_a_sparse_input(write_spec, monkeypatch, function, right):
    import sys
    import types

    module = types.ModuleType("test_sparse_square")
    module.SquareDetached = SquareDetached  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "test_sparse_square", module)
    text = f"function: {function}\nchecks: [double_backward]\ninputs:\n  - {{shape: [4, 3], layout: sparse_coo}}\n"
    (case,) = spec.load_file(write_spec(text))
    result = run_case(case, "cpu")
    assert result.status is (Status.PASS if right else Status.FAIL), result.checks[0].message


def test_the_json_report_has_the_sparse_row(write_spec, invoke):
    path = write_spec(SPEC.format(function="SparseDenseMMDenseGrad", checks="[backward]", x="layout: sparse_coo"))
    out = invoke(str(path), "--format", "json", "--no-isolate")
    assert out.exit_code == 1
    (row, _) = json.loads(out.stdout)["results"][0]["checks"][0]["inputs"]
    assert row["shape"] == [5, 5] and row["via"].startswith("sparse_coo, ") and len(row["worst_index"]) == 2


def test_a_sparse_input_under_distributed_is_a_spec_error_naming_the_key(write_spec):
    text = "function: a.b:C\ndistributed: {world_size: 2}\ninputs:\n  - {shape: [4, 4], layout: sparse_coo}\n"
    (err,) = spec.load_file(write_spec(text))
    assert "spec.yaml:4: inputs[0].layout: a sparse input is not checked across ranks yet: drop `distributed`" in str(
        err
    )


def test_opcheck_skips_a_custom_op_with_a_sparse_input_instead_of_failing_it(write_spec, user_module):
    user_module(
        """
        import torch

        @torch.library.custom_op("gradcheck_sparse_test::rowsum", mutates_args=())
        def rowsum(x: torch.Tensor) -> torch.Tensor:
            return x.to_dense().sum(1)

        @rowsum.register_fake
        def _(x):
            return x.new_empty((x.shape[0],), layout=torch.strided)

        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g[:, None].expand(x.shape).sparse_mask(x.detach().coalesce())

        rowsum.register_autograd(backward, setup_context=setup)
        """,
        name="sparse_op",
    )
    text = "function: sparse_op:rowsum\nchecks: [backward, opcheck]\ninputs:\n  - {shape: [4, 3], layout: sparse_coo}\n"
    (case,) = spec.load_file(write_spec(text))
    result = run_case(case, "cpu")
    assert [(c.check, c.status) for c in result.checks] == [("backward", Status.PASS), ("opcheck", Status.SKIP)]
    assert "torch.library.opcheck cannot take a sparse argument (layout: sparse_coo" in result.checks[1].message
