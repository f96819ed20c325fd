"""The ``gradcheck`` command line; the only module that imports click.

torch is imported only once there is something to check, so --help and --version stay fast.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import click
from click.core import ParameterSource
from click.shell_completion import CompletionItem

from . import __version__
from .checks import NAMES as CHECKS
from .core import options
from .reporters import FORMATS as REPORTERS
from .results import ExitCode, Report

PROGRESS_MIN = 3  # more cases than this get a progress bar
FORMATS = (*REPORTERS, "auto")  # the reporters' registry (no torch behind it), plus auto
CONFIG = "gradcheck.config"  # ctx.meta key of the check command's Config


class DefaultGroup(click.Group):
    """A group whose default subcommand is ``check``: ``gradcheck specs/`` = ``gradcheck check specs/``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and ctx.resilient_parsing:  # shell completion of the first word: commands and paths
            return super().parse_args(ctx, args)
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version", "-V")):
            args = ["check", *args]  # bare `gradcheck`: the paths of [tool.gradcheck], or a hint
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """``gradcheck sp<TAB>``: file paths (the default command's targets), and the commands that match;
        ``gradcheck --ch<TAB>``: the options of the group and of the default command."""
        if incomplete.startswith("-"):
            check = self.commands["check"]
            return [
                *super().shell_complete(ctx, incomplete),
                *check.shell_complete(click.Context(check, info_name="check", parent=ctx), incomplete),
            ]
        return [CompletionItem(incomplete, type="file"), *super().shell_complete(ctx, incomplete)]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """``gradcheck --help``: the group's options, the default command's (``gradcheck TARGETS`` is
        ``gradcheck check TARGETS``), then the commands."""
        click.Command.format_options(self, ctx, formatter)
        check = self.commands["check"]
        sub = click.Context(check, info_name="check", parent=ctx)
        records = [r for p in check.get_params(sub) if isinstance(p, click.Option) and (r := p.get_help_record(sub))]
        with formatter.section("Options of check, the default command (gradcheck TARGETS = gradcheck check TARGETS)"):
            formatter.write_dl(records)
        self.format_commands(ctx, formatter)


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``gradcheck-cli 0.1.0 (torch 2.13.0, Python 3.11.7)``, without importing torch."""
    if not value or ctx.resilient_parsing:
        return
    import importlib.metadata  # here: a run's start-up (before the workers' torch import begins) need not pay it

    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    click.echo(f"gradcheck-cli {__version__} (torch {torch}, Python {platform.python_version()})")
    ctx.exit()


class ConfiguredCommand(click.Command):
    """A command whose defaults come from [tool.gradcheck] of the nearest pyproject.toml (the command
    line wins: click's default map); the configuration is kept in ``ctx.meta[CONFIG]``."""

    def make_context(
        self, info_name: Optional[str], args: list[str], parent: Optional[click.Context] = None, **extra: Any
    ) -> click.Context:
        from .config import Config, ConfigError, load

        try:
            found = load()
        except ConfigError as exc:
            if extra.get("resilient_parsing") or (parent is not None and parent.resilient_parsing):
                found = Config()  # shell completion: no error messages
            else:
                raise click.UsageError(str(exc)) from exc
        extra["default_map"] = {**found.defaults, **(extra.get("default_map") or {})}
        ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta[CONFIG] = found
        return ctx


@click.group(
    cls=DefaultGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 passed, 1 a check failed, 2 usage error, 3 a spec could not be checked, "
    "4 internal error. See `gradcheck check --help` for the options.",
)
@click.option(
    "-V",
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version (and torch's) and exit.",
)
def cli() -> None:
    """Check the hand-written backward of custom torch.autograd.Functions against finite differences.

    \b
      gradcheck specs/                      every spec file under specs/
      gradcheck specs/linear.yaml           one spec file
      gradcheck pkg.mod.MyFunction          the specs in ./specs that name it
      gradcheck pkg.mod.MyFunction -i 20x20 -i 30x20   inline input shapes
    """


def _parse_shard(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[tuple[int, int]]:
    if value is None:
        return None
    index, _, count = value.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise click.BadParameter(f"expected I/N with 1 <= I <= N, e.g. 2/4; got {value!r}")
    return int(index), int(count)


def _parse_shapes(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    import re

    shapes: dict[str, tuple[int, ...]] = {}
    for text in value:
        name, eq, dims = text.partition("=")
        if not eq or not name or not re.fullmatch(r"scalar|\d+(x\d+)*", dims):
            raise click.BadParameter(
                f"expected NAME=DIMS with the argument's name as the report gives it and a shape like 2x3 "
                f"(or scalar), e.g. --shape weight=2x3; got {text!r}"
            )
        shapes[name] = () if dims == "scalar" else tuple(int(d) for d in dims.split("x"))
    return tuple(shapes.items())


def _parse_values(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    from .subject.overrides import KINDS

    values: dict[str, str] = {}
    for text in value:
        name, eq, kind = text.partition("=")
        if not eq or not name or kind not in KINDS:
            raise click.BadParameter(
                f"expected NAME=KIND with the argument's name as the report gives it and KIND one of "
                f"{', '.join(KINDS)}, e.g. --values x=ones; got {text!r}"
            )
        values[name] = kind
    return tuple(values.items())


def _check_junit(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:
    """The JUnit file's folder must exist before the run, not be found missing after it."""
    if value is not None and not Path(value).resolve().parent.is_dir():
        raise click.BadParameter(
            f"the folder {str(Path(value).parent)!r} does not exist; create it first (mkdir -p {Path(value).parent})"
        )
    return value


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Optional[Callable[[Any], None]]]:
    """A progress bar on stderr for runs of more than a few cases, when stderr is a terminal."""
    if total <= PROGRESS_MIN or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("checking"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        job = bar.add_task("", total=total)
        yield lambda result: bar.update(job, advance=1, description=f"{result.status.value} {result.id}")


class _Read(click.ParamType[Any]):
    """The value of an option of ``core.options``, read as its kind says (``config.read_text``: the same
    message in every front end); a typed value (a default, [tool.gradcheck]'s) by ``config.read_value``."""

    def __init__(self, option: options.Option) -> None:
        self.option = option
        self.name = (option.metavar or option.name).lower()

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        from .config import read_text, read_value

        try:
            return read_text(self.option, value) if isinstance(value, str) else read_value(self.option, value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        from .config import RULES

        kind = self.option.kind
        words = RULES[kind.rule].words if isinstance(kind, options.Text) else ()
        return [CompletionItem(word) for word in words if word.startswith(incomplete)]


def _option(name: str) -> Callable[[Any], Any]:
    """The click option of the row ``name`` of ``core.options``: its spellings, parameter, default, help and
    the reading of its kind. A row that shares another row's parameter (--fast, probes) leaves it the default."""
    row = options.BY_NAME[name]
    kind = row.kind
    text = row.help
    if isinstance(kind, options.Text) and kind.rule == "check":
        text += f" Names: {', '.join((*CHECKS, 'all'))}."
    declared: dict[str, Any] = {"help": text, "metavar": row.metavar}
    if options.FIELDS[row.field] is row:  # else the other row's default stands (click: the last given wins)
        declared.update(default=row.default, show_default=options.shown(row))
    if isinstance(kind, options.Flag):
        declared.update(flag_value=kind.const, type=type(kind.const))
    else:
        declared.update(type=_Read(row), multiple=isinstance(kind, options.Text) and kind.repeat)
    return click.option(*row.flags, f"--{row.name}", row.field, **declared)


def _terminate(signum: int, frame: Any) -> None:
    """While checking, SIGTERM raises ``session.Terminated`` (as SIGINT raises KeyboardInterrupt), so the
    run stops its workers and reports what finished (exit 143)."""
    from .run.session import Terminated

    raise Terminated()


@contextlib.contextmanager
def _handling(handlers: dict[signal.Signals, Any]) -> Iterator[None]:
    """These signal handlers for a while, then the previous ones (only the main thread may set them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, handler) for number, handler in handlers.items()}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@cli.command("check", cls=ConfiguredCommand)
@click.argument("targets", nargs=-1, type=click.Path())
@click.option(
    "-i",
    "--input",
    "inline",
    multiple=True,
    metavar="SHAPE[:DTYPE]|=VALUE",
    help="An inline positional argument for a Function target: a shape like 20x20 (float64 "
    "normal values), 20x20:float32, scalar, or =VALUE for a non-tensor (=2.5, =null). Repeat.",
)
@click.option(
    "--kwarg",
    "kwargs",
    multiple=True,
    metavar="NAME=VALUE",
    help="An inline keyword argument (a YAML value) for a Function target. Repeat.",
)
@click.option(
    "--specs",
    "specs_dir",
    default="specs",
    show_default=True,
    metavar="DIR",
    help="Where to look for the specs of a Function named on the command line.",
)
@click.option(
    "-k",
    "select",
    metavar="EXPRESSION",
    help="Only the case named EXPRESSION (path::case, as in the report) or, if none is, the cases it "
    "selects as pytest's -k: words joined by and, or, not and parentheses, each matching a case "
    "whose name or function contains it, case-insensitively (or matches it as a glob when it has "
    "* ? [).",
)
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Report format on stdout."
)
@click.option(
    "--junit-xml",
    "--junitxml",
    "junit_xml",
    type=click.Path(dir_okay=False),
    callback=_check_junit,
    metavar="PATH",
    help="Also write a JUnit XML report (one testcase per spec, case and device) to PATH.",
)
@click.option(
    "--junit-locations",
    is_flag=True,
    help="Give each testcase file and line attributes (GitLab, action-junit-report read them; the "
    "Jenkins xUnit schema rejects them, so they are off by default).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    callback=_check_junit,
    metavar="PATH",
    help="Also write an HTML report to PATH: one self-contained page (no network) with the tables, a "
    "heatmap of the error of each mismatching argument, and the replay commands.",
)
@_option("jobs")
@_option("timeout")
@_option("shrink")
@_option("no-shrink")
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    callback=_parse_shapes,
    metavar="NAME=DIMS",
    help="Draw the tensor argument NAME at this shape instead of the spec's (e.g. weight=2x3; a shrunk "
    "case's replay command uses it). Repeat for several.",
)
@click.option(
    "--values",
    "values",
    multiple=True,
    callback=_parse_values,
    metavar="NAME=KIND",
    help="Draw the tensor argument NAME with simpler values than the spec's: zeros, ones or integers (small "
    "ones), where its spec's range allows them (a shrunk case's replay command uses it). Repeat for several.",
)
@_option("fail-fast")
@_option("maxfail")
@click.option(
    "--lf",
    "--last-failed",
    "last_failed",
    is_flag=True,
    help="Check only the cases that failed or could not be checked last time (all of them when none did); "
    "every run records its failures in .gradcheck_cache/ beside pyproject.toml, or in the current folder.",
)
@click.option("--cache-clear", is_flag=True, help="Forget the failures recorded in .gradcheck_cache/ first.")
@click.option(
    "--shard",
    callback=_parse_shard,
    metavar="I/N",
    help="Check only shard I of N (1-based; stable across machines), for CI matrix jobs.",
)
@_option("seed")
@_option("trials")
@_option("device")
@_option("check")
@_option("reference")
@_option("import")
@_option("strict")
@_option("require-device")
@click.option(
    "--no-isolate",
    is_flag=True,
    help="Check in this process, one case after another (for debuggers); a crash in user code then ends the run.",
)
@_option("fast")
@_option("probes")
@_option("no-compress")
@_option("max-memory")
@click.option(
    "--color/--no-color",
    default=None,
    help="Colour the table, also into a pipe or a file (--color, e.g. for less -R), or never (default: "
    "NO_COLOR set: no; FORCE_COLOR set: yes; else when stdout is a terminal). json and github: never.",
)
@click.option(
    "-q",
    "--quiet",
    "verbosity",
    flag_value="quiet",
    help="Show failures, errors and the summary only (the table format).",
)
@click.option(
    "-v",
    "--verbose",
    "verbosity",
    flag_value="verbose",
    help="Show every case in full (the table format); by default a case that did not fail is one "
    "line, a failure is in full. The last of -q and -v wins.",
)
@click.option(
    "--tb",
    "tb",
    type=click.Choice(("short", "long", "line", "no")),
    default="short",
    show_default=True,
    help="How an error in your code is traced (the table format), as pytest's --tb: short, every frame "
    "of your code; long, with the lines before each; line, the innermost frame; no, none.",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Check, then re-check the cases that a saved spec file or Python file they import affects, "
    "until Ctrl-C (one worker keeps torch and your modules loaded). Exit code: that of every "
    "watched case's latest result; 130 when stopped during a round.",
)
@click.option(
    "--show-config",
    is_flag=True,
    help="Print the effective settings and where each comes from (the command line, [tool.gradcheck] "
    "in pyproject.toml, or the default), and exit.",
)
@click.pass_context
def check_cmd(
    ctx: click.Context,
    /,
    targets: tuple[str, ...],
    inline: tuple[str, ...],
    kwargs: tuple[str, ...],
    specs_dir: str,
    select: Optional[str],
    fmt: str,
    junit_xml: Optional[str],
    junit_locations: bool,
    html_path: Optional[str],
    shapes: tuple[tuple[str, tuple[int, ...]], ...],
    values: tuple[tuple[str, str], ...],
    last_failed: bool,
    cache_clear: bool,
    shard: Optional[tuple[int, int]],
    no_isolate: bool,
    color: Optional[bool],
    verbosity: Optional[str],
    tb: str,
    watch: bool,
    show_config: bool,
    **chosen: Any,  # the options of core.options, by field
) -> None:
    """Check spec files, directories of specs (recursively) and Functions named by import path.

    Defaults come from [tool.gradcheck] in the nearest pyproject.toml (see --show-config).
    """
    from .run.discovery import Item, TargetError
    from .run.discovery import collect as discovered

    if targets and not (show_config or no_isolate or watch):
        from .run.pool import prepare

        prepare()  # the workers' torch import starts now, beside the reading of the specs
    if show_config:
        from .config import describe

        given = {name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE}
        click.echo(describe(ctx.meta[CONFIG], ctx.params, given), nl=False)
        return
    if not targets:
        raise click.UsageError(
            "no TARGETS: give spec files, folders or import paths (e.g. gradcheck specs/), "
            'or set the default in pyproject.toml: [tool.gradcheck] paths = ["specs"]; '
            "gradcheck --help lists the commands",
            ctx,
        )

    if junit_locations and not junit_xml:
        raise click.UsageError("--junit-locations: give --junit-xml PATH too (the locations go into that file)")
    if watch and no_isolate:
        raise click.UsageError(
            "--watch checks in a worker process of its own (a module that cannot be imported "
            "twice needs a fresh one): leave out --no-isolate"
        )
    from . import reporters
    from .run import lastfailed, plan, pool, replay, session

    def collect() -> list[Item]:
        """The targets' cases (-k, --shard applied); TargetError when there is nothing to check."""
        items = discovered(list(targets), Path(specs_dir), list(inline), list(kwargs), select)
        return plan.shard(items, *shard) if shard is not None else items

    try:
        items = collect()
    except TargetError as exc:
        raise click.UsageError(str(exc)) from exc
    config = ctx.meta[CONFIG].path
    root = config.parent if config is not None else Path.cwd()  # where .gradcheck_cache/ is
    if cache_clear:
        lastfailed.clear(root)
    if last_failed:
        failed, unreadable = lastfailed.read(root)
        if unreadable:
            click.echo(f"gradcheck: warning: {unreadable}", err=True)
        items, said = lastfailed.select(items, failed)
        click.echo(f"gradcheck: {said}", err=True)
    fields = {row.field for row in options.OPTIONS if row.run}
    opts = plan.run_options(**{field: chosen[field] for field in fields}, shapes=shapes, values=values)
    timeout = opts.timeout
    if fmt == "auto":
        fmt = reporters.choose_auto(os.environ)
    color = reporters.use_color(color, fmt, os.environ, sys.stdout.isatty())

    unwritten: list[str] = []  # the reports the last write could not write

    def write(report: Report, planned: list[Any]) -> None:
        """The report in the chosen format on stdout, and the files asked for."""
        replay.attach(
            report.results,
            planned,
            [
                token
                for flag, values in (("-i", inline), ("--kwarg", kwargs))
                for value in values
                for token in (flag, value)
            ],
        )
        # SIGINT and SIGTERM are ignored while the report is written: a report cut in half loses what finished
        # (a watch keeps every result: Ctrl-C there must stop it at once)
        ignored = {} if watch else {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
        with _handling(ignored):
            unwritten[:] = _write(report, fmt, color, (verbosity, tb), junit_xml, junit_locations, html_path)
        for message in unwritten:
            click.echo(message, err=True)

    if watch:
        from .watch import watch_targets

        with _handling({signal.SIGTERM: _terminate}):
            sys.exit(watch_targets(collect, targets, Path(specs_dir), opts, write, timeout))
    planned = plan.expand(items, opts)
    cores = pool.usable_cores()
    jobs = chosen["jobs"]
    if jobs and jobs > cores and not no_isolate:
        click.echo(
            f"gradcheck: -j {jobs}: using at most {cores} workers, one per usable core (a worker is a "
            "torch process that computes flat out; more would only compete for the cores)",
            err=True,
        )
    settings = session.BatchOptions(
        jobs=jobs or cores,
        timeout=timeout,
        maxfail=1 if chosen["fail_fast"] else chosen["maxfail"],
        isolate=not no_isolate,
    )
    reporters.get(fmt)  # imported while the workers start (rich, for the table), not after the last result
    with _progress(len(planned)) as on_result, _handling({signal.SIGTERM: _terminate}):
        report = session.execute(items, opts, settings, on_result)
    write(report, planned)
    warning = lastfailed.update(root, report.results)
    if warning:
        click.echo(f"gradcheck: warning: {warning}", err=True)
    code = report.exit_code()
    if unwritten and code not in (ExitCode.INTERRUPTED, ExitCode.TERMINATED, ExitCode.INTERNAL):
        code = ExitCode.NOT_CHECKED  # the run's verdict did not reach where it was asked for
    sys.exit(code)


def _write(
    report: Report,
    fmt: str,
    color: bool,
    table: tuple[Optional[str], str],
    junit_xml: Optional[str],
    junit_locations: bool,
    html_path: Optional[str],
) -> list[str]:
    """The report in ``fmt`` on stdout, and the files asked for; ``table``: the table's verbosity (-q, -v)
    and traceback style (--tb). Each is written whatever became of the others: what could not be written
    (a full disk, a folder that is not writable, a closed stdout) is returned, one message naming it each."""
    from . import reporters

    def on_stdout() -> None:
        if fmt == "table":  # -q / -v choose how much of it, --tb how errors are traced
            from .reporters.table import Verbosity
            from .reporters.table import render as render_table

            verbosity, tb = table
            render_table(report, sys.stdout, color, Verbosity[(verbosity or "normal").upper()], tb)
        else:
            reporters.get(fmt)(report, sys.stdout, color)
        sys.stdout.flush()

    def summary(path: str) -> None:
        from .reporters import github

        github.append_step_summary(report, path)

    def junit(path: str) -> None:
        from .reporters import junit

        junit.write(report, path, locations=junit_locations)

    def html(path: str) -> None:
        from .reporters import html

        html.write(report, path)

    outputs: list[tuple[str, Callable[[], None]]] = [(f"the {fmt} report on stdout", on_stdout)]
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if fmt == "github" and step_summary:  # the job's summary page
        outputs.append((f"the step summary {step_summary}", lambda: summary(step_summary)))
    if junit_xml:
        outputs.append((f"the JUnit XML report {junit_xml}", lambda: junit(junit_xml)))
    if html_path:
        outputs.append((f"the HTML report {html_path}", lambda: html(html_path)))
    failed = []
    for what, write_it in outputs:
        try:
            write_it()
        except OSError as exc:
            failed.append(f"gradcheck: cannot write {what}: {exc.strerror or exc}")
            if write_it is on_stdout:  # what is left in its buffer would fail again at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return failed


def main(argv: Optional[list[str]] = None) -> Any:
    """The command line: click's own exit codes (2 for a usage error), 130 for Ctrl-C wherever it comes (click
    would say "Aborted!" and exit 1 before the run's own handling starts), and 4 for a bug of ours."""
    try:
        code = cli.main(args=argv, prog_name="gradcheck", standalone_mode=False)
    except click.exceptions.Abort as exc:  # Ctrl-C (click's Abort from a KeyboardInterrupt), or end of input
        if isinstance(exc.__cause__, KeyboardInterrupt):
            sys.exit(ExitCode.INTERRUPTED)
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    except click.ClickException as exc:  # what standalone mode does with it
        exc.show()
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - report, then exit with the contract's internal-error code
        traceback.print_exc()
        click.echo("gradcheck-cli internal error: please report it with the traceback above", err=True)
        sys.exit(ExitCode.INTERNAL)
    sys.exit(code if isinstance(code, int) else 0)  # a command's return, or ctx.exit's code (--help: 0)


@cli.command("init")
@click.argument("function")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the spec here (default: stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option(
    "--import",
    "imports",
    multiple=True,
    type=_Read(options.BY_NAME["import"]),
    metavar="MODULE",
    help="Import this module first (it registers the op FUNCTION names); the spec gets `import:` too. "
    "Repeat for several.",
)
def init_cmd(function: str, output: Optional[str], force: bool, imports: tuple[str, ...]) -> None:
    """Write a spec skeleton for FUNCTION (pkg.mod.MyFunction, or a custom op torch.ops.ns.op) from its
    forward signature (an op's schema)."""
    from .sandbox.errors import LoadError
    from .scaffold import skeleton

    try:
        text = skeleton(function, imports)
    except LoadError as exc:
        key = f"{exc.key}: " if exc.key != "function" else ""
        click.echo(f"gradcheck init: {key}{exc}" + (f" (at {exc.where})" if exc.where else ""), err=True)
        sys.exit(ExitCode.NOT_CHECKED)
    if output is None:
        click.echo(text, nl=False)
        return
    path = Path(output)
    if path.exists() and not force:
        raise click.UsageError(f"{output} exists; use --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    click.echo(f"wrote {output}; set the shapes, then run: gradcheck {output}", err=True)


@cli.command("schema")
@click.argument("kind", type=click.Choice(["spec", "report"]), default="spec")
def schema_cmd(kind: str) -> None:
    """Print the JSON Schema of spec files (default) or of the JSON report.

    \b
    Editors validate and complete specs with it, e.g. with yaml-language-server:
      gradcheck schema > gradcheck.schema.json
    and, in the editor's settings (every document of the matching files):
      "yaml.schemas": {"./gradcheck.schema.json": ["specs/**/*.yaml"]}
    or, in each document of a spec file (after each ---):
      # yaml-language-server: $schema=gradcheck.schema.json
    On the command line: gradcheck validate FILES...
    """
    from . import schemas

    click.echo(schemas.text(kind), nl=False)


@cli.command("validate")
@click.argument("targets", nargs=-1, required=True, metavar="FILES...")
def validate_cmd(targets: tuple[str, ...]) -> None:
    """Check every document of spec files (and of the spec files under folders) against the rules a run
    applies, without importing torch or the specs' code: one line per unusable document,
    PATH:LINE: KEY: MESSAGE. Exit 0 when all are valid, 3 when any is not (as a run would), 2 for a
    missing path.
    """
    from .run.discovery import TargetError, files_of
    from .spec import SpecError, load_file

    try:
        files = [f for target in targets for f in files_of(target)]
    except TargetError as exc:
        raise click.UsageError(str(exc)) from exc
    if not files:
        raise click.UsageError(f"no spec files (*.yaml, *.yml) found in {', '.join(targets)}")
    items = [item for f in dict.fromkeys(files) for item in load_file(f)]
    errors = [item for item in items if isinstance(item, SpecError)]
    for error in errors:
        click.echo(str(error))
    cases = len(items) - len(errors)
    click.echo(
        f"gradcheck validate: {len(files)} file{'s' * (len(files) != 1)}, {cases} case{'s' * (cases != 1)} "
        f"valid, {len(errors)} invalid document{'s' * (len(errors) != 1)}",
        err=True,
    )
    sys.exit(ExitCode.NOT_CHECKED if errors else ExitCode.OK)
