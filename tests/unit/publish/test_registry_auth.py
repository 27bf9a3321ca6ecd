"""Only the pipeline's identity moves approved-* aliases: MLflow's basic-auth app, a real server.

The pipeline user creates the registered model by publishing (so it holds MANAGE on it); every
other user has the server's default READ, and moving or removing an alias is refused with 403,
which quantgate reports as a refusal (exit 2) with a one-line message, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from quantgate.publish import RegistryConfig, publish_report, withdraw_failed
from quantgate.publish.signing import generate_key_pair
from quantgate.runtime.errors import RegistryRefusedError
from support.artifacts import write_artifact, write_report
from support.servers import free_port

pytestmark = [pytest.mark.unit, pytest.mark.heavy]

ADMIN = ("admin", "admin-password-1234")
PIPELINE = ("pipeline", "pipeline-password-1234")
INTRUDER = ("intruder", "intruder-password-1234")


@pytest.fixture
def auth_server(tmp_path):
    """``mlflow server --app-name basic-auth`` on loopback, default permission READ."""
    pytest.importorskip("flask_wtf", reason="mlflow's basic-auth app needs Flask-WTF (mlflow[auth])")
    ini = tmp_path / "auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{tmp_path / 'auth.db'}\n"
        f"admin_username = {ADMIN[0]}\nadmin_password = {ADMIN[1]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only"}
    args = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth"]
    args += ["--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    args += ["--default-artifact-root", str(tmp_path / "store"), "--no-serve-artifacts"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"basic-auth server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)


def _as(monkeypatch, user: tuple[str, str]) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", user[1])


def test_a_user_other_than_the_pipeline_cannot_move_an_approval(auth_server, tmp_path, monkeypatch):
    from mlflow.server import get_app_client

    _as(monkeypatch, ADMIN)
    users = get_app_client("basic-auth", tracking_uri=auth_server)
    users.create_user(*PIPELINE)
    users.create_user(*INTRUDER)
    write_artifact(tmp_path / "arts" / "hopper-fp8", "hopper-fp8", {"model.safetensors": os.urandom(1000)})
    public = generate_key_pair(tmp_path / "keys" / "pipeline.key")
    cfg = RegistryConfig(
        tracking_uri=auth_server,
        artifact_uri=str(tmp_path / "store"),
        signing_key=tmp_path / "keys" / "pipeline.key",
        trusted_keys=(public,),
    )
    _as(monkeypatch, PIPELINE)
    published = publish_report(
        write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}), tmp_path / "arts", cfg
    )
    assert published.artifacts[0].aliases == ["approved-chat"]

    _as(monkeypatch, INTRUDER)  # a gate report that fails chat would take the alias off
    with pytest.raises(RegistryRefusedError) as err:
        withdraw_failed(write_report(tmp_path / "gate2", {"hopper-fp8": []}), tmp_path / "arts", cfg)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert "Permission denied" in str(err.value) and "pipeline's identity" in str(err.value)

    from mlflow import MlflowClient

    _as(monkeypatch, PIPELINE)
    aliases = MlflowClient(auth_server).get_registered_model(published.artifacts[0].registered_model).aliases
    assert aliases == {"approved-chat": published.artifacts[0].version}
