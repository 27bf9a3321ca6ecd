"""One config file's YAML, read and parsed within fixed bounds.

Every config file (gates, targets, recipes, suites, calibration specs, registry settings, and the
files they ``include:``) is read here, so a hostile or broken one is refused in one line naming
``file:line`` instead of exhausting memory, hanging or ending in a traceback (issue 25):

- a regular file only (``/dev/zero``, a FIFO or a directory is refused before a byte is read),
  of at most ``MAX_BYTES``, in UTF-8;
- nesting at most ``MAX_DEPTH`` deep, checked while composing, before PyYAML's recursive
  composer and constructor could overflow the stack;
- aliases: the document with every alias expanded holds at most ``MAX_VALUES`` values (a 2 kB
  "billion laughs" expands to 10^9, which a later ``json.dumps`` of a plan writes out in full);
  an alias inside its own anchor is refused;
- integers of at most ``MAX_INT_DIGITS`` characters (Python refuses 4,300 digits with a traceback;
  no setting needs more than a few dozen), and floats that are finite (``.inf``, ``.nan`` and
  ``1e999`` are refused here, where the line is known; the models refuse them too).

Safe loader only: no tag constructs an object.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from quantgate.runtime.errors import ConfigFileError
from quantgate.runtime.units import format_bytes

MAX_BYTES = 1_000_000  # SI: the largest config in the project (gates.yaml) is under 10 kB
MAX_DEPTH = 32
MAX_VALUES = 200_000  # after alias expansion; gates.yaml holds about a thousand
MAX_INT_DIGITS = 32

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def read_bytes(path: Path) -> bytes:
    """The bytes of a regular file of at most ``MAX_BYTES``; ConfigFileError otherwise.

    Opened without blocking and checked on the open descriptor, so a FIFO cannot hang the read
    and a file swapped after a check cannot slip through."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigFileError(path, "file not found", "check the path, or create the file") from None
    except OSError as exc:
        raise ConfigFileError(
            path, f"cannot be read ({exc.strerror or exc})", "make it a readable YAML file"
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise ConfigFileError(path, f"is {kind}, not a regular file", "point at a YAML file")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigFileError(
            path, f"cannot be read ({exc.strerror or exc})", "make it a readable YAML file"
        ) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise ConfigFileError(
            path,
            f"is larger than the {format_bytes(MAX_BYTES)} a config file may be",
            "split it with include:, or point at the right file",
        )
    return b"".join(chunks)


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than ``MAX_DEPTH`` while it composes."""

    def __init__(self, stream: str, where: Path) -> None:
        super().__init__(stream)
        self.where = where
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _refused(
                    self.where,
                    self.peek_event().start_mark,
                    f"nested more than {MAX_DEPTH} levels deep",
                    "flatten the structure",
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _refused(path: Path, mark: yaml.Mark | None, problem: str, fix: str) -> ConfigFileError:
    return ConfigFileError(f"{path}:{mark.line + 1}" if mark is not None else path, problem, fix)


def parse(path: Path) -> tuple[Any, yaml.Node | None, int]:
    """``path``'s one YAML document: its data, its node tree (for line numbers) and how many
    values it holds with every alias expanded."""
    raw = read_bytes(path)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(
            path, f"is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x})", "save it as UTF-8"
        ) from None
    loader = _Loader(text, path)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None, 0
        values = _measure(path, loader, node)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise _refused(
            path, mark, f"not valid YAML ({getattr(exc, 'problem', None) or exc})", "fix the syntax"
        ) from None
    except (ValueError, TypeError, AttributeError, IndexError, OverflowError) as exc:
        # a tagged scalar its constructor cannot read (``!!timestamp abc``, ``!!float ''``)
        raise ConfigFileError(
            path,
            f"not valid YAML (a tagged value cannot be read as its tag says: {exc})",
            "fix the tagged value",
        ) from None
    finally:
        loader.dispose()
    return data, node, values


def _measure(path: Path, loader: _Loader, root: yaml.Node) -> int:
    """Values in ``root`` with every alias expanded, refusing too many, expanded nesting past
    ``MAX_DEPTH``, an alias inside its own anchor, and unreadable numbers.

    Each node is measured once (an alias is the node it names), so this is linear in the file,
    and the recursion is as deep as the text's nesting (an anchor is measured where it is written,
    before any alias to it), which the loader has already bounded."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) with aliases expanded
    open_nodes: set[int] = set()

    def visit(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in measured:
            return measured[key]
        if key in open_nodes:
            raise _refused(
                path, node.start_mark, "an alias refers to the value that contains it", "remove the alias"
            )
        if isinstance(node, yaml.ScalarNode):
            _check_scalar(path, loader, node)
            measured[key] = (1, 1)
            return measured[key]
        open_nodes.add(key)
        children: list[yaml.Node] = (
            [part for pair in node.value for part in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        values, depth = 1, 1
        for child in children:
            n, d = visit(child)
            values, depth = values + n, max(depth, d + 1)
        open_nodes.discard(key)
        if values > MAX_VALUES:
            raise _refused(
                path,
                node.start_mark,
                f"its aliases expand to more than {MAX_VALUES:,} values",
                "write the values out, or nest fewer aliases",
            )
        if depth > MAX_DEPTH:
            raise _refused(
                path,
                node.start_mark,
                f"its aliases nest more than {MAX_DEPTH} levels deep",
                "flatten the structure",
            )
        measured[key] = (values, depth)
        return measured[key]

    return visit(root)[0]


def _check_scalar(path: Path, loader: _Loader, node: yaml.ScalarNode) -> None:
    if node.tag == _INT and len(node.value) > MAX_INT_DIGITS:
        raise _refused(
            path,
            node.start_mark,
            f"an integer of {len(node.value):,} characters (at most {MAX_INT_DIGITS})",
            "write a smaller number",
        )
    if node.tag == _FLOAT:
        try:
            value = loader.construct_yaml_float(node)
        except (ValueError, IndexError):
            raise _refused(
                path, node.start_mark, f"{node.value[:40]!r} is not a number", "write a number"
            ) from None
        if not math.isfinite(value):
            raise _refused(
                path,
                node.start_mark,
                f"{node.value[:40]!r} is not a finite number",
                "write a finite value (no .inf, .nan or overflowing exponent)",
            )
