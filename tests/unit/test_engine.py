"""numerics.engine.grad: the very gradients and errors of torch.autograd.grad, without its sympy import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gradcheck_cli.numerics import engine

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import CORPUS, Case
except ImportError:  # pragma: no cover
    from tests.corpus import CORPUS, Case

ROOT = Path(__file__).resolve().parents[2]


def _graph(case: Case, seed: int = 7) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(live outputs, inputs that require grad, grad_outputs) of one corpus case."""
    gen = torch.Generator().manual_seed(seed)
    args = case.make_args(gen)
    out = case.fn.apply(*args)
    outs = out if isinstance(out, tuple) else (out,)
    live = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    probes = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in live]
    return live, inputs, probes


def _identical(got: tuple, want: tuple) -> bool:
    return len(got) == len(want) and all(
        (g is None and w is None)
        or (g is not None and w is not None and g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w))
        for g, w in zip(got, want)
    )


CASES = [c for c in CORPUS if not c.kwargs and _graph(c)[0]]  # apply() takes positional arguments only


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_gradients_as_torch_on_the_agreement_corpus(case: Case) -> None:
    live, inputs, probes = _graph(case)
    for kwargs in ({"retain_graph": True, "allow_unused": True}, {"retain_graph": True, "materialize_grads": True}):
        got = engine.grad(live, inputs, [p.clone() for p in probes], **kwargs)
        want = torch.autograd.grad(live, inputs, [p.clone() for p in probes], **kwargs)
        assert _identical(got, want), (case.name, kwargs)


@pytest.mark.parametrize("case", CASES[:6], ids=[c.name for c in CASES[:6]])
def test_same_gradients_batched_and_with_a_graph(case: Case) -> None:
    live, inputs, probes = _graph(case)
    batch = [torch.stack([p, 2 * p, -p]) for p in probes]
    got = engine.grad(live, inputs, batch, retain_graph=True, allow_unused=True, is_grads_batched=True)
    want = torch.autograd.grad(live, inputs, batch, retain_graph=True, allow_unused=True, is_grads_batched=True)
    assert _identical(got, want)
    got = engine.grad(live, inputs, probes, create_graph=True, allow_unused=True)
    want = torch.autograd.grad(live, inputs, probes, create_graph=True, allow_unused=True)
    assert _identical(tuple(g.detach() for g in got), tuple(w.detach() for w in want))
    assert [g.requires_grad for g in got] == [w.requires_grad for w in want]


def test_defaults_free_the_graph_as_torch_does() -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = x.exp()
    engine.grad(y, x, torch.ones(3, dtype=torch.float64))  # retain_graph defaults to create_graph (False)
    with pytest.raises(RuntimeError, match="second time"):
        engine.grad(y, x, torch.ones(3, dtype=torch.float64))


def _raised(call) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


class Broken(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise ValueError("the user's backward broke on purpose")


class TooMany(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g, g


@pytest.mark.parametrize(
    "grads",
    [
        lambda y: [torch.ones(3, dtype=torch.float64)],  # the user's backward raises
        lambda y: [torch.ones(4, dtype=torch.float64)],  # a grad_output of another shape
        lambda y: [torch.ones(3, dtype=torch.complex128)],  # complex for a real output
        lambda y: [None],  # no grad_output for a non-scalar output
        lambda y: [],  # too few grad_outputs
    ],
    ids=["backward raises", "shape", "complex", "none", "count"],
)
def test_same_errors_as_torch(grads) -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = Broken.apply(x)
    assert _raised(lambda: engine.grad([y], [x], grads(y), retain_graph=True)) == _raised(
        lambda: torch.autograd.grad([y], [x], grads(y), retain_graph=True)
    )


def test_same_error_for_a_backward_that_returns_too_many_gradients() -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = TooMany.apply(x)
    g = torch.ones(3, dtype=torch.float64)
    assert _raised(lambda: engine.grad(y, x, g, retain_graph=True)) == _raised(
        lambda: torch.autograd.grad(y, x, g, retain_graph=True)
    )


def test_a_scalar_output_without_grad_output_is_torch_s_case() -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = (x * x).sum()
    assert _identical(engine.grad(y, x, None, retain_graph=True), torch.autograd.grad(y, x, retain_graph=True))


def test_checking_a_small_spec_does_not_import_sympy() -> None:
    """torch.autograd.grad imports sympy (a third of a second) on its first call with a grad_output."""
    script = textwrap.dedent(f"""
        import sys
        from gradcheck_cli import spec
        from gradcheck_cli.run.runner import run_case
        (case,) = spec.load_file({str(ROOT / "specs" / "relu.yaml")!r})
        result = run_case(case, "cpu")
        print(result.status.value, "sympy" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["pass", "False"], out.stdout + out.stderr


def test_a_compressed_check_does_not_import_sympy() -> None:
    """Nor does the compressed path (torch.unravel_index's argument checks import it too): a Linear layer
    of 24, past the size taken whole, with grouped rows on its diagonals."""
    script = textwrap.dedent("""
        import sys
        import torch
        from gradcheck_cli import check
        from gradcheck_cli.examples.linear import LinearFunction
        from gradcheck_cli.numerics import compressed
        used = []
        evaluate = compressed.Groups.evaluate
        compressed.Groups.evaluate = lambda self: used.append(1) or evaluate(self)
        args = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((24, 24), (24, 24), (24,))]
        print(check(LinearFunction, args).status.value, bool(used), "sympy" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["pass", "True", "False"], out.stdout + out.stderr
