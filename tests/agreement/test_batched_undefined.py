"""The ``batched`` and ``undefined_grad`` checks: correct and broken Functions, agreement with
torch.autograd.gradcheck's ``check_batched_grad`` and ``check_undefined_grad``, and the CLI."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from gradcheck_cli.checks import batched, undefined_grad
from gradcheck_cli.checks.parts import undefined
from gradcheck_cli.checks.parts.base import CheckContext, Options
from gradcheck_cli.numerics.streams import Streams
from gradcheck_cli.results import CheckResult, Status
from gradcheck_cli.spec import Tolerance
from gradcheck_cli.subject.binding import bind
from gradcheck_cli.subject.target import Target

DT = torch.float64
REPO = Path(__file__).resolve().parents[2]


def run_check(check: Any, fn: Any, args: tuple, seed: int = 0) -> CheckResult:
    """Run ``check`` (a check module) on ``fn`` called with ``args``."""
    target = Target(fn.__qualname__, fn, isinstance(fn, type))
    bound = bind(target, [(None, a) for a in args], [])
    bound.streams = Streams(seed)
    return check.run(CheckContext(target, bound, options=Options(Tolerance())))


def torch_verdict(fn: Any, args: tuple, **flags: bool) -> bool:
    """torch.autograd.gradcheck's verdict; raising (e.g. a TypeError from backward) counts as failing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.autograd.gradcheck(fn.apply, args, raise_exception=False, **flags)
        except Exception:
            return False


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=DT, generator=torch.Generator().manual_seed(sum(shape) + 7)).requires_grad_()


# ------------------------------------------------------------------ Functions for the batched check


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class SquareOnce(Square):
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class _Times(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a * b

    @staticmethod
    def backward(ctx, g):
        return None, None


class SquareNested(Square):
    """backward calls another (old-style) Function."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _Times.apply(2 * x, g)


class Linear(Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)


class SinCosOld(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), x.cos()

    @staticmethod
    def backward(ctx, gs, gc):
        (x,) = ctx.saved_tensors
        return gs * x.cos() - gc * x.sin()


class MulGen(Function):
    """setup_context style with generate_vmap_rule, two inputs, two outputs."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w):
        return x * w, (x * w).sum()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, gp, gs):
        x, w = ctx.saved_tensors
        g = gp + gs
        return g * w, g * x


class CubeVmap(Function):
    @staticmethod
    def forward(x):
        return x**3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g

    @staticmethod
    def vmap(info, in_dims, x):
        return CubeVmap.apply(x), in_dims[0]


class ScaleRowsVmap(Function):
    """x * w[:, None] with a vmap staticmethod that moves batch dimensions to the front."""

    @staticmethod
    def forward(x, w):
        return x * w.unsqueeze(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w.unsqueeze(-1), (g * x).sum(-1)

    @staticmethod
    def vmap(info, in_dims, x, w):
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x.expand(info.batch_size, *x.shape)
        w = w.movedim(in_dims[1], 0) if in_dims[1] is not None else w.expand(info.batch_size, *w.shape)
        return x * w.unsqueeze(-1), 0


class ItemInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        scale = g.abs().max().item()
        return 2 * x * (g / scale) * scale


class BranchInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if (g == 0).all():
            return torch.zeros_like(x)
        return 2 * x * g


class InplaceOnGrad(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g.mul_(2)
        return x * g


class BufferInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        out += 2 * x * g
        return out


class DetachInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g.detach()


class TolistInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * torch.tensor(g.tolist(), dtype=g.dtype)


class OutInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        out = torch.empty_like(x)
        torch.mul(2 * x, g, out=out)
        return out


class StatefulBackward(Square):
    """Scales by how often backward ran: each call gives something else."""

    calls = 0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        StatefulBackward.calls += 1
        return 2 * x * g * StatefulBackward.calls


class WrongOutDims(ScaleRowsVmap):
    @staticmethod
    def vmap(info, in_dims, x, w):
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x.expand(info.batch_size, *x.shape)
        w = w.movedim(in_dims[1], 0) if in_dims[1] is not None else w.expand(info.batch_size, *w.shape)
        return (x * w.unsqueeze(-1)).movedim(0, -1), 0  # the batch dimension is last, not 0


class ItemInForward(MulGen):
    @staticmethod
    def forward(x, w):
        scale = float(w.abs().max().item())
        return x * w * scale / scale, (x * w).sum()


@dataclass(frozen=True)
class Entry:
    fn: Any
    make: Callable[[], tuple]
    correct: bool
    says: str = ""  # a fragment the failure message must contain
    torch_can_judge: bool = True  # torch's check_batched_grad looks at backward only


def x4() -> tuple:
    return (randn(4),)


def xw() -> tuple:
    return randn(3, 4), randn(3, 4)


def rows() -> tuple:
    return randn(3, 4), randn(3)


BATCHED = [
    Entry(Square, x4, True),
    Entry(SquareOnce, x4, True),
    Entry(SquareNested, x4, True),
    Entry(Linear, lambda: (randn(5, 4), randn(3, 4), randn(3)), True),
    Entry(SinCosOld, x4, True),
    Entry(MulGen, xw, True),
    Entry(CubeVmap, lambda: (randn(2, 3),), True),
    Entry(ScaleRowsVmap, rows, True),
    Entry(ItemInBackward, x4, False, "backward calls .item()"),
    Entry(BranchInBackward, x4, False, "backward uses a tensor's value in Python control flow"),
    Entry(InplaceOnGrad, x4, False, "backward modified grad_output in place"),
    Entry(BufferInBackward, x4, False, "writes batched values in place into a tensor it created itself"),
    Entry(DetachInBackward, x4, True, torch_can_judge=False),  # only is_grads_batched lacks aten::detach
    Entry(TolistInBackward, x4, False, "reads a tensor's memory directly"),
    Entry(OutInBackward, x4, False, "out="),
    Entry(StatefulBackward, x4, False, "the gradient of 'x' differs when batched"),
    Entry(WrongOutDims, rows, False, "out_dims", torch_can_judge=False),
    Entry(ItemInForward, xw, False, "forward calls .item()", torch_can_judge=False),
]


def ids(entries: list[Entry]) -> list[str]:
    return [e.fn.__name__ for e in entries]


@pytest.mark.parametrize("entry", [e for e in BATCHED if e.correct], ids=ids([e for e in BATCHED if e.correct]))
def test_batched_passes_correct_functions(entry: Entry) -> None:
    result = run_check(batched, entry.fn, entry.make())
    assert result.status is Status.PASS, result.message
    for row in result.inputs:
        assert row.status is Status.PASS and row.max_abs_err is not None and row.atol == 1e-8
        assert row.mismatched == 0 and row.worst_output.startswith("batch element")
    vmapped = Target("", entry.fn, True).declares_vmap
    assert ("vmap over forward and backward" in result.message) is vmapped
    assert ("forward not vmapped" in result.message) is (not vmapped)


@pytest.mark.parametrize("entry", [e for e in BATCHED if not e.correct], ids=ids([e for e in BATCHED if not e.correct]))
def test_batched_fails_and_names_the_problem(entry: Entry) -> None:
    result = run_check(batched, entry.fn, entry.make())
    assert result.status is Status.FAIL
    assert entry.says in result.message
    if "failed at" in result.message:  # a refusal points at the user's line
        assert "test_batched_undefined.py:" in result.message


@pytest.mark.parametrize(
    "entry", [e for e in BATCHED if e.torch_can_judge], ids=ids([e for e in BATCHED if e.torch_can_judge])
)
def test_batched_agrees_with_torch(entry: Entry) -> None:
    args = entry.make()
    theirs = torch_verdict(entry.fn, args, check_batched_grad=True, check_undefined_grad=False)
    ours = run_check(batched, entry.fn, args).status is Status.PASS
    assert ours == theirs == entry.correct


def test_batched_rows_say_which_batch_element_and_argument() -> None:
    result = run_check(batched, StatefulBackward, (randn(2, 3),))
    (row,) = result.inputs
    assert row.status is Status.FAIL and row.mismatched == 6 and row.numel == 6
    assert row.max_abs_err > 1e-3 and len(row.worst_index) == 2
    assert row.worst_output.startswith("batch element") and "batched grad_outputs" in row.worst_output


def test_batched_refusal_leaves_rows_uncompared() -> None:
    result = run_check(batched, ItemInBackward, x4())
    (row,) = result.inputs
    assert row.status is Status.SKIP and "vmap failed" in row.reason
    assert "keep the value a tensor" in result.message and "aten::item" in result.message


def test_batched_is_reproducible_from_the_seed() -> None:
    args = (randn(3, 4), randn(3, 4))
    first, again = (run_check(batched, MulGen, args, seed=3) for _ in range(2))
    other = run_check(batched, MulGen, args, seed=4)
    assert [r.analytical for r in first.inputs] == [r.analytical for r in again.inputs]
    assert [r.analytical for r in first.inputs] != [r.analytical for r in other.inputs]


class RowsSumToOne(MulGen):
    """Refuses inputs off its domain (rows of x must sum to 1), as real Functions do."""

    @staticmethod
    def forward(x, w):
        if not torch.allclose(x.sum(-1), torch.ones((), dtype=x.dtype)):
            raise ValueError("rows of x must sum to 1")
        return x * w, (x * w).sum()


def test_batched_forward_off_its_domain_is_a_note_not_an_error() -> None:
    x = torch.full((2, 4), 0.25, dtype=DT, requires_grad=True)
    result = run_check(batched, RowsSumToOne, (x, randn(2, 4)))
    assert result.status is Status.PASS, result.message
    assert "forward not vmapped: it raised on the inputs scaled by 1 +- 0.01" in result.message
    assert "rows of x must sum to 1" in result.message


def test_batched_checks_plain_callables_and_skips_without_grad() -> None:
    def fn(x, w):
        return Square.apply(x) * w

    assert run_check(batched, fn, (randn(3), randn(3))).status is Status.PASS
    skipped = run_check(batched, Square, (torch.randn(3, dtype=DT),))
    assert skipped.status is Status.SKIP and "no argument requires grad" in skipped.message


# ------------------------------------------------------------ Functions for the undefined_grad check


class TwoOutputs(Function):
    """(2x, x^2), materialized grads (the default): backward never sees None."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 2 * x, x * x

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        return 2 * grad_a + 2 * x * grad_b


class TwoHandlesNone(TwoOutputs):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return 2 * x, x * x

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        grad = torch.zeros_like(x)
        if grad_a is not None:
            grad = grad + 2 * grad_a
        if grad_b is not None:
            grad = grad + 2 * x * grad_b
        return grad


class ThreeHandlesNone(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x.sin(), x.cos(), x.exp()

    @staticmethod
    def backward(ctx, gs, gc, ge):
        (x,) = ctx.saved_tensors
        terms = [g * d for g, d in ((gs, x.cos()), (gc, -x.sin()), (ge, x.exp())) if g is not None]
        return sum(terms) if terms else None


class MaxWithIndex(Function):
    """Values and (non-differentiable) indices of the maximum along the last dimension."""

    @staticmethod
    def forward(ctx, x):
        values, index = x.max(-1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x, index)
        return values, index

    @staticmethod
    def backward(ctx, g, _):
        x, index = ctx.saved_tensors
        return torch.zeros_like(x).scatter(-1, index.unsqueeze(-1), g.unsqueeze(-1))


class CrashesOnNone(TwoHandlesNone):
    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        return 2 * grad_a + 2 * x * grad_b


class OnesForNone(TwoHandlesNone):
    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        grad_a = torch.ones_like(x) if grad_a is None else grad_a
        grad_b = torch.ones_like(x) if grad_b is None else grad_b
        return 2 * grad_a + 2 * x * grad_b


class DropsTheOther(TwoHandlesNone):
    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        if grad_a is None or grad_b is None:
            return None
        return 2 * grad_a + 2 * x * grad_b


class AttributeOfNone(TwoHandlesNone):
    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        grad = grad_b.new_zeros(x.shape) + 2 * x * grad_b
        return grad + 2 * grad_a if grad_a is not None else grad


class ThreeHandlesOneNone(ThreeHandlesNone):
    @staticmethod
    def backward(ctx, gs, gc, ge):
        (x,) = ctx.saved_tensors
        ge = torch.zeros_like(x) if ge is None else ge
        return gs * x.cos() - gc * x.sin() + ge * x.exp()


class SingleOnesForNone(Square):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * (torch.ones_like(x) if g is None else g)


class DecayInBackward(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g + 0.01 * x


class ConstantInBackward(TwoOutputs):
    @staticmethod
    def backward(ctx, grad_a, grad_b):
        (x,) = ctx.saved_tensors
        return 2 * grad_a + 2 * x * grad_b + 1e-3


UNDEFINED = [
    Entry(Square, x4, True),
    Entry(Linear, lambda: (randn(5, 4), randn(3, 4), randn(3)), True),
    Entry(TwoOutputs, x4, True),
    Entry(TwoHandlesNone, x4, True),
    Entry(ThreeHandlesNone, x4, True),
    Entry(MaxWithIndex, lambda: (randn(3, 4),), True),
    Entry(MulGen, xw, True),
    Entry(SinCosOld, x4, True),
    Entry(
        CrashesOnNone,
        x4,
        False,
        "backward raised TypeError when the gradient of output 1 ('grad_b') is undefined (None)",
    ),
    Entry(OnesForNone, x4, False, "backward must treat an undefined (None) gradient as zero"),
    Entry(DropsTheOther, x4, False, "differs from the one with an explicit zero gradient"),
    Entry(AttributeOfNone, x4, False, "backward raised AttributeError when the gradient of output 1 ('grad_b')"),
    Entry(ThreeHandlesOneNone, x4, False, "backward raised TypeError when the gradient of outputs 1, 2"),
    Entry(SingleOnesForNone, x4, False, "backward returned a nonzero gradient for 'x'"),
    Entry(DecayInBackward, x4, False, "backward returned a nonzero gradient for 'x'"),
    Entry(ConstantInBackward, x4, False, "backward returned a nonzero gradient for 'x'"),
]


@pytest.mark.parametrize("entry", [e for e in UNDEFINED if e.correct], ids=ids([e for e in UNDEFINED if e.correct]))
def test_undefined_grad_passes_correct_functions(entry: Entry) -> None:
    result = run_check(undefined_grad, entry.fn, entry.make())
    assert result.status is Status.PASS, result.message
    assert all(r.status is Status.PASS and r.max_abs_err == 0 for r in result.inputs if r.numel and r.atol)
    assert "with every output's gradient undefined the gradients are zero" in result.message


@pytest.mark.parametrize(
    "entry", [e for e in UNDEFINED if not e.correct], ids=ids([e for e in UNDEFINED if not e.correct])
)
def test_undefined_grad_fails_and_says_what_to_do(entry: Entry) -> None:
    result = run_check(undefined_grad, entry.fn, entry.make())
    assert result.status is Status.FAIL
    assert entry.says in result.message, result.message


@pytest.mark.parametrize("entry", UNDEFINED, ids=ids(UNDEFINED))
def test_undefined_grad_agrees_with_torch(entry: Entry) -> None:
    args = entry.make()
    theirs = torch_verdict(entry.fn, args, check_undefined_grad=True, check_batched_grad=False)
    ours = run_check(undefined_grad, entry.fn, args).status is Status.PASS
    assert ours == theirs == entry.correct


def test_undefined_grad_crash_message_in_the_users_terms() -> None:
    message = run_check(undefined_grad, CrashesOnNone, x4()).message
    assert message.startswith(
        "backward raised TypeError when the gradient of output 1 ('grad_b') is undefined (None) at "
    )
    assert (
        "with ctx.set_materialize_grads(False) backward receives None for outputs that were not used; handle "
        "it (e.g. `if grad_b is not None:`)"
    ) in message
    assert "backward also raised TypeError with the gradient of output 0 ('grad_a') undefined" in message


def test_undefined_grad_situations() -> None:
    assert undefined.scenarios(1) == [frozenset()]
    assert undefined.scenarios(2) == [{0}, {1}, frozenset()]
    assert undefined.scenarios(3) == [{0}, {1}, {2}, {1, 2}, {0, 2}, {0, 1}, frozenset()]
    result = run_check(undefined_grad, ThreeHandlesNone, x4())
    assert "gradient of outputs 1, 2 ('gc', 'ge') undefined" in result.message


def test_undefined_grad_rows_name_the_situation() -> None:
    result = run_check(undefined_grad, OnesForNone, x4())
    (row,) = result.inputs
    assert row.status is Status.FAIL and row.mismatched == 4 and row.max_abs_err > 0.1
    assert "undefined" in row.worst_output and row.atol == 1e-8


# ------------------------------------------------------------------------------------ the CLI

USER = """
import torch

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        scale = float(g.abs().sum()) + 1.0  # a Python number: fine in a loop, not under vmap
        return 2 * x * g * scale / scale

class Pair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return 2 * x, 3 * x

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        return 2 * grad_a + 3 * grad_b
"""


def test_cli_json_entries_for_both_checks(user_module, write_spec, invoke) -> None:
    user_module(USER)
    spec = write_spec("""
        function: usermod:Square
        checks: [batched, undefined_grad]
        inputs: [{name: x, shape: [2, 3]}]
        ---
        function: usermod:Pair
        checks: [batched, undefined_grad]
        inputs: [{shape: [3]}]
    """)
    out = invoke(str(spec), "--no-isolate", "--format", "json")
    assert out.exit_code == 1, out.output
    square, pair = json.loads(out.output)["results"]
    b, u = square["checks"]
    assert (b["check"], b["status"], b["mode"]) == ("batched", "fail", "vmap")
    assert "backward calls .item() (or float()/int() of a tensor)" in b["message"] and "usermod.py:" in b["message"]
    assert b["inputs"][0]["name"] == "x" and b["inputs"][0]["shape"] == [2, 3] and b["inputs"][0]["status"] == "skip"
    assert (u["check"], u["status"]) == ("undefined_grad", "pass")
    assert u["inputs"][0]["max_abs_err"] == 0 and u["inputs"][0]["index"] == 0
    b, u = pair["checks"]
    assert b["status"] == "pass" and b["inputs"][0]["atol"] == 1e-8
    assert u["status"] == "fail" and "output 1 ('grad_b') is undefined (None)" in u["message"]


def test_cli_check_option_runs_batched_only(user_module, write_spec, invoke) -> None:
    user_module(USER)
    spec = write_spec("""
        function: usermod:Pair
        inputs: [{shape: [3]}]
    """)
    out = invoke(str(spec), "--no-isolate", "--format", "json", "--check", "batched")
    assert out.exit_code == 0, out.output
    (result,) = json.loads(out.output)["results"]
    (entry,) = result["checks"]
    assert entry["check"] == "batched" and entry["status"] == "pass"
    assert entry["inputs"][0]["worst_output"].startswith("batch element")
    assert "forward not vmapped: Pair declares no vmap support" in entry["message"]


def test_shipped_vmap_specs_pass(monkeypatch, invoke) -> None:
    monkeypatch.chdir(REPO)
    out = invoke("specs/vmap.yaml", "--no-isolate", "--format", "json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    checks = {c["check"] for r in report["results"] for c in r["checks"]}
    assert {"batched", "undefined_grad"} <= checks and report["summary"]["passed"] == 4
