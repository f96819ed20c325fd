"""mkdocs hook: the reference pages, generated from the code at every build, so they cannot drift.

Each page is made from the one place the code keeps that fact:

- ``reference/cli.md``: the click commands of ``gradcheck_cli.cli`` (every option: name, type, default, help);
- ``reference/spec.md``: ``gradcheck_cli/schemas/spec.schema.json`` (every key of every mapping: type,
  default, example, description), walked from the document down through ``$defs``;
- ``reference/report.md``: ``gradcheck_cli/schemas/report.schema.json`` (every field), walked the same way;
- ``reference/exit-codes.md``: ``gradcheck_cli.results.ExitCode`` (each member, its value and its comment);
- ``reference/checks.md``: ``gradcheck_cli.checks.REGISTRY`` (each check's module and ``run`` docstrings,
  read from the source with ``ast``: importing a check would import torch) and the ``Status`` enum.

Nothing here imports torch: the registry, the schemas and ``results`` are torch-free, and ``cli`` imports
torch lazily (a test holds it). The pages are written into the build only (``on_files``), never into docs/.
"""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import io
import json
import sys
import tokenize
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose code the pages describe

NOTE = (
    '!!! note "Generated"\n'
    "    This page is generated from {source} at every build of these docs (`docs/hooks/reference.py`), "
    "so it says what this version of the code does.\n"
)


def _ensure_importable() -> None:
    """This checkout first on sys.path, so the pages describe the code beside them."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def cell(text: Any) -> str:
    """``text`` made safe for a Markdown table cell: one line, no table pipes, no emphasis, no HTML; its
    `code spans` kept as code (escaped only where they hold a pipe)."""
    parts = " ".join(str(text).split()).replace("``", "`").split("`")  # reST's ``code`` is Markdown's `code`
    if len(parts) % 2 == 0:  # an unbalanced backtick: all of it is plain text
        parts = ["&#96;".join(parts)]
    out = []
    for i, part in enumerate(parts):
        if i % 2 and "|" not in part and part.strip():
            out.append(f"`{part}`")
            continue
        part = html.escape(part, quote=False)
        for char, entity in (("|", "&#124;"), ("*", "&#42;"), ("[", "&#91;")):
            part = part.replace(char, entity)
        out.append(part if i % 2 == 0 else f"<code>{part}</code>")
    return "".join(out)


def code(text: Any) -> str:
    """``text`` as an inline code span that may sit in a table cell."""
    body = str(text).replace("|", "&#124;")
    return f"`` {body} ``" if "`" in body else f"`{body}`"


def _yaml(value: Any) -> str:
    """A JSON value as it is written in a YAML spec (flow style)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and (abs(value) < 1e-3 or abs(value) >= 1e6) and value != 0:
        return f"{value:.1e}".replace("e-0", "e-").replace("e+0", "e+")  # 1.0e-6, as the README writes it
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value) if not isinstance(value, str) else value


# --- the command line ---------------------------------------------------------------------------------------


def _option_type(param: Any) -> str:
    import click

    if getattr(param, "is_flag", False) and not getattr(param, "count", False):
        return "flag"
    kind = param.type
    words: str
    if isinstance(kind, click.Choice):
        words = "one of " + ", ".join(code(c) for c in kind.choices)
    elif isinstance(kind, (click.IntRange, click.FloatRange)):
        bounds = []
        if kind.min is not None:
            bounds.append(f"&ge; {kind.min}")
        if kind.max is not None:
            bounds.append(f"&le; {kind.max}")
        words = ("integer" if isinstance(kind, click.IntRange) else "number") + (" " + ", ".join(bounds))
    elif isinstance(kind, click.Path):
        words = "path"
    elif kind is click.INT:
        words = "integer"
    elif kind is click.FLOAT:
        words = "number"
    else:
        words = cell(param.metavar) if getattr(param, "metavar", None) else "text"
    if getattr(param, "multiple", False) or getattr(param, "nargs", 1) == -1:
        words += " (repeatable)" if isinstance(param, click.Option) else " (any number)"
    return words


def _help_text(text: str) -> list[str]:
    """A command's help as Markdown: click's paragraphs, the ones it keeps as written (``\\b``) as text blocks."""
    out: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if paragraph.startswith("\b\n"):
            out += ["```text", paragraph[2:], "```", ""]
        elif "\n  " in paragraph:  # an indented example after an introducing line
            head, _, rest = paragraph.partition("\n")
            out += [head, "", "```text", rest, "```", ""]
        else:
            out += [paragraph, ""]
    return out


def option_default(param: Any) -> Optional[str]:
    """An option's default as the reference shows it, or None where it has none."""
    default = param.default
    if default is None or callable(default) or type(default).__name__ == "Sentinel" or default == ():
        return None
    if getattr(param, "is_flag", False) and default is False:
        return None  # a flag that is off unless given
    return str(default)


def option_names(param: Any) -> list[str]:
    """Every spelling of an option (``--color``, ``--no-color``)."""
    return [*param.opts, *getattr(param, "secondary_opts", [])]


def commands() -> list[tuple[str, Any]]:
    """The ``gradcheck`` group (as ``gradcheck``) and each of its commands (``gradcheck NAME``)."""
    _ensure_importable()
    from gradcheck_cli.cli import cli

    return [("gradcheck", cli), *((f"gradcheck {name}", cmd) for name, cmd in sorted(cli.commands.items()))]


def cli_page() -> str:
    """reference/cli.md: every command, argument and option of the click command line."""
    import click

    root = click.Context(commands()[0][1], info_name="gradcheck")
    out = ["# Command line", "", NOTE.format(source="the click commands of `gradcheck_cli/cli.py`"), ""]
    out.append(
        "`gradcheck TARGETS` is `gradcheck check TARGETS`: `check` is the default command. Options of `check` "
        "also take their defaults from `[tool.gradcheck]` in pyproject.toml (see "
        "[Configuration](configuration.md)); the defaults below are those without it."
    )
    for full, cmd in commands():
        ctx = root if full == "gradcheck" else click.Context(cmd, info_name=full.split()[-1], parent=root)
        anchor = full.replace(" ", "-")
        out += ["", f"## `{full}` {{#{anchor}}}", ""]
        out += [
            "```text",
            "Usage: " + full + " " + " ".join(cmd.collect_usage_pieces(ctx)),
            "```",
            "",
            *_help_text(cmd.help or ""),
        ]
        arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
        if arguments:
            out += ["| argument | type | default |", "|---|---|---|"]
            for p in arguments:
                default = option_default(p)
                out.append(f"| `{p.human_readable_name}` | {_option_type(p)} | {code(default) if default else '-'} |")
            out.append("")
        options = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
        if options:
            out += ["| option | type | default | what it does |", "|---|---|---|---|"]
            for p in options:
                names = ", ".join(code(n) for n in option_names(p))
                default = option_default(p)
                shown = code(default) if default else "-"
                out.append(f"| {names} | {_option_type(p)} | {shown} | {cell(p.help or '')} |")
        if isinstance(cmd, click.Group):
            out += ["", "Commands: " + ", ".join(f"[`{n}`](#gradcheck-{n})" for n in sorted(cmd.commands))]
    return "\n".join(out) + "\n"


# --- JSON Schemas -----------------------------------------------------------------------------------------


def load_schema(name: str) -> dict[str, Any]:
    """A shipped JSON Schema (``spec`` or ``report``), read through the package (no torch)."""
    _ensure_importable()
    from gradcheck_cli import schemas

    return schemas.load(name)


def _ref_name(node: dict[str, Any]) -> Optional[str]:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) and ref.startswith("#/$defs/") else None


def _resolved(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``node`` with the fields of the definition it refers to, its own fields winning."""
    name = _ref_name(node)
    return {**_resolved(defs[name], defs), **node} if name else node


def type_of(node: Any, defs: dict[str, Any], depth: int = 0) -> str:
    """A JSON Schema node's type in words, with links to the named definitions it uses."""
    if not isinstance(node, dict) or depth > 4:
        return "any"
    name = _ref_name(node)
    if name:
        target = defs[name]
        if "properties" in target:  # a mapping: its own section
            return f"[{name}](#{anchor_of(name)})"
        return type_of(target, defs, depth + 1)
    if "const" in node:
        return code(_yaml(node["const"]))
    if "enum" in node:
        values = node["enum"]
        shown = ", ".join(code(_yaml(v)) for v in values[:24]) + (", ..." if len(values) > 24 else "")
        return "one of " + shown
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            return " or ".join(dict.fromkeys(type_of(alt, defs, depth + 1) for alt in node[combinator]))
    kinds = node.get("type")
    if kinds is None and "allOf" in node:
        return " and ".join(dict.fromkeys(type_of(alt, defs, depth + 1) for alt in node["allOf"]))
    if kinds is None:
        return "object" if "properties" in node else "any"
    words = []
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if kind == "array" and "items" in node:
            words.append(f"list of {type_of(node['items'], defs, depth + 1)}")
        elif kind in ("integer", "number") and ("minimum" in node or "maximum" in node):
            low, high = node.get("minimum"), node.get("maximum")
            bounds = [f"&ge; {low}" if low is not None else "", f"&le; {high}" if high is not None else ""]
            words.append(f"{kind} " + ", ".join(b for b in bounds if b))
        else:
            words.append(kind)
    return " or ".join(words)


def anchor_of(section: str) -> str:
    """The HTML anchor of a schema section (a ``$defs`` name or ``parent.key`` of an inline mapping)."""
    return "def-" + section.replace(".", "-").replace("_", "-")


def _visit(node: Any, path: str, found: list[tuple[str, dict[str, Any]]]) -> None:
    """``node`` and the mappings with ``properties`` nested in it (not behind a ``$ref``, which is its own
    section), as (``path``, node), outermost first; a path already taken gets a number."""
    if not isinstance(node, dict) or "$ref" in node:
        return
    if "properties" in node:
        taken = {name for name, _ in found}
        name, n = path, 2
        while name in taken:
            name, n = f"{path}-{n}", n + 1
        found.append((name, node))
        path = name
    _nested(node, path, found)


def _nested(node: dict[str, Any], path: str, found: list[tuple[str, dict[str, Any]]]) -> None:
    for key, sub in (node.get("properties") or {}).items():
        _visit(sub, f"{path}.{key}", found)
    for combinator in ("anyOf", "oneOf", "allOf"):
        for alt in node.get(combinator) or []:
            _visit(alt, path, found)
    for key, suffix in (("items", "[]"), ("additionalProperties", ".*"), ("not", "")):
        _visit(node.get(key), path + suffix, found)


def sections(schema: dict[str, Any], root_name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every mapping of a schema that has keys, as (section name, node): the document itself
    (``root_name``), each ``$defs`` entry with ``properties``, and the inline mappings inside them."""
    found: list[tuple[str, dict[str, Any]]] = [(root_name, schema)]
    _nested(schema, root_name, found)
    for name, node in schema.get("$defs", {}).items():
        _visit(node, name, found)
    return found


def _example(node: dict[str, Any]) -> Optional[str]:
    if node.get("examples"):
        return _yaml(node["examples"][0])
    if "default" in node:
        return _yaml(node["default"])
    if node.get("enum"):
        return _yaml(node["enum"][0])
    if "const" in node:
        return _yaml(node["const"])
    return None


def schema_page(name: str, title: str, intro: str, root_name: str) -> str:
    """One section per mapping of the schema, one row per key: type, default, example, description."""
    schema = load_schema(name)
    defs = schema.get("$defs", {})
    out = [f"# {title}", "", NOTE.format(source=f"`gradcheck_cli/schemas/{name}.schema.json`"), "", intro, ""]
    if schema.get("description"):
        out += [cell(schema["description"]), ""]
    for section, node in sections(schema, root_name):
        required = set(node.get("required") or [])
        heading = node.get("title") or section
        out += ["", f"## {cell(heading)} {{#{anchor_of(section)}}}", ""]
        if section != root_name:
            out += [f"Section `{section}`" + (f": {cell(node['description'])}" if node.get("description") else "."), ""]
        out += ["| key | type | default | example | description |", "|---|---|---|---|---|"]
        for key, sub in node["properties"].items():
            full = _resolved(sub, defs) if isinstance(sub, dict) else {}
            nested = f"{section}.{key}" if isinstance(sub, dict) and "properties" in sub and "$ref" not in sub else None
            kind = f"[object](#{anchor_of(nested)})" if nested else type_of(sub, defs)
            default = "required" if key in required else (code(_yaml(full["default"])) if "default" in full else "-")
            example = _example(full)
            words = full.get("description") or full.get("title") or ""
            out.append(f"| `{key}` | {kind} | {default} | {code(example) if example else '-'} | {cell(words)} |")
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out += ["", f"Any other key: {type_of(extra, defs)}."]
    out += ["", "## Value types {#def-value-types}", ""]
    out += ["Named definitions that the tables above refer to and that have no keys of their own.", ""]
    out += ["| name | type | description |", "|---|---|---|"]
    for def_name, node in defs.items():
        if "properties" not in node:
            shown = type_of({k: v for k, v in node.items() if k != "title"}, defs)
            name = f'<span id="{anchor_of(def_name)}">`{def_name}`</span>'
            out.append(f"| {name} | {shown} | {cell(node.get('description', ''))} |")
    return "\n".join(out) + "\n"


def spec_page() -> str:
    """reference/spec.md: every key of the spec format."""
    intro = (
        "A spec file holds one or more YAML documents (separated by `---`); each is a mapping with the keys "
        "of [the spec document](#def-spec). Argument entries (under `inputs`, `kwargs` and inside `list`/`dict`) "
        "are one of a [tensor](#def-tensor), a [literal value](#def-value), an [alias](#def-same-as), a "
        "[list](#def-list) or a [dict](#def-dict). `gradcheck schema` prints this schema for editors."
    )
    return schema_page("spec", "Spec file keys", intro, "spec")


def report_page() -> str:
    """reference/report.md: every field of the JSON report."""
    intro = (
        "`gradcheck --format json` prints one object with the fields of [the report](#def-report); "
        "`gradcheck schema report` prints this schema."
    )
    return schema_page("report", "JSON report fields", intro, "report")


# --- exit codes and checks ----------------------------------------------------------------------------------


def member_comments(cls: type) -> dict[str, str]:
    """The ``#`` comment on each member line of an enum class, read from its source."""
    source = inspect.getsource(cls)
    comments: dict[str, str] = {}
    last_name: Optional[str] = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4:
            last_name = tok.string
        elif tok.type == tokenize.COMMENT and last_name and tok.start[1] > 4:
            comments[last_name] = tok.string.lstrip("# ").strip()
        elif tok.type == tokenize.NEWLINE:
            last_name = None
    return comments


def exit_codes_page() -> str:
    """reference/exit-codes.md: the members of ``ExitCode``."""
    _ensure_importable()
    from gradcheck_cli.results import ExitCode

    words = member_comments(ExitCode)
    out = ["# Exit codes", "", NOTE.format(source="`gradcheck_cli.results.ExitCode`"), ""]
    out += [cell(inspect.getdoc(ExitCode) or ""), ""]
    out += [
        "When results disagree, 3 wins over 1. An interrupted run (SIGINT, SIGTERM) still reports what "
        "finished, in every requested format, with the count not run. `--watch` exits with the code of every "
        "watched case's latest result, or 130 / 143 when stopped during a round.",
        "",
    ]
    out += ["| code | name | meaning |", "|---|---|---|"]
    for member in ExitCode:
        out.append(f"| {int(member)} | `ExitCode.{member.name}` | {cell(words.get(member.name, ''))} |")
    return "\n".join(out) + "\n"


def check_docs() -> list[tuple[str, str, str, str]]:
    """(check name, module, module docstring, run's docstring) for every check in the registry, read
    from the source with ast (importing a check imports torch)."""
    _ensure_importable()
    from gradcheck_cli import checks

    rows = []
    for name, module in checks.REGISTRY.items():
        spec = importlib.util.find_spec(f"{checks.__name__}.{module}")
        assert spec is not None and spec.origin is not None, module
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        run = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None)
        rows.append((name, module, ast.get_docstring(tree) or "", (ast.get_docstring(run) or "") if run else ""))
    return rows


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")


def checks_page() -> str:
    """reference/checks.md: each check of the registry, and what each status means."""
    _ensure_importable()
    from gradcheck_cli.results import Status

    statuses = member_comments(Status)
    meaning = {  # the contract's words (shared/contract.md, section 5) where the enum has no comment
        "PASS": "every compared value agrees within the tolerance",
        "FAIL": "the check found the Function wrong (a defect you can act on)",
        "ERROR": "it could not check (an invalid spec, an import, forward or backward that raised, ...)",
        "SKIP": "not applicable or not available here, with the reason",
    }
    out = ["# Checks", "", NOTE.format(source="`gradcheck_cli.checks.REGISTRY` and each check's docstrings"), ""]
    out += [
        "Name them in a spec's `checks:` or with `--check NAME` (repeatable); `all` runs every applicable one, "
        "in the order below. A check that cannot apply is a `skip` with the reason under `all`, and a `fail` "
        "when named explicitly. See [What each check compares](../explanation/checks.md).",
        "",
        "## Statuses {#statuses}",
        "",
        cell(inspect.getdoc(Status) or ""),
        "",
        "| status | meaning |",
        "|---|---|",
    ]
    for member in Status:
        out.append(f"| `{member.value}` | {cell(statuses.get(member.name) or meaning.get(member.name, ''))} |")
    out += ["", "| check | module |", "|---|---|"]
    for name, module, _, _ in check_docs():
        out.append(f"| [`{name}`](#{name.replace('_', '-')}) | `gradcheck_cli/checks/{module}.py` |")
    for name, _module, doc, run_doc in check_docs():
        out += ["", f"## `{name}` {{#{name.replace('_', '-')}}}", "", _rst_to_md(doc), ""]
        if run_doc:
            out += [f"`run(ctx)`: {_rst_to_md(run_doc)}", ""]
    return "\n".join(out) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/spec.md": spec_page,
    "reference/report.md": report_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/checks.md": checks_page,
}


def on_files(files: Any, config: Any) -> Any:
    """mkdocs event: add the generated reference pages to the build (replacing any file of the same name)."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        old = files.get_file_from_path(path)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=make()))
    return files


def main(argv: Optional[list[str]] = None) -> int:
    """``python docs/hooks/reference.py OUTDIR``: write the generated pages there (to read them without mkdocs)."""
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0] if args else "reference-pages")
    for path, make in PAGES.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(make(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
