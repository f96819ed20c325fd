"""The ``batched`` check's verdict policy, with its truth set: vmap refusing the Function's code
(``.item()``), a wrong ``vmap`` rule or a batched backward that differs from a loop of calls fails
everywhere; torch lacking a batching rule for an operation used correctly never does. Where only
``is_grads_batched`` (torch's older vmap, which torch.autograd.gradcheck uses) lacks the rule,
torch.func.vmap judges instead; where neither can batch it, the check skips naming the op, whether it was
named or ran under ``checks: all``. A right backward that writes batched values in place into a tensor it
created itself is a warning under ``checks: all`` and a failure when ``batched`` is named, in the same
words: the hazard (batched gradients through it fail) and the fix."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest
import torch
from torch.autograd import Function

from gradcheck_cli.checks import batched
from gradcheck_cli.checks.parts.base import CheckContext, Options
from gradcheck_cli.examples.structured import Interp
from gradcheck_cli.results import CheckResult, Status
from gradcheck_cli.spec import Tolerance
from gradcheck_cli.subject.binding import bind
from gradcheck_cli.subject.target import Target

DT = torch.float64
HERE = "test_batched_policy.py:"
INTERP_LINE = next(  # where the Interp example's backward first writes into its own buffer
    f"structured.py:{n} (grad_values.index_add_("
    for n, line in enumerate(inspect.getsource(inspect.getmodule(Interp)).splitlines(), 1)
    if "grad_values.index_add_(" in line
)


def run_check(fn: Any, args: tuple, named: bool = True) -> CheckResult:
    target = Target(fn.__qualname__, fn, isinstance(fn, type))
    bound = bind(target, [(None, a) for a in args], [])
    return batched.run(CheckContext(target, bound, options=Options(Tolerance()), named=named))


def torch_verdict(fn: Any, args: tuple) -> bool:
    """torch.autograd.gradcheck(check_batched_grad=True); raising counts as failing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(torch.autograd.gradcheck(fn.apply, args, raise_exception=False, check_batched_grad=True))
        except Exception:
            return False


def torch_batches(fn: Any, args: tuple) -> str:
    """What each of torch's two vmaps says about a batch of grad_outputs through fn's backward."""
    y = fn.apply(*args)
    leaves = tuple(a for a in args if a.requires_grad)
    stack = torch.randn((3,) + y.shape, dtype=DT)
    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for run in (
            lambda: torch.autograd.grad(y, leaves, stack, retain_graph=True, is_grads_batched=True),
            lambda: torch.func.vmap(lambda v: torch.autograd.grad(y, leaves, v, retain_graph=True))(stack),
        ):
            try:
                run()
                said.append("ok")
            except Exception as exc:
                said.append(str(exc))
    return " | ".join(said)


def x44() -> tuple:
    return (torch.randn(4, 4, dtype=DT, generator=torch.Generator().manual_seed(1)).requires_grad_(),)


class Double(Function):
    """y = 2x: its subclasses compute the same backward with operations vmap may lack."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return 2 * x


def eye(g: torch.Tensor) -> torch.Tensor:
    return torch.eye(g.shape[-1], dtype=g.dtype)


# ------------------------------------------ correct, with an op only is_grads_batched cannot batch: judged


class Einsum3(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ij,jk,kl->il", eye(g), g, 2 * eye(g))


class BlockDiag(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        n, m = g.shape
        return 2 * torch.block_diag(g, g)[:n, :m]


class FlattenView(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return (2 * g).mT.flatten().reshape(g.shape[1], g.shape[0]).mT


class DetachGrad(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g.detach()


# ------------------------------------------ correct, with ops neither vmap can batch: skipped, naming the op


class EinsumNonzero(Double):
    """Copies only the nonzero entries of an einsum's result: right, but nonzero's shape depends on values."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        dense = torch.einsum("ij,jk,kl->il", eye(g), g, 2 * eye(g))
        idx = dense.nonzero(as_tuple=True)
        out = torch.zeros_like(dense)
        out[idx] = dense[idx]
        return out


class BlockDiagUnique(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        n, m = g.shape
        levels = torch.unique(g)
        return 2 * torch.block_diag(g, g)[:n, :m] * (levels.numel() > 0)


class CartesianMasked(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        pairs = torch.cartesian_prod(g[0], g[0])
        picked = g.masked_select(g != 0)
        return 2 * g + 0 * pairs.sum() + 0 * picked.sum()


class EinsumUnique(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        values, inverse = torch.unique(torch.einsum("ij,jk->ik", g, 2 * eye(g)), return_inverse=True)
        return values[inverse]


class ThroughSparse(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return (2 * g).to_sparse().to_dense()


# ------------------------------------------ right one grad_output at a time, but backward writes batched values in
# ------------------------------------------ place into a tensor it created itself: a warning under `all`, named a fail


class BufferGrad(Double):
    """Writes batched values in place into zeros it made from the (unbatched) input."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        out.index_add_(0, torch.arange(x.shape[0]), 2 * g)
        return out


class FlattenThenBuffer(Double):
    """The Interp pattern: a flatten is_grads_batched cannot batch, then an in-place write into a buffer."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x).flatten()
        out.index_add_(0, torch.arange(x.numel()), (2 * g).mT.flatten().reshape(g.shape[1], -1).mT.flatten())
        return out.reshape(x.shape)


class AddIntoBuffer(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = x.new_zeros(x.shape)
        out += 2 * g
        return out


class FlattenThenAdd(Double):
    """A flatten is_grads_batched cannot batch, then `out += ...`, which torch.func.vmap words differently."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x).flatten()
        out += (2 * g).mT.flatten().reshape(g.shape[1], -1).mT.flatten()
        return out.reshape(x.shape)


class SetRowsOfBuffer(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.zeros(x.shape, dtype=x.dtype)
        rows = torch.arange(x.shape[0])
        out[rows] = 2 * g[rows]
        return out


class ScatterAddIntoBuffer(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        index = torch.arange(x.shape[0]).unsqueeze(1).expand(x.shape)
        return torch.zeros_like(x).scatter_add_(0, index, 2 * g)


class CopyRowsIntoBuffer(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = torch.empty_like(x)
        for i in range(x.shape[0]):
            out[i].copy_(2 * g[i])
        return out


class MaskedScatterIntoBuffer(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.zeros_like(x).masked_scatter_(torch.ones_like(x, dtype=torch.bool), 2 * g)


class VmapRuleThenBuffer(Function):
    """2x with generate_vmap_rule (forward batches), and a backward that fills a buffer of forward's shape."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(ctx.shape, dtype=g.dtype)
        out.index_add_(0, torch.arange(ctx.shape[0]), 2 * g)
        return out


# ------------------------------------------ correct and batchable: pass, named or under `all`


class BufferFromGrad(Double):
    """The fix of BufferGrad: the buffer is made from the (batched) grad_output."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(g)
        out.index_add_(0, torch.arange(g.shape[0]), 2 * g)
        return out


class ScatterAddOutOfPlace(Double):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        index = torch.arange(g.shape[0]).unsqueeze(1).expand(g.shape)
        return torch.zeros_like(g).scatter_add(0, index, 2 * g)


class SavedProduct(Function):
    """x * y, both saved: two gradients that read the other argument."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return g * y, g * x


class GeneratedRule(Function):
    """sin(x) * y with generate_vmap_rule = True: forward, backward and the whole vjp batch."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sin() * y

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return g * x.cos() * y, g * x.sin()


class Cube(Function):
    """x**3 with a right vmap staticmethod."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x**3

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return Cube.apply(x.movedim(in_dims[0], 0)), 0


# ------------------------------------------ vmap refuses backward's own code for another reason: right one
# grad_output at a time, batched gradients fail (a warning under `all`, a fail named), as for the buffers


class ItemGrad(Double):
    """Right, but calls .item()."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * float((0 * g.sum() + 2).item())


class BranchGrad(Double):
    """Right, but branches on a tensor's value."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if (g.abs().sum() >= 0) and True:
            return 2 * g
        return -2 * g


class TolistGrad(Double):
    """Right, but goes through Python lists."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return torch.tensor(g.tolist(), dtype=g.dtype) * 2


class OutGrad(Double):
    """Right, but writes into a preallocated tensor with out=."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(g)
        torch.mul(g, 2, out=out)
        return out


class NumpyGrad(Double):
    """Right, but computes in numpy."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(g.detach().numpy() * 2)


# ------------------------------------------ broken: wrong values when batched (fail, named or under `all`)


class EinsumStateful(Double):
    """A backward that keeps state between calls, behind an einsum: wrong values must still fail."""

    calls = 0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        EinsumStateful.calls += 1
        return torch.einsum("ij,jk,kl->il", eye(g), g, 2 * eye(g)) * EinsumStateful.calls


class Stateful(Double):
    """The same state without the einsum, which torch's own check can run."""

    calls = 0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        Stateful.calls += 1
        return 2 * g * Stateful.calls


class WrongVmapRule(Cube):
    """x**3 with a vmap staticmethod that computes x**2."""

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x.movedim(in_dims[0], 0) ** 2, 0


class WrongOutDims(Cube):
    """x**3 whose vmap staticmethod puts the batch last but says out_dims 0."""

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (x.movedim(in_dims[0], 0) ** 3).movedim(0, -1), 0


def pair() -> tuple:
    gen = torch.Generator().manual_seed(2)
    return tuple(torch.randn(4, 4, dtype=DT, generator=gen).requires_grad_() for _ in range(2))


def interp() -> tuple:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(5, dtype=DT, generator=gen).requires_grad_()
    return x, torch.linspace(0, 1, 6, dtype=DT), torch.randn(6, dtype=DT, generator=gen).requires_grad_()


ONLY_LEGACY = [
    (Einsum3, "aten::einsum"),
    (BlockDiag, "aten::block_diag"),
    (FlattenView, "aten::flatten.using_ints"),
    (DetachGrad, "aten::detach"),
]
NEITHER = [
    (EinsumNonzero, "aten::nonzero"),
    (BlockDiagUnique, "aten::_unique2"),
    (CartesianMasked, "masked_select"),
    (EinsumUnique, "aten::_unique2"),
    (ThroughSparse, "sparse tensors"),
]
BUFFERS = [
    (BufferGrad, x44, "index_add_(self"),
    (FlattenThenBuffer, x44, "index_add_(self"),
    (AddIntoBuffer, x44, "output with shape [4, 4] doesn't match the broadcast shape [3, 4, 4]"),
    (FlattenThenAdd, x44, "output with shape [16] doesn't match the broadcast shape [3, 16]"),
    (SetRowsOfBuffer, x44, "index_put_(self"),
    (ScatterAddIntoBuffer, x44, "scatter_add_(self"),
    (CopyRowsIntoBuffer, x44, "inplace arithmetic(self"),
    (MaskedScatterIntoBuffer, x44, "masked_scatter_(self"),
    (VmapRuleThenBuffer, x44, "index_add_(self"),
    (Interp, interp, "index_add_(self"),
]
CORRECT = [(BufferFromGrad, x44), (ScatterAddOutOfPlace, x44), (SavedProduct, pair), (GeneratedRule, pair), (Cube, x44)]
BROKEN = [
    (EinsumStateful, "the gradient of 'x' differs when batched"),
    (Stateful, "the gradient of 'x' differs when batched"),
    (WrongVmapRule, "vmap over forward differs from a loop of forwards"),
    (
        WrongOutDims,
        "vmap over forward returned output 0 with shape [4, 3] per batch element, but forward returns "
        "[4, 4]: the `vmap` staticmethod must return out_dims",
    ),
]
UNBATCHABLE = [
    (ItemGrad, "calls .item()"),
    (BranchGrad, "uses a tensor's value in Python control flow"),
    (TolistGrad, "reads a tensor's memory directly"),
    (OutGrad, "writes into a preallocated tensor"),
    (NumpyGrad, "reads a tensor's memory directly"),
]


def names(cases: list[tuple[Any, ...]]) -> list[str]:
    return [fn.__name__ for fn, *_ in cases]


@pytest.mark.parametrize(("fn", "op"), ONLY_LEGACY, ids=names(ONLY_LEGACY))
def test_an_op_only_is_grads_batched_lacks_is_judged_with_torch_func(fn: Any, op: str) -> None:
    said = torch_batches(fn, x44())
    assert said.startswith("Batching rule not implemented for " + op) and said.endswith("| ok")
    assert not torch_verdict(fn, x44())  # torch's own check calls it wrong: that is its vmap's limit
    result = run_check(fn, x44())
    assert result.status is Status.PASS, result.message
    assert f"torch has no batching rule for {op} (used by backward at " in result.message and HERE in result.message
    assert "torch.func.vmap over backward with 3 grad_outputs = 3 backward calls" in result.message
    assert result.inputs[0].mismatched == 0 and result.inputs[0].max_abs_err is not None


@pytest.mark.parametrize(("fn", "op"), NEITHER, ids=names(NEITHER))
@pytest.mark.parametrize("named", [True, False], ids=["named", "all"])
def test_an_op_neither_vmap_can_batch_skips_naming_it(fn: Any, op: str, named: bool) -> None:
    args = x44()
    gx = torch.autograd.grad(fn.apply(*args), args, torch.ones(4, 4, dtype=DT))[0]
    assert torch.equal(gx, 2 * torch.ones(4, 4, dtype=DT))  # the Function is right
    assert torch.autograd.gradcheck(fn.apply, args)
    legacy, func = torch_batches(fn, args).split(" | ")
    assert legacy != "ok" and func != "ok" and (op in func or "Sparse" in func)
    result = run_check(fn, args, named=named)
    assert result.status is Status.SKIP, result.message
    assert op in result.message and "cannot be checked here" in result.message
    assert result.inputs[0].status is Status.SKIP


def jacobian_vectorized(fn: Any, args: tuple) -> str:
    """What torch.autograd.functional.jacobian(vectorize=True) says of fn ('ok' when it runs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.autograd.functional.jacobian(lambda *a: fn.apply(*a), args, vectorize=True)
        except Exception as exc:
            return str(exc)
    return "ok"


@pytest.mark.parametrize(("fn", "make", "said"), BUFFERS, ids=names(BUFFERS))
def test_torch_agrees_a_buffer_backward_is_right_but_cannot_batch(fn: Any, make: Any, said: str) -> None:
    args = make()
    assert torch.autograd.gradcheck(fn.apply, args)  # right, one grad_output at a time
    assert not torch_verdict(fn, args)  # gradcheck(check_batched_grad=True) fails
    assert jacobian_vectorized(fn, args) != "ok"
    func = torch_batches(fn, args).split(" | ")[1]  # torch.func.vmap over backward
    assert said in func and ("being vmapped over but `self` not" in func or "broadcast shape [3, " in func)


@pytest.mark.parametrize(("fn", "make", "said"), BUFFERS, ids=names(BUFFERS))
@pytest.mark.parametrize("named", [True, False], ids=["named", "all"])
def test_a_buffer_backward_is_a_warning_under_all_and_a_fail_named(fn: Any, make: Any, said: str, named: bool) -> None:
    result = run_check(fn, make(), named=named)
    hazard = (
        "backward writes batched values in place into a tensor it created itself (e.g. `out = "
        "torch.zeros_like(x); out += grad` or `out[idx] = grad`), at "
    )
    uses = (
        "batched gradients through it fail (torch.autograd.functional.jacobian(vectorize=True), torch.func.vmap "
        "over backward, torch.autograd.gradcheck(check_batched_grad=True)), since that tensor has no batch "
        "dimension; compute the result out of place, or create the buffer from the batched value "
        "(torch.zeros_like(grad), grad.new_zeros(...))"
    )
    assert result.message.startswith(hazard), result.message
    assert uses in result.message and "(torch: RuntimeError: " in result.message
    assert any(k in result.message for k in ("(self, *extra_args) is not possible because", "broadcast shape [3, "))
    assert (HERE if fn is not Interp else INTERP_LINE) in result.message
    assert "out=" not in result.message and all(r.status is not Status.FAIL for r in result.inputs)
    if named:
        assert result.status is Status.FAIL and result.warnings == []
        assert "; batched was named explicitly, so that fails (`checks: all` makes it a warning)" in result.message
    else:
        assert result.status is Status.SKIP
        assert "(a warning under `checks: all`; naming batched makes it a fail)" in result.message
        (warning,) = result.warnings
        assert warning.startswith(hazard) and uses in warning
    assert all(r.status is Status.SKIP for r in result.inputs if r.name in ("x", "values"))


@pytest.mark.parametrize(("fn", "make"), CORRECT, ids=names(CORRECT))
@pytest.mark.parametrize("named", [True, False], ids=["named", "all"])
def test_a_correct_batchable_function_passes(fn: Any, make: Any, named: bool) -> None:
    args = make()
    assert torch_verdict(fn, args)  # torch.autograd.gradcheck(check_batched_grad=True) passes it
    result = run_check(fn, args, named=named)
    assert result.status is Status.PASS, result.message
    assert result.warnings == [] and all(r.status is Status.PASS for r in result.inputs)
    if fn in (GeneratedRule, Cube):
        assert "vmap over forward = 3 forwards" in result.message
        assert "vmap over forward and backward = 3 forward and backward calls" in result.message


@pytest.mark.parametrize(("fn", "says"), BROKEN, ids=names(BROKEN))
@pytest.mark.parametrize("named", [True, False], ids=["named", "all"])
def test_wrong_batched_values_fail(fn: Any, says: str, named: bool) -> None:
    result = run_check(fn, x44(), named=named)
    assert result.status is Status.FAIL, result.message
    assert says in result.message and result.warnings == []
    if "failed at" in result.message:
        assert HERE in result.message


@pytest.mark.parametrize(("fn", "says"), UNBATCHABLE, ids=names(UNBATCHABLE))
def test_torch_agrees_an_unbatchable_backward_is_right_but_cannot_batch(fn: Any, says: str) -> None:
    args = x44()
    assert torch.autograd.gradcheck(fn.apply, args)  # right, one grad_output at a time
    assert not torch_verdict(fn, args)  # gradcheck(check_batched_grad=True) fails
    assert jacobian_vectorized(fn, args) != "ok"


@pytest.mark.parametrize(("fn", "says"), UNBATCHABLE, ids=names(UNBATCHABLE))
@pytest.mark.parametrize("named", [True, False], ids=["named", "all"])
def test_an_unbatchable_backward_is_a_warning_under_all_and_a_fail_named(fn: Any, says: str, named: bool) -> None:
    """.item() in backward was a fail under `all` though backward is right: it cannot judge batched values"""
    result = run_check(fn, x44(), named=named)
    assert result.message.startswith(f"backward {says}"), result.message
    assert (
        "batched gradients through it fail (torch.autograd.functional.jacobian(vectorize=True), "
        "torch.func.vmap over backward, torch.autograd.gradcheck(check_batched_grad=True)), since "
    ) in result.message
    assert HERE in result.message
    if named:
        assert result.status is Status.FAIL and result.warnings == []
    else:
        assert result.status is Status.SKIP, result.message
        (warning,) = result.warnings
        assert warning.startswith(f"backward {says}")


def test_torch_sees_the_wrong_vmap_rules_as_the_check_does() -> None:
    """torch's gradcheck batches backward only, so it cannot judge a vmap rule: torch.func.vmap shows it."""
    x = torch.randn(3, 4, 4, dtype=DT)
    assert torch.allclose(torch.func.vmap(Cube.apply)(x), x**3)
    assert torch.allclose(torch.func.vmap(WrongVmapRule.apply)(x), x**2)
    assert torch.func.vmap(WrongOutDims.apply)(x).shape == (4, 4, 3)
    for fn in (WrongVmapRule, WrongOutDims):
        assert torch.autograd.gradcheck(fn.apply, x44())  # its backward is right one call at a time


def test_interp_pattern_names_the_buffer_not_out() -> None:
    result = run_check(FlattenThenBuffer, x44())
    assert "out=" not in result.message and "index_add_" in result.message


@pytest.mark.parametrize(
    "fn",
    [ItemGrad, BufferGrad, FlattenThenBuffer, EinsumStateful, Double],
    ids=["ItemGrad", "BufferGrad", "FlattenThenBuffer", "EinsumStateful", "Square"],
)
def test_agrees_with_torch_where_torch_can_judge(fn: Any) -> None:
    if fn is Double:
        fn = type("Square", (Double,), {"backward": staticmethod(lambda ctx, g: 2 * g)})
    args = x44()
    if fn is EinsumStateful:  # torch's vmap cannot run einsum: judge the same state without it
        fn = Stateful
    theirs = torch_verdict(fn, args)
    ours = run_check(fn, args).status
    assert ours is (Status.PASS if theirs else Status.FAIL), ours
    assert theirs is (fn.__name__ == "Square")


class NonzeroForward(Function):
    """2x computed at the nonzero entries only, with generate_vmap_rule: right, but vmap cannot batch nonzero."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        idx = x.nonzero(as_tuple=True)
        out = torch.zeros_like(x)
        out[idx] = 2 * x[idx]
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


def test_an_op_vmap_cannot_batch_in_forward_is_a_note_not_a_failure() -> None:
    with pytest.raises(RuntimeError, match="Batching rule not implemented for aten::nonzero_numpy"):
        torch.func.vmap(NonzeroForward.apply)(torch.randn(3, 4, dtype=DT))
    result = run_check(NonzeroForward, x44())
    assert result.status is Status.PASS, result.message
    assert "torch has no batching rule for aten::nonzero_numpy (used by forward at " in result.message
    assert "torch.func.vmap over forward cannot be checked here" in result.message
    assert "one backward with 3 grad_outputs = 3 backward calls" in result.message


def test_words_torch_does_not_explain_are_not_called_the_functions_fault() -> None:
    odd = RuntimeError("some new failure of torch's batching")
    assert not batched.is_defect(odd) and batched.limit(odd) is None
    said = batched.untold("backward", "vmap over backward", odd)
    assert said.startswith("vmap over backward cannot be checked here: it raised where single calls did not")
    assert "some new failure of torch's batching" in said
    for known in (
        RuntimeError("Batching rule not implemented for aten::item. We could not generate a fallback."),
        RuntimeError(
            "Batching rule not implemented for aten::mul.out; the fallback path doesn't work on out= or view ops."
        ),
    ):
        assert batched.is_defect(known) and batched.limit(known) is None
    view = RuntimeError(
        "Batching rule not implemented for aten::flatten.using_ints; the fallback path doesn't work "
        "on out= or view ops."
    )
    assert (
        not batched.is_defect(view) and batched.limit(view) == "torch has no batching rule for aten::flatten.using_ints"
    )


def test_an_add_into_a_buffer_in_torch_funcs_words_is_the_buffer_hazard() -> None:
    """torch.func.vmap says `out += g` into an unbatched `out` differently from the older vmap."""
    with pytest.raises(RuntimeError) as info:
        torch.func.vmap(lambda g: torch.zeros(4, dtype=DT).add_(g))(torch.ones(3, 4, dtype=DT))
    assert "doesn't match the broadcast shape" in str(info.value)
    assert batched.is_defect(info.value) and batched.limit(info.value) is None


def test_the_interp_example_warns_for_its_buffer_not_for_torchs_flatten() -> None:
    legacy, func = torch_batches(Interp, interp()).split(" | ")
    assert "aten::flatten.using_ints" in legacy and "being vmapped over but `self` not" in func
    for named, status in ((True, Status.FAIL), (False, Status.SKIP)):
        result = run_check(Interp, interp(), named=named)
        assert result.status is status and "aten::flatten" not in result.message
        assert INTERP_LINE in result.message
        assert "writes batched values in place into a tensor it created itself" in result.message
