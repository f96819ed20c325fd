"""gradcheck --watch: rounds driven through the watch loop's hooks (each edit is made after a round or at
a given look at the files, so the next look sees it: no timing), and Ctrl-C on the real command."""

from __future__ import annotations

import io
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from gradcheck_cli.results import ErrorKind, Report, Status
from gradcheck_cli.run import plan
from gradcheck_cli.run.discovery import resolve
from gradcheck_cli.watch import Hooks, Settings, Watch, spec_files_of

SQUARE = """
import torch
{imports}

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x * {factor}
"""


def square(factor: str, imports: str = "") -> str:
    return SQUARE.format(factor=factor, imports=imports)


def spec_text(function: str, shape: str = "[3, 4]") -> str:
    return f"function: {function}\ninputs:\n  - shape: {shape}\n"


class Run:
    """A watch over ``specs/`` whose rounds are recorded; ``edits[n]`` runs after round n,
    ``at_poll[(n, k)]`` at the k-th look at the files after round n."""

    def __init__(
        self,
        rounds: int,
        edits: Optional[dict[int, Callable[[], None]]] = None,
        at_poll: Optional[dict[tuple[int, int], Callable[[], None]]] = None,
        opts: Optional[plan.RunOptions] = None,
    ) -> None:
        self.reports: list[Report] = []
        self.err, self.out = io.StringIO(), io.StringIO()
        edits, at_poll = edits or {}, at_poll or {}

        def on_round(n: int, report: Report) -> None:
            self.reports.append(report)
            if n in edits:
                edits[n]()

        def on_poll(k: int) -> bool:
            if (len(self.reports), k) in at_poll:
                at_poll[(len(self.reports), k)]()
            return k > 600  # a round that never comes: stop after a minute of looks, the test then fails

        watch = Watch(
            lambda: resolve(["specs"], Path("specs"), [], []),
            lambda: spec_files_of(["specs"], Path("specs")),
            opts or plan.RunOptions(),
            lambda report, planned: None,
            Settings(threads=1, err=self.err, out=self.out, interval=0.1),
            Hooks(rounds=rounds, on_round=on_round, on_poll=on_poll),
        )
        self.code = watch.run()

    def statuses(self, n: int) -> list[tuple[str, Status]]:
        """Round n's (spec file, status) pairs."""
        return [(r.spec, r.status) for r in self.reports[n - 1].results]


def test_a_backward_fixed_on_disk_changes_the_next_rounds_verdict(user_module, write_spec, tmp_path):
    mod = user_module(square("3"), "sqmod")
    write_spec(spec_text(f"{mod}:Square"), "specs/square.yaml")
    run = Run(2, edits={1: lambda: (tmp_path / "sqmod.py").write_text(square("2.0"))})
    assert run.statuses(1) == [("specs/square.yaml", Status.FAIL)]
    assert run.statuses(2) == [("specs/square.yaml", Status.PASS)]
    assert "round 2 (changed: sqmod.py): checking 1 of 1 case" in run.err.getvalue()
    assert "watching 1 case (1 passed) in 1 spec file, 1 module; Ctrl-C to stop" in run.err.getvalue()
    assert run.code == 0  # the state now: every watched case passes


def test_an_edited_spec_is_checked_again_with_its_new_inputs(user_module, write_spec, tmp_path):
    mod = user_module(square("2"), "sqmod")
    spec = write_spec(spec_text(f"{mod}:Square"), "specs/square.yaml")
    run = Run(2, edits={1: lambda: spec.write_text(spec_text(f"{mod}:Square", "[5, 6, 2]"))})
    shapes = [r.results[0].checks[0].inputs[0].shape for r in run.reports]
    assert shapes == [[3, 4], [5, 6, 2]]
    assert run.statuses(2) == [("specs/square.yaml", Status.PASS)]


def test_a_change_rechecks_only_the_specs_that_import_the_file(user_module, write_spec, tmp_path):
    user_module("def factor():\n    return 2\n", "helper_b")
    user_module(square("2"), "mod_a")
    user_module(square("factor()", "from helper_b import factor"), "mod_b")
    user_module("X = 1\n", "unrelated")
    write_spec(spec_text("mod_a:Square"), "specs/a.yaml")
    write_spec(spec_text("mod_b:Square"), "specs/b.yaml")
    # after round 1: an unrelated file changes (nothing to re-check), later the helper that mod_b imports
    run = Run(
        2,
        at_poll={
            (1, 1): lambda: (tmp_path / "unrelated.py").write_text("X = 22\n"),
            (1, 5): lambda: (tmp_path / "helper_b.py").write_text("def factor():\n    return 3\n"),
        },
    )
    assert run.statuses(1) == [("specs/a.yaml", Status.PASS), ("specs/b.yaml", Status.PASS)]
    assert run.statuses(2) == [("specs/b.yaml", Status.FAIL)]
    assert "round 2 (changed: helper_b.py): checking 1 of 2 cases" in run.err.getvalue()
    assert run.code == 1


def test_a_syntax_error_is_that_rounds_error_and_the_watch_goes_on(user_module, write_spec, tmp_path):
    mod = user_module(square("2"), "sqmod")
    write_spec(spec_text(f"{mod}:Square"), "specs/square.yaml")
    source = tmp_path / "sqmod.py"
    run = Run(
        3,
        edits={
            1: lambda: source.write_text(square("2") + "\ndef broken(:\n"),
            2: lambda: source.write_text(square("2.00")),
        },
    )
    assert run.statuses(1) == [("specs/square.yaml", Status.PASS)]
    (broken,) = run.reports[1].results
    assert broken.status is Status.ERROR and broken.error is not None and broken.error.kind is ErrorKind.IMPORT
    assert "SyntaxError" in broken.error.message
    assert run.statuses(3) == [("specs/square.yaml", Status.PASS)]


def test_a_module_moved_away_and_back_is_checked_again_and_a_syntax_error_in_it_reported(
    user_module, write_spec, tmp_path
):
    """issue 31 item 13: a module moved away (import error, "0 modules" watched) and put back ran no round, and
    the watch's state stayed an error (exit 3)"""
    mod = user_module(square("2"), "sqmod")
    write_spec(spec_text(f"{mod}:Square"), "specs/square.yaml")
    source, away = tmp_path / "sqmod.py", tmp_path / "sqmod.py.away"
    run = Run(
        4,
        edits={
            1: lambda: source.rename(away),
            2: lambda: away.rename(source),
            3: lambda: source.write_text(square("2") + "\ndef broken(:\n"),
        },
    )
    assert run.statuses(1) == [("specs/square.yaml", Status.PASS)]
    (gone,) = run.reports[1].results
    assert gone.status is Status.ERROR and gone.error is not None and gone.error.kind is ErrorKind.IMPORT
    assert run.statuses(3) == [("specs/square.yaml", Status.PASS)]  # back: a round, and it passes
    (broken,) = run.reports[3].results
    assert broken.error is not None and "SyntaxError" in broken.error.message
    assert "watching 1 case (1 error) in 1 spec file, 1 module" in run.err.getvalue()


def test_a_module_that_registers_a_custom_op_is_reloaded_in_a_fresh_worker(user_module, write_spec, tmp_path):
    op = """
        import torch

        @torch.library.custom_op("watchtest::sq", mutates_args=())
        def sq(x: torch.Tensor) -> torch.Tensor:
            return x * x

        def _setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        def _backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x * {factor}

        sq.register_autograd(_backward, setup_context=_setup)
    """
    import textwrap

    mod = user_module(op.format(factor="3"), "opmod")
    write_spec(spec_text(f"{mod}:sq", "[3]"), "specs/op.yaml")
    run = Run(2, edits={1: lambda: (tmp_path / "opmod.py").write_text(textwrap.dedent(op.format(factor="2.0")))})
    assert run.statuses(1) == [("specs/op.yaml", Status.FAIL)]
    assert run.statuses(2) == [("specs/op.yaml", Status.PASS)]
    assert "a fresh worker, as opmod.py registers custom ops" in run.err.getvalue()


def test_ctrl_c_stops_the_watch_with_the_state_exit_code_and_no_traceback(
    user_module, write_spec, tmp_path, gradcheck_argv
):
    user_module(square("3"), "sqmod")
    write_spec(spec_text("sqmod:Square"), "specs/square.yaml")
    proc = subprocess.Popen(
        [*gradcheck_argv, "--watch", "specs/", "--no-color"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 300  # a bound for a broken run only
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if not line or "Ctrl-C to stop" in line:
            break
    assert "watching 1 case (1 failed) in 1 spec file, 1 module; Ctrl-C to stop" in seen[-1], seen
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=600)  # a bound for a hung run only, not a speed
    assert proc.returncode == 1, stderr  # every watched case's latest result: one failed
    assert "FAIL" in stdout and "1 failed" in stdout
    assert "stopped watching: 1 case (1 failed) in 1 spec file, 1 module; exit code 1" in stderr
    assert "Traceback" not in stderr, stderr


def test_watch_and_no_isolate_is_a_usage_error(user_module, write_spec, invoke):
    user_module(square("2"), "sqmod")
    write_spec(spec_text("sqmod:Square"), "specs/square.yaml")
    result = invoke("specs/", "--watch", "--no-isolate")
    assert result.exit_code == 2 and "leave out --no-isolate" in result.stderr


QUITTING = """
import torch
import gradcheck_cli.subject.devices

gradcheck_cli.subject.devices.forks_run_backward = lambda: False  # as on a machine with a GPU: the search runs here

class Quitting(torch.autograd.Function):  # wrong; away from the spec's shape it raises KeyboardInterrupt itself
    @staticmethod
    def forward(ctx, x):
        if tuple(x.shape) != (6, 8):
            raise KeyboardInterrupt
        return 3 * x

    @staticmethod
    def backward(ctx, g):
        return 6 * g
"""


def test_an_attempt_of_the_search_that_raises_keyboard_interrupt_leaves_the_verdict(user_module, write_spec):
    # in the watch's worker, as in the pool's (plan.interrupted): the search is information only; before, the
    # failing case became a forward error
    mod = user_module(QUITTING, "quitmod")
    write_spec(spec_text(f"{mod}:Quitting", "[6, 8]"), "specs/quitting.yaml")
    run = Run(1, opts=plan.RunOptions(shrink=30))
    (result,) = run.reports[0].results
    assert result.status is Status.FAIL and result.error is None, result.error
    assert any("cut short" in w and "KeyboardInterrupt" in w for w in result.warnings), result.warnings
