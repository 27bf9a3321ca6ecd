"""Names are data, never markup (issue 25): the terminal, report.md and report.html show a name as
written, with control characters visible, and nothing in it becomes markup.

Before ``quantgate.runtime.escape``: a name holding ``[/]`` crashed the verdict table (rich MarkupError),
``[bold]`` and ``:thumbs_up:`` rendered, an ANSI escape reached the terminal raw; report.md's
repair section passed ``<script>`` and ``<img onerror>`` through, and ``md()`` let
``![x](http://...)`` put a tracking pixel into a PR comment.
"""

from __future__ import annotations

import io

import pytest

from quantgate.contracts.report_schema import ProbeRecord, TargetRepair, TenantRepair
from quantgate.report import render_html, render_markdown
from quantgate.report.console import verdict_table
from quantgate.runtime.progress import RichProgress

pytestmark = pytest.mark.unit

PIXEL = "![x](http://tracker.example/p.png)"
LINK = "[click](http://evil.example)"
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
EMPHASIS = "**bold** _em_ ~~gone~~ `code` @org/team"
MARKUP = "ck[/] [bold red]RED[/bold red] [link=http://evil.example]x[/link] :thumbs_up:"
CONTROL = "ck\x1b[2J\x1b[31mred\x1b]0;title\x07\u202eevil\nerror: forged second line"


def _rendered(table) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=400, color_system=None, emoji=True).print(table)
    return out.getvalue()


@pytest.mark.parametrize("name", [MARKUP, CONTROL], ids=["markup", "control"])
def test_the_verdict_table_shows_names_as_text(e1_report, name):
    e1_report["model"] = name
    for v in e1_report["verdicts"]:
        if v["tenant"] == "chat":
            v["tenant"] = name
    e1_report["verdicts"][0]["artifact"] = name
    text = _rendered(verdict_table(e1_report, f"quantgate gate: {name}"))
    if name == MARKUP:
        assert "ck[/] [bold red]RED[/bold red] [link=http://evil.example]x[/link] :thumbs_up:" in text
        assert "👍" not in text
    else:
        assert "ck\\x1b[2J\\x1b[31mred\\x1b]0;title\\x07\\u202eevil\\nerror: forged second line" in text
        assert not any(c in text for c in "\x1b\x07\u202e")
        assert not any(line.startswith("error:") for line in text.splitlines())


def test_progress_logs_and_bars_show_names_as_text(capsys):
    """intake logs the checkpoint's path through ``progress.log``: ``ck[/]`` crashed it."""
    with RichProgress() as progress:
        progress.log(f"intake {MARKUP}")
        with progress.task(f"hashing {MARKUP} {CONTROL}", 1) as task:
            task.advance()
    err = capsys.readouterr().err
    assert "ck[/] [bold red]RED[/bold red]" in err and "\x1b[2J" not in err


def _hostile(report: dict) -> dict:
    """Every name and free text of the report, hostile."""
    names = [PIXEL, LINK, SCRIPT, IMG, EMPHASIS, "# heading", "a|b"]
    report["model"] = PIXEL
    report["model_class"] = f"x` {IMG} `y"
    report["notes"] = [f"# {SCRIPT} {PIXEL}"]
    for i, v in enumerate(report["verdicts"]):
        v["tenant"] = names[i % len(names)] + f" {i}"
        v["reasons"] = [LINK, IMG]
        for f in v["floors"]:
            f["reason"] = f"{PIXEL} {SCRIPT}"
            f["suite"] = f"{f['suite']}`{IMG}"
    report["no_evidence"] = {PIXEL: [SCRIPT, EMPHASIS]}
    first = next(iter(report["numerics"]))
    report["numerics"][first]["mode"] = IMG
    report["repairs"] = [
        TargetRepair(
            target=SCRIPT,
            upgrade=IMG,
            units=2,
            uniform_bytes=100,
            parent_build_key="k" * 64,
            sensitivity_seconds=1.0,
            sensitivity_cached=True,
            kld_uniform=0.3,
            ranked=[PIXEL, LINK],
            budget=3,
            probes=[
                ProbeRecord(
                    k=1, bytes=120, passed=[PIXEL], quality={f"{SCRIPT}.m": 0.1}, seconds=1.0, path="p"
                )
            ],
            tenants=[
                TenantRepair(tenant=IMG, k=1, stopped=EMPHASIS),
                TenantRepair(tenant=LINK, k=None, stopped=SCRIPT),
            ],
            seconds=2.0,
        ).model_dump()
    ]
    return report


def test_report_md_renders_no_name_as_markup(e1_report):
    """report.md rendered as GitHub renders it (CommonMark with raw HTML, tables, strikethrough):
    the only markup in it is the report's own."""
    markdown_it = pytest.importorskip("markdown_it")
    text = render_markdown(_hostile(e1_report))
    assert "## Repair" in text
    html = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)
    for made in ("<img", "<script", "<a ", "<em>", "<del>", "<h1>heading", "<h2>heading"):
        assert made not in html, made
    assert html.count("<strong>") == 1  # the headline's own bold
    assert html.count("<h1>") == 1  # the title: a name cannot start another heading
    # and every name is still there, as text
    for shown in ("![x](http://tracker.example/p.png)", "&lt;script&gt;alert(1)&lt;/script&gt;", "**bold**"):
        assert shown in html, shown


def test_report_md_lines_stay_lines(e1_report):
    e1_report["model"] = "m\n# forged heading\r\n| forged | row |"
    e1_report["verdicts"][0]["floors"][0]["suite"] = "s\nx"
    text = render_markdown(e1_report)
    assert not any(line.startswith(("# forged", "| forged")) for line in text.splitlines())


@pytest.mark.heavy
def test_report_html_escapes_every_name(e1_report):
    html = render_html(_hostile(e1_report))
    assert "<script" not in html.lower() and "<img src=x" not in html and "onerror=alert(1)>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
