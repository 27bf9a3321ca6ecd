"""The gate's signed approval, checked at pull, against a real SQLite MLflow registry.

Each attack is what someone who can write the registry (not the signing key) did in the issue-25
attack round, and got exit 0 and an installed artifact: an alias moved to a version the gate
failed, another model's signed artifact registered under this name, a build of another target
registered as this one, and a cache hit whose manifest was another version's.

Since issue 44 each of these is refused first by the tenant's signed release record (the alias
no longer points where the newest record says, or no record releases the version at all). The
approval is the check behind it: each test then has the pipeline's key release the attacked
version anyway (``_released_anyway``, as a mistaken ``release.issue`` would) and asserts the
approval's own refusal, so both layers stay tested.
"""

from __future__ import annotations

import json
import os

import pytest
from mlflow import MlflowClient

from quantgate.contracts.artifact import read_manifest
from quantgate.publish import naming, publish_report, pull, release, withdraw_failed
from quantgate.runtime.errors import (
    SignatureError,
    StaleReleaseError,
    TamperedArtifactError,
    UnapprovedVersionError,
)
from support.artifacts import MODEL, installed_entries, write_artifact, write_report

pytestmark = pytest.mark.unit


def _client(cfg) -> MlflowClient:
    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri)


def _one_line_exit_2(err) -> None:
    assert err.value.exit_code == 2 and "\n" not in str(err.value) and "Fix:" in str(err.value)


def _register_copy(cfg, name: str, of_name: str, of_version: str) -> str:
    """The attack: a new version of ``name`` pointing at version ``of_version`` of ``of_name``'s
    bytes, with all its tags (signed manifest and approval included); ``approved-chat`` moved to it."""
    client = _client(cfg)
    theirs = client.get_model_version(of_name, of_version)
    mine = client.create_model_version(name, source=theirs.source, run_id=theirs.run_id, tags=theirs.tags)
    client.set_registered_model_alias(name, naming.alias_for("chat"), mine.version)
    return str(mine.version)


def _released_anyway(cfg, name: str, tenant: str, version: str) -> None:
    """A release record for ``version``, signed with the pipeline's key: the release layer
    bypassed, so that what is asserted next is the signed approval's own refusal."""
    client = _client(cfg)
    manifest = client.get_model_version(name, version).tags[naming.MANIFEST_SHA256]
    release.issue(
        client,
        cfg,
        name,
        tenant,
        event="rollback",
        version=str(version),
        manifest_sha256=manifest,
        evidence_sha256="00" * 32,
    )


def _refused_by_the_release_record(pull_call, pull_cache) -> None:
    with pytest.raises((StaleReleaseError, UnapprovedVersionError), match="release record") as err:
        pull_call()
    _one_line_exit_2(err)
    assert installed_entries(pull_cache) == []


@pytest.mark.heavy
def test_an_alias_moved_to_a_version_the_gate_failed_is_refused(artifacts, report, registry, pull_cache):
    """draft-int4 failed every tenant: registered for audit, signed, no alias. Someone points
    approved-chat at it; before the fix the pull installed it (exit 0)."""
    draft = next(
        a for a in publish_report(report, artifacts, registry).artifacts if a.artifact == "draft-int4"
    )
    _client(registry).set_registered_model_alias(draft.registered_model, "approved-chat", draft.version)
    _refused_by_the_release_record(
        lambda: pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache), pull_cache
    )
    _released_anyway(registry, draft.registered_model, "chat", draft.version)
    with pytest.raises(UnapprovedVersionError, match="the gate did not approve version 1") as err:
        pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache)
    _one_line_exit_2(err)
    assert f"{draft.registered_model} version {draft.version}" in str(err.value)
    assert installed_entries(pull_cache) == []
    # a non-serving test may still load it, knowingly
    assert read_manifest(
        pull(MODEL, "draft-int4", "chat", registry, cache_dir=pull_cache, allow_unapproved=True)
    ).target == ("draft-int4")


@pytest.mark.heavy
def test_a_version_holding_another_models_signed_artifact_is_refused(
    artifacts, registry, pull_cache, tmp_path
):
    other = write_report(tmp_path / "gate-other", {"hopper-fp8": ["chat"]}, model="other-model")
    theirs = publish_report(other, artifacts, registry).artifacts[0]
    ours = publish_report(write_report(tmp_path / "gate", {"draft-int4": ["chat"]}), artifacts, registry)
    assert ours.artifacts[0].aliases == ["approved-chat"]
    name = naming.registered_model_name(MODEL, "hopper-fp8")
    _client(registry).create_registered_model(name)
    mine = _register_copy(registry, name, theirs.registered_model, theirs.version)
    _refused_by_the_release_record(
        lambda: pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache), pull_cache
    )
    _released_anyway(registry, name, "chat", mine)
    with pytest.raises(TamperedArtifactError, match="registered model 'other-model.hopper-fp8'") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    _one_line_exit_2(err)
    assert installed_entries(pull_cache) == []


def _twins(tmp_path):
    """hopper-fp8 and rocm-cdna3-fp8 as a build makes them: the same files, two manifests."""
    files = {"model.safetensors": os.urandom(50_000), "config.json": b'{"a": 1}'}
    for target in ("hopper-fp8", "rocm-cdna3-fp8"):
        write_artifact(tmp_path / "arts" / target, target, files)
    return tmp_path / "arts"


def test_a_version_whose_manifest_is_another_targets_is_refused(registry, pull_cache, tmp_path):
    arts = _twins(tmp_path)
    by = {
        a.artifact: a
        for a in publish_report(
            write_report(tmp_path / "gate", {"hopper-fp8": ["chat"], "rocm-cdna3-fp8": ["chat"]}),
            arts,
            registry,
        ).artifacts
    }
    rocm, hopper = by["rocm-cdna3-fp8"], by["hopper-fp8"]
    mine = _register_copy(registry, rocm.registered_model, hopper.registered_model, hopper.version)
    _refused_by_the_release_record(
        lambda: pull(MODEL, "rocm-cdna3-fp8", "chat", registry, cache_dir=pull_cache), pull_cache
    )
    _released_anyway(registry, rocm.registered_model, "chat", mine)
    with pytest.raises(TamperedArtifactError, match="registered model 'tiny-model.hopper-fp8'") as err:
        pull(MODEL, "rocm-cdna3-fp8", "chat", registry, cache_dir=pull_cache)
    _one_line_exit_2(err)
    assert installed_entries(pull_cache) == []


@pytest.mark.heavy
def test_a_manifest_tag_pointed_at_another_targets_manifest_is_refused(registry, pull_cache, tmp_path):
    """Only the tags moved (the signed approval left as it was): the approval names the manifest."""
    arts = _twins(tmp_path)
    by = {
        a.artifact: a
        for a in publish_report(
            write_report(tmp_path / "gate", {"hopper-fp8": ["chat"], "rocm-cdna3-fp8": ["chat"]}),
            arts,
            registry,
        ).artifacts
    }
    rocm, hopper = by["rocm-cdna3-fp8"], by["hopper-fp8"]
    client = _client(registry)
    theirs = client.get_model_version(hopper.registered_model, hopper.version)
    tags = {**client.get_model_version(rocm.registered_model, rocm.version).tags}
    tags[naming.MANIFEST_SHA256] = theirs.tags[naming.MANIFEST_SHA256]
    mine = client.create_model_version(
        rocm.registered_model, source=theirs.source, run_id=theirs.run_id, tags=tags
    )
    client.set_registered_model_alias(rocm.registered_model, "approved-chat", mine.version)
    _refused_by_the_release_record(
        lambda: pull(MODEL, "rocm-cdna3-fp8", "chat", registry, cache_dir=pull_cache), pull_cache
    )
    _released_anyway(registry, rocm.registered_model, "chat", mine.version)
    with pytest.raises(TamperedArtifactError) as err:
        pull(MODEL, "rocm-cdna3-fp8", "chat", registry, cache_dir=pull_cache)
    _one_line_exit_2(err)
    assert installed_entries(pull_cache) == []


@pytest.mark.heavy
def test_a_cache_hit_is_the_versions_own_manifest(registry, pull_cache, tmp_path):
    """Pulling rocm-cdna3-fp8 after hopper-fp8 (the same files): before the fix the hopper-fp8
    entry, whose manifest says hopper-fp8, was served for rocm-cdna3-fp8."""
    arts = _twins(tmp_path)
    publish_report(
        write_report(tmp_path / "gate", {"hopper-fp8": ["chat"], "rocm-cdna3-fp8": ["chat"]}), arts, registry
    )
    hopper = pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    rocm = pull(MODEL, "rocm-cdna3-fp8", "chat", registry, cache_dir=pull_cache)
    assert read_manifest(hopper).target == "hopper-fp8"
    assert read_manifest(rocm).target == "rocm-cdna3-fp8" and rocm != hopper
    assert pull(MODEL, "rocm-cdna3-fp8", "chat", registry, cache_dir=pull_cache, offline=True) == rocm


@pytest.mark.heavy
def test_an_edited_approval_does_not_verify(published, registry, pull_cache):
    client = _client(registry)
    tags = client.get_model_version(published.registered_model, published.version).tags
    statement = json.loads(tags[naming.APPROVAL])
    statement["verdicts"]["code"] = "pass"
    client.set_model_version_tag(
        published.registered_model, published.version, naming.APPROVAL, json.dumps(statement)
    )
    client.set_registered_model_alias(published.registered_model, "approved-code", published.version)
    _refused_by_the_release_record(
        lambda: pull(MODEL, "hopper-fp8", "code", registry, cache_dir=pull_cache), pull_cache
    )
    _released_anyway(registry, published.registered_model, "code", published.version)
    with pytest.raises(SignatureError, match="does not verify") as err:
        pull(MODEL, "hopper-fp8", "code", registry, cache_dir=pull_cache)
    _one_line_exit_2(err)
    assert installed_entries(pull_cache) == []


@pytest.mark.heavy
def test_a_version_without_a_signed_approval_is_refused_until_published_again(
    published, artifacts, report, registry, pull_cache
):
    client = _client(registry)
    client.delete_model_version_tag(published.registered_model, published.version, naming.APPROVAL)
    with pytest.raises(SignatureError, match="no signed approval") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    _one_line_exit_2(err)
    publish_report(report, artifacts, registry)  # the same content: no new version, approval signed again
    assert (
        read_manifest(pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)).target
        == "hopper-fp8"
    )


@pytest.mark.heavy
def test_a_report_gating_other_tenants_keeps_the_earlier_approvals(published, artifacts, registry, tmp_path):
    """Re-gating the same content for 'code' only (it passes) leaves 'chat' approved; a later report
    failing 'chat' withdraws it from the signed approval as well as from the alias."""
    from quantgate.publish import approval

    code_only = write_report(tmp_path / "gate-code", {"hopper-fp8": ["code"]}, tenants=("code",))
    publish_report(code_only, artifacts, registry)
    tags = _client(registry).get_model_version(published.registered_model, published.version).tags
    assert approval.Approval.model_validate_json(tags[naming.APPROVAL]).tenants == ["chat", "code"]

    failing = write_report(tmp_path / "gate-fail", {"hopper-fp8": []}, tenants=("chat",), exit_code=1)
    assert withdraw_failed(failing, artifacts, registry) == {published.registered_model: ["approved-chat"]}
    tags = _client(registry).get_model_version(published.registered_model, published.version).tags
    assert approval.Approval.model_validate_json(tags[naming.APPROVAL]).tenants == ["code"]
    # moving the alias back is not enough: the newest release record withdrew it, and behind that
    # the signed approval says chat failed
    _client(registry).set_registered_model_alias(
        published.registered_model, "approved-chat", published.version
    )
    with pytest.raises(UnapprovedVersionError, match="approval was withdrawn"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=tmp_path / "cache")
    _released_anyway(registry, published.registered_model, "chat", published.version)
    with pytest.raises(UnapprovedVersionError, match="it failed"):
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=tmp_path / "cache")


@pytest.mark.heavy
def test_an_offline_pull_checks_the_remembered_approval(published, registry, pull_cache):
    pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache)
    index = pull_cache / "pull" / "index.json"
    records = json.loads(index.read_text())
    for record in records.values():
        statement = json.loads(record[naming.APPROVAL])
        statement["target"] = "draft-int4"
        record[naming.APPROVAL] = json.dumps(statement)
    index.write_text(json.dumps(records))
    with pytest.raises(SignatureError, match="does not verify") as err:
        pull(MODEL, "hopper-fp8", "chat", registry, cache_dir=pull_cache, offline=True)
    _one_line_exit_2(err)
