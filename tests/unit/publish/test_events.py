"""The alias-moved event: what it carries, and that emitting it never costs or fails a publish."""

from __future__ import annotations

import time

import pytest

from quantgate.publish import RegistryConfig, events

pytestmark = pytest.mark.unit


def test_payload_names_the_alias_both_versions_and_the_content():
    cfg = RegistryConfig(tracking_uri="http://mlflow:5000")
    assert events.payload(cfg, "m.hopper-fp8", "approved-chat", "3", "2", "ab" * 32) == {
        "tracking_uri": "http://mlflow:5000",
        "registered_model": "m.hopper-fp8",
        "alias": "approved-chat",
        "version": "3",
        "previous_version": "2",
        "content_hash": "ab" * 32,
    }


def test_outside_prefect_nothing_is_emitted_and_no_server_is_started(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    start = time.monotonic()
    assert (
        events.alias_moved(RegistryConfig(tracking_uri="sqlite:///x.db"), "m.t", "approved-a", "1", None, "")
        is False
    )
    assert time.monotonic() - start < 1.0


def test_an_unreachable_prefect_server_does_not_fail_or_stall_the_publish(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing listens on port 9
    start = time.monotonic()
    events.alias_moved(RegistryConfig(tracking_uri="sqlite:///x.db"), "m.t", "approved-a", "1", None, "")
    assert time.monotonic() - start < 10
