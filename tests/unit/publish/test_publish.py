"""Publishing against a real SQLite MLflow registry and a local artifact store."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from quantgate.contracts.artifact import read_manifest
from quantgate.publish import naming, publish_report
from quantgate.publish.local_store import local_path
from quantgate.runtime.errors import ArtifactAlteredError, ReportError
from support.artifacts import MODEL, write_artifact, write_report

pytestmark = pytest.mark.unit


def _client(cfg) -> MlflowClient:
    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri)


def _aliases(client: MlflowClient, name: str) -> dict[str, str]:
    return {alias: str(v) for alias, v in client.get_registered_model(name).aliases.items()}


def test_publish_registers_version_with_lineage_and_aliases_only_approved_tenants(
    artifacts, report, registry
):
    outcome = publish_report(report, artifacts, registry)
    by_name = {a.artifact: a for a in outcome.artifacts}
    hopper, draft = by_name["hopper-fp8"], by_name["draft-int4"]
    assert (
        hopper.registered_model == f"{MODEL}.hopper-fp8"
        and hopper.created
        and hopper.aliases == ["approved-chat"]
    )
    assert draft.created and draft.aliases == []  # failed: recorded for audit, no alias
    client = _client(registry)
    assert _aliases(client, hopper.registered_model) == {"approved-chat": hopper.version}
    assert _aliases(client, draft.registered_model) == {}
    mv = client.get_model_version(hopper.registered_model, hopper.version)
    manifest = read_manifest(artifacts / "hopper-fp8")
    assert mv.tags[naming.UPLOAD] == "complete"
    assert mv.tags[naming.BUILD_KEY] == manifest.build_key
    assert mv.tags[naming.SOURCE_HASH] == manifest.source.content_hash
    assert mv.tags[naming.RECIPE_SHA256] == manifest.recipe.sha256
    assert mv.tags[naming.GATE] == "approved"
    assert client.get_model_version(draft.registered_model, draft.version).tags[naming.GATE] == "failed"
    run = client.get_run(hopper.run_id)
    assert run.data.params["recipe_sha256"] == manifest.recipe.sha256
    assert run.data.params["tools.torch"] == manifest.tools["torch"]
    assert run.data.metrics == {"wikitext.perplexity": 10.5, "wikitext.kld_mean": 0.01}
    stored = local_path(hopper.source)
    assert (stored / "model.safetensors").read_bytes() == (
        artifacts / "hopper-fp8" / "model.safetensors"
    ).read_bytes()
    assert (stored.parent / "reports" / "report.json").is_file()
    assert json.loads(json.dumps(outcome.to_dict()))["artifacts"][0]["registered_model"].startswith(MODEL)


@pytest.mark.heavy
def test_publishing_the_same_content_twice_creates_no_second_version(artifacts, report, registry):
    first = publish_report(report, artifacts, registry)
    second = publish_report(report, artifacts, registry)
    assert [a.created for a in second.artifacts] == [False, False]
    assert [a.version for a in second.artifacts] == [a.version for a in first.artifacts]
    client = _client(registry)
    assert len(client.search_model_versions(f"name = '{MODEL}.hopper-fp8'")) == 1


@pytest.mark.heavy
def test_new_content_moves_the_alias_and_a_failing_tenant_loses_it(artifacts, report, registry, tmp_path):
    first = publish_report(report, artifacts, registry).artifacts[0]
    rebuilt = write_artifact(
        tmp_path / "v2" / "hopper-fp8", "hopper-fp8", {"model.safetensors": b"other bytes"}
    )
    second = publish_report(
        write_report(tmp_path / "gate2", {"hopper-fp8": ["chat", "code"]}), rebuilt.parent, registry
    ).artifacts[0]
    assert second.created and second.version != first.version
    client = _client(registry)
    assert _aliases(client, second.registered_model) == {
        "approved-chat": second.version,
        "approved-code": second.version,
    }
    # a later gate of the same content fails 'code': its approval on this version is withdrawn
    third = publish_report(
        write_report(tmp_path / "gate3", {"hopper-fp8": ["chat"]}), rebuilt.parent, registry
    ).artifacts[0]
    assert not third.created and third.removed_aliases == ["approved-code"]
    assert _aliases(client, second.registered_model) == {"approved-chat": second.version}


def test_an_artifact_altered_after_build_is_refused_before_any_upload(artifacts, report, registry):
    (artifacts / "hopper-fp8" / "config.json").write_bytes(b'{"a": 2}')
    with pytest.raises(ArtifactAlteredError, match="config.json"):
        publish_report(report, artifacts, registry)
    assert not _client(registry).search_model_versions(f"name = '{MODEL}.hopper-fp8'")


def test_a_failed_gate_run_publishes_nothing(artifacts, tmp_path, registry):
    failed = write_report(tmp_path / "gate", {"hopper-fp8": []}, exit_code=1)
    with pytest.raises(ReportError, match="exit code 1") as err:
        publish_report(failed, artifacts, registry)
    assert err.value.exit_code == 2


def test_a_report_naming_a_missing_artifact_is_refused(artifacts, tmp_path, registry):
    report = write_report(tmp_path / "gate", {"blackwell-nvfp4": ["chat"]})
    with pytest.raises(ReportError, match="blackwell-nvfp4"):
        publish_report(report, artifacts, registry)
