"""The HTML report: self-contained, escaped, deterministic, and rendered by a real browser.

The browser test needs Chromium (``apt-get install -y chromium``); it is skipped when absent.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from quantgate.report import render_html

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def e1_html(_e1_report) -> str:
    return render_html(_e1_report)


def test_self_contained(e1_html):
    assert e1_html.startswith("<!DOCTYPE html>") and '<table id="verdicts">' in e1_html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", e1_html, re.IGNORECASE)
    assert "<script" not in e1_html.lower() and "<link" not in e1_html.lower() and "@import" not in e1_html
    images = re.findall(r'<img [^>]*src="([^"]*)"', e1_html)
    assert len(images) >= 5 and all(src.startswith("data:image/png;base64,") for src in images)
    # the verdict table comes before any floor detail or plot
    assert e1_html.index('id="verdicts"') < e1_html.index("<details") < e1_html.index("<img")


def test_deterministic(_e1_report, e1_html):
    assert render_html(_e1_report) == e1_html


def test_escapes_hostile_text(e1_report):
    e1_report["verdicts"][0]["tenant"] = HOSTILE
    e1_report["verdicts"][0]["floors"][0]["reason"] = HOSTILE
    e1_report["verdicts"][0]["reasons"] = [HOSTILE]
    e1_report["model"] = HOSTILE
    html = render_html(e1_report)
    assert HOSTILE not in html and "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_optional_data_plotted(e1_report):
    bins = {
        f"{k}_bin{i}": v for i in range(1, 5) for k, v in (("kld", 0.01 * i), ("agreement", 1 - 0.01 * i))
    }
    e1_report["metrics"] = {"source": {"long-chain": {"kld_bin1": 0.0}}, "hopper-fp8": {"long-chain": bins}}
    e1_report["sizes"] = {"source": 1000, "hopper-fp8": 500}
    html = render_html(e1_report)
    assert 'alt="long-chain by position"' in html and "50.0%" in html
    assert "no per-bin long-chain metrics" in render_html({**e1_report, "metrics": {}})


def _png_pixels(path: Path) -> tuple[int, int, set[bytes]]:
    """Width, height and a sample of distinct pixels of an 8-bit RGB(A) PNG (no PIL needed)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = 1 + width * bpp
    # filtered bytes: enough to see variety
    rows = [raw[i * stride + 1 : (i + 1) * stride] for i in range(0, height, 7)]
    return width, height, {row[j : j + bpp] for row in rows for j in range(0, len(row), bpp * 13)}


CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_chromium_renders(e1_html, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(e1_html, encoding="utf-8")
    shot = tmp_path / "shot.png"
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    run = subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1280,900", page.as_uri()],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 10_000
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1280, 900) and len(pixels) > 10, "blank screenshot"
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], check=False, capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<table id="verdicts">' in dom.stdout and "rocm-cdna3-fp8" in dom.stdout
    for err in (run.stderr, dom.stderr):
        bad = [
            line
            for line in err.splitlines()
            if "Uncaught" in line or "CONSOLE" in line.upper() and "ERROR" in line
        ]
        assert not bad, bad


def test_sequential_items_used_table_in_html_and_markdown(e1_report):
    """A sequential evaluation's items used, stopping reason and seconds saved show in both
    renderers, one row per (artifact, suite); a fixed-design report has no such section."""
    from quantgate.report import render_markdown

    assert 'id="sequential"' not in render_html(e1_report)
    e1_report["sequential"] = {
        "blackwell-nvfp4": {
            "wikitext": {
                "items_used": 12,
                "items_total": 128,
                "stopped": "decided",
                "seconds": 31.5,
                "seconds_saved_estimate": 304.5,
            },
        },
        "hopper-fp8": {
            "traffic": {
                "items_used": 64,
                "items_total": 64,
                "stopped": "exhausted",
                "seconds": 160.0,
                "seconds_saved_estimate": 0.0,
            },
        },
    }
    html = render_html(e1_report)
    section = html[html.index('id="sequential"') :]
    rows = re.findall(
        r"<tr><th>([^<]+)</th><td>([^<]+)</td><td class=\"num\">([^<]+)</td><td>([^<]+)</td>", section
    )
    assert rows[:2] == [
        ("blackwell-nvfp4", "wikitext", "12 of 128", "decided"),
        ("hopper-fp8", "traffic", "64 of 64", "exhausted"),
    ]
    markdown = render_markdown(e1_report)
    assert "## Sequential evaluation" in markdown
    assert "| blackwell-nvfp4 | wikitext | 12 of 128 | decided |" in markdown
