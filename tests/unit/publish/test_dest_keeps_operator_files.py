"""``--dest`` replaces only what quantgate placed there: the operator's own files survive a pull
of another version. A real SQLite MLflow registry, a local store, two published versions."""

from __future__ import annotations

import os

import pytest

from quantgate.contracts.artifact import hash_files, read_manifest
from quantgate.publish import publish_report, pull
from quantgate.runtime.errors import DestinationError
from support.artifacts import MODEL, write_artifact, write_report

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _publish_new_content(tmp_path, registry, files: dict[str, bytes], name: str):
    write_artifact(tmp_path / name / "hopper-fp8", "hopper-fp8", files)
    publish_report(
        write_report(tmp_path / f"gate-{name}", {"hopper-fp8": ["chat"]}), tmp_path / name, registry
    )
    return tmp_path / name / "hopper-fp8"


@pytest.mark.parametrize("link", [False, True], ids=["copies", "links"])
def test_pulling_another_version_keeps_the_operators_files(published, registry, pull_cache, tmp_path, link):
    dest = tmp_path / "serving" / "model"
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest, link=link)
    (dest / "serving.yaml").write_text("max_model_len: 4096\n")  # the operator's own files
    (dest / "local").mkdir()
    (dest / "local" / "override.json").write_text('{"temperature": 0}')
    os.symlink("serving.yaml", dest / "current.yaml")
    second = _publish_new_content(
        tmp_path, registry, {"model.safetensors": os.urandom(20_000), "config.json": b'{"b": 2}'}, "v2"
    )
    got = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest, link=link)
    assert got == dest and read_manifest(dest) == read_manifest(second)
    assert (dest / "serving.yaml").read_text() == "max_model_len: 4096\n"  # before the fix: deleted
    assert (dest / "local" / "override.json").read_text() == '{"temperature": 0}'
    assert os.readlink(dest / "current.yaml") == "serving.yaml"
    assert not (dest / "sub" / "tokenizer.json").exists()  # the first version's own file went with it
    theirs = {"serving.yaml", "local/override.json", "current.yaml", ".quantgate-pull.json"}  # dest.RECORD
    assert set(hash_files(dest)) - theirs == set(hash_files(second))


def test_an_operator_file_named_like_a_new_versions_file_is_refused_untouched(
    published, registry, pull_cache, tmp_path
):
    dest = tmp_path / "serving" / "model"
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest)
    (dest / "generation_config.json").write_text("mine")
    _publish_new_content(
        tmp_path,
        registry,
        {"model.safetensors": os.urandom(20_000), "generation_config.json": b"{}"},
        "v2",
    )
    before = hash_files(dest)
    with pytest.raises(DestinationError, match="was not placed by quantgate") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, dest=dest)
    assert err.value.exit_code == 2 and str(err.value).startswith(str(dest / "generation_config.json"))
    assert hash_files(dest) == before
