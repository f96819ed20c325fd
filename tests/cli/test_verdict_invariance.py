"""Issue 14: the same verdicts for any order, any -j, in-process, isolated and under the plugin.

The batch mixes correct and wrong Functions with callables that change global state (grad mode,
the default dtype, monkeypatched torch functions, the working directory, deterministic flags, a
thread left running, state set at import). The truth is each spec checked alone in a fresh
process; every run of the whole batch, in any order and mode, must give exactly those verdicts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

USER = """
import os, tempfile, threading, time
import torch


class Sin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


class Wrong(Sin):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * g * torch.cos(x)


def scaled(x):  # reads a file relative to the working directory
    with open("scale.txt") as f:
        return x * float(f.read())


def scratch(x):  # right only when the default dtype is float64: fails in a fresh process
    # (in float32 the gradient is cut; a float32 buffer alone is judged again at float32 level and passes)
    t = torch.empty(x.shape)
    return t.copy_(x if t.dtype == torch.float64 else x.detach()) ** 2


def disables_grad(x):
    y = x * 3
    torch.set_grad_enabled(False)
    return y


def sets_float64_default(x):
    torch.set_default_dtype(torch.float64)
    return x * 3


def patches_sin(x):
    torch.sin = lambda t: t * 0
    return x * 3


def changes_directory(x):
    os.chdir(tempfile.gettempdir())
    return x * 3


def sets_deterministic(x):
    torch.use_deterministic_algorithms(True)
    return x * 3


def leaves_a_thread(x):
    threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()
    return x * 3
"""

IMPORT_TIME = """
import torch

torch.set_default_dtype(torch.float64)


def scratch(x):
    t = torch.empty(x.shape)
    return t.copy_(x if t.dtype == torch.float64 else x.detach()) ** 2
"""

FUNCTIONS = [
    "usermod:Sin",
    "usermod:Wrong",
    "usermod:scaled",
    "usermod:scratch",
    "usermod:disables_grad",
    "usermod:sets_float64_default",
    "usermod:patches_sin",
    "usermod:changes_directory",
    "usermod:sets_deterministic",
    "usermod:leaves_a_thread",
    "importtime:scratch",
    "usermod:Sin",
]
MODES = [
    ("cli", "-j", "1"),
    ("cli", "-j", "2"),
    ("cli", "--no-isolate"),
    ("plugin",),
    ("plugin", "-n", "2"),
    ("plugin", "--gradcheck-no-isolate"),
]


def name(k: int) -> str:
    return f"{k:02d}_{FUNCTIONS[k].replace(':', '_').lower()}"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("invariance")
    (root / "usermod.py").write_text(USER)
    (root / "importtime.py").write_text(IMPORT_TIME)
    (root / "scale.txt").write_text("2.0")
    (root / "all").mkdir()
    for k, function in enumerate(FUNCTIONS):
        (root / "all" / f"{name(k)}.yaml").write_text(f"function: {function}\ninputs: [{{shape: [3]}}]\n")
    return root


def gradcheck(cwd: Path, *args: str) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", *args, "--format", "json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return {Path(r["spec"]).stem[-100:]: r["status"] for r in json.loads(proc.stdout)["results"]}


# Each spec alone, in a process of its own that has imported torch and gradcheck-cli and nothing else: forked
# from one that did only that (as gradcheck's own workers are), so that torch is imported once, not once a spec.
ALONE = """
import os, sys
import torch  # noqa: F401
from gradcheck_cli.cli import main

for path in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        with open(path + ".alone.json", "w") as out:
            os.dup2(out.fileno(), 1)
            try:
                main([path, "--no-isolate", "--format", "json"])
            except SystemExit:
                pass
            sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
"""


@pytest.fixture(scope="module")
def truth(project: Path) -> dict[str, str]:
    """Each spec alone, in a fresh process."""
    paths = [f"all/{name(k)}.yaml" for k in range(len(FUNCTIONS))]
    subprocess.run([sys.executable, "-c", ALONE, *paths], cwd=project, capture_output=True, timeout=600, check=True)
    verdicts = {}
    for path in paths:
        results = json.loads((project / f"{path}.alone.json").read_text())["results"]
        verdicts.update({Path(r["spec"]).stem[-100:]: r["status"] for r in results})
    assert len(verdicts) == len(FUNCTIONS)
    assert verdicts[name(0)] == "pass" and verdicts[name(1)] == "fail" and verdicts[name(3)] == "fail"
    assert verdicts[name(10)] == "pass"  # the same scratch passes where its module set float64 at import
    return verdicts


def batch(project: Path, order: list[int]) -> Path:
    """The specs in ``order`` (file names sort in that order) in a fresh folder."""
    folder = project / ("run_" + "_".join(map(str, order)))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for position, k in enumerate(order):
        shutil.copy(project / "all" / f"{name(k)}.yaml", folder / f"{position:02d}-{name(k)}.yaml")
    return folder


def plugin(cwd: Path, folder: Path, *args: str) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gradcheck", folder.name, "-rA", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    verdicts = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::" in rest:
            stem = Path(rest.split("::")[0]).stem
            verdicts[stem] = {"PASSED": "pass", "FAILED": "fail", "SKIPPED": "skip"}.get(word, "error")
    return verdicts


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(len(FUNCTIONS))), mode=st.sampled_from(MODES))
def test_verdicts_do_not_depend_on_order_jobs_or_isolation(project, truth, order, mode):
    folder = batch(project, list(order))
    if mode[0] == "cli":
        got = gradcheck(project, folder.name, *mode[1:])
    else:
        got = plugin(project, folder, *mode[1:])
    got = {stem.split("-", 1)[1]: verdict for stem, verdict in got.items()}
    expected = dict(truth)
    if mode[0] == "plugin":  # pytest has pass and fail; an error result is a failed test
        expected = {k: "fail" if v == "error" else v for k, v in expected.items()}
    assert got == expected, (mode, order)
