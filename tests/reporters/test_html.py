"""The HTML report (--html): a self-contained page, parsed with html.parser, and rendered in headless
Chromium where one is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from gradcheck_cli.reporters import html
from gradcheck_cli.results import CaseResult, CheckResult, ErrorMap, InputReport, Report, Status

EVIL = "<script>alert('x')</script>"


class Page(HTMLParser):
    """What a browser would load or run, and the page's sections and text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.sections: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name != "xmlns" and value and re.search(r"(https?:)?//|url\(", value):  # xmlns names, loads nothing
                self.urls.append(f"{tag} {name}={value}")
            if tag == "section" and name == "class":
                self.sections.append(value or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if re.search(r"@import|url\(|https?://", data) and self.tags[-1] == "style":
            self.urls.append(data)


def _failing_row(index: int, name: str, shape: list[int]) -> InputReport:
    numel = 1
    for s in shape:
        numel *= s
    row = InputReport(
        index,
        name,
        shape,
        "float64",
        Status.FAIL,
        numel=numel,
        mismatched=2,
        max_abs_err=1.0,
        max_rel_err=1.0,
        worst_index=[0] * len(shape),
        analytical=2.0,
        numerical=1.0,
        atol=1e-5,
        rtol=1e-3,
        diagnosis=f"2 of {numel} elements are wrong {EVIL}",
        mismatched_indices=[[0] * len(shape), [1] + [0] * (len(shape) - 1)],
        mismatched_indices_cap=100,
    )
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    error = [0.0] * (rows * cols)
    error[0], error[cols] = 1.0, float("inf")
    row.error_map = ErrorMap(rows, cols, [1, 1], error, [1.0] * len(error), [0.5] * len(error), "gradients")
    return row


def _report() -> Report:
    passing = InputReport(0, "x", [3], "float64", Status.PASS, numel=3, mismatched=0)
    failing = CheckResult(
        "backward",
        Status.FAIL,
        f"gradient of {EVIL} is wrong",
        "elementwise",
        [passing, _failing_row(1, EVIL, [4, 3]), _failing_row(2, "w", [5, 2])],
    )
    bad = CaseResult(
        f"specs/a.yaml::{EVIL}[cpu]",
        "specs/a.yaml",
        EVIL,
        f"mod:{EVIL}",
        "cpu",
        0,
        Status.FAIL,
        checks=[failing],
        replay=f"gradcheck specs/a.yaml -k '{EVIL}'",
    )
    good = CaseResult(
        "specs/b.yaml::default[cpu]",
        "specs/b.yaml",
        "default",
        "mod:Good",
        "cpu",
        0,
        Status.PASS,
        checks=[CheckResult("backward", Status.PASS, "1 argument checked", "elementwise", [passing])],
    )
    return Report([bad, good], 1.5)


def test_the_page_loads_nothing_from_the_network_and_runs_no_script():
    page = Page(html.page(_report()))
    assert page.urls == []
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(page.tags)
    assert page.tags[0] == "html" and "style" in page.tags and "svg" in page.tags


def test_one_section_per_failing_argument_and_one_per_case():
    page = Page(html.page(_report()))
    assert page.sections.count("argument") == 2 and page.sections.count("case") == 2


def test_user_text_is_escaped_everywhere():
    text = html.page(_report())
    assert "<script" not in text
    shown = "".join(Page(text).text)
    assert shown.count(EVIL) >= 5  # the case id, function, message, argument name, diagnosis, replay


def test_the_page_holds_the_table_the_replay_command_and_the_mismatches():
    page = Page(html.page(_report()))
    shown = "".join(page.text)
    assert "max abs err" in shown and "2 / 12" in shown  # the table's cells
    assert f"gradcheck specs/a.yaml -k '{EVIL}'" in shown
    assert "mismatching: [0, 0], [1, 0]" in shown
    assert page.tags.count("rect") >= 3 * (12 + 10)  # three maps (error, analytical, numerical) per argument


def test_non_finite_and_hot_cells_get_their_own_colours():
    text = html.page(_report())
    assert html.NONFINITE in text and html._heat(1.0, 1.0) in text and html._heat(0.0, 1.0) in text


def test_cli_writes_the_page_and_checks_its_folder_first(user_module, write_spec, invoke, tmp_path):
    user_module("""
        import torch
        class Wrong(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return 3 * x
            @staticmethod
            def backward(ctx, g):
                return -3 * g
    """)
    write_spec("function: usermod:Wrong\ninputs: [{shape: [3, 4]}]\n", "specs/wrong.yaml")
    result = invoke("specs/", "--no-isolate", "--html", "out/report.html")
    assert result.exit_code == 2 and "out" in result.output and "mkdir -p out" in result.output
    result = invoke("specs/", "--no-isolate", "--html", "report.html")
    assert result.exit_code == 1
    page = Page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert page.sections.count("argument") == 1 and page.urls == []
    assert "gradcheck specs/wrong.yaml -k specs/wrong.yaml::default" in "".join(page.text)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed to render the page")
def test_headless_chromium_renders_the_page_offline(tmp_path):
    path = tmp_path / "report.html"
    html.write(_report(), path)
    flags = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--user-data-dir=" + str(tmp_path / "profile")]
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1200,1600", path.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 1200
    dom = subprocess.run(
        [*flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert dom.count('<section class="argument">') == 2 and dom.count("<svg") == 6  # parsed, as written
    assert "<script" not in dom
