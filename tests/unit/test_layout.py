"""The product never imports test support: servers with test credentials and synthetic models
live in tests/support, and a module of src/quantgate that imports them (or moto, a test-only
dependency) would break every installation without the test extra."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "quantgate"
TEST_ONLY = ("support", "tests", "conftest", "moto")


def _imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _test_only_imports(source: str) -> list[tuple[int, str]]:
    return [(line, name) for line, name in _imported_modules(source) if name.split(".")[0] in TEST_ONLY]


def test_the_scan_sees_top_level_and_nested_imports_of_test_support():
    source = "import os\nfrom support.servers import moto_s3\n\ndef f():\n    import moto.server\n"
    assert _test_only_imports(source) == [(2, "support.servers"), (5, "moto.server")]
    assert _test_only_imports("from quantgate.support_matrix import x\nfrom . import support\n") == []


@pytest.mark.heavy
def test_no_module_of_the_product_imports_test_support():
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 50, f"found only {len(modules)} modules under {SRC}"
    offenders = [
        f"{path.relative_to(SRC.parent)}:{line}: import {name}"
        for path in modules
        for line, name in _test_only_imports(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "test support imported by the product:\n" + "\n".join(offenders)


def test_test_support_is_not_shipped_in_the_product():
    for moved in ("synthetic.py", "publish/local_servers.py"):
        assert not (SRC / moved).exists(), f"{moved} is test support: it lives in tests/support"
