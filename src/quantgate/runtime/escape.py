"""Names are data, never markup: the one place that turns text read from data into output.

A checkpoint directory, a model, target, tenant or suite name, a reason: any of them may hold
``[/]`` (Rich markup: the verdict table crashed on it), ``[bold]`` or ``:emoji:`` (rendered),
an ANSI escape (sent to the terminal raw), a newline (a forged second ``error:`` line), or
``![x](http://...)`` (a tracking pixel in a PR comment). So every such value reaches
a person through one of these:

- ``visible``: control characters (C0, DEL, C1, line and paragraph separators, bidi overrides)
  written as their escapes (``\\x1b``), so one value is one line and sends the terminal nothing.
  The CLI's error printer writes every error through it.
- ``terminal``: a Rich ``Text`` of the visible text, for tables, titles and logs: a ``Text`` is
  never parsed for markup or emoji codes.
- ``md`` (text) and ``md_code`` (a code span): for report.md, which GitHub renders in CI
  summaries and PR comments.

HTML needs nothing here: report.html is a Jinja2 template with autoescape on everywhere.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported only when terminal text is built
    from rich.text import Text

_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_HIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029" + "".join(sorted(_BIDI)) + "]")
_HIDDEN_BUT_NEWLINE = re.compile(_HIDDEN.pattern.replace("\\x00-\\x1f", "\\x00-\\x09\\x0b-\\x1f"))

# Markdown: every character that can start markup inside a line (links and images, emphasis,
# code, strikethrough, raw HTML and entities, table cells, @mentions); a line break becomes a space
_MD = str.maketrans(
    {
        "\\": "\\\\",
        "`": "\\`",
        "*": "\\*",
        "[": "\\[",
        "]": "\\]",
        "~": "\\~",
        "|": "\\|",
        "@": "\\@",
        "<": "&lt;",
        ">": "&gt;",
        "&": "&amp;",
        "\r": " ",
        "\n": " ",
    }
)
# "_" opens or closes emphasis only beside a character that is not a letter or digit: kld_mean stays
_MD_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
_MD_HEADING = re.compile(r"^(\s*)#")


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, *, newlines: bool = False) -> str:
    """``text`` with its control characters written as escapes (``\\n``, ``\\x1b``, ``\\u202e``);
    ``newlines`` keeps line breaks (a log's tail, where each line is its own)."""
    s = str(text)
    if newlines:
        return _HIDDEN_BUT_NEWLINE.sub(_escape, s)
    return _HIDDEN.sub(_escape, s.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))


def terminal(text: object) -> Text:
    """Text for a Rich table cell, title or log line: visible, and never read as markup or emoji."""
    from rich.text import Text

    return Text(visible(text))


def md(text: object) -> str:
    """Plain text for report.md (a table cell, a list item, a heading): no markup, no HTML, one line."""
    s = visible(str(text).replace("\r\n", " ").translate(_MD))
    s = _MD_UNDERSCORE.sub(r"\\_", s)
    return _MD_HEADING.sub(r"\1\\#", s)  # "#" first would make a list item a heading


def md_code(text: object) -> str:
    """``text`` as a Markdown code span: shown literally, on one line, whatever backticks it holds."""
    s = visible(str(text).replace("\r\n", " ").replace("\r", " ").replace("\n", " "))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s[:1] in ("`", " ") or s[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{s}{pad}{fence}"
