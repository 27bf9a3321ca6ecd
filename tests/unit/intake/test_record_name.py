"""A source record knows the name it is registered under (issue 26 item 8: the rule lived in
embedded/smollm2.py, for every checkpoint)."""

from __future__ import annotations

import pytest

from quantgate.intake import SourceRecord

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "path, name",
    [
        ("/data/llama-3-8b", "llama-3-8b"),
        ("/cache/quantgate/smollm2-135m-instruct-0123456789ab-v3", "smollm2-135m-instruct"),
    ],
)
def test_the_registered_name_is_the_directory_without_the_embedded_cache_tag(path, name):
    assert SourceRecord.model_construct(path=path).model_name == name
