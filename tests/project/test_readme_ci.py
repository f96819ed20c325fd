"""CI runs exactly the README's test command.

The README's "Quick start" shows one command under "Run the tests"; ``.ci/run`` must run that
command and no other pytest command, so what a reader runs is what CI checks.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTEST = re.compile(r"^(python3? -m )?pytest\b")


def commands(text: str) -> list[str]:
    """The shell lines of ``text`` without blank lines and ``#`` comments, stripped."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def readme_test_command() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quick_start = re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.S | re.M)
    assert quick_start, "README.md has no '## Quick start' section"
    after = quick_start.group(1).split("Run the tests", 1)
    assert len(after) == 2, "README.md's Quick start has no 'Run the tests' paragraph"
    block = re.search(r"```[a-z]*\n(.*?)```", after[1], re.S)
    assert block, "no code block after 'Run the tests' in README.md's Quick start"
    (command,) = commands(block.group(1))  # one command, nothing else in the block
    return command


def ci_test_commands() -> list[str]:
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    return [line for line in commands(script) if PYTEST.match(line)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = readme_test_command()
    assert PYTEST.match(readme), readme
    ci = ci_test_commands()
    assert len(ci) == 1, f".ci/run should run pytest once, as the README says: {ci}"
    # compared as words (a trailing comment in .ci/run is allowed), otherwise exactly
    assert shlex.split(ci[0], comments=True) == shlex.split(readme), (
        f"README.md's test command is {readme!r} but .ci/run runs {ci[0]!r}: change both together"
    )


def test_the_readme_names_every_other_test_run_of_ci() -> None:
    """The other pytest runs of .ci/run (the full relations, the other CPUs' rounding) are written in the
    README, as they run."""
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    others = re.findall(r'^[A-Z_]+="(python -m pytest .*)"$', script, re.M)
    assert len(others) == 2, others
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for other in others:
        assert f"`{other}`" in readme, f"README.md should show the command .ci/run runs: {other!r}"
    for isa in re.findall(r"^for isa in (.*); do$", script, re.M)[0].split():
        assert isa in readme, isa
