"""What a node trusts of the fleet (issue 28): the swarm only through the torrent info-hash the
signed approval names. A real SQLite MLflow registry and a local store (conftest); the fleet
path is taken by listing a peer, which nothing answers here (no peer reachable: the origin
serves every piece, as it serves every file without peers)."""

from __future__ import annotations

import filecmp
import os

import pytest
from mlflow import MlflowClient

from quantgate.fleet import (
    TORRENT,
    FleetSettings,
    Seeder,
    load_torrent,
    make_torrent,
    open_node,
    torrent_info_hash,
)
from quantgate.publish import approval, naming, pull
from quantgate.publish.cache import PullCache
from quantgate.publish.local_store import local_path
from quantgate.runtime.errors import TamperedArtifactError
from support.artifacts import MODEL, installed_entries, write_artifact
from support.servers import free_port

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

NAME = f"{MODEL}.hopper-fp8"


def _with_peers(registry):
    fleet = FleetSettings(peers=f"127.0.0.1:{free_port()}", listen=f"127.0.0.1:{free_port()}")
    return registry.model_copy(update={"fleet": fleet})


def test_publish_signs_the_torrent_info_hash_and_stores_the_torrent(published, registry):
    tags = MlflowClient(registry.tracking_uri).get_model_version(NAME, published.version).tags
    signed = approval.from_tags(tags, "test", registry)
    data = (local_path(published.source) / TORRENT).read_bytes()
    assert signed.torrent == tags[naming.TORRENT] == torrent_info_hash(data)
    found = load_torrent(data, signed.torrent, published.manifest_sha256)
    assert set(found.files) == {
        "model.safetensors",
        "config.json",
        "sub/tokenizer.json",
        "manifest.json",
        "manifest.sig",
    }


def test_no_peer_reachable_pulls_every_piece_from_the_origin(published, registry, artifacts, pull_cache):
    path = pull(MODEL, "hopper-fp8", "chat", _with_peers(registry), cache_dir=pull_cache)
    source = artifacts / "hopper-fp8"
    assert all(
        filecmp.cmp(source / rel, path / rel, shallow=False) for rel in ("model.safetensors", "config.json")
    )
    record = PullCache(pull_cache / "pull", registry.cache_max_bytes).record(path.name) or {}
    assert int(record["peer_bytes"]) == 0
    installed = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert int(record["origin_bytes"]) == installed + len(record["signature"])  # manifest.sig too
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == sorted(
        ["manifest.json", "model.safetensors", "config.json", "sub/tokenizer.json"]
    )


def test_a_torrent_tag_the_approval_does_not_sign_is_refused(published, registry, pull_cache):
    client = MlflowClient(registry.tracking_uri)
    client.set_model_version_tag(NAME, published.version, naming.TORRENT, "ab" * 32)  # a foreign swarm
    with pytest.raises(TamperedArtifactError, match="signed approval does not name") as err:
        pull(MODEL, "hopper-fp8", "chat", _with_peers(registry), cache_dir=pull_cache)
    assert err.value.exit_code == 2 and installed_entries(pull_cache) == []


def test_an_approval_signed_without_the_torrent_is_refused_while_the_tag_names_one(
    published, registry, pull_cache
):
    client = MlflowClient(registry.tracking_uri)
    tags = client.get_model_version(NAME, published.version).tags
    unsigned = approval.from_tags(tags, "test", registry).model_copy(update={"torrent": None})
    for key, value in approval.sign(unsigned, registry).items():
        client.set_model_version_tag(NAME, published.version, key, value)
    with pytest.raises(TamperedArtifactError, match="does not name") as err:
        pull(MODEL, "hopper-fp8", "chat", _with_peers(registry), cache_dir=pull_cache)
    assert err.value.exit_code == 2 and installed_entries(pull_cache) == []


def test_a_foreign_torrent_in_the_store_is_refused(published, registry, pull_cache, tmp_path):
    other = write_artifact(
        tmp_path / "other", "hopper-fp8", {"model.safetensors": os.urandom(1000), "x.json": b"{}"}
    )
    foreign = make_torrent(
        published.manifest_sha256,
        {"model.safetensors": other / "model.safetensors", "manifest.json": other / "manifest.json"},
    )
    (local_path(published.source) / TORRENT).write_bytes(foreign)
    with pytest.raises(TamperedArtifactError, match="not the signed torrent") as err:
        pull(MODEL, "hopper-fp8", "chat", _with_peers(registry), cache_dir=pull_cache)
    assert err.value.exit_code == 2 and installed_entries(pull_cache) == []


def test_the_seeder_serves_installed_versions_and_drops_evicted_ones(published, registry, pull_cache):
    cfg = _with_peers(registry)
    path = pull(MODEL, "hopper-fp8", "chat", cfg, cache_dir=pull_cache)
    cache = PullCache(pull_cache / "pull", cfg.cache_max_bytes)
    with open_node(cfg.fleet) as own:
        seeder = Seeder(own, cache)
        assert seeder.sync() == {path.name}
        assert cache.signature_path(path.name).is_file()  # the signature its peers are served
        cache.remove(path.name)  # what eviction does
        assert seeder.sync() == set()
    assert not cache.torrent_path(path.name).exists() and not cache.signature_path(path.name).exists()
