"""docs/ARCHITECTURE.md states only what the code at HEAD holds, so it cannot drift silently (issue 45).

Issue 45 found the page wrong in 11 places (functions over 80 lines, the ``--device`` edge, twins,
a ``cli/`` list without ``seed``, files it named that did not exist) and too long to read (median
sentence 55 words). Here every figure and name the page states is compared with the tree: the
layer list with pyproject's import-linter layers, the house's figures and the long functions with
``bench/house/architecture_scan.py``, the package table and the command list with the source, every
path and every cited test with the files. README.md's "Layout" must list every package and every
module at the package root. The page's median sentence stays at most 30 words (the anchors'
guides run 22-33).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import statistics
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "quantgate"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MEDIAN_WORDS = 30
# files the page names that a run writes, not files of the repository
WRITTEN_BY_A_RUN = {"report.md", "report.html"}


def _scan():
    spec = importlib.util.spec_from_file_location(
        "architecture_scan", ROOT / "bench" / "house" / "architecture_scan.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``)."""
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _fences(text: str) -> list[str]:
    return re.findall(r"^```\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _table(section: str) -> list[list[str]]:
    """The rows of the first table in ``section``, cells stripped, header and rule left out."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def sentences(markdown: str) -> list[str]:
    """The page's prose as sentences: fenced blocks and headings left out, each table row one
    sentence (its cells joined), a paragraph split after ``.``, ``?`` or ``!``."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    out: list[str] = []
    paragraph: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not set(line) <= set("|- "):
                out.append(" ".join(c.strip() for c in line.strip("|").split("|")))
            continue
        if not line.strip() or line.startswith("#"):
            out += [s for s in re.split(r"(?<=[.!?])\s+", " ".join(paragraph)) if s.strip()]
            paragraph = []
            continue
        paragraph.append(line.strip())
    return out


def words(sentence: str) -> int:
    """Whitespace-separated tokens that hold a letter or a digit (a backticked name is one)."""
    return sum(1 for token in sentence.split() if re.search(r"\w", token))


def median_sentence_words(markdown: str) -> float:
    return statistics.median(words(s) for s in sentences(markdown))


def median_words_read(markdown: str) -> float:
    """The length of the sentence the median word sits in: the plain median counts a table row of
    four words like a paragraph of eighty, and so passed the page issue 45 found unreadable (27
    words at b463db0; this measure gave it 45)."""
    return statistics.median(n for s in sentences(markdown) for n in [words(s)] * words(s))


def test_the_sentence_measure_counts_what_a_reader_reads():
    page = "# Title\n\nOne two three. Four five!\n\n```\nnot prose at all here\n```\n| a | b c |\n| --- | --- |\n| d | e |\n"
    assert sentences(page) == ["One two three.", "Four five!", "a b c", "d e"]
    assert words("`quantgate build --plan` runs — fast") == 5


def test_the_median_sentence_is_short():
    page = DOC.read_text()
    median, read = median_sentence_words(page), median_words_read(page)
    assert median <= MEDIAN_WORDS, f"docs/ARCHITECTURE.md's median sentence is {median} words"
    assert read <= MEDIAN_WORDS, f"docs/ARCHITECTURE.md's median word sits in a sentence of {read} words"


def test_the_word_weighted_median_sees_long_prose_among_short_rows():
    rows = "| a | b |\n| --- | --- |\n" + "| x | y |\n" * 5
    prose = " ".join(["word"] * 60) + "."
    page = rows + "\n" + prose + "\n"
    assert median_sentence_words(page) == 2  # five rows of two words outvote one long sentence
    assert median_words_read(page) == 60  # but most of what is read is the long sentence


def test_every_path_the_page_names_exists():
    text = DOC.read_text()
    named = set(re.findall(r"`([^`\s<>*]+)`", text))
    named |= set(re.findall(r"(?<![\w./<>-])([\w-]+(?:/[\w.-]+)*\.(?:py|md|yaml|toml|sh))\b", text))
    paths = {
        n.split("::")[0] for n in named if "/" in n or re.search(r"\.(py|md|yaml|toml|sh)$", n.split("::")[0])
    }
    missing = sorted(
        p
        for p in paths - WRITTEN_BY_A_RUN
        if p.startswith("/") or not any((base / p).exists() for base in (ROOT, SRC))
    )
    assert len(paths) > 40, sorted(paths)  # the scan reads the page
    assert not missing, f"docs/ARCHITECTURE.md names paths the tree lacks: {missing}"


def test_every_test_the_page_cites_is_defined():
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", DOC.read_text())
    assert len(cited) >= 10
    absent = [
        f"{path}::{name}"
        for path, name in cited
        if name
        not in {
            n.name for n in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(n, ast.FunctionDef)
        }
    ]
    assert not absent, f"docs/ARCHITECTURE.md cites tests that do not exist: {absent}"


def test_every_dotted_name_of_a_package_module_exists():
    """``devices.resolve``, ``hashing.SOURCE_SCHEME``: the module (``runtime/devices.py``, one level
    below the package root) defines the name."""
    missing, checked = [], 0
    for module, name in re.findall(r"`(\w+)\.(\w+)`", DOC.read_text()):
        found = sorted(SRC.glob(f"*/{module}.py"))
        path = found[0] if len(found) == 1 else SRC / f"{module}.py"
        if (
            name != "py"
            and path.exists()
            and not re.search(rf"^(def |class )?{name}\b", path.read_text(), flags=re.MULTILINE)
        ):
            missing.append(f"{module}.{name}")
        checked += name != "py" and path.exists()
    assert checked >= 2 and not missing, missing


def test_the_layers_are_pyprojects_import_linter_layers():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    wanted = [sorted(n.strip().strip("()") for n in re.split(r"[|:]", layer)) for layer in contract["layers"]]
    block = next(f for f in _fences(_section(DOC.read_text(), "Layers, checked")) if f.startswith("cli\n"))
    drawn = [
        sorted(n.strip() for n in re.split(r"[|,]", line.split("helpers:")[-1]))
        for line in block.splitlines()
        if line.strip()
    ]
    assert drawn == wanted


def test_the_house_figures_are_the_scans():
    scan = _scan()
    mods = scan.modules(ROOT / "src")
    drawn = scan.house(ROOT, mods)
    now = {row[0]: row[2] for row in _table(_section(DOC.read_text(), "Layers, checked"))}
    assert now == {
        "cross-stage private imports": str(len(scan.private_imports(mods))),
        "circles of modules": str(len(drawn["circles"])),
        "largest circle": f"{max((len(c) for c in drawn['circles']), default=0)} modules",
        "arrows running back up": str(len(drawn["up"])),
        "modules at the package root": str(drawn["at_root"]),
    }


def test_the_long_functions_are_the_scans():
    scan = _scan()
    longs = {
        re.sub(r"^quantgate\.| \(\d+ lines\)$", "", f)
        for f in scan.long_functions(scan.modules(ROOT / "src"))
    }
    section = _section(DOC.read_text(), "Layers, checked")
    stated = re.search(r"Functions over 80 lines: (\d+)\.", section)
    assert stated is not None and int(stated.group(1)) == len(longs)
    listed = section[section.index("They are ") :].split("\n\n")[0]
    assert set(re.findall(r"`([\w.]+)`", listed)) == longs


def test_the_package_table_lists_every_package():
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    table = {row[0].strip("`/") for row in _table(_section(DOC.read_text(), "The packages"))}
    # declarations/ and config/ are described with the contracts, below config
    assert table == packages - {"config", "declarations"}


def test_the_command_list_is_the_clis():
    source = (SRC / "cli" / "commands.py").read_text()
    commands = set(re.findall(r'app\.command\("(\w+)"\)', source)) | set(
        re.findall(r'name="(\w+)"\)', source)
    )
    line = next(line for line in DOC.read_text().splitlines() if line.startswith("The commands are "))
    assert set(re.findall(r"`(\w+)`", line)) == commands


def test_the_readme_layout_lists_every_package_and_root_module():
    readme = (ROOT / "README.md").read_text()
    layout = _section(readme, "Layout")
    listed = set(re.findall(r"^([\w.]+)/?\s", layout, flags=re.MULTILINE))
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    modules = {p.name for p in SRC.glob("*.py") if p.name != "__init__.py"}
    assert packages <= listed, sorted(packages - listed)
    assert modules <= listed, sorted(modules - listed)


def test_every_section_another_page_cites_is_a_heading():
    """BENCHMARKS.md, CONTRIBUTING.md and bench/README.md cite this page's sections by name."""
    headings = set(re.findall(r"^#+ (.+)$", DOC.read_text(), flags=re.MULTILINE))
    cited = {
        (page.relative_to(ROOT).as_posix(), name)
        for page in [*ROOT.glob("*.md"), *(ROOT / "bench").glob("*.md")]
        for name in re.findall(r'ARCHITECTURE\.md[`,]* "([^"]+)"', page.read_text())
    }
    assert cited, "no page cites a section: the pattern no longer reads them"
    assert not [c for c in cited if c[1] not in headings], sorted(cited)
