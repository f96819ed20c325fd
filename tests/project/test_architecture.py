"""The floor plan, held by tests: the check registry, the contract's enums and the schemas agree;
no import cycle inside the package; no module imports another's private name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from gradcheck_cli import checks, schemas
from gradcheck_cli.results import ErrorKind, Pattern

PACKAGE = Path(checks.__file__).resolve().parent.parent


def test_every_registered_check_has_a_run_and_the_schemas_list_exactly_them():
    for name in checks.REGISTRY:
        assert callable(checks.get(name)), name
    spec_enum = schemas.load("spec")["$defs"]["check_name"]["enum"]
    assert spec_enum == list(checks.NAMES)


def test_error_kinds_and_patterns_are_the_report_schema_enums():
    props = schemas.load("report")["$defs"]
    assert props["error"]["properties"]["kind"]["enum"] == [k.value for k in ErrorKind]
    assert props["input"]["properties"]["pattern"]["enum"] == [None] + [p.value for p in Pattern]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported gradcheck_cli module, names taken from it) for each import in ``path``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("gradcheck_cli"):
                names = [a.name for a in node.names]
                submodules = [f"{base}.{n}" for n in names if _is_module(f"{base}.{n}")]
                found += [(s, []) for s in submodules]
                rest = [n for n in names if f"{base}.{n}" not in submodules]
                if rest:  # `from . import mod` takes a submodule, not a name of the package
                    found.append((base, rest))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("gradcheck_cli")]
    return found


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").exists()


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def test_no_module_imports_a_private_name_of_another():
    private = [
        f"{_module_name(p)} takes {n} from {m}"
        for p in PACKAGE.rglob("*.py")
        for m, names in _imports(p)
        for n in names
        if n.startswith("_") and n != "__version__"
    ]
    assert private == []


def test_results_import_no_reporter_they_register_how_results_show_themselves():
    """The result model is the contract the reporters read: it imports none of them, not even lazily;
    ``reporters.display`` registers their drawings (``results.shown_as``) and the library API imports it."""
    upward = [m for p in [PACKAGE / "results.py"] for m, _ in _imports(p) if m.startswith("gradcheck_cli.reporters")]
    assert upward == []
    code = "import sys, gradcheck_cli.results; assert not any('reporters' in m or m == 'rich' for m in sys.modules)"
    import subprocess
    import sys

    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_no_import_cycle_inside_the_package():
    graph = {_module_name(p): {m for m, _ in _imports(p) if m != _module_name(p)} for p in PACKAGE.rglob("*.py")}
    # a package's __init__ is imported with each of its modules: importing pkg.mod imports pkg first
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, stack: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend(stack[stack.index(nxt) :] + [node, nxt] if nxt in stack else [node, nxt])
                return True
            if nxt not in state and visit(nxt, stack + [node]):
                return True
        state[node] = 2
        return False

    assert not any(visit(n, []) for n in sorted(graph) if n not in state), " -> ".join(cycle)


LEAVES = ("gradcheck_cli.core.tolerance",)  # the bottom floor beside numerics: they import nothing of the package


def test_the_numerics_import_nothing_of_the_package_outside_them():
    """numerics/ is pure torch: it knows no check, result or spec, and no module above it (their random
    streams are ``numerics.streams``), lazy imports included; only the leaves beside it (the tolerances,
    which the torch-free spec reads too), which import nothing of the package themselves."""
    numerics = PACKAGE / "numerics"
    outside = [
        f"{_module_name(p)} imports {m}"
        for p in numerics.rglob("*.py")
        for m, _ in _imports(p)
        if not m.startswith("gradcheck_cli.numerics") and m not in LEAVES
    ]
    assert outside == []
    for leaf in LEAVES:
        assert _imports(PACKAGE.parent / (leaf.replace(".", "/") + ".py")) == [], leaf


def test_the_seeds_are_the_bottom_floor_the_spec_takes_them_from_rng():
    """rng.py (the range of a seed, the seed after a seed) imports nothing of the package and no torch,
    so the spec, the plan and the runner all read it without pulling in anything above them."""
    import subprocess
    import sys

    assert _imports(PACKAGE / "core" / "rng.py") == []
    code = "import sys, gradcheck_cli.core.rng; assert 'torch' not in sys.modules and 'gradcheck_cli.spec' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    defined = [p.name for p in (PACKAGE / "spec").glob("*.py") if "\nSEEDS = " in p.read_text(encoding="utf-8")]
    assert defined == []  # one definition of the seeds' range


def test_the_cli_and_the_check_names_import_no_torch():
    import subprocess
    import sys

    code = "import sys, gradcheck_cli.cli, gradcheck_cli.checks, gradcheck_cli.spec; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    importlib.import_module("gradcheck_cli.checks")


def test_the_development_map_lists_every_module():
    """The development guide's map (docs/development.md) names each module of the package under its folder (examples/ and
    schemas/ as folders), folders nested by indentation: a new module is not done until the map says what it is for."""
    import re

    guide = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    block = guide[guide.index("```\ngradcheck_cli/") :]
    block = block[: block.index("\n```")]
    listed: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, name/) of the folders open at this line
    for line in block.splitlines()[2:]:
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > 2 + 2 * len(folders):
            names = re.findall(r"\b(\w+\.py)\b", line)  # a description's continuation
        else:
            while folders and folders[-1][0] >= indent:
                folders.pop()
            first = line.split()[0]
            names = re.findall(r"\b(\w+\.py)\b", line)
            if first.endswith("/"):
                folders.append((indent, first))
                continue
        listed |= {"".join(f for _, f in folders) + name for name in names}
    modules = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.parent.name not in ("examples", "schemas") and "__pycache__" not in p.parts
    }
    assert sorted(modules - listed) == []
