"""gradcheck-cli and torch.autograd.gradcheck agree on a corpus with known verdicts.

``tests/corpus.py`` holds correct and deliberately wrong custom autograd Functions.
First the corpus itself is validated against torch's own gradcheck (whole case and
per argument), then gradcheck-cli's library API must reach the same verdicts.
"""

from __future__ import annotations

import inspect

import pytest
import torch

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import CORPUS, Case
except ImportError:  # pragma: no cover
    from tests.corpus import CORPUS, Case

SEED = 1234
MAX_NUMEL = 64

CORRECT = [c for c in CORPUS if c.correct]
WRONG = [c for c in CORPUS if not c.correct]


def test_corpus_has_enough_cases():
    assert len(CORRECT) >= 20, f"only {len(CORRECT)} correct cases"
    assert len(WRONG) >= 20, f"only {len(WRONG)} wrong cases"


# ----------------------------------------------------------------------- helpers


def _make_args(case: Case) -> tuple:
    return case.make_args(torch.Generator().manual_seed(SEED))


def _uses_setup_context(fn: type) -> bool:
    return fn.setup_context is not torch.autograd.Function.setup_context


def _forward_signature(fn: type) -> inspect.Signature:
    """forward()'s signature as the caller of fn.apply sees it (without ctx)."""
    sig = inspect.signature(fn.forward)
    params = list(sig.parameters.values())
    if not _uses_setup_context(fn):
        params = params[1:]  # ctx
    return sig.replace(parameters=params)


def _bind_positionally(case: Case, args: tuple) -> tuple:
    """args plus case.kwargs (and the defaults in between) as one positional tuple."""
    bound = _forward_signature(case.fn).bind(*args, **case.kwargs)
    bound.apply_defaults()
    assert not bound.kwargs, f"{case.name}: keyword-only parameters cannot be passed to torch's gradcheck"
    return tuple(bound.args)


def _torch_verdict(fn, args: tuple) -> bool:
    try:
        return bool(torch.autograd.gradcheck(fn, args, raise_exception=False))
    except Exception:  # torch raised instead of answering: not a pass
        return False


def _ids(cases):
    return [c.name for c in cases]


# ------------------------------------------------------------ corpus sanity checks


@pytest.mark.parametrize("case", CORPUS, ids=_ids(CORPUS))
def test_corpus_inputs_are_small_reproducible_float64(case):
    args = _make_args(case)
    again = _make_args(case)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert any(t.requires_grad for t in tensors), "no differentiable input"
    for a, b in zip(args, again):
        if isinstance(a, torch.Tensor):
            assert a.dtype == torch.float64
            assert a.numel() <= MAX_NUMEL
            assert torch.equal(a, b), "make_args is not reproducible from the generator"
        else:
            assert a == b
    if not case.correct:
        names = set(_forward_signature(case.fn).parameters)
        assert set(case.wrong_args) <= names, f"wrong_args {case.wrong_args} are not parameters of forward"


# ------------------------------------------------------------ torch's own verdicts


@pytest.mark.parametrize("case", CORPUS, ids=_ids(CORPUS))
def test_torch_verdict_matches_label(case):
    if not case.torch_can_judge:
        pytest.skip(f"torch.autograd.gradcheck cannot judge this case: {case.torch_note}")
    args = _bind_positionally(case, _make_args(case))
    verdict = _torch_verdict(case.fn.apply, args)
    assert verdict == case.correct, (
        f"torch.autograd.gradcheck says {'pass' if verdict else 'fail'}, "
        f"but the case is labelled {'correct' if case.correct else 'wrong'}"
    )


@pytest.mark.parametrize("case", CORPUS, ids=_ids(CORPUS))
def test_torch_per_argument_verdicts_match_wrong_args(case):
    """Checking one differentiable argument at a time, exactly case.wrong_args fail."""
    if not case.torch_can_judge:
        pytest.skip(f"torch.autograd.gradcheck cannot judge this case: {case.torch_note}")
    args = _bind_positionally(case, _make_args(case))
    names = list(_forward_signature(case.fn).parameters)
    differentiable = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    failing = set()
    for i in differentiable:
        only_i = tuple(
            a.detach().requires_grad_(j == i) if isinstance(a, torch.Tensor) else a for j, a in enumerate(args)
        )
        if not _torch_verdict(case.fn.apply, only_i):
            failing.add(names[i])
    assert failing == set(case.wrong_args)


# ------------------------------------------------------------------ gradcheck-cli


@pytest.mark.parametrize("case", CORPUS, ids=_ids(CORPUS))
def test_gradcheck_cli_agrees_with_torch(case):
    from gradcheck_cli import check

    args = _make_args(case)
    result = check(case.fn, args, kwargs=case.kwargs)  # eps=1e-6, atol=1e-5, rtol=1e-3 like torch

    passed = result.status.value == "pass"
    detail = [
        (inp.name, inp.status.value, inp.max_abs_err, inp.diagnosis, inp.reason)
        for check_result in result.checks
        for inp in check_result.inputs
    ]
    assert passed == case.correct, (
        f"gradcheck-cli says {result.status.value} ({getattr(result, 'error', None)}), "
        f"but the case is labelled {'correct' if case.correct else 'wrong'}; inputs: {detail}"
    )

    inputs = result.checks[0].inputs
    failing = {inp.name for inp in inputs if inp.status.value == "fail"}
    if case.correct:
        assert not failing, f"a passing case reports failing arguments {failing}: {detail}"
    else:
        assert failing, f"no argument of a wrong case has status fail: {detail}"
        if case.wrong_args:
            # e.g. bad_linear_wrong_weight_only: only `weight` is wrong, `x` and `bias` are right.
            assert failing == set(case.wrong_args), f"failing arguments {failing}, expected {set(case.wrong_args)}"


@pytest.mark.parametrize("case", CORPUS, ids=_ids(CORPUS))
def test_probe_mode_gives_the_same_verdicts(case):
    """--fast decides with a few signed random probes per argument: the same verdict as torch's slow
    mode on every case, and the failing arguments found element by element after a probe fails."""
    from gradcheck_cli import FAST_PROBES, check

    result = check(case.fn, _make_args(case), kwargs=case.kwargs, probes=FAST_PROBES)
    assert (result.status.value == "pass") == case.correct, result.checks[0].message
    (backward,) = result.checks
    if case.correct:
        assert backward.mode == "probe"
    else:
        failing = {inp.name for inp in backward.inputs if inp.status.value == "fail"}
        assert failing == set(case.wrong_args)
