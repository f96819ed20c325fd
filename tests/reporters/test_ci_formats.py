"""CI formats: GitHub annotations, JUnit XML (against the Jenkins xUnit XSD), and the shipped
JSON Schemas of the JSON report and of spec files, on real runs and on hand-built results."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import shutil
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import gradcheck_cli
from gradcheck_cli import reporters, schemas, spec
from gradcheck_cli.reporters import github, json_, junit, table
from gradcheck_cli.results import CaseResult, CheckResult, ErrorInfo, InputReport, Pattern, Report, Status
from gradcheck_cli.run import runner

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"
SPEC_FILES = sorted(
    p.relative_to(REPO).as_posix() for d in ("specs", "broken-specs") for p in (REPO / d).glob("*.y*ml")
)

# ------------------------------------------------------------------------ builders


def row(index: int, name: str, status: Status, line: int | None = None, **kw: Any) -> InputReport:
    base: dict[str, Any] = {
        "numel": 3,
        "mismatched": 0,
        "max_abs_err": 1e-10,
        "max_rel_err": 1e-9,
        "worst_index": [0],
        "analytical": 1.0,
        "numerical": 1.0,
        "atol": 1e-5,
        "rtol": 1e-3,
    }
    if status is Status.FAIL:
        base.update(
            mismatched=3,
            max_abs_err=1.0,
            max_rel_err=1.0,
            worst_index=[2],
            analytical=2.0,
            numerical=1.0,
            diagnosis="analytical is 2.00x numerical",
            worst_output="output 0 [0, 2]",
        )
    base.update(kw)
    return InputReport(index, name, [3], "float64", status, line=line, **base)


def failing(
    line_of_bias: int | None = 8,
    case_line: int | None = 1,
    spec_path: str | None = "specs/lin.yaml",
    warnings: tuple[str, ...] = (),
) -> CaseResult:
    check = CheckResult(
        "backward",
        Status.FAIL,
        "gradient of 'bias': analytical is 2.00x numerical",
        "elementwise",
        [row(0, "input", Status.PASS, 4), row(2, "bias", Status.FAIL, line_of_bias)],
        list(warnings),
        0.5,
    )
    rid = f"{spec_path}::default[cpu]" if spec_path else "pkg.mod.Lin"
    return CaseResult(
        rid,
        spec_path,
        "default",
        "pkg.mod:Lin",
        "cpu",
        0,
        Status.FAIL,
        0.25,
        None,
        [check],
        replay=f"gradcheck {spec_path} -k {rid}" if spec_path else None,
        line=case_line,
    )


def errored(
    kind: str = "import",
    message: str = "specs/e.yaml:1: function: no module named 'nope'",
    spec_path: str | None = "specs/e.yaml",
    line: int | None = 1,
    where: str | None = None,
) -> CaseResult:
    rid = f"{spec_path}::default[cpu]" if spec_path else "pkg.mod.E"
    return CaseResult(
        rid, spec_path, "default", "nope:F", "cpu", 0, Status.ERROR, 0.0, ErrorInfo(kind, message, where), line=line
    )


def skipped_result() -> CaseResult:
    checks = [CheckResult("backward", Status.SKIP, "CUDA is not available on this machine")]
    return CaseResult(
        "specs/gpu.yaml::default[cuda]",
        "specs/gpu.yaml",
        "default",
        "pkg.mod:G",
        "cuda",
        0,
        Status.SKIP,
        0.0,
        None,
        checks,
        line=1,
    )


def run_files(paths: list[str]) -> Report:
    items = [item for p in paths for item in spec.load_file(p)]
    return runner.run_all(items)


# ------------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def shipped_report() -> Report:
    """Every spec under specs/ and broken-specs/, run from the repository root."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        report = run_files(SPEC_FILES)
    assert {Status.PASS, Status.FAIL} <= {r.status for r in report.results}  # the fixture covers both
    return report


@pytest.fixture
def problem_report(write_spec, user_module, monkeypatch) -> Report:
    """A spec error, an import error, a forward that raises (all real), and a hand-built skip."""
    user_module(
        """
        import torch
        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                raise ValueError("boom <&> \\"quoted\\"")
            @staticmethod
            def backward(ctx, g):
                return g
    """,
        name="boommod",
    )
    write_spec(
        """
        function: boommod:Boom
        inputs: [{shape: [3]}]
        colour: red
    """,
        "bad_key.yaml",
    )
    write_spec(
        """
        function: gc_no_such_module_xyz:F
        inputs: [{shape: [3]}]
    """,
        "no_module.yaml",
    )
    write_spec(
        """
        function: boommod:Boom
        inputs: [{shape: [3]}]
    """,
        "boom.yaml",
    )
    report = run_files(["bad_key.yaml", "no_module.yaml", "boom.yaml"])
    assert [r.error.kind for r in report.results if r.error] == ["spec", "import", "forward"]
    report.results.append(skipped_result())
    return report


# ------------------------------------------------------------------------ JSON report schema


def report_json(report: Report) -> dict[str, Any]:
    stream = io.StringIO()
    json_.render(report, stream)
    return json.loads(stream.getvalue())


@pytest.fixture(scope="module")
def report_validator() -> jsonschema.Draft202012Validator:
    schema = schemas.load("report")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors_of(validator: jsonschema.Draft202012Validator, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def test_real_reports_validate_against_report_schema(shipped_report, problem_report, report_validator):
    for report in (shipped_report, problem_report, Report([failing(), errored(where="m.py:3"), skipped_result()])):
        data = report_json(report)
        assert errors_of(report_validator, data) == []
    statuses = {r["status"] for r in report_json(problem_report)["results"]}
    assert statuses == {"error", "skip"}


def _valid_report() -> dict[str, Any]:
    return report_json(Report([failing(), errored(where="m.py:3")]))


def _set(path: tuple, value: Any) -> Any:
    def mutate(d: dict) -> None:
        target = d
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return mutate


FAIL_ROW = ("results", 0, "checks", 0, "inputs", 1)


@pytest.mark.parametrize(
    "mutate",
    [
        _set(FAIL_ROW + ("max_abs_err",), "1.0"),  # numbers are numbers, not strings
        _set(FAIL_ROW + ("shape",), ["3"]),
        _set(FAIL_ROW + ("status",), "ok"),
        _set(FAIL_ROW + ("name",), KeyError),  # every row has its name
        _set(FAIL_ROW + ("index",), -1),
        _set(FAIL_ROW + ("surprise",), 1),
        _set(("results", 0, "status"), "failed"),
        _set(("results", 0, "error"), {"kind": "x", "message": "m", "where": None}),  # error only with status error
        _set(("results", 1, "error"), None),
        _set(("results", 1, "error", "kind"), KeyError),
        _set(("results", 0, "seed"), "0"),
        _set(("results", 0, "line"), 0),
        _set(("summary", "total"), -1),
        _set(("summary", "failed"), KeyError),
        _set(("schema_version",), 2),
        _set(("tool", "name"), "other"),
    ],
    ids=lambda m: "",
)
def test_report_schema_rejects_broken_reports(mutate, report_validator):
    data = _valid_report()
    assert errors_of(report_validator, data) == []
    mutate(data)
    assert errors_of(report_validator, data) != []


def test_report_schema_has_every_field_of_the_data_model():
    defs = schemas.load("report")["$defs"]
    for name, cls in (("result", CaseResult), ("check", CheckResult), ("input", InputReport), ("error", ErrorInfo)):
        fields = {f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True)}  # not: pictures' data
        optional = {f.name for f in dataclasses.fields(cls) if f.metadata.get("optional")}  # absent where None
        assert set(defs[name]["properties"]) == fields, name
        assert set(defs[name]["required"]) == fields - optional, name
    summary = schemas.load("report")["properties"]["summary"]
    assert set(Report([]).summary()) <= set(summary["properties"])
    assert defs["status"]["enum"] == [s.value for s in Status]


# ------------------------------------------------------------------------ spec schema


@pytest.fixture(scope="module")
def spec_validator() -> jsonschema.Draft202012Validator:
    schema = schemas.load("spec")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", SPEC_FILES)
def test_shipped_specs_validate_against_spec_schema(path, spec_validator):
    docs = [d for d in yaml.safe_load_all((REPO / path).read_text(encoding="utf-8")) if d is not None]
    assert docs
    for doc in docs:
        assert errors_of(spec_validator, doc) == []


BASE = "function: pkg.mod:F\n"

INVALID = {
    "unknown top key": BASE + "colour: red\n",
    "unknown input key": BASE + "inputs: [{shape: [3], colour: red}]\n",
    "bad dtype": BASE + "dtype: float128\n",
    "bad input dtype": BASE + "inputs: [{shape: [3], dtype: fp32}]\n",
    "shape of strings": BASE + "inputs: [{shape: [a, b]}]\n",
    "negative dim": BASE + "inputs: [{shape: [-1]}]\n",
    "shape and value": BASE + "inputs: [{shape: [3], value: 1}]\n",
    "shape and data": BASE + "inputs: [{shape: [3], data: [1, 2, 3]}]\n",
    "value and same_as": BASE + "inputs: [{value: 1, same_as: x}]\n",
    "no kind": BASE + "inputs: [{name: x}]\n",
    "no function": "inputs: [{shape: [3]}]\n",
    "function without module": "function: F\n",
    "bad device": BASE + "device: gpu\n",
    "bad device in list": BASE + "device: [cpu, 'cuda:x']\n",
    "unknown check": BASE + "checks: [backward, hessian]\n",
    "empty checks": BASE + "checks: []\n",
    "unknown dist": BASE + "inputs: [{shape: [3], dist: gamma}]\n",
    "dist with data": BASE + "inputs: [{data: [1.0], dist: normal}]\n",
    "low with normal": BASE + "inputs: [{shape: [3], dist: normal, low: 0}]\n",
    "mean with uniform": BASE + "inputs: [{shape: [3], dist: uniform, mean: 0}]\n",
    "low without dist on a float tensor": BASE + "inputs: [{shape: [3], low: 0}]\n",
    "mean without dist on an int tensor": BASE + "inputs: [{shape: [3], dtype: int64, mean: 0}]\n",
    "negative std": BASE + "inputs: [{shape: [3], std: -1}]\n",
    "avoid not intervals": BASE + "inputs: [{shape: [3], avoid: [1, 2]}]\n",
    "requires_grad not bool": BASE + "inputs: [{shape: [3], requires_grad: yes please}]\n",
    "unknown tolerance key": BASE + "tolerance: {eps: 1.0e-6, tol: 1}\n",
    "zero eps": BASE + "tolerance: {eps: 0}\n",
    "negative atol": BASE + "tolerance: {atol: -1.0}\n",
    "tolerance not a number": BASE + "tolerance: {rtol: small}\n",
    "negative seed": BASE + "seed: -1\n",
    "seed not int": BASE + "seed: zero\n",
    "unknown case key": BASE + "cases: [{name: a, colour: red}]\n",
    "nested cases": BASE + "cases: [{name: a, cases: []}]\n",
    "empty cases": BASE + "cases: []\n",
    "bad kwargs entry": BASE + "kwargs: {dim: -1}\n",
    "unknown init key": BASE + "init: {args: [], extra: 1}\n",
    "same_as not a name": BASE + "inputs: [{same_as: [x]}]\n",
}

VALID = {
    "minimal": BASE,
    "full": """
        function: pkg.mod.F
        description: a description
        seed: 3
        device: [cpu, cuda, 'cuda:1', mps]
        dtype: double
        tolerance: {eps: 1e-6, atol: 1.0e-5, rtol: 0.001, nondet_tol: 0}
        checks: all
        inputs:
          - {name: x, shape: [2, 3], dist: uniform, low: -1, high: 1, avoid: [[-0.01, 0.01]]}
          - {name: y, shape: [], dtype: complex128}
          - {name: n, shape: [4], dtype: int64, low: 0, high: 5}
          - {name: m, data: [[1, 2], [3, 4]], dtype: float32, requires_grad: false}
          - {name: z, same_as: x}
          - {name: c, value: null}
        kwargs:
          dim: {value: -1}
          w: {shape: [3], mean: 1.0, std: 0.5}
        init: {args: [1, 2], kwargs: {bias: true}}
        cases:
          - name: one
          - name: 2
            device: cpu
            checks: backward
            seed: 1
            inputs: [{shape: [1]}]
            tolerance: {atol: 1e-3}
    """,
    "checks list with all": BASE + "checks: [all]\n",
    "literal scalar data": BASE + "inputs: [{data: 2.5}]\n",
    "null kwargs and init": BASE + "kwargs:\ninit:\n",
}


def _spec_py_accepts(text: str, tmp_path: Path) -> bool:
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    return all(isinstance(item, spec.Case) for item in spec.load_file(path))


@pytest.mark.parametrize("text", INVALID.values(), ids=INVALID.keys())
def test_spec_schema_rejects_what_spec_py_rejects(text, spec_validator, tmp_path):
    assert errors_of(spec_validator, yaml.safe_load(text)) != []
    assert not _spec_py_accepts(text, tmp_path)  # the schema and the loader agree


@pytest.mark.parametrize("text", VALID.values(), ids=VALID.keys())
def test_spec_schema_accepts_what_spec_py_accepts(text, spec_validator, tmp_path):
    import textwrap

    text = textwrap.dedent(text)
    assert errors_of(spec_validator, yaml.safe_load(text)) == []
    assert _spec_py_accepts(text, tmp_path)


def test_spec_schema_enums_and_keys_match_spec_py():
    schema = schemas.load("spec")
    defs = schema["$defs"]
    assert set(schema["properties"]) == set(spec.TOP_KEYS)
    assert set(defs["case"]["properties"]) == set(spec.CASE_KEYS)
    assert set(defs["tensor"]["properties"]) == set(spec.TENSOR_KEYS)
    assert set(defs["tolerance"]["properties"]) == set(spec.TOLERANCE_KEYS)
    assert set(defs["dtype"]["enum"]) == set(spec.DTYPES)
    integer = {k for k, v in spec.DTYPES.items() if v.startswith(("int", "uint", "bool"))}
    assert set(defs["int_dtype"]["enum"]) == integer
    assert defs["check_name"]["enum"] == list(spec.CHECKS)
    assert defs["tensor"]["properties"]["dist"]["enum"] == list(spec.DISTS)


DEVICES = [
    "cpu",
    "cuda",
    "cuda:0",
    "cuda:12",
    "mps",
    "gpu",
    "CPU",
    "cuda:",
    "cuda:x",
    " cpu",
    "cpu\n",
    "cuda:1\n",
    "cpu,cuda",
]
FUNCTIONS = [
    "pkg.mod:F",
    "pkg.mod.F",
    "pkg:F",
    "a.b.c:D.E",
    "F",
    "pkg.mod:F\n",
    "1pkg.mod:F",
    "pkg mod:F",
    "pkg.mod:F:G",
    "pkg.mod:",
    ":F",
    "_p._m:_F",
]


@pytest.mark.parametrize("device", DEVICES)
def test_spec_schema_and_spec_py_agree_on_devices(device, spec_validator, tmp_path):
    doc = {"function": "pkg.mod:F", "device": device}
    assert (errors_of(spec_validator, doc) == []) == _spec_py_accepts(json.dumps(doc), tmp_path)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_spec_schema_and_spec_py_agree_on_function_paths(function, spec_validator, tmp_path):
    doc = {"function": function}
    assert (errors_of(spec_validator, doc) == []) == _spec_py_accepts(json.dumps(doc), tmp_path)


def _walk_properties(node: Any) -> Iterator[tuple[str, dict]]:
    """Every (name, schema) under a ``properties`` keyword, outside if/then conditions."""
    if isinstance(node, dict):
        yield from node.get("properties", {}).items()
        for key, value in node.items():
            if key not in ("if", "then", "else", "not"):
                yield from _walk_properties(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_properties(value)


def test_spec_schema_documents_every_key_for_editors():
    schema = schemas.load("spec")
    defs = schema["$defs"]
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] and schema["description"]
    missing = []
    for name, sub in _walk_properties(schema):
        target = defs[sub["$ref"].split("/")[-1]] if "$ref" in sub else sub
        if not (sub.get("description") or target.get("description")):
            missing.append(name)
    assert missing == []


def test_schemas_load_by_name():
    assert schemas.load("report")["properties"]["schema_version"]["const"] == json_.SCHEMA_VERSION
    assert json.loads(schemas.text("spec")) == schemas.load("spec")
    with pytest.raises(ValueError, match="report, spec"):
        schemas.load("nope")


# ------------------------------------------------------------------------ JUnit XML


@pytest.fixture(scope="module")
def xsd():
    xmlschema = pytest.importorskip("xmlschema")
    return xmlschema.XMLSchema(str(DATA / "junit-10.xsd"))


def junit_tree(report: Report, tmp_path: Path, **kw: Any) -> tuple[Path, ET.Element]:
    path = tmp_path / "junit.xml"
    junit.write(report, path, **kw)
    return path, ET.parse(path).getroot()


def test_junit_of_real_runs_is_valid_and_counts_match(shipped_report, problem_report, xsd, tmp_path):
    report = Report(shipped_report.results + problem_report.results, duration_s=1.23456)
    path, root = junit_tree(report, tmp_path)
    xsd.validate(str(path))
    (suite,) = root.findall("testsuite")
    s = report.summary()
    assert suite.get("name") == "gradcheck"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        str(s["total"]),
        str(s["failed"]),
        str(s["errors"]),
        str(s["skipped"] + s["xfailed"]),
    )
    assert s["failed"] and s["errors"] and s["skipped"]
    assert suite.get("time") == "1.235"
    cases = suite.findall("testcase")
    assert len(cases) == len(report.results)
    assert len(suite.findall("testcase/failure")) == s["failed"]
    assert len(suite.findall("testcase/error")) == s["errors"]
    assert len(suite.findall("testcase/skipped")) == s["skipped"] + s["xfailed"]  # an xfail is skipped, as pytest
    keys = [(c.get("classname"), c.get("name")) for c in cases]
    assert len(set(keys)) == len(keys)  # unique, also for files with several documents
    # as pytest's --junitxml names the plugin's items (specs/max_pool.yaml::#1::default[cpu])
    assert ("specs.max_pool.yaml.#1", "default[cpu]") in keys and ("specs.max_pool.yaml.#2", "default[cpu]") in keys
    assert ("specs.linear.yaml", "with_bias[cpu]") in keys and ("specs.linear.yaml", "no_bias[cpu]") in keys


def test_junit_failure_of_linear_double_bias(shipped_report, tmp_path):
    (result,) = [r for r in shipped_report.results if r.spec == "broken-specs/linear_double_bias.yaml"]
    _, root = junit_tree(Report([result]), tmp_path)
    (case,) = root.iter("testcase")
    assert (case.get("classname"), case.get("name")) == ("broken-specs.linear_double_bias.yaml", "default[cpu]")
    assert case.get("file") is None and case.get("line") is None  # not in the XSD
    (failure,) = case.findall("failure")
    assert failure.get("type") == "gradcheck.fail"
    assert "2.00x" in failure.get("message") and "bias" in failure.get("message")
    text = failure.text
    bias_rows = [line for line in text.splitlines() if "2: bias" in line]
    assert len(bias_rows) == 1 and "fail" in bias_rows[0] and "3 / 3" in bias_rows[0]
    assert "analytical is 2.00x numerical" in text
    assert "\x1b" not in text and not any(line != line.rstrip() for line in text.splitlines())


def test_junit_errors_and_skips(problem_report, tmp_path):
    _, root = junit_tree(problem_report, tmp_path)
    cases = root.findall("testsuite/testcase")
    spec_case, import_case, forward_case, skip_case = cases
    assert (spec_case.get("classname"), spec_case.get("name")) == ("bad_key.yaml", "spec_error[line 4]")
    assert spec_case.find("error").get("type") == "gradcheck.spec"
    assert "colour" in spec_case.find("error").get("message")
    err = import_case.find("error")
    assert err.get("type") == "gradcheck.import" and err.get("message").startswith("import error: ")
    assert "gc_no_such_module_xyz" in err.get("message") and "gc_no_such_module_xyz" in err.text
    forward = forward_case.find("error")
    assert forward.get("type") == "gradcheck.forward"
    assert 'boom <&> "quoted"' in forward.get("message")  # escaped in the file, intact once parsed
    assert skip_case.find("skipped").get("message") == "backward: CUDA is not available on this machine"
    assert skip_case.find("failure") is None and skip_case.find("error") is None


def test_junit_escapes_and_strips_illegal_characters(xsd, tmp_path):
    nasty = 'a <b> & "c" \x00\x08\x0b\x1b[31mred\x1b[0m\ud800 \u00e9\u4e2d'
    result = failing(warnings=(nasty,))
    result.checks[0].message = nasty
    result.warnings.append("case warning")
    path, root = junit_tree(Report([result]), tmp_path)
    xsd.validate(str(path))
    failure = root.find("testsuite/testcase/failure")
    # a lone surrogate is written as an escape, as in every format (was: dropped)
    assert failure.get("message") == 'backward: a <b> & "c" red\\ud800 \u00e9\u4e2d'
    out = root.find("testsuite/testcase/system-out").text
    assert out == 'warning: backward: a <b> & "c" red\\ud800 \u00e9\u4e2d\nwarning: case warning\n'


def test_junit_time_and_inline_names(xsd, tmp_path):
    inline = failing(spec_path="<command line>")
    library = failing(spec_path=None)
    library.case = None
    path, root = junit_tree(Report([inline, library], duration_s=2.0), tmp_path)
    xsd.validate(str(path))
    first, second = root.findall("testsuite/testcase")
    assert (first.get("classname"), first.get("name"), first.get("time")) == ("pkg.mod.Lin", "default[cpu]", "0.250")
    assert (second.get("classname"), second.get("name")) == ("pkg.mod.Lin", "pkg.mod.Lin")


@pytest.mark.parametrize(
    "path, expected",
    [
        ("specs/linear.yaml", "specs.linear.yaml"),
        ("./specs/sub/a.yml", "specs.sub.a.yml"),
        ("/abs/dir/b.yaml", "abs.dir.b.yaml"),
        ("c.yaml", "c.yaml"),
        ("<command line>", "pkg.mod.Lin"),
    ],
)
def test_junit_classname(path, expected):
    assert junit.classname(failing(spec_path=path)) == expected


def test_junit_locations_follow_the_older_xsd_only(xsd, tmp_path):
    xmlschema = pytest.importorskip("xmlschema")
    path, root = junit_tree(Report([failing(), errored(line=None)]), tmp_path, locations=True)
    first, second = root.findall("testsuite/testcase")
    assert (first.get("file"), first.get("line")) == ("specs/lin.yaml", "1")
    assert (second.get("file"), second.get("line")) == ("specs/e.yaml", None)
    xmlschema.XMLSchema(str(DATA / "junit-10-locations.xsd")).validate(str(path))
    assert not xsd.is_valid(str(path))  # which is why it is not the default


def test_junit_empty_report_is_valid(xsd, tmp_path):
    path, root = junit_tree(Report([]), tmp_path)
    xsd.validate(str(path))
    assert root.find("testsuite").get("tests") == "0"


# ------------------------------------------------------------------------ GitHub Actions


def test_choose_auto():
    assert reporters.choose_auto({"GITHUB_ACTIONS": "true"}) == "github"
    assert reporters.choose_auto({"GITHUB_ACTIONS": "false"}) == "table"
    assert reporters.choose_auto({"CI": "true"}) == "table"
    assert reporters.choose_auto({}) == "table"


def test_github_is_registered():
    assert "github" in reporters.FORMATS
    assert reporters.get("github") is github.render


def test_github_escaping():
    assert github.escape_data("50% a\r\nb: c, d") == "50%25 a%0D%0Ab: c, d"
    assert github.escape_property("50% a\r\nb: c, d") == "50%25 a%0D%0Ab%3A c%2C d"
    assert (
        github.command("error", "m%\nx", "dir/a,b:c.yaml", 7, "t: 1, 2")
        == "::error file=dir/a%2Cb%3Ac.yaml,line=7,title=t%3A 1%2C 2::m%25%0Ax"
    )
    assert github.command("warning", "plain") == "::warning::plain"
    assert github.command("error", "m", None, 7) == "::error::m"  # a line of no file means nothing


FAIL_MESSAGE = (
    "backward: gradient of 'bias': analytical is 2.00x numerical%0A"
    "  argument 2 'bias' [3]: 3 of 3 elements out of tolerance, max abs err 1, max rel err 1, "
    "worst at [2] (analytical 2 vs numerical 1): analytical is 2.00x numerical%0A"
    "replay: gradcheck specs/lin.yaml -k specs/lin.yaml::default[cpu]"
)


def test_github_failing_result_points_at_the_failing_argument():
    assert github.commands(Report([failing()])) == [
        "::error file=specs/lin.yaml,line=8,title=gradcheck fail%3A specs/lin.yaml%3A%3Adefault[cpu]::" + FAIL_MESSAGE
    ]


def test_github_line_falls_back_to_the_case_then_to_none():
    (by_case,) = github.commands(Report([failing(line_of_bias=None, case_line=12)]))
    assert by_case.startswith("::error file=specs/lin.yaml,line=12,title=")
    (no_line,) = github.commands(Report([failing(line_of_bias=None, case_line=None)]))
    assert no_line.startswith("::error file=specs/lin.yaml,title=")


def test_github_error_results():
    result = errored(kind="forward", message="forward raised ValueError: 100% bad", where="mod.py:3")
    result.replay = "gradcheck specs/e.yaml"
    spec_err = errored(
        kind="spec", message="specs/s.yaml:4: inputs[0].shape: expected a list", spec_path="specs/s.yaml", line=4
    )
    assert github.commands(Report([result, spec_err])) == [
        "::error file=specs/e.yaml,line=1,title=gradcheck forward error%3A specs/e.yaml%3A%3Adefault[cpu]::"
        "forward error: forward raised ValueError: 100%25 bad%0Aat mod.py:3%0Areplay: gradcheck specs/e.yaml",
        "::error file=mod.py,line=3,title=gradcheck forward error%3A specs/e.yaml%3A%3Adefault[cpu]::"
        "forward error: forward raised ValueError: 100%25 bad%0Awhile checking specs/e.yaml::default[cpu]",
        "::error file=specs/s.yaml,line=4,title=gradcheck spec error%3A specs/s.yaml%3A%3Adefault[cpu]::"
        "spec error: specs/s.yaml:4: inputs[0].shape: expected a list",
    ]


def test_github_warnings_one_per_warning():
    result = failing(warnings=("'x' is not float64",))
    result.warnings.append("case, warning")
    passed = CaseResult(
        "specs/p.yaml::default[cpu]",
        "specs/p.yaml",
        "default",
        "m:P",
        "cpu",
        0,
        Status.PASS,
        checks=[CheckResult("backward", Status.PASS, warnings=["w%"])],
        line=2,
    )
    lines = github.commands(Report([result, passed]))
    assert lines[1:] == [
        "::warning file=specs/lin.yaml,line=1,title=gradcheck warning%3A specs/lin.yaml%3A%3Adefault[cpu]::"
        "backward: 'x' is not float64",
        "::warning file=specs/lin.yaml,line=1,title=gradcheck warning%3A specs/lin.yaml%3A%3Adefault[cpu]::"
        "case, warning",
        "::warning file=specs/p.yaml,line=2,title=gradcheck warning%3A specs/p.yaml%3A%3Adefault[cpu]::backward: w%25",
    ]


def test_github_inline_results_have_no_file():
    inline = failing(spec_path="<command line>", line_of_bias=None, case_line=None)
    library = errored(spec_path=None, line=None)
    lines = github.commands(Report([inline, library]))
    assert lines[0].startswith("::error title=gradcheck fail%3A <command line>%3A%3Adefault[cpu]::backward: ")
    assert lines[1] == (
        "::error title=gradcheck import error%3A pkg.mod.E::import error: "
        "specs/e.yaml:1: function: no module named 'nope'"
    )
    assert not any("file=" in line for line in lines)


def test_github_render_groups_each_case_then_the_summary_and_the_commands():
    report = Report([failing(), skipped_result(), errored()])
    out = io.StringIO()
    github.render(report, out, color=True)  # colour is ignored: Actions logs get the plain table
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue()
    groups = [i for i, line in enumerate(lines) if line.startswith("::group::")]
    assert [lines[i] for i in groups] == [
        "::group::FAIL specs/lin.yaml::default[cpu]",
        "::group::SKIP specs/gpu.yaml::default[cuda]",
        "::group::ERROR specs/e.yaml::default[cpu]",
    ]
    for i, result in zip(groups, report.results):
        # in each group, the case's plain table, fenced: text in it never runs as a command
        token = lines[i + 1].removeprefix("::stop-commands::")
        assert lines[i + 1].startswith("::stop-commands::") and len(token) == 16
        end = lines.index(f"::{token}::", i)
        assert "\n".join(lines[i + 2 : end]) + "\n" == table.case_text(result)
        assert lines[end + 1] == "::endgroup::"
    tail = lines[lines.index("::endgroup::", groups[-1]) + 1 :]
    assert tail[0] == "3 results: 0 passed, 1 failed, 1 error, 1 skipped in 0.00s"
    assert tail[1:] == github.commands(report) and len(tail[1:]) == 2  # nothing for the skip


def test_github_group_titles_are_escaped_as_actions_core_does():
    result = failing(spec_path="specs/a%b.yaml")
    result.id = "specs/a%b.yaml::x\ny[cpu]"
    out = io.StringIO()
    github.render(Report([result]), out)
    assert out.getvalue().startswith("::group::FAIL specs/a%25b.yaml::x%0Ay[cpu]\n")


def test_github_user_location():
    assert github.user_location("pkg/mod.py:42 (raise ValueError(x))") == ("pkg/mod.py", 42)
    assert github.user_location("mod.py:3") == ("mod.py", 3)
    assert github.user_location("../elsewhere/mod.py:3 (x)") is None  # outside the workspace: no annotation
    assert github.user_location("/usr/lib/python3/site.py:3") is None
    assert github.user_location("Traceback:\n  File x.py, line 3") is None
    assert github.user_location(None) is None


STEP_SUMMARY = """\
### gradcheck: 3 results: 0 passed, 1 failed, 1 error, 1 skipped in 0.00s

| case | check | argument | pattern | ratio | replay |
|---|---|---|---|---|---|
| specs/lin.yaml::default[cpu] | backward | 2: bias | constant_ratio: analytical is 2.00x numerical | 2 | \
`` gradcheck specs/lin.yaml -k 'a`b\\|c' `` |

| case | error | replay |
|---|---|---|
| specs/e.yaml::default[cpu] | import error: specs/e.yaml:1: function: no module named &lt;nope&gt; |  |
"""


def test_github_step_summary_markdown():
    fail = failing()
    fail.checks[0].inputs[1].pattern, fail.checks[0].inputs[1].ratio = Pattern.CONSTANT_RATIO, 2.0
    fail.replay = "gradcheck specs/lin.yaml -k 'a`b|c'"
    report = Report([fail, skipped_result(), errored(message="specs/e.yaml:1: function: no module named <nope>")])
    assert github.step_summary(report) == STEP_SUMMARY


def test_github_step_summary_is_appended_by_the_command_line(write_spec, invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "summary.md").write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    shutil.copy(REPO / "broken-specs/linear_double_bias.yaml", tmp_path / "double_bias.yaml")
    result = invoke("double_bias.yaml", "--no-isolate", "--format", "github")
    assert result.exit_code == 1, result.output
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("earlier step\n### gradcheck: 1 result: 0 passed, 1 failed, 0 errors, 0 skipped in ")
    (row,) = [line for line in text.splitlines() if line.startswith("| double_bias.yaml")]
    assert row.startswith(
        "| double_bias.yaml::default[cpu] | backward | 2: bias | constant_ratio: analytical is "
        "2.00x numerical | 2 | ` gradcheck double_bias.yaml -k double_bias.yaml::default ` |"
    )
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    invoke("double_bias.yaml", "--no-isolate", "--format", "table")  # only with --format github (or auto)
    assert (tmp_path / "summary.md").read_text() == text


def test_github_on_real_runs(shipped_report, problem_report):
    every = github.annotations_by_kind(shipped_report)["error"]  # one per failing case, before GitHub's cap
    failed = shipped_report.summary()["failed"]
    assert len(every) == failed > github.SHOWN
    shown = [x for x in github.commands(shipped_report) if x.startswith("::error ")]
    assert shown[: github.SHOWN - 1] == every[: github.SHOWN - 1] and len(shown) == github.SHOWN
    assert f"::{failed - github.SHOWN + 1} more error annotations folded (GitHub shows 10 per step)" in shown[-1]
    (double_bias,) = [x for x in every if "linear_double_bias" in x]
    # line 8 of the file is the bias entry: the failing argument
    assert double_bias.startswith("::error file=broken-specs/linear_double_bias.yaml,line=8,")
    assert (REPO / "broken-specs/linear_double_bias.yaml").read_text().splitlines()[7].strip() == "- name: bias"
    assert "2.00x" in double_bias
    problems = github.commands(problem_report)
    assert problems[0].startswith("::error file=bad_key.yaml,line=4,title=gradcheck spec error%3A ")
    # the forward that raised: at the spec's case, and at the line of the user's module that raised
    assert problems[2].startswith("::error file=boom.yaml,line=2,title=gradcheck forward error%3A ")
    assert problems[3].startswith("::error file=boommod.py,line=6,title=gradcheck forward error%3A boom.yaml")
    assert problems[3].endswith("%0Awhile checking boom.yaml::default[cpu]")
    assert Path("boommod.py").read_text().splitlines()[5].strip() == 'raise ValueError("boom <&> \\"quoted\\"")'
    # (the written files start with a blank line: the document begins on line 2)
    assert problems[1].startswith("::error file=no_module.yaml,line=2,title=gradcheck import error%3A ")
    assert len(problems) == 4  # the forward error twice: in the spec and in the user's module


def test_junit_suite_has_timestamp_hostname_and_properties(xsd, tmp_path):
    other = failing(spec_path="specs/other.yaml")
    other.seed, other.device, other.function = 7, "cuda", "pkg.other:G"
    report = Report([failing(), other, failing(spec_path="specs/third.yaml"), errored()], duration_s=2.0)
    path, root = junit_tree(report, tmp_path)
    xsd.validate(str(path))  # still valid against the Jenkins schema
    suite = root.find("testsuite")
    stamp = datetime.datetime.fromisoformat(suite.get("timestamp"))
    assert stamp.tzinfo is not None  # local time with its offset, as pytest writes it
    assert abs((datetime.datetime.now().astimezone() - stamp).total_seconds()) < 600
    assert suite.get("hostname") == socket.gethostname()
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props == {
        "gradcheck-cli": gradcheck_cli.__version__,
        "torch": json_.torch_version(),
        "seed": "0, 7",
        "device": "cpu, cuda",
        "function": "pkg.mod:Lin, pkg.other:G, nope:F",
    }
    assert suite.find("testcase/properties") is None  # the Jenkins schema has none on a testcase


def test_junit_timestamp_and_hostname_can_be_given():
    root = junit.build(Report([failing()]), timestamp="2024-01-02T03:04:05+00:00", hostname="ci-7")
    suite = root.find("testsuite")
    assert (suite.get("timestamp"), suite.get("hostname")) == ("2024-01-02T03:04:05+00:00", "ci-7")


@pytest.mark.parametrize(
    "rid, spec_path, case, expected",
    [
        ("specs/l.yaml::with_bias[cpu]", "specs/l.yaml", "with_bias", ("specs.l.yaml", "with_bias[cpu]")),
        ("specs/m.yaml#2::default[cuda:1]", "specs/m.yaml", "default", ("specs.m.yaml.#2", "default[cuda:1]")),
        ("./specs/l.yaml::a.b[cpu]", "./specs/l.yaml", "a.b", ("specs.l.yaml", "a.b[cpu]")),
        ("specs/bad.yaml:4", "specs/bad.yaml", None, ("specs.bad.yaml", "spec_error[line 4]")),
    ],
)
def test_junit_names_are_pytests_names_of_the_plugins_items(rid, spec_path, case, expected):
    result = CaseResult(rid, spec_path, case, "m:F", "cpu" if "cpu" in rid else "cuda:1", 0, Status.PASS, line=4)
    assert junit.names(result) == expected


def test_github_annotations_are_capped_at_what_github_shows_the_most_useful_first():
    """GitHub shows 10 error (and 10 warning) annotations per step and drops the rest silently: 32 for
    broken-specs/ meant 22 lost without a word. Each failing case comes first, on its spec line; the cases that
    could not be checked after; the last annotation says how many were folded, and the step summary too."""
    errors = [errored(spec_path=f"specs/e{i}.yaml") for i in range(3)]
    fails = [failing(spec_path=f"specs/f{i:02}.yaml", warnings=(f"warning {i}",)) for i in range(15)]
    report = Report(errors + fails)  # the errors first in the results: still after the fails when capped
    said = github.commands(report)
    shown = [c for c in said if c.startswith("::error ")]
    assert len(shown) == github.SHOWN
    assert [f"specs/f{i:02}.yaml" in c for i, c in enumerate(shown[:9])] == [True] * 9
    assert shown[-1] == (
        "::error title=gradcheck%3A 9 more errors::9 more error annotations folded (GitHub shows 10 per step): "
        "the step summary and the log above hold every result"
    )
    warnings = [c for c in said if c.startswith("::warning ")]
    assert len(warnings) == 10 and "6 more warning annotations folded" in warnings[-1]
    assert github.folded(report) == {"error": 9, "notice": 0, "warning": 6}
    summary = github.step_summary(report)
    assert "9 errors, 6 warnings not shown as annotations (GitHub shows 10 of each kind per step)" in summary
    assert all(f": warning {i} |" in summary for i in range(15))  # every warning is in the summary
    few = Report(errors[:1] + fails[:2])
    assert github.folded(few) == {"error": 0, "notice": 0, "warning": 0}
    assert "not shown as annotations" not in github.step_summary(few)
