"""The alias-moved event: what it carries, and that emitting it never costs or fails a publish."""

from __future__ import annotations

import os
import subprocess
import sys

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


def _alias_moved_in_a_fresh_process(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter, as a publish starts: Prefect reads its settings at import, so what
    one process does with a variable is only seen in a process that starts with it."""
    code = (
        "import sys\n"
        "from quantgate.publish import RegistryConfig, events\n"
        "sent = events.alias_moved(RegistryConfig(tracking_uri='sqlite:///x.db'), 'm.t', 'approved-a', '1', None, '')\n"
        "print('sent' if sent else 'skipped', 'prefect-imported' if 'prefect' in sys.modules else 'prefect-not-imported')\n"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)


def test_outside_prefect_nothing_is_emitted_and_prefect_is_not_even_imported():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    done = _alias_moved_in_a_fresh_process(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["skipped", "prefect-not-imported"]


@pytest.mark.heavy
def test_an_unreachable_prefect_server_does_not_fail_the_publish_or_start_a_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_API_URL": "http://127.0.0.1:9/api",
        "PREFECT_HOME": str(tmp_path),
    }  # nothing listens on 9
    done = _alias_moved_in_a_fresh_process(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sent", "prefect-imported"]  # handed to the events worker
    assert "temporary server" not in done.stderr


def test_prefect_imported_without_a_server_skips_rather_than_starting_one(monkeypatch):
    """In this process Prefect's settings were read at import: a variable set now is not what
    ``emit_event`` would use, so it must not be taken as a server to send to."""
    import prefect  # noqa: F401  the state of a long-lived process that already imported it
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        pytest.skip("this process's Prefect settings name a server")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert (
        events.alias_moved(RegistryConfig(tracking_uri="sqlite:///x.db"), "m.t", "approved-a", "1", None, "")
        is False
    )
