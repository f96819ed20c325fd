"""The shipped specs' verdicts under two torch installs, compared (issue 45 item 4; not in CI: a second torch
is gigabytes to install on each run).

    python benchmarks/compare_torch.py PYTHON_A PYTHON_B [SPEC_PATHS...]

Each PYTHON is an interpreter whose environment has torch (and click, rich, pyyaml, numpy); this checkout is
put first on its path (PYTHONPATH), so nothing needs installing there. Both run
``python -m gradcheck_cli SPEC_PATHS --format json -j 1`` (default: specs/ broken-specs/) and the script
prints, per case id, the status under each where they differ, then one line with the torch versions and the
counts. Exit 0 when every case has the same status under both, 1 when one differs, 2 when a run could not
give its JSON report (its stderr is shown).

The status is what the maths determines; rows' numbers are rounding (another torch may sum in another
order) and are not compared. Cases whose check torch itself lacks in one version (a skip with the reason)
count as differences: the script says what a version cannot do, and the docs say which versions were tried.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def verdicts(python: str, paths: list[str]) -> tuple[str, dict[str, str]]:
    """``python``'s torch version and the status of every case of ``paths``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, env=env
    )
    if version.returncode:
        sys.exit(f"{python}: cannot import torch:\n{version.stderr[-2000:]}")
    done = subprocess.run(
        [python, "-m", "gradcheck_cli", *paths, "--format", "json", "-j", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        print(f"{python}: exit {done.returncode}, no JSON report:\n{done.stderr[-4000:]}", file=sys.stderr)
        sys.exit(2)
    return version.stdout.strip(), {r["id"]: r["status"] for r in report["results"]}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    paths = argv[2:] or ["specs/", "broken-specs/"]
    (va, a), (vb, b) = verdicts(argv[0], paths), verdicts(argv[1], paths)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for k in differ:
        print(f"{k}: torch {va} {a.get(k, 'absent')}, torch {vb} {b.get(k, 'absent')}")
    print(f"torch {va} and {vb}: {len(a)} and {len(b)} cases, {len(differ)} with another status")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
