"""Telemetry settings (presets, overrides, refusals) and request logs read through the store."""

from __future__ import annotations

import json

import pytest

from quantgate.publish import LocalStore
from quantgate.rollout.evidence import (
    ENGINES,
    EvidenceFormatError,
    errors_by_version,
    load_telemetry,
    read_logs,
    sample_prompts,
)
from quantgate.runtime.errors import SettingError

pytestmark = pytest.mark.unit


def test_vllm_preset_and_an_override(tmp_path):
    path = tmp_path / "telemetry.yaml"
    path.write_text("prometheus_url: http://prom:9090\nmetrics: {version_label: pod_version}\n")
    metrics = load_telemetry(path).engine_metrics()
    assert metrics.ttft == ENGINES["vllm"].ttft == "vllm:time_to_first_token_seconds"
    assert metrics.version_label == "pod_version"
    assert ENGINES["vllm-v0"].itl == "vllm:time_per_output_token_seconds"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("prometheus_url: http://p:9090\nengine: vllmm\n", "unknown engine 'vllmm'.*did you mean 'vllm'"),
        (
            "prometheus_url: http://p:9090\nmetrics: {tfft: x}\n",
            "unknown key metrics.tfft.*did you mean 'ttft'",
        ),
        ("prometheus_url: http://p:9090\nextra: 1\n", "extra"),
        ("prometheus_url: not a url\n", "prometheus_url"),
    ],
)
def test_bad_settings_name_the_file_and_the_fix(tmp_path, text, match):
    path = tmp_path / "telemetry.yaml"
    path.write_text(text)
    with pytest.raises(SettingError, match=match) as info:
        load_telemetry(path)
    assert str(path) in str(info.value) and info.value.exit_code == 2


def test_environment_without_a_url_is_refused(monkeypatch):
    monkeypatch.delenv("QUANTGATE_PROMETHEUS_URL", raising=False)
    monkeypatch.delenv("QUANTGATE_TELEMETRY_FILE", raising=False)
    with pytest.raises(SettingError, match="QUANTGATE_PROMETHEUS_URL"):
        load_telemetry()


def _log(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_request_logs_count_errors_per_version_and_sample_by_mix(tmp_path):
    rows = [
        {
            "id": f"r{i}",
            "version": "3" if i % 2 else "4",
            "class": "chat" if i < 30 else "code",
            "prompt": f"prompt {i}",
            "status": ("error", "abort", "ok", "ok")[i % 4],
        }
        for i in range(40)
    ]
    _log(tmp_path / "store" / "logs" / "a.jsonl", rows[:20])
    _log(tmp_path / "store" / "logs" / "b.jsonl", rows[20:])
    records = read_logs(LocalStore(str(tmp_path / "store")), ["logs/a.jsonl", "logs/b.jsonl"])
    assert len(records) == 40
    assert errors_by_version(records) == {"4": 10, "3": 10}
    sample = sample_prompts(records, {"chat": 0.5, "code": 0.5}, 10, seed=3)
    assert sorted(r.class_ for r in sample) == ["chat"] * 5 + ["code"] * 5
    assert sample == sample_prompts(records, {"chat": 0.5, "code": 0.5}, 10, seed=3)
    assert sample != sample_prompts(records, {"chat": 0.5, "code": 0.5}, 10, seed=4)


def test_a_bad_log_line_names_the_file_and_line(tmp_path):
    _log(
        tmp_path / "store" / "x.jsonl",
        [{"id": "1", "version": "3", "class": "chat", "prompt": "p", "status": "??"}],
    )
    with pytest.raises(EvidenceFormatError, match=r"x.jsonl:1.*status '\?\?'"):
        read_logs(LocalStore(str(tmp_path / "store")), ["x.jsonl"])
    with pytest.raises(EvidenceFormatError, match="not found"):
        read_logs(LocalStore(str(tmp_path / "store")), ["missing.jsonl"])
