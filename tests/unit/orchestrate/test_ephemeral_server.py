"""``quantgate run`` without a Prefect server waits long enough for the ephemeral one to start.

Under a fresh HOME the ephemeral API server first creates and migrates its database; on this
2-core machine that once took longer than Prefect's default 20 s, and the README's first command
failed before any work ("Timed out while attempting to connect to ephemeral Prefect API server").
"""

from __future__ import annotations

import pytest
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

from quantgate.orchestrate.run import EPHEMERAL_STARTUP_S, patient_ephemeral_server

pytestmark = pytest.mark.unit


def test_the_run_gives_the_ephemeral_server_two_minutes_to_start(monkeypatch):
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    before = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
    with patient_ephemeral_server():
        assert PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() == EPHEMERAL_STARTUP_S == 120
    assert PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() == before  # only for the run


def test_a_startup_timeout_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "7")
    before = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
    with patient_ephemeral_server():
        assert PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() == before
