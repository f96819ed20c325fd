"""JUnit XML report, for CI services that show test results (Jenkins, GitLab, Azure, ...).

One ``<testsuite name="gradcheck">`` with one ``<testcase>`` per (spec, case, device). A testcase's
classname and name are those pytest's ``--junitxml`` gives the pytest plugin's item of the same
case (``specs.linear.yaml`` / ``with_bias[cpu]``), so CI test history follows a case from one
front end to the other. The testsuite carries ``timestamp``, ``hostname`` and ``<properties>``.
By default the output is valid against the Jenkins xUnit plugin's ``junit-10.xsd`` (the schema
pytest's ``xunit2`` output follows), which has no ``file``/``line`` attributes on a testcase;
``locations=True`` (``--junit-locations``) adds them for tools that read them (GitLab's file
column, action-junit-report, junitparser), as pytest's ``xunit1`` output does.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath
from typing import Optional, TextIO, Union

from ..core.printable import printable
from ..results import CaseResult, Report, Status, expected_reason
from ..version import __version__
from . import spec_file, table
from .json_ import torch_version

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


def node_id(result: CaseResult) -> str:
    """The pytest plugin's node id of the same case: ``specs/linear.yaml::with_bias[cpu]``,
    ``specs/max_pool.yaml::#2::default[cpu]``, ``specs/bad.yaml::spec_error[line 4]``; the path relative
    to the working directory (pytest's rootdir when run from the project root), with ``/``."""
    path = spec_file(result) or ""
    resolved = Path(path).resolve()
    cwd = Path.cwd().resolve()
    if resolved.is_relative_to(cwd):
        path = resolved.relative_to(cwd).as_posix()
    else:
        path = "/".join(p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("/", ".", ".."))
    if result.case is None:  # a spec that could not be read: the plugin's spec_error item
        return f"{path}::spec_error[line {result.line}]" if result.line else f"{path}::spec_error"
    rest = result.id[len(result.spec or "") :] if result.spec and result.id.startswith(result.spec) else ""
    if rest.startswith("#"):  # the id of a case in a file of several documents: path#N::case[device]
        rest = "::" + rest
    return path + (rest if rest.startswith("::") else f"::{result.case}[{result.device}]")


def names(result: CaseResult) -> tuple[str, str]:
    """(classname, name) of a result's testcase: for a spec file's case, what pytest's ``--junitxml``
    writes for the plugin's item of that case (CI services key test history on the pair):
    ``specs/linear.yaml::with_bias[cpu]`` -> (``specs.linear.yaml``, ``with_bias[cpu]``); a result without
    a spec file (inline, library) is named by its function."""
    if not spec_file(result):
        name = result.id if result.case is None else f"{result.case}[{result.device}]"
        return result.function.replace(":", ".") or "gradcheck", name
    # pytest's junitxml.mangle_test_address: split the node id before its parameters at '::'
    path, bracket, params = node_id(result).partition("[")
    parts = path.split("::")
    parts[0] = parts[0].replace("/", ".")
    parts[-1] += bracket + params
    return ".".join(parts[:-1]), parts[-1]


def classname(result: CaseResult) -> str:
    """``specs/linear.yaml`` -> ``specs.linear.yaml`` (CI services split a classname at its dots into
    package and class), as pytest names the plugin's items."""
    return names(result)[0]


def testcase_name(result: CaseResult) -> str:
    """``case[device]``, as pytest names the plugin's item."""
    return names(result)[1]


def _child(parent: ET.Element, tag: str, text: Optional[str] = None, **attrs: str) -> ET.Element:
    elem = ET.SubElement(parent, tag, {k: clean(v) for k, v in attrs.items()})
    if text is not None:
        elem.text = clean(text)
    return elem


def _testcase(suite: ET.Element, result: CaseResult, locations: bool) -> None:
    cls, name = names(result)
    attrs = {"classname": cls, "name": name, "time": _seconds(result.duration_s)}
    if locations and spec_file(result):
        attrs["file"] = str(result.spec)
        if result.line:
            attrs["line"] = str(result.line)
    case = _child(suite, "testcase", **attrs)
    if result.status is Status.FAIL:
        messages = [
            f"{c.check}: {c.message}" if c.message else f"{c.check} failed"
            for c in result.checks
            if c.status is Status.FAIL
        ]
        _child(case, "failure", table.case_text(result), message="; ".join(messages) or "failed", type="gradcheck.fail")
    elif result.status is Status.ERROR:
        kind = result.error.kind if result.error else "unknown"
        message = result.error.message if result.error else "could not be checked"
        _child(case, "error", table.case_text(result), message=f"{kind} error: {message}", type=f"gradcheck.{kind}")
    elif result.status is Status.XFAIL:  # as pytest writes an xfail
        _child(case, "skipped", message=f"expected failure: {expected_reason(result)}", type="xfail")
    elif result.status is Status.SKIP:
        reasons = [f"{c.check}: {c.message}" if c.message else f"{c.check} skipped" for c in result.checks]
        _child(case, "skipped", message="; ".join(dict.fromkeys(reasons)) or "skipped")
    warnings = [f"warning: {c.check}: {w}" for c in result.checks for w in c.warnings]
    warnings += [f"warning: {w}" for w in result.warnings]
    if warnings:
        _child(case, "system-out", "\n".join(warnings) + "\n")


def properties(report: Report) -> dict[str, str]:
    """The suite's ``<properties>``: the versions, and the seeds, devices and functions of its cases
    (each distinct value once, in result order). The Jenkins schema has no properties on a testcase; a
    case's own seed and function are in its failure text, its device in its name."""

    def distinct(values: list[str]) -> str:
        return ", ".join(dict.fromkeys(v for v in values if v))

    checked = [r for r in report.results if r.case is not None]
    return {
        "gradcheck-cli": __version__,
        "torch": torch_version(),
        "seed": distinct([str(r.seed) for r in checked]),
        "device": distinct([r.device for r in checked]),
        "function": distinct([r.function for r in checked]),
    }


def build(
    report: Report, locations: bool = False, timestamp: Optional[str] = None, hostname: Optional[str] = None
) -> ET.Element:
    """The ``<testsuites>`` element of ``report``; ``timestamp`` (ISO 8601) defaults to when the run
    started (now minus its duration), ``hostname`` to this machine's name."""
    report = printable(report)  # lone surrogates as escapes, before clean() drops what XML cannot hold
    s = report.summary()
    if timestamp is None:
        started = datetime.datetime.now().astimezone() - datetime.timedelta(seconds=report.duration_s)
        timestamp = started.isoformat(timespec="seconds")
    counts = {"tests": str(s["total"]), "failures": str(s["failed"]), "errors": str(s["errors"])}
    root = ET.Element("testsuites", {"name": "gradcheck-cli", **counts, "time": _seconds(report.duration_s)})
    suite = _child(
        root,
        "testsuite",
        name="gradcheck",
        **counts,
        skipped=str(s["skipped"] + s["xfailed"]),
        time=_seconds(report.duration_s),
        timestamp=timestamp,
        hostname=socket.gethostname() if hostname is None else hostname,
    )
    props = _child(suite, "properties")
    for name, value in properties(report).items():
        _child(props, "property", name=name, value=value)
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
