"""A failing case shrunk to a smaller one that fails alike (issue 33 item 5): the search, its bounds, and
that the smaller case really fails (here, in its replay, and for torch.autograd.gradcheck)."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch

from gradcheck_cli import schemas
from gradcheck_cli.results import ErrorInfo, ErrorKind, Pattern, Shrunk, Status, to_dict
from gradcheck_cli.run import pool, runner, session, shrink
from gradcheck_cli.run.plan import RunOptions, Task
from gradcheck_cli.spec import load_file

SOURCE = """
import os, signal, time
import torch

class Scale(torch.autograd.Function):  # wrong at every shape: backward is 2x the derivative
    @staticmethod
    def forward(ctx, x):
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 6 * g

class Right(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()

class Wide(torch.autograd.Function):  # wrong only where the last dim is 4 or more (a "fast path")
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (2.0 if x.shape[-1] >= 4 else 1.0) * g * x.cos()

class Linear(torch.autograd.Function):  # y = x w^T + b; the weight's gradient 2x; dims tied by the matmul
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, 2 * g.t() @ x, g.sum(0)

class Log(torch.autograd.Function):  # log(x) for x > 0; backward 2x the derivative
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.log()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g / x

class Interrupting(torch.autograd.Function):  # wrong; away from the spec's shape it gets a Ctrl-C, as a group would
    @staticmethod
    def forward(ctx, x):
        if tuple(x.shape) != (6, 8):
            os.kill(os.getpid(), signal.SIGINT)
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 6 * g

class Quitting(torch.autograd.Function):  # wrong; away from the spec's shape it raises KeyboardInterrupt itself
    @staticmethod
    def forward(ctx, x):
        if tuple(x.shape) != (6, 8):
            raise KeyboardInterrupt
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 6 * g

class Chatty(torch.autograd.Function):  # wrong, and at any other shape: prints, changes state, raises
    @staticmethod
    def forward(ctx, x):
        if tuple(x.shape) != (12, 10):
            print("CHATTY SAYS HELLO", flush=True)
            os.write(1, b"CHATTY ON FD 1\\n")
            os.write(2, b"CHATTY ON FD 2\\n")
            torch.set_default_dtype(torch.float32)
            raise ValueError("only 12x10")
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 6 * g

class Picky(torch.autograd.Function):  # wrong, and at any other shape: raises, hangs, prints, changes state
    @staticmethod
    def forward(ctx, x):
        if tuple(x.shape) != (12, 10):
            print("PICKY SAYS HELLO", flush=True)
            os.write(1, b"PICKY ON FD 1\\n")
            torch.set_default_dtype(torch.float32)
            if x.shape[0] == 12:
                time.sleep(600)
            raise ValueError("only 12x10")
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 6 * g
"""


@pytest.fixture
def spec(user_module, write_spec):
    user_module(SOURCE, "shrinkmod")

    def make(function: str, *shapes: list[int]) -> Task:
        inputs = "".join(f"\n  - shape: {list(s)}" for s in shapes)
        path = write_spec(f"function: shrinkmod:{function}\ninputs:{inputs}\n", f"{function.lower()}.yaml")
        (case,) = load_file(str(path))
        return Task(case, "cpu")

    return make


def run(task: Task, **opts) -> runner.CaseResult:
    return runner.run_task(dataclasses.replace(task, opts=RunOptions(**opts)))


def replayed(task: Task, shrunk: Shrunk) -> runner.CaseResult:
    """The shrunk case as its replay command checks it: --seed SEED --shape NAME=DIMS ..."""
    shapes = tuple((name, tuple(shape)) for name, shape in shrunk.shapes.items())
    return run(task, seed=shrunk.seed, shapes=shapes, values=tuple(shrunk.values.items()))


def row(result: runner.CaseResult, name: str):
    return next(r for c in result.checks if c.check == "backward" for r in c.inputs if r.name == name)


def torch_says(function, *shapes: list[int]) -> bool:
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    return torch.autograd.gradcheck(function.apply, args, raise_exception=False)


@pytest.mark.slow  # the case itself, at 64 x 128, is most of it
def test_a_bug_at_every_shape_shrinks_to_a_tiny_shape_that_fails_alike(spec):
    task = spec("Scale", [64, 128])
    result = run(task, shrink=60)
    assert result.status is Status.FAIL
    assert row(result, "x").pattern is Pattern.CONSTANT_RATIO
    shrunk = result.shrunk
    assert shrunk is not None
    assert (shrunk.check, shrunk.argument, shrunk.pattern) == ("backward", "x", Pattern.CONSTANT_RATIO)
    assert (shrunk.shapes, shrunk.values) == ({"x": [1, 1]}, {"x": "zeros"})
    again = replayed(task, shrunk)  # its replay fails at that shape, as the case did
    assert again.status is Status.FAIL
    assert (row(again, "x").shape, row(again, "x").pattern) == ([1, 1], Pattern.CONSTANT_RATIO)
    import shrinkmod

    assert not torch_says(shrinkmod.Scale, [1, 1])  # and torch agrees the smaller case is wrong


def test_tied_dims_shrink_together_and_the_replay_fails(spec):
    task = spec("Linear", [64, 32], [16, 32], [16])
    result = run(task, shrink=60)
    assert result.status is Status.FAIL
    assert result.shrunk is not None
    assert result.shrunk.argument == "w"
    assert result.shrunk.shapes == {"x": [1, 1], "w": [1, 1], "b": [1]}
    assert result.shrunk.values == {"x": "ones", "w": "zeros", "b": "zeros"}  # x zeros: w's gradient 0, right
    again = replayed(task, result.shrunk)
    assert again.status is Status.FAIL
    assert row(again, "w").pattern is Pattern.CONSTANT_RATIO and row(again, "w").shape == [1, 1]
    assert row(again, "x").status is Status.PASS


def test_a_bug_from_dim_4_on_stops_at_4(spec):
    task = spec("Wide", [8, 24])
    result = run(task, shrink=60)
    assert result.shrunk is not None
    assert (result.shrunk.shapes, result.shrunk.values) == ({"x": [1, 4]}, {"x": "zeros"})
    assert replayed(task, result.shrunk).status is Status.FAIL
    shrunk_3 = dataclasses.replace(result.shrunk, shapes={"x": [1, 3]})
    assert replayed(task, shrunk_3).status is Status.PASS  # one smaller passes: 4 is the smallest
    import shrinkmod

    assert not torch_says(shrinkmod.Wide, [1, 4]) and torch_says(shrinkmod.Wide, [1, 3])


def test_a_square_matrix_shrinks_square(user_module, write_spec):
    # dist spd takes square shapes only: an attempt at another shape is a spec error, which does not count
    path = write_spec(
        "function: gradcheck_cli.examples.structured:CholeskyNoHalf\ninputs:\n  - {name: a, shape: [4, 4], dist: spd}\n",
        "chol.yaml",
    )
    (case,) = load_file(str(path))
    task = Task(case, "cpu")
    result = run(task, shrink=60)
    assert result.shrunk is not None
    (shape,) = result.shrunk.shapes.values()
    assert shape[0] == shape[1] < 4
    again = replayed(task, result.shrunk)
    assert again.status is Status.FAIL and row(again, "a").shape == shape


def test_the_same_seed_gives_the_same_shrunk_case(spec):
    task = spec("Linear", [12, 6], [5, 6], [5])
    first, second = run(task, shrink=60).shrunk, run(task, shrink=60).shrunk
    assert first is not None and second is not None
    assert (first.shapes, first.values, first.seed, first.attempts) == (
        second.shapes,
        second.values,
        second.seed,
        second.attempts,
    )


def test_simpler_values_stay_in_the_spec_range(user_module, write_spec):
    user_module(SOURCE, "shrinkmod")
    path = write_spec("function: shrinkmod:Log\ninputs:\n  - {shape: [5, 6], dist: positive}\n", "log.yaml")
    (case,) = load_file(str(path))
    task = Task(case, "cpu")
    result = run(task, shrink=60)
    assert result.shrunk is not None
    assert (result.shrunk.shapes, result.shrunk.values) == ({"x": [1, 1]}, {"x": "ones"})  # never zeros: log
    assert replayed(task, result.shrunk).status is Status.FAIL


@pytest.mark.parametrize(
    ("entry", "allowed"),
    [
        ({}, {"zeros": (0, 1), "ones": (1, 2), "integers": (-2, 3)}),  # within 3 std, not on it
        ({"dist": "positive"}, {"ones": (1, 2), "integers": (1, 4)}),
        ({"dist": "uniform", "low": -1.0, "high": 1.0}, {"zeros": (0, 1)}),
        ({"dist": "uniform", "low": 0.0, "high": 1.0}, {}),  # the bounds are not inside
        ({"avoid": [[-0.1, 0.1]]}, {"ones": (1, 2)}),  # a kink at 0 kept away from
        ({"dist": "normal", "mean": 5.0, "std": 0.1}, {}),
        ({"dtype": "int64", "dist": "randint", "low": 0, "high": 5}, {}),
        ({"dtype": "complex128"}, {}),
        ({"dist": "spd"}, {}),
    ],
)
def test_the_simpler_values_a_spec_allows(entry, allowed):
    from gradcheck_cli.spec import parse_argument
    from gradcheck_cli.subject import overrides

    arg = parse_argument({"shape": [3, 3], **entry}, "inputs[0]")
    assert overrides.kinds(arg, "float64") == allowed


def test_a_correct_function_never_shrinks_and_pays_nothing(spec, monkeypatch):
    calls = []
    monkeypatch.setattr(shrink, "shrunk", lambda *a, **k: calls.append(a))
    result = run(spec("Right", [64, 128]), shrink=60)
    assert result.status is Status.PASS
    assert result.shrunk is None and calls == []


def test_without_a_budget_nothing_is_shrunk_and_the_result_is_the_same(spec):
    task = spec("Scale", [6, 8])
    off, on = run(task), run(task, shrink=60)
    assert off.shrunk is None and on.shrunk is not None

    def timeless(r: runner.CaseResult) -> dict:
        checks = [dataclasses.replace(c, duration_s=0) for c in r.checks]
        return to_dict(dataclasses.replace(r, shrunk=None, duration_s=0, checks=checks))

    assert timeless(on) == timeless(off)


def test_attempts_that_raise_hang_print_or_change_state_change_nothing(spec, capfd):
    task = spec("Picky", [12, 10])
    dtype = torch.get_default_dtype()
    began = time.perf_counter()
    result = run(task, shrink=1.5)
    spent = time.perf_counter() - began
    assert result.status is Status.FAIL and result.error is None
    assert result.shrunk is None  # every smaller case raised or hung: none counts
    assert spent < 120  # bounded by the budget (a hung attempt would sleep 600 s)
    assert torch.get_default_dtype() is dtype
    out, err = capfd.readouterr()
    assert "PICKY" not in out + err


def test_the_time_budget_stays_within_half_the_timeout(spec, monkeypatch):
    budgets = []
    monkeypatch.setattr(shrink, "shrunk", lambda result, start, allowed, attempt, budget, **k: budgets.append(budget))
    run(spec("Scale", [6, 8]), shrink=60, timeout=10)
    assert len(budgets) == 1 and 0 < budgets[0] <= 5


def test_a_ctrl_c_that_reaches_the_child_is_the_parents_to_handle(spec):
    """A terminal sends Ctrl-C to the whole process group, the shrinking child too: the parent, which gets it as
    well, ends the child; the child itself goes on (here the parent got none, so the search finishes)."""
    result = run(spec("Interrupting", [6, 8]), shrink=60)
    assert result.status is Status.FAIL
    assert result.shrunk is not None and result.shrunk.shapes == {"x": [1, 1]}


@pytest.mark.parametrize("stop,said", [(KeyboardInterrupt, "SIGINT"), (session.Terminated, "SIGTERM")])
def test_an_interrupt_while_shrinking_stops_the_run_and_keeps_the_verdict(spec, monkeypatch, stop, said):
    """The case failed before the interrupt: its result is reported, the cases after it are not run."""

    def interrupted(*args: object) -> None:
        raise stop()

    monkeypatch.setattr(runner, "_shrunk", interrupted)
    tasks = [spec("Scale", [6, 8]), spec("Right", [3])]
    report = session.execute([t.case for t in tasks], RunOptions(shrink=60), session.BatchOptions(isolate=False))
    assert [r.status for r in report.results] == [Status.FAIL]
    assert report.interrupted == said and report.not_run == 1


def found(result: runner.CaseResult) -> tuple:
    assert result.shrunk is not None
    return result.shrunk.shapes, result.shrunk.values, result.shrunk.seed, result.shrunk.attempts


def test_where_a_forked_child_cannot_run_backward_the_search_runs_here_and_finds_the_same_case(spec, monkeypatch):
    """On a machine with a GPU torch refuses backward in a child forked after a backward: the search runs in
    this process (``devices.forks_run_backward`` asks torch; tests/cli/test_autograd_fork.py emulates the
    refusal itself) and finds what the forked search finds, attempt for attempt."""
    task = spec("Linear", [6, 5], [4, 5], [4])
    forked = run(task, shrink=60)
    monkeypatch.setattr(runner.devices, "forks_run_backward", lambda: False)
    here = run(task, shrink=60)
    assert here.status is Status.FAIL and found(here) == found(forked)
    assert here.shrunk.shapes == {"x": [1, 1], "w": [1, 1], "b": [1]}


def test_without_fork_the_search_runs_here(spec, monkeypatch):
    forked = run(spec("Scale", [6, 8]), shrink=60)
    monkeypatch.delattr(os, "fork")
    here = run(spec("Scale", [6, 8]), shrink=60)
    assert here.status is Status.FAIL and found(here) == found(forked)


def test_attempts_here_that_raise_print_or_change_state_change_nothing(spec, monkeypatch, capfd):
    monkeypatch.setattr(runner.devices, "forks_run_backward", lambda: False)
    task = spec("Chatty", [12, 10])
    dtype = torch.get_default_dtype()
    result = run(task, shrink=60)
    assert result.status is Status.FAIL and result.error is None
    assert result.shrunk is not None and result.shrunk.shapes == {}  # every smaller shape raised: only values
    assert torch.get_default_dtype() is dtype
    out, err = capfd.readouterr()
    assert "CHATTY" not in out + err


def test_a_forked_child_can_run_backward_here():
    from gradcheck_cli.subject import devices

    x = torch.ones(3, requires_grad=True)
    (x * x).sum().backward()  # this process has run backward: on a CPU machine a child still can
    assert devices.forks_run_backward() is True


def test_moves_shrink_tied_sizes_together_first():
    first = next(shrink.moves({"x": (64, 32), "w": (16, 32), "b": (16,)}))
    assert first == {"x": (1, 32), "w": (16, 32), "b": (16,)}
    sizes_32 = [m for m in shrink.moves({"x": (64, 32), "w": (16, 32)}) if m["x"][0] == 64 and m["w"][0] == 16]
    assert sizes_32[0] == {"x": (64, 1), "w": (16, 1)}  # the matmul's inner dims move as one
    assert shrink.candidates(64) == [1, 2, 32, 63] and shrink.candidates(2) == [1] and shrink.candidates(1) == []


def test_the_report_schema_describes_every_field_of_shrunk():
    shrunk = schemas.load("report")["$defs"]["shrunk"]
    names = {f.name for f in dataclasses.fields(Shrunk)}
    assert set(shrunk["properties"]) == names == set(shrunk["required"])


# ---------------------------------------------------------------------------------- a case on a GPU


def on_a_gpu(task: Task, monkeypatch: pytest.MonkeyPatch, cuda_error_from: int = 0) -> list[Task]:
    """``task`` as a CUDA case whose checks run on the CPU (the emulation: what the search decides is what it
    decides on a GPU): its trials recorded; from the ``cuda_error_from``-th on (0: never), each ends in a CUDA
    error, as an attempt after a device-side assert would."""
    real, ran = runner._trials, []

    def trials(t: Task) -> runner.CaseResult:
        ran.append(t)
        got = real(dataclasses.replace(t, device="cpu"))
        if cuda_error_from and len(ran) >= cuda_error_from:
            got.status, got.error = Status.ERROR, ErrorInfo(ErrorKind.CUDA, "CUDA error: device-side assert triggered")
        return got

    monkeypatch.setattr(runner, "_trials", trials)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("a CUDA case's search forked"))  # a CUDA context is not forked
    monkeypatch.setattr(runner.state_guard.GUARD, "_tainted", [])  # this process's own, put back after the test
    return ran


def test_a_gpu_cases_failure_is_shrunk_in_a_worker_that_is_replaced_after_it(spec, monkeypatch):
    # before, a case on a GPU was never shrunk (a CUDA context is not forked); a pool's worker searches in itself
    task = dataclasses.replace(spec("Linear", [6, 5], [4, 5], [4]), device="cuda", opts=RunOptions(shrink=60))
    ran = on_a_gpu(task, monkeypatch)
    got = runner.run_task(task, disposable=True)
    assert got.status is Status.FAIL and got.shrunk is not None
    assert got.shrunk.shapes == {"x": [1, 1], "w": [1, 1], "b": [1]}
    assert len(ran) == 1 + got.shrunk.attempts and all(t.device == "cuda" for t in ran)
    assert not runner.state_guard.GUARD.tainted()  # no attempt broke the device: the worker goes on


def test_a_gpu_case_is_not_shrunk_in_a_process_that_stays(spec, monkeypatch):
    # in-process (--no-isolate, the pytest plugin, Python): a CUDA error in an attempt would break the next cases
    task = dataclasses.replace(spec("Linear", [6, 5], [4, 5], [4]), device="cuda", opts=RunOptions(shrink=60))
    ran = on_a_gpu(task, monkeypatch)
    got = runner.run_task(task)
    assert got.status is Status.FAIL and got.shrunk is None and len(ran) == 1


def test_a_cuda_error_in_an_attempt_ends_the_search_and_the_worker(spec, monkeypatch):
    task = dataclasses.replace(spec("Linear", [6, 5], [4, 5], [4]), device="cuda", opts=RunOptions(shrink=60))
    ran = on_a_gpu(task, monkeypatch, cuda_error_from=3)  # the case, one attempt, then a CUDA error
    got = runner.run_task(task, disposable=True)
    assert got.status is Status.FAIL and len(ran) == 3  # no attempt after the error: the device is unusable
    assert got.shrunk is not None and got.shrunk.attempts == 2  # what the first attempt found stands
    assert got.shrunk.shapes == {"x": [1, 5]}
    (why,) = runner.state_guard.GUARD.tainted()  # a pool's worker is replaced before its next task
    assert why.startswith("a CUDA error in the search for a smaller failing case: CUDA error: device-side assert")


class Pipe:
    """A worker's end of its pipe to the parent: the messages it will receive, and those it sent."""

    def __init__(self, *messages: object) -> None:
        self.inbox, self.sent = list(messages), []

    def recv(self) -> object:
        return self.inbox.pop(0)

    def send(self, message: object) -> None:
        self.sent.append(message)


def in_a_worker(task: Task, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """``task`` checked by a pool worker's loop in this process (what the case starts is not ended here: this
    process is pytest's); the messages the worker sent."""
    monkeypatch.setattr(pool.processes, "started", lambda: frozenset())
    monkeypatch.setattr(runner.state_guard.GUARD, "_tainted", [])  # what earlier tests left in this process: not its
    pipe = Pipe((0, task), None)
    pool._tasks(pipe)
    return pipe.sent


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_in_a_worker_an_attempt_that_raises_keyboard_interrupt_leaves_the_verdict_as_it_was(spec, monkeypatch, device):
    # no Ctrl-C reaches a worker, so a KeyboardInterrupt there is the code under test's; raised by an attempt of
    # the search (information only), it cut the search short and must not make the failing case an error
    task = dataclasses.replace(spec("Quitting", [6, 8]), device=device, opts=RunOptions(shrink=60))
    if device == "cuda":
        on_a_gpu(task, monkeypatch)  # the search runs in the worker
    else:
        monkeypatch.setattr(runner.devices, "forks_run_backward", lambda: False)  # a machine with a GPU
    sent = in_a_worker(task, monkeypatch)
    assert [m[0] for m in sent] == ["started", "verdict", "done"]
    result = sent[-1][3]
    assert result.status is Status.FAIL and result.error is None and result.shrunk is None, result.error
    assert any("cut short" in w and "KeyboardInterrupt" in w for w in result.warnings), result.warnings


def test_in_a_worker_a_case_that_raises_keyboard_interrupt_is_an_error(spec, monkeypatch):
    task = dataclasses.replace(spec("Quitting", [5, 8]), opts=RunOptions(shrink=60))
    result = in_a_worker(task, monkeypatch)[-1][3]
    assert result.status is Status.ERROR and result.error.kind is ErrorKind.FORWARD
    assert "raised KeyboardInterrupt" in result.error.message
