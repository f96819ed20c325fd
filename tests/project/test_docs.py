"""The docs site (docs/, mkdocs.yml): its generated reference covers every option, spec key, report field,
exit code and check of the code; every `console` block that runs `gradcheck` shows what gradcheck prints;
the site builds with warnings as errors; and a page renders in headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import click
import pytest

from gradcheck_cli import checks, schemas
from gradcheck_cli.cli import cli
from gradcheck_cli.results import ExitCode, Status

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """The generated reference pages, as the docs build makes them."""
    return {path: make() for path, make in _generator().PAGES.items()}


def _sections(text: str) -> list[str]:
    """A page cut at its second-level headings (the first piece is the page's top)."""
    return re.split(r"\n(?=## )", text)


def _row(section: str, first_cell: str) -> str:
    """The table row of ``section`` whose first cell is ``first_cell``; '' when there is none."""
    for line in section.splitlines():
        if line.startswith("|") and line.split("|")[1].strip() == first_cell:
            return line
    return ""


# --- the reference covers the code ---------------------------------------------------------------------------


def _commands() -> list[tuple[str, click.Command]]:
    return [("gradcheck", cli), *((f"gradcheck {n}", c) for n, c in cli.commands.items())]


def test_every_cli_option_and_argument_is_in_the_reference(pages):
    text = pages["reference/cli.md"]
    by_heading = {s.split("\n", 1)[0]: s for s in _sections(text)}
    missing = []
    for full, command in _commands():
        section = next((s for h, s in by_heading.items() if h.startswith(f"## `{full}`")), None)
        if section is None:
            missing.append(f"the section of {full!r}")
            continue
        for param in command.params:
            if isinstance(param, click.Argument):
                if not _row(section, f"`{param.human_readable_name}`"):
                    missing.append(f"{full} argument {param.human_readable_name}")
                continue
            if getattr(param, "hidden", False):
                continue
            names = [*param.opts, *param.secondary_opts]
            row = next((line for line in section.splitlines() if line.startswith(f"| `{names[0]}`")), "")
            for name in names:
                if f"`{name}`" not in row:
                    missing.append(f"{full} {name}")
            default = param.default
            shown = not (default is None or callable(default) or default in ((), False) or "UNSET" in repr(default))
            if row and shown and f"`{default}`" not in row:
                missing.append(f"{full} {names[0]}: default {default!r}")
            if row and param.help and param.help.split()[0] not in row:
                missing.append(f"{full} {names[0]}: its help")
    assert not missing, f"the generated CLI reference lacks: {missing}"


def _mappings(node: Any, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every schema node with ``properties``, anywhere in the schema (walked over every value)."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict):
            found.append(node)
        for key, value in node.items():
            if key == "properties":
                for sub in value.values():
                    _mappings(sub, found)
            else:
                _mappings(value, found)
    elif isinstance(node, list):
        for item in node:
            _mappings(item, found)
    return found


def _missing_keys(schema: dict[str, Any], text: str) -> list[str]:
    """The keys of the schema's mappings that no section of ``text`` lists together with their siblings,
    and the schema examples that the key's row does not show."""
    tables = []
    for section in _sections(text):
        rows = {line.split("|")[1].strip().strip("`"): line for line in section.splitlines() if line.startswith("| `")}
        tables.append(rows)
    missing = []
    for mapping in _mappings(schema, []):
        keys = set(mapping["properties"])
        table = next((t for t in tables if keys <= set(t)), None)
        if table is None:
            best = max(tables, key=lambda t: len(keys & set(t)))
            missing += sorted(keys - set(best))
            continue
        for key, sub in mapping["properties"].items():
            if len(table[key].split("|")) != 7:  # key, type, default, example, description
                missing.append(f"{key}: its row")
            for example in sub.get("examples", [])[:1]:
                if json.dumps(example) not in table[key] and str(example) not in table[key]:
                    missing.append(f"{key}: example {example!r}")
    return missing


def test_every_spec_key_is_in_the_reference(pages):
    assert not _missing_keys(schemas.load("spec"), pages["reference/spec.md"])


def test_every_report_field_is_in_the_reference(pages):
    assert not _missing_keys(schemas.load("report"), pages["reference/report.md"])


def test_the_key_check_finds_a_missing_key(pages):
    schema = schemas.load("spec")
    schema["$defs"]["tolerance"]["properties"]["not_documented"] = {"type": "number"}
    assert _missing_keys(schema, pages["reference/spec.md"]) == ["not_documented"]


def test_every_exit_code_is_in_the_reference(pages):
    text = pages["reference/exit-codes.md"]
    for code in ExitCode:
        row = _row(text, str(int(code)))
        assert f"`ExitCode.{code.name}`" in row and row.split("|")[3].strip(), code  # with its meaning


def test_every_check_and_status_is_in_the_reference(pages):
    text = pages["reference/checks.md"]
    headings = {s.split("\n", 1)[0] for s in _sections(text)}
    for name in checks.REGISTRY:
        assert any(h.startswith(f"## `{name}`") for h in headings), name
    for status in Status:
        assert len(_row(text, f"`{status.value}`").split("|")[2].strip()) > 10, status


def test_the_generator_imports_no_torch():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref', {str(HOOK)!r})\n"
        "ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)\n"
        "[make() for make in ref.PAGES.values()]\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_generated_page_is_committed():
    assert not [path for path in _generator().PAGES if (DOCS / path).exists()]


# --- every command shown runs and prints what is shown ------------------------------------------------------

FENCE = re.compile(r"^```(\w*)(?:\s+title=\"([^\"]+)\")?\s*$")


def _steps(page: Path) -> list[tuple[str, str, str]]:
    """A page's files to write (``("file", path, text)``) and commands to run (``("run", command, output)``),
    in page order: the code blocks with a title, and the ``console`` blocks that run gradcheck."""
    steps: list[tuple[str, str, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = lines[i + 1 : end]
        language, title = match.groups()
        if title:
            steps.append(("file", title, "\n".join(body) + "\n"))
        elif language == "console" and body and body[0].startswith("$ gradcheck"):
            command, output = "", []
            for line in [*body, "$ "]:
                if line.startswith("$ "):
                    if command:
                        steps.append(("run", command, "\n".join(output)))
                    command, output = line[2:], []
                else:
                    output.append(line)
        i = end + 1
    return steps


PAGES_WITH_COMMANDS = sorted(
    p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if any(s[0] == "run" for s in _steps(p))
)


# The cells of a passing row that are rounding noise: its largest errors, where the largest one is and the two
# values there (the argmax of noise, which moves with the CPU's vector instructions and the summation order).
NOISE = ("max abs err", "max rel err", "worst at", "analytical / numerical", "target / reference")


def _cells(line: str, bar: str) -> list[str]:
    return [cell.strip() for cell in line.split(bar)]


def _tables(lines: list[str]) -> list[str]:
    """A rows table as its cells, without the column widths (a passing row's wider noise widens its column),
    and a passing row's noise cells as ``<noise>``: what a page pins of a table is what the maths determines."""
    out: list[str] = []
    header: list[str] = []
    for line in lines:
        if "┃" in line:
            header = _cells(line, "┃")
            out.append(" ┃ ".join(header))
        elif header and set(line.strip()) <= set("━╇"):
            out.append("━╇━")
        elif header and "│" in line:
            cells = _cells(line, "│")
            if len(cells) == len(header) and cells[header.index("status")] == "pass":
                cells = ["<noise>" if name in NOISE else cell for name, cell in zip(header, cells)]
            out.append(" │ ".join(cells))
        else:
            header = []
            out.append(line)
    return out


def _normal(text: str) -> str:
    """Output without what changes from run to run or from CPU to CPU: durations (``0.40s``, ``in 3.39s``),
    trailing space, column widths and a passing row's rounding noise (``_tables``)."""
    text = re.sub(r"\b\d+(\.\d+)?s\b", "<time>", text)
    return "\n".join(_tables([line.rstrip() for line in text.strip("\n").splitlines()]))


def test_pages_with_commands_are_found():
    assert {"index.md", "tutorial.md"} <= set(PAGES_WITH_COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS)
def test_console_blocks_show_what_gradcheck_prints(page, tmp_path):
    for folder in ("specs", "broken-specs"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS", "GRADCHECK_FUZZ_SEEDS")}
    env.update(PYTHONPATH=str(ROOT), NO_COLOR="1", PYTHONDONTWRITEBYTECODE="1", TERM="dumb")
    for kind, what, text in _steps(DOCS / page):
        if kind == "file":
            (tmp_path / what).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / what).write_text(text, encoding="utf-8")
            continue
        argv = shlex.split(what)
        assert argv[0] == "gradcheck", what
        checks = len(argv) == 1 or argv[1] == "check" or argv[1] not in cli.commands
        if checks and not {"--shrink", "--no-shrink"} & set(argv):
            # the shrunk case a page shows is what a search finds when it does not run out of time (5 s by
            # default): a loaded machine gets the time the search needs, not another output; a page that shows
            # none is run without the search
            argv += ["--shrink", "600"] if "shrunk: " in text else ["--no-shrink"]
        done = subprocess.run(
            [sys.executable, "-m", "gradcheck_cli", *argv[1:]],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert _normal(done.stdout) == _normal(text), f"{page}: `{what}` now prints:\n{done.stdout}"


def _command_lines() -> list[tuple[str, str]]:
    """(file, command) for every ``gradcheck ...`` the docs and the README show: inline code, and the
    lines of ``bash`` blocks (up to a redirection or pipe; comments dropped)."""
    found = []
    for path in [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, flags=re.S | re.M):
            for line in block.splitlines():
                for part in re.split(r"&&|\|\||;", re.split(r"\s#\s", f" {line}")[0]):
                    if part.strip().startswith("gradcheck"):
                        found.append((path.name, part.strip()))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M).replace("\n", " ")
        found += [(path.name, m) for m in re.findall(r"`(gradcheck(?: [^`]*)?)`", prose)]
    return [(name, re.split(r"\s[>|<]", command)[0]) for name, command in found]


def test_every_command_line_shown_parses_with_the_current_options():
    """A renamed or removed option makes the docs' (and the README's) command lines that use it fail here."""
    lines = _command_lines()
    assert len(lines) > 40
    wrong = []
    for where, line in lines:
        args = shlex.split(line)[1:]
        if {"-h", "--help", "-V", "--version"} & set(args):
            continue  # eager options that print and exit
        name, rest = (args[0], args[1:]) if args and args[0] in cli.commands else ("check", args)
        root = click.Context(cli, info_name="gradcheck")
        try:
            cli.commands[name].make_context(name, rest, parent=root)
        except (click.MissingParameter, click.exceptions.Exit):
            pass  # a command named without its arguments, as prose does
        except click.ClickException as error:
            wrong.append(f"{where}: `{line}`: {error.format_message()}")
    assert not wrong, "\n".join(wrong)


# --- the site builds, and renders -------------------------------------------------------------------------


def _build(config: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``target`` (never with -q: it hides the warnings that strict counts)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(target)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built with warnings as errors (broken links and anchors fail it)."""
    target = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", target)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "index.md", "a", encoding="utf-8") as page:
        page.write("\nSee [the tutorial's last step](tutorial.md#6-no-such-step).\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 1 and "#6-no-such-step" in done.stderr, done.stderr


def test_the_site_builds_strict_with_the_generated_reference(site):
    for path in _generator().PAGES:
        html = (site / path.removesuffix(".md") / "index.html").read_text(encoding="utf-8")
        assert "<table>" in html, path
    assert "--max-memory" in (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for html_file in site.rglob("*.html"):  # offline: no web fonts or other outside requests
        assert "fonts.googleapis" not in html_file.read_text(encoding="utf-8"), html_file


def test_readme_and_dev_extra_give_the_build_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'pip install -e ".[dev]" && mkdocs build --strict' in readme
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    names = {re.split(r"[~<>=!\[; ]", requirement, maxsplit=1)[0] for requirement in extras["dev"]}
    assert {"mkdocs", "mkdocs-material"} <= names  # CI (.ci/run) installs .[dev], so it builds the site
    assert not any(r.startswith("mkdocs") for r in extras["test"])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed to render the page")
def test_headless_chromium_renders_a_page_offline(site, tmp_path):
    page = site / "tutorial" / "index.html"
    flags = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--user-data-dir=" + str(tmp_path / "profile")]
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1400,1600", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 1400
    dom = subprocess.run(
        [*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "The first useful failure" in dom and "analytical / numerical" in dom  # the page and its output
    assert "fonts.googleapis" not in dom


def test_a_pages_table_pins_a_failing_rows_place_and_not_a_passing_rows_noise():
    shown = """argument ┃ status ┃ max abs err ┃ worst at ┃ mismatched ┃ analytical / numerical
━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━
0: x     │ pass   │ 1.5e-09     │ [10, 4]  │ 0 / 512    │ 0.00979 / 0.00979
1: w     │ fail   │ 3.15        │ [0, 1]   │ 240 / 256  │ -3.15 / 0"""
    other_cpu = shown.replace("1.5e-09     │ [10, 4] ", "1.57e-09  │ [24, 11]").replace(
        "0.00979 / 0.00979", "-0.0014 / -0.0014"
    )
    assert _normal(other_cpu) == _normal(shown)
    for wrong in ("[0, 2]  ", "240 / 255", "-3.1 / 0", "fail   │ 1.5e-09", "│ pass   │ 3.15"):
        changed = shown.replace(
            {
                "[0, 2]  ": "[0, 1]  ",
                "240 / 255": "240 / 256",
                "-3.1 / 0": "-3.15 / 0",
                "fail   │ 1.5e-09": "pass   │ 1.5e-09",
                "│ pass   │ 3.15": "│ fail   │ 3.15",
            }[wrong],
            wrong,
        )
        assert changed != shown and _normal(changed) != _normal(shown), wrong
