"""Which evidence source a look reads, from the watcher's named options (``rollout.sources``), and
where the built-in source finds its request logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantgate.rollout import FileEvidence, SourceOptions, TelemetryEvidence, evidence_source
from quantgate.rollout.telemetry_source import split_log_uri
from quantgate.runtime.errors import InputError, SettingError, UsageError

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_telemetry_env(monkeypatch):
    for name in ("QUANTGATE_PROMETHEUS_URL", "QUANTGATE_TELEMETRY_FILE", "QUANTGATE_TELEMETRY_ENGINE"):
        monkeypatch.delenv(name, raising=False)


def _source(**options):
    return evidence_source(Path("."), None, SourceOptions(**options))


def test_prometheus_url_gives_the_built_in_source_with_logs_and_replay():
    found = _source(prometheus="http://prom:9090/", logs=("s3://b/logs/a.jsonl",), replay=Path("r.json"))
    assert isinstance(found, TelemetryEvidence)
    assert found.settings.base_url == "http://prom:9090"
    assert found.settings.engine_metrics().ttft == "vllm:time_to_first_token_seconds"
    assert (found.logs, found.replay) == (("s3://b/logs/a.jsonl",), Path("r.json"))


def test_telemetry_file_and_engine_override(tmp_path):
    file = tmp_path / "telemetry.yaml"
    file.write_text("prometheus_url: http://prom:9090\nmetrics: {version_label: pod_version}\n")
    found = _source(telemetry=file, engine="vllm-v0")
    assert found.settings.engine_metrics().itl == "vllm:time_per_output_token_seconds"
    assert found.settings.engine_metrics().version_label == "pod_version"


def test_environment_names_prometheus_when_no_option_does(monkeypatch):
    monkeypatch.setenv("QUANTGATE_PROMETHEUS_URL", "http://from-env:9090")
    assert _source().settings.base_url == "http://from-env:9090"
    assert isinstance(_source(live=Path("live.json")), FileEvidence)  # a named file wins


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "no evidence source"),
        ({"live": Path("l.json"), "prometheus": "http://p:9090"}, "name one live evidence source"),
        ({"source": "m:f", "live": Path("l.json")}, "name one live evidence source"),
        ({"source": "m:f", "replay": Path("r.json")}, "given with --source"),
        ({"source": "no_colon"}, "is not 'module:factory'"),
        ({"prometheus": "not a url"}, "--prometheus"),
        ({"prometheus": "http://p:9090", "telemetry": Path("t.yaml")}, "given with --telemetry"),
    ],
)
def test_options_that_make_no_sense_are_refused(options, message):
    with pytest.raises(UsageError, match=message) as info:
        _source(**options)
    assert info.value.exit_code == 2


def test_unknown_engine_is_refused_at_once():
    with pytest.raises(SettingError, match="unknown engine 'vlm'"):
        _source(prometheus="http://p:9090", engine="vlm")


def test_log_uris_split_into_store_and_name(tmp_path):
    assert split_log_uri("s3://bucket/fleet/logs/day1.jsonl") == ("s3://bucket/fleet/logs", "day1.jsonl")
    assert split_log_uri(str(tmp_path / "requests.jsonl")) == (str(tmp_path), "requests.jsonl")
    assert split_log_uri(f"file://{tmp_path}/requests.jsonl") == (str(tmp_path), "requests.jsonl")
    with pytest.raises(InputError, match="names no request log"):
        split_log_uri("s3://bucket")
    with pytest.raises(InputError, match="'gs://' logs are not read"):
        split_log_uri("gs://bucket/x.jsonl")


def test_the_flow_and_the_command_take_every_source_option():
    """``canary_watch``'s parameters and ``rollout watch``'s options name every SourceOptions field,
    so a deployment can ask for whatever the command line can (the replay endpoints included)."""
    import dataclasses
    import inspect

    from quantgate.cli.rollout import watch
    from quantgate.orchestrate import canary_watch

    fields = {f.name for f in dataclasses.fields(SourceOptions)}
    assert fields <= set(inspect.signature(canary_watch.fn).parameters)
    assert fields <= set(inspect.signature(watch).parameters)
