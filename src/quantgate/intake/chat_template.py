"""Chat templates: Jinja from the checkpoint's author, rendered for every chat prompt.

transformers renders a chat template in Jinja's immutable sandbox, which stops a template that
reaches for ``''.__class__.__mro__`` and the like, but only when the line runs, with a
``SecurityError`` traceback from wherever the first chat prompt is built (evaluation, a serving
engine). Intake finds such a template first, among every one the tokenizer would load
(``tokenizer_config.json``'s ``chat_template``, a string or a named list; ``chat_template.jinja``;
``additional_chat_templates/*.jinja``; ``chat_template.json``), and refuses it naming the file:

- parsed: a syntax error is refused, and so is any attribute the sandbox refuses to hand out
  (names starting with an underscore, and Python's internal attributes such as ``mro``), found
  in the syntax tree so that a branch the sample conversation does not reach is caught too;
- rendered by transformers' own sandboxed environment on a short conversation, within a time
  limit: a template the sandbox stops, or one that does not finish, is refused. A template that
  merely declines the sample (``raise_exception`` on a role it does not support) is not.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantgate.errors import CheckpointConfigError
from quantgate.intake import bounded_json
from quantgate.intake.architecture import read_json

RENDER_SECONDS = 5.0  # real templates render a short conversation in milliseconds
_SAMPLE = [
    {"role": "user", "content": "What is 12 plus 30?"},
    {"role": "assistant", "content": "42."},
    {"role": "user", "content": "Thank you."},
]
_FIX = "replace the chat template with the one the model was released with"


def check(root: Path, files: list[str]) -> None:
    """Refuse (CheckpointConfigError, exit 2) the first chat template that is broken or unsafe."""
    tokens: dict[str, Any] = {}
    for rel, name, text in _templates(root, files, tokens):
        _check_one(root / rel, f"chat template{f' {name!r}' if name else ''} in {rel}", text, tokens)


def _templates(root: Path, files: list[str], tokens: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(file, template name, text) of every template the tokenizer would load; fills ``tokens``."""
    present = set(files)
    if "tokenizer_config.json" in present:
        config = read_json(root / "tokenizer_config.json", "tokenizer_config.json")
        tokens.update({k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)})
        yield from _from_json(root, "tokenizer_config.json", config.get("chat_template"))
    if "chat_template.json" in present:
        yield from _from_json(
            root,
            "chat_template.json",
            read_json(root / "chat_template.json", "chat_template.json").get("chat_template"),
        )
    for rel in sorted(present):
        if rel == "chat_template.jinja" or (
            rel.startswith("additional_chat_templates/") and rel.endswith(".jinja")
        ):
            yield rel, "" if rel == "chat_template.jinja" else Path(rel).stem, _read_text(root, rel)


def _from_json(root: Path, rel: str, value: Any) -> Iterator[tuple[str, str, str]]:
    """A ``chat_template`` value: absent, one template, or a list of ``{"name", "template"}``."""
    if value is None:
        return
    if isinstance(value, str):
        yield rel, "", value
        return
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        for t in value
    ):
        for t in value:
            yield rel, t["name"], t["template"]
        return
    raise CheckpointConfigError(
        root / rel,
        f'\'chat_template\' in {rel} is neither a string nor a list of {{"name", "template"}} objects',
        _FIX,
    )


def _read_text(root: Path, rel: str) -> str:
    path = root / rel
    try:
        return bounded_json.read_bytes(path, bounded_json.SIDE_CONFIG_BYTES).decode("utf-8")
    except bounded_json.JsonRefused as exc:
        raise CheckpointConfigError(path, f"{rel} {exc.problem}", _FIX) from None
    except UnicodeDecodeError as exc:
        raise CheckpointConfigError(path, f"{rel} is not UTF-8 text (byte {exc.start})", _FIX) from None


def _check_one(path: Path, what: str, text: str, tokens: dict[str, Any]) -> None:
    import jinja2
    from jinja2 import nodes
    from transformers.utils.chat_template_utils import _compile_jinja_template

    # transformers' environment (its {% generation %} tag, loop controls), to parse without compiling
    environment = _compile_jinja_template("").environment
    try:
        tree = environment.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise CheckpointConfigError(
            path, f"{what} is not valid Jinja (line {exc.lineno}: {exc.message})", _FIX
        ) from None
    for node in tree.find_all((nodes.Getattr, nodes.Filter)):
        name = node.attr if isinstance(node, nodes.Getattr) else _attr_filter_argument(node)
        if name is not None and _unsafe(name):
            raise CheckpointConfigError(
                path,
                f"{what} reads the attribute '{name}' (line {node.lineno}), which the Jinja sandbox "
                "refuses: a template reaching into Python internals",
                _FIX,
            )
    _render(path, what, text, tokens)


def _attr_filter_argument(node: Any) -> str | None:
    """The attribute name of ``x|attr('name')``, when it is a constant."""
    from jinja2 import nodes

    if node.name == "attr" and node.args and isinstance(node.args[0], nodes.Const):
        value = node.args[0].value
        return value if isinstance(value, str) else None
    return None


def _unsafe(name: str) -> bool:
    from jinja2 import sandbox

    internal = (
        sandbox.UNSAFE_FUNCTION_ATTRIBUTES
        | sandbox.UNSAFE_METHOD_ATTRIBUTES
        | sandbox.UNSAFE_GENERATOR_ATTRIBUTES
        | sandbox.UNSAFE_COROUTINE_ATTRIBUTES
        | sandbox.UNSAFE_ASYNC_GENERATOR_ATTRIBUTES
        | {"mro"}
    )
    return name.startswith("_") or name in internal


def _render(path: Path, what: str, text: str, tokens: dict[str, Any]) -> None:
    """Render ``text`` as transformers does (its sandboxed environment), within ``RENDER_SECONDS``."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        with _deadline(RENDER_SECONDS):
            render_jinja_template(
                conversations=[_SAMPLE], chat_template=text, add_generation_prompt=True, **tokens
            )
    except jinja2.exceptions.SecurityError as exc:
        raise CheckpointConfigError(path, f"{what} is refused by the Jinja sandbox ({exc})", _FIX) from None
    except jinja2.TemplateSyntaxError as exc:
        raise CheckpointConfigError(
            path, f"{what} is not valid Jinja (line {exc.lineno}: {exc.message})", _FIX
        ) from None
    except _TooSlow:
        raise CheckpointConfigError(
            path,
            f"{what} did not finish rendering a three-message conversation in {RENDER_SECONDS:g} s",
            _FIX,
        ) from None
    except Exception:  # noqa: BLE001, S110  a template may decline the sample (raise_exception): not unsafe
        pass


class _TooSlow(BaseException):
    """Raised into the rendering frame at the deadline (BaseException: no template code catches it)."""


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Stop Python code run in this thread after ``seconds``: a compiled template is Python code, so a
    trace function sees its every line (no signal: intake may run outside the main thread)."""
    end = time.monotonic() + seconds
    fired = False

    def trace(frame, event, arg):
        nonlocal fired
        if fired:
            return None
        if time.monotonic() > end:
            fired = True
            raise _TooSlow
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)
