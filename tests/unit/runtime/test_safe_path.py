"""safe_relpath: the one check every name read from data goes through before it is joined to a root."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from quantgate.runtime.errors import UnsafePathError
from quantgate.runtime.safe_path import safe_relpath

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "name", ["model.safetensors", "sub/tokenizer.json", "a/b/c.bin", "..x", "x..", ".hidden"]
)
def test_normalized_relative_names_pass_unchanged(name):
    assert safe_relpath(name, "manifest.json") == PurePosixPath(name)
    assert str(safe_relpath(name, "manifest.json")) == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../outside", "'..'"),
        ("a/../../b", "'..'"),
        ("..", "'..'"),
        ("a\\..\\b", "backslash"),
        ("a\0b", "control"),
        ("a\nb", "control"),
        ("a\x7fb", "control"),
        ("a//b", "not normalized"),
        ("./a", "not normalized"),
        ("a/./b", "not normalized"),
        ("a/", "not normalized"),
        (".", "not normalized"),
    ],
)
def test_hostile_or_ambiguous_names_are_refused_naming_the_source(name, problem):
    with pytest.raises(UnsafePathError, match=problem) as err:
        safe_relpath(name, "s3://bucket/ckpt/")
    assert err.value.exit_code == 2
    assert str(err.value).startswith("s3://bucket/ckpt/: file name ")
    assert "\n" not in str(err.value).replace(repr(name), "")
