"""Faults on the way to the registry (issue 15 item 7), through the command line a CI job runs.

A real ``mlflow server`` (SQLite) and a real S3 API (moto), with ``support.fault_proxy`` between
boto3 and the store: connections reset, 500 and 503 (with Retry-After) answers, responses stalled
past the read timeout, bodies cut short on the way up or down. What must hold, per fault kind:

- transient (the first few requests fail): publish completes, one version, every file intact;
- persistent: bounded retries, then exit 75 with no version and no alias; once the fault clears,
  a re-run completes with exactly one version;
- the MLflow server killed between upload and registration (after the first S3 upload the proxy
  sees) and restarted on the same port and backend: exit 75, then a re-run completes;
- a pull whose bodies are cut short retries, and never installs a truncated file.

Retries are configured small here (the project's ``registry.yaml``: 3 attempts, a 2 s read
timeout; MLflow's client: 2 retries) so that each persistent fault costs seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from quantgate.contracts.artifact import MANIFEST, read_manifest
from quantgate.publish import RegistryConfig, naming
from quantgate.publish.config import TransferSettings
from quantgate.publish.s3_store import S3Store
from quantgate.runtime.hashing import sha256_file
from quantgate.runtime.units import MB
from support.artifacts import write_artifact, write_report
from support.cli import quantgate
from support.fault_proxy import Fault, FaultProxy
from support.servers import TEST_CREDENTIALS, free_port, mlflow_server, moto_s3

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 2
MAX_ATTEMPTS = 3
# 6 MB parts, so the 7 MB weights go up in two (S3's smallest part is 5 MiB)
TRANSFER = TransferSettings(
    concurrency=2,
    multipart_threshold_mb=6,
    multipart_chunksize_mb=6,
    max_attempts=MAX_ATTEMPTS,
    connect_timeout_s=2,
    read_timeout_s=READ_TIMEOUT_S,
)

# each kind of fault, hitting every request it matches until given a count
KINDS = {
    "reset": Fault("reset", count=None, method="PUT"),
    "500": Fault("status", count=None, status=500),
    "503-retry-after": Fault("status", count=None, status=503, retry_after_s=1),
    "slow": Fault("delay", count=None, delay_s=3 * READ_TIMEOUT_S),
    "truncated-upload": Fault("truncate_upload", count=None, method="PUT", keep=0.5),
}


def fault(kind: str, count: int | None) -> Fault:
    """A fresh fault of ``kind`` (none of its hits used) for ``count`` requests (None: all)."""
    return dataclasses.replace(KINDS[kind], count=count)


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def proxy(s3):
    with FaultProxy(s3.url) as running:
        yield running


@pytest.fixture(autouse=True)
def clean_proxy(proxy, monkeypatch):
    """Each test starts with no faults, and boto3 in this process signs with the test credentials."""
    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    proxy.clear()
    proxy.on_request = None
    yield
    proxy.clear()
    proxy.on_request = None


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A project root whose registry.yaml sets small retries, and the environment naming the
    publisher's keys (a server registry has no key of its own)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    root = tmp_path_factory.mktemp("project")
    (root / "artifacts_registry").mkdir()
    settings = {"version": 1, "transfer": TRANSFER.model_dump()}
    (root / "artifacts_registry" / "registry.yaml").write_text(yaml.safe_dump(settings))
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = root / "publisher.key", root / "publisher.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return root, {"QUANTGATE_SIGNING_KEY": str(private), "QUANTGATE_TRUSTED_KEYS": str(public)}


@pytest.fixture(scope="module")
def tracking(s3, tmp_path_factory):
    db = tmp_path_factory.mktemp("mlflow-server") / "mlflow.db"
    with mlflow_server(f"sqlite:///{db}", f"s3://{s3.bucket}/mlflow", s3.url) as url:
        yield url


def cli_env(url: str, proxy: FaultProxy, project) -> dict[str, str]:
    """What a CI job's environment holds: the server, the store (through the proxy), the keys."""
    return {
        **TEST_CREDENTIALS,
        **project[1],
        "MLFLOW_TRACKING_URI": url,
        "MLFLOW_S3_ENDPOINT_URL": proxy.url,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    }


def small_artifact(tmp_path: Path, model: str) -> tuple[Path, Path]:
    """(artifacts dir, gate dir): one hopper-fp8 artifact (7 MB of weights in two parts, config
    and tokenizer) with its real manifest, approved for the chat tenant."""
    out = tmp_path / "artifacts"
    write_artifact(
        out / "hopper-fp8",
        "hopper-fp8",
        {
            "model.safetensors": os.urandom(7 * MB),
            "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
            "tokenizer.json": b'{"version": "1.0"}',
        },
    )
    return out, write_report(tmp_path / "gate", {"hopper-fp8": ["chat"]}, model=model).parent


def publish(out: Path, gate: Path, env: dict[str, str], project):
    return quantgate(
        "publish",
        "--report",
        str(gate),
        "--artifacts",
        str(out),
        "--json",
        "--root",
        str(project[0]),
        env=env,
    )


def versions(url: str, name: str) -> list:
    return MlflowClient(tracking_uri=url).search_model_versions(f"name = '{name}'")


def assert_one_complete_version(url: str, s3, name: str, artifact: Path) -> None:
    """Exactly one version, verified, aliased for chat, and every file intact in S3 (read
    directly from the store, past the proxy)."""
    found = versions(url, name)
    assert len(found) == 1, [v.version for v in found]
    version = found[0]
    assert version.tags[naming.UPLOAD] == naming.UPLOAD_COMPLETE
    assert MlflowClient(tracking_uri=url).get_registered_model(name).aliases == {
        "approved-chat": version.version
    }
    store = S3Store(
        version.source, RegistryConfig(tracking_uri=url, s3_endpoint_url=s3.url, transfer=TRANSFER)
    )
    names = [*read_manifest(artifact).files, MANIFEST]
    assert store.verify({rel: store.digest(artifact / rel) for rel in names}) == []


def stored_objects(s3, url: str, model: str) -> int:
    """Objects in the store under the artifact locations of ``model``'s runs (what a failed
    publish left there for the re-run to check and reuse)."""
    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name(naming.experiment_name(model))
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    count = 0
    for run in runs:
        prefix = run.info.artifact_uri.removeprefix(f"s3://{s3.bucket}/")
        count += s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("KeyCount", 0)
    return count


@pytest.mark.parametrize("kind", list(KINDS))
def test_transient_store_faults_are_retried_and_publish_completes(
    kind, s3, proxy, tracking, project, tmp_path
):
    model = f"transient-{kind}"
    out, gate = small_artifact(tmp_path, model)
    hits = 2 if kind != "slow" else 1  # each stalled request costs a read timeout
    proxy.schedule(fault(kind, hits))
    done = publish(out, gate, cli_env(tracking, proxy, project), project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["artifacts"][0]["created"]
    assert proxy.count(faulted=True) == hits
    assert_one_complete_version(tracking, s3, f"{model}.hopper-fp8", out / "hopper-fp8")
    print(f"FAULT| transient {kind} ({hits} requests) | exit 0 | {proxy.count()} requests")


@pytest.mark.parametrize("kind", list(KINDS))
def test_persistent_store_faults_exit_75_register_nothing_and_a_rerun_completes(
    kind, s3, proxy, tracking, project, tmp_path
):
    model = f"persistent-{kind}"
    name = f"{model}.hopper-fp8"
    out, gate = small_artifact(tmp_path, model)
    env = cli_env(tracking, proxy, project)
    proxy.schedule(fault(kind, None))
    failed = publish(out, gate, env, project)
    assert failed.returncode == 75, failed.stderr[-3000:]
    assert failed.stdout == "" and "S3 store" in failed.stderr
    faulted = proxy.count(faulted=True)
    assert 0 < faulted <= MAX_ATTEMPTS**2 * 5  # bounded: attempts per request x rounds, per file
    # no version, no alias: nothing a node could pull over incomplete files
    assert versions(tracking, name) == []
    assert MlflowClient(tracking_uri=tracking).get_registered_model(name).aliases == {}
    left = stored_objects(s3, tracking, model)

    proxy.clear()
    again = publish(out, gate, env, project)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["artifacts"][0]["created"]
    assert_one_complete_version(tracking, s3, name, out / "hopper-fp8")
    print(
        f"FAULT| persistent {kind} | exit 75 after {faulted} faulted requests; re-run exit 0, one version"
        f" | {left} objects left in the store by the failed run, reused or replaced by the re-run"
    )


def test_mlflow_server_killed_between_upload_and_registration(s3, proxy, project, tmp_path):
    backend, port = f"sqlite:///{tmp_path / 'mlflow.db'}", free_port()
    root = f"s3://{s3.bucket}/mlflow"
    model = "killed-server"
    name = f"{model}.hopper-fp8"
    out, gate = small_artifact(tmp_path, model)
    with contextlib.ExitStack() as server:
        url = server.enter_context(mlflow_server(backend, root, s3.url, port=port))
        killed = threading.Event()

        def kill_on_first_upload(method: str, path: str) -> None:
            if method in ("PUT", "POST") and not killed.is_set():
                killed.set()
                server.close()  # the server's process group, killed; the upload goes on

        proxy.on_request = kill_on_first_upload
        env = cli_env(url, proxy, project)
        failed = publish(out, gate, env, project)
        assert killed.is_set()
        assert failed.returncode == 75, failed.stderr[-3000:]
        assert "MLFLOW_TRACKING_URI" in failed.stderr
    proxy.on_request = None
    with mlflow_server(backend, root, s3.url, port=port) as restarted:
        assert restarted == url
        assert versions(url, name) == []
        client = MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name(naming.experiment_name(model)).experiment_id
        (run,) = client.search_runs([experiment])
        assert run.data.tags[naming.UPLOAD] != naming.UPLOAD_COMPLETE  # the upload was never marked done
        left = stored_objects(s3, url, model)
        again = publish(out, gate, env, project)
        assert again.returncode == 0, again.stderr[-3000:]
        entry = json.loads(again.stdout)["artifacts"][0]
        assert entry["created"] and entry["run_id"] == run.info.run_id  # the interrupted run, completed
        assert_one_complete_version(url, s3, name, out / "hopper-fp8")
    print(
        f"FAULT| mlflow server killed after the first S3 upload, restarted | exit 75; re-run exit 0, one version"
        f" | nothing: {left} objects already in the store were kept and the run resumed"
    )


def test_pull_with_bodies_cut_short_retries_and_never_installs_a_truncated_file(
    s3, proxy, tracking, project, tmp_path
):
    model = "truncated-pull"
    out, gate = small_artifact(tmp_path, model)
    env = cli_env(tracking, proxy, project)
    assert publish(out, gate, env, project).returncode == 0
    source = out / "hopper-fp8"
    expected = {rel: entry.sha256 for rel, entry in read_manifest(source).files.items()}
    cache = tmp_path / "node-cache"
    args = ("pull", model, "--target", "hopper-fp8", "--tenant", "chat", "--cache-dir", str(cache))
    args = (*args, "--root", str(project[0]))

    def installed_files_are_whole() -> int:
        """Every file under the cache named like an artifact file holds that file's bytes."""
        checked = 0
        for path in cache.rglob("*"):
            if path.is_file() and path.name in expected:
                assert sha256_file(path).sha256 == expected[path.name], f"{path} is not whole"
                checked += 1
        return checked

    proxy.schedule(Fault("truncate_response", count=None, method="GET", keep=0.5))
    failed = quantgate(*args, env=env)
    assert failed.returncode == 75, failed.stderr[-3000:]
    assert failed.stdout == ""
    faulted = proxy.count(faulted=True)
    assert faulted <= MAX_ATTEMPTS**2 * len(expected)
    assert installed_files_are_whole() == 0  # nothing installed, not even a verified part

    proxy.schedule(Fault("truncate_response", count=2, method="GET", keep=0.5))
    pulled = quantgate(*args, env=env)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert proxy.count(faulted=True) == 2
    path = Path(pulled.stdout.strip())
    assert {rel: sha256_file(path / rel).sha256 for rel in expected} == expected
    assert installed_files_are_whole() >= len(expected)
    print(
        f"FAULT| pull, every GET body cut in half | exit 75 after {faulted} faulted GETs, nothing installed"
        " | nothing; re-run with 2 cut bodies exit 0, files verified"
    )


def test_a_registration_whose_response_is_lost_still_makes_one_version(
    s3, proxy, tracking, project, tmp_path
):
    """MLflow's client retries every method, POST included: when the server registered the
    version but the answer was lost, the retry registers it again. Publish must end with one."""
    model = "lost-response"
    out, gate = small_artifact(tmp_path, model)
    with FaultProxy(tracking) as to_mlflow:
        lost = Fault("drop_response", count=1, method="POST", path_contains="model-versions/create")
        to_mlflow.schedule(lost)
        done = publish(out, gate, cli_env(to_mlflow.url, proxy, project), project)
        assert done.returncode == 0, done.stderr[-3000:]
        assert to_mlflow.count(faulted=True) == 1
    assert_one_complete_version(tracking, s3, f"{model}.hopper-fp8", out / "hopper-fp8")
    print("FAULT| MLflow's answer to create-version lost (1 request) | exit 0, one version | nothing")
