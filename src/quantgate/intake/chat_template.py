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
- rendered by transformers' own sandboxed environment on the one-turn conversation evaluation
  renders and on a short exchange: a template the sandbox stops is refused, and so is one that
  fails on those ordinary messages in any other way (division by zero, endless recursion, an
  undefined value): evaluation would crash on it. A template that declines a conversation on
  purpose (``raise_exception``, say on a role it does not support) is not refused.

Parsing, compiling and rendering all happen in a forked child under CPU-time and address-space
limits, killed at a wall-clock deadline (``bounded_child``): a template that computes a huge
number or string, in one C call or while Jinja folds constants at compile time, is refused
naming the limit it hit, at a bounded cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantgate.intake import bounded_child, bounded_json
from quantgate.intake.architecture import read_json
from quantgate.intake.tree import excerpt
from quantgate.runtime.errors import CheckpointConfigError

# Real templates render a short conversation in milliseconds and a few MB. The wall-clock limit
# leaves room for a machine whose cores are busy; CPU time is what the template is allowed.
LIMITS = bounded_child.Limits(cpu_seconds=5, memory_bytes=512 * 1024**2, wall_seconds=30.0)
# what evaluation renders (one user turn, generation prompt), and a short exchange
_CONVERSATIONS = (
    [{"role": "user", "content": "What is 12 plus 30?"}],
    [
        {"role": "user", "content": "What is 12 plus 30?"},
        {"role": "assistant", "content": "42."},
        {"role": "user", "content": "Thank you."},
    ],
)
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
    """Parse, scan and render ``text`` in a bounded child (``bounded_child``); refuse what it reports.

    The parent never parses or compiles the template itself: Jinja folds constant expressions while
    compiling (``{{ 10 ** 100000000 }}`` is computed there, in one C call), and its parser recurses
    on nesting, so both happen under the child's limits.
    """
    outcome = bounded_child.run(lambda: _verdict(text, tokens), LIMITS)
    if outcome.failure in ("cpu", "wall"):
        raise CheckpointConfigError(
            path,
            f"{what} did not finish rendering a short conversation within {LIMITS.cpu_seconds} s of CPU time "
            f"(stopped: {outcome.detail})",
            _FIX,
        )
    if outcome.failure == "memory":
        raise CheckpointConfigError(
            path,
            f"{what} needed more than {LIMITS.memory_bytes // 1024**2:,} MiB to render a short conversation",
            _FIX,
        )
    if outcome.failure is not None:  # an exception on ordinary messages: evaluation would crash on it
        raise CheckpointConfigError(
            path,
            f"{what} cannot render an ordinary conversation ({excerpt(outcome.detail, 200, quote=False)}): "
            "evaluation would fail on it",
            _FIX,
        )
    kind, *details = outcome.value
    if kind == "syntax":
        line, message = details
        raise CheckpointConfigError(
            path, f"{what} is not valid Jinja (line {line}: {excerpt(message, 200, quote=False)})", _FIX
        )
    if kind == "unsafe":
        name, line = details
        raise CheckpointConfigError(
            path,
            f"{what} reads the attribute {excerpt(name)} (line {line}), which the Jinja sandbox "
            "refuses: a template reaching into Python internals",
            _FIX,
        )
    if kind == "sandbox":
        raise CheckpointConfigError(
            path, f"{what} is refused by the Jinja sandbox ({excerpt(details[0], 200, quote=False)})", _FIX
        )


def _verdict(text: str, tokens: dict[str, Any]) -> tuple[Any, ...]:
    """In the child: ``("ok",)``, or what is wrong, as ``(kind, details...)``; an exception the
    template raises on ordinary messages propagates (the parent refuses it, naming it)."""
    import jinja2
    from jinja2 import nodes
    from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

    # transformers' environment (its {% generation %} tag, loop controls), to parse before compiling
    environment = _compile_jinja_template("").environment
    try:
        tree = environment.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return ("syntax", exc.lineno, exc.message or "")
    for node in tree.find_all((nodes.Getattr, nodes.Filter)):
        name = node.attr if isinstance(node, nodes.Getattr) else _attr_filter_argument(node)
        if name is not None and _unsafe(name):
            return ("unsafe", name, node.lineno)
    for conversation in _CONVERSATIONS:
        try:
            render_jinja_template(
                conversations=[conversation], chat_template=text, add_generation_prompt=True, **tokens
            )
        except jinja2.exceptions.SecurityError as exc:
            return ("sandbox", str(exc))
        except jinja2.TemplateSyntaxError as exc:
            return ("syntax", exc.lineno, exc.message or "")
        except jinja2.exceptions.TemplateError as exc:
            if type(exc) is not jinja2.exceptions.TemplateError:
                raise  # UndefinedError and kin: the template is broken, not declining
            # raise_exception(...): the template declines this conversation on purpose
    return ("ok",)


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
