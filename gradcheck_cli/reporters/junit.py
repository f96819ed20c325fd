"""JUnit XML report, for CI services that show test results (Jenkins, GitLab, Azure, ...).

One ``<testsuite name="gradcheck">`` with one ``<testcase>`` per (spec, case, device). By
default the output is valid against the Jenkins xUnit plugin's ``junit-10.xsd`` (the schema
pytest's ``xunit2`` output follows), which has no ``file``/``line`` attributes on a testcase;
``locations=True`` adds them for tools that read them (GitLab's file column,
action-junit-report), as pytest's ``xunit1`` output does.
"""
from __future__ import annotations

import io
import os
import re
import xml.etree.ElementTree as ET
from pathlib import PurePosixPath
from typing import Optional, TextIO, Union

from rich.console import Console

from ..printable import printable
from ..results import CaseResult, Report, Status, expected_reason
from . import spec_file, table

# characters XML 1.0 cannot hold at all (not even escaped), and terminal colour codes
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SUFFIX = re.compile(r"\.ya?ml$")


def clean(text: object) -> str:
    """``text`` as a string XML 1.0 can hold: colour codes and illegal characters removed."""
    return _ILLEGAL.sub("", _ANSI.sub("", str(text)))


def _seconds(value: float) -> str:
    # at most 3 decimals: the schema's SUREFIRE_TIME pattern
    return f"{max(value, 0.0):.3f}"


def classname(result: CaseResult) -> str:
    """``specs/linear.yaml`` -> ``specs.linear`` (CI services split a classname at its dots into
    package and class); a result without a spec file is named by its function."""
    path = spec_file(result)
    if path:
        parts = [p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("/", ".", "..")]
        return _SUFFIX.sub("", ".".join(parts))
    return result.function.replace(":", ".") or "gradcheck"


def testcase_name(result: CaseResult) -> str:
    """``case[device]``; ``#N::case[device]`` when the file holds several documents (as in the
    result id, so the name is unique); ``spec`` for a spec that could not be read at all."""
    if result.case is None:
        if not spec_file(result):
            return result.id
        return f"spec:{result.line}" if result.line else "spec"
    if result.spec and result.id.startswith(result.spec):
        rest = result.id[len(result.spec):]
        return rest[2:] if rest.startswith("::") else rest
    return f"{result.case}[{result.device}]" if result.device else result.case


def case_text(result: CaseResult) -> str:
    """The plain table of one result (the same text as the table report), no trailing blanks."""
    buffer = io.StringIO()
    console = Console(file=buffer, no_color=True, highlight=False, soft_wrap=False, width=1000,
                      force_terminal=False, color_system=None)
    table.render_case(result, console)
    return "\n".join(line.rstrip() for line in buffer.getvalue().strip("\n").splitlines()) + "\n"


def _child(parent: ET.Element, tag: str, text: Optional[str] = None, **attrs: str) -> ET.Element:
    elem = ET.SubElement(parent, tag, {k: clean(v) for k, v in attrs.items()})
    if text is not None:
        elem.text = clean(text)
    return elem


def _testcase(suite: ET.Element, result: CaseResult, locations: bool) -> None:
    attrs = {"classname": classname(result), "name": testcase_name(result), "time": _seconds(result.duration_s)}
    if locations and spec_file(result):
        attrs["file"] = str(result.spec)
        if result.line:
            attrs["line"] = str(result.line)
    case = _child(suite, "testcase", **attrs)
    if result.status is Status.FAIL:
        messages = [f"{c.check}: {c.message}" if c.message else f"{c.check} failed"
                    for c in result.checks if c.status is Status.FAIL]
        _child(case, "failure", case_text(result), message="; ".join(messages) or "failed", type="gradcheck.fail")
    elif result.status is Status.ERROR:
        kind = result.error.kind if result.error else "unknown"
        message = result.error.message if result.error else "could not be checked"
        _child(case, "error", case_text(result), message=f"{kind} error: {message}", type=f"gradcheck.{kind}")
    elif result.status is Status.XFAIL:  # as pytest writes an xfail
        _child(case, "skipped", message=f"expected failure: {expected_reason(result)}", type="xfail")
    elif result.status is Status.SKIP:
        reasons = [f"{c.check}: {c.message}" if c.message else f"{c.check} skipped" for c in result.checks]
        _child(case, "skipped", message="; ".join(dict.fromkeys(reasons)) or "skipped")
    warnings = [f"warning: {c.check}: {w}" for c in result.checks for w in c.warnings]
    warnings += [f"warning: {w}" for w in result.warnings]
    if warnings:
        _child(case, "system-out", "\n".join(warnings) + "\n")


def build(report: Report, locations: bool = False) -> ET.Element:
    """The ``<testsuites>`` element of ``report``."""
    report = printable(report)  # lone surrogates as escapes, before clean() drops what XML cannot hold
    s = report.summary()
    counts = {"tests": str(s["total"]), "failures": str(s["failed"]), "errors": str(s["errors"])}
    root = ET.Element("testsuites", {"name": "gradcheck-cli", **counts, "time": _seconds(report.duration_s)})
    suite = _child(root, "testsuite", name="gradcheck", **counts, skipped=str(s["skipped"] + s["xfailed"]),
                   time=_seconds(report.duration_s))
    for result in report.results:
        _testcase(suite, result, locations)
    not_run = s.get("not_run", 0)
    if not_run:
        why = f"interrupted by {s['interrupted']}" if s.get("interrupted") else "--fail-fast stopped the run"
        _child(suite, "system-out", f"{not_run} not run ({why})\n")
    return root


def render(report: Report, stream: TextIO, color: bool = False, locations: bool = False) -> None:
    """Write the XML document (with its declaration) to a text stream."""
    root = build(report, locations)
    ET.indent(root)
    stream.write('<?xml version="1.0" encoding="utf-8"?>\n')
    stream.write(ET.tostring(root, encoding="unicode"))
    stream.write("\n")


def write(report: Report, path: Union[str, os.PathLike[str]], locations: bool = False) -> None:
    """Write the JUnit XML of ``report`` to the file ``path`` (UTF-8), replacing it."""
    with open(path, "w", encoding="utf-8", newline="\n") as stream:
        render(report, stream, locations=locations)
