"""Where the registry lives: one immutable ``RegistryConfig`` for publish and pull.

The embedded default (an SQLite registry and a local artifact directory under the project's
``artifacts_registry/``) needs no server, so a laptop or a CI run publishes exactly as the
platform does. At scale the same code talks to ``mlflow server`` and an S3-compatible store;
only the values here change. Precedence: built-in defaults, then
``artifacts_registry/registry.yaml``, then the environment (``from_env``), because a fleet
node is configured by its environment, not by a checkout.

Keys: publish signs every manifest with ``signing_key`` and pull accepts only manifests signed by
one of ``trusted_keys``. A SQLite registry (the embedded one included) keeps a key pair of its
own beside its database, made on first publish and trusted by pulls from it, so a laptop
publishes and pulls with no setup; a server registry has no default: publish and pull refuse
until the keys are configured, because a fleet that trusts "whatever key is lying around"
trusts nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, TypedDict, Unpack

from pydantic import Field, PositiveFloat, PositiveInt

from quantgate.config import expanded, load_model, overridden, path_setting, setting
from quantgate.fleet import FleetSettings
from quantgate.runtime.frozen import Frozen
from quantgate.runtime.units import GB

SETTINGS_FILE = Path("artifacts_registry") / "registry.yaml"
KEYS_DIR = "keys"  # beside a SQLite registry's database: its own key pair
PRIVATE_KEY = "publisher.key"
PUBLIC_KEY = "publisher.pub"

# when a cache hit is re-hashed: "always" (every pull), "offline" (--offline pulls; online hits
# compare each file's size, mtime, ctime and inode with the install record). Measured in
# artifacts_registry/README.md: a few tenths of a second per 300 MB artifact on one core.
PullVerify = Literal["always", "offline"]
RELEASE_TTL_HOURS = 7 * 24.0  # TUF's default for a snapshot; a daily renewal job can make it 24
MAX_RELEASE_TTL_HOURS = 366 * 24.0


class TransferSettings(Frozen):
    """Parallelism and part sizes of uploads and downloads (boto3's ``TransferConfig``).

    Sizes are SI, like every size in quantgate (``quantgate.runtime.units``): 16 MB = 16,000,000 bytes.
    s3transfer raises a part below S3's minimum (5 MiB) to that minimum.
    """

    # files in flight at once, and ranged parts per large file (each a thread)
    concurrency: int = Field(default=8, ge=1, le=256)
    multipart_threshold_mb: PositiveInt = 16  # files this large or larger go in parts
    multipart_chunksize_mb: PositiveInt = 16
    # Retries, so that a flaky store costs a bounded wait and then exit 75 (a re-run resumes):
    # every S3 request is tried at most max_attempts times in all (botocore's "standard" mode:
    # connection errors, 5xx, throttling and timeouts, with jittered exponential backoff), and a
    # file whose stored copy does not match after upload is sent again, at most max_attempts times.
    max_attempts: int = Field(default=5, ge=1, le=20)
    connect_timeout_s: PositiveFloat = 10.0
    read_timeout_s: PositiveFloat = 60.0  # a response that stalls this long is retried


class RegistrySettings(Frozen):
    """``artifacts_registry/registry.yaml``: null means "the embedded default"."""

    version: Literal[1] = 1
    tracking_uri: str | None = None
    artifact_uri: str | None = None
    s3_endpoint_url: str | None = None
    transfer: TransferSettings = TransferSettings()
    # SI: 100 GB = 100 * 10**9 bytes; at least one byte, at most an exabyte
    pull_cache_max_gb: float = Field(default=100.0, ge=1e-9, le=1e9)
    pull_verify: PullVerify = "always"
    # relative paths are from the project root; null: a SQLite registry's own key pair
    signing_key: Path | None = None
    trusted_keys: list[Path] | None = None
    fleet: FleetSettings = FleetSettings()  # peers to pull from and seed to (quantgate.fleet)
    # how long a signed release record is valid (publish.release): a replayed or frozen record is
    # refused by every node past it; `quantgate release --renew` re-signs before then
    release_ttl_hours: float = Field(default=RELEASE_TTL_HOURS, gt=0, le=MAX_RELEASE_TTL_HOURS)


# environment variable -> the field of registry.yaml it overrides (validated as the file's value is)
ENV_SETTINGS = {
    "QUANTGATE_PULL_CACHE_MAX_GB": ("pull_cache_max_gb",),
    "QUANTGATE_PULL_VERIFY": ("pull_verify",),
    "QUANTGATE_TRANSFER_CONCURRENCY": ("transfer", "concurrency"),
    "QUANTGATE_S3_MAX_ATTEMPTS": ("transfer", "max_attempts"),
    "QUANTGATE_FLEET_PEERS": ("fleet", "peers"),
    "QUANTGATE_FLEET_LISTEN": ("fleet", "listen"),
    "QUANTGATE_FLEET_UPLOAD_MB_S": ("fleet", "upload_mb_s"),
    "QUANTGATE_RELEASE_TTL_HOURS": ("release_ttl_hours",),
}


class _Overrides(TypedDict, total=False):
    """The fields besides the tracking and artifact URIs that ``from_env`` reads and ``local`` passes on."""

    registry_uri: str | None
    s3_endpoint_url: str | None
    transfer: TransferSettings
    cache_max_bytes: int
    pull_verify: PullVerify
    fleet: FleetSettings
    release_ttl_hours: float


class RegistryConfig(Frozen):
    """Everything publish and pull need to find the registry and its bytes.

    ``artifact_uri`` is the artifact location given to the experiments quantgate creates; None
    lets the tracking server choose (its ``--default-artifact-root``).
    """

    tracking_uri: str
    registry_uri: str | None = None
    artifact_uri: str | None = None
    s3_endpoint_url: str | None = None
    transfer: TransferSettings = TransferSettings()
    cache_max_bytes: PositiveInt = int(100 * GB)
    pull_verify: PullVerify = "always"
    signing_key: Path | None = None  # PEM EC private key (P-256/384/521) publish signs manifests with
    trusted_keys: tuple[Path, ...] = ()  # PEM public keys whose signatures pull accepts
    generate_signing_key: bool = False  # make signing_key (and its .pub) on first publish if absent
    fleet: FleetSettings = FleetSettings()  # empty peers: every byte from the origin
    release_ttl_hours: float = Field(default=RELEASE_TTL_HOURS, gt=0, le=MAX_RELEASE_TTL_HOURS)

    @property
    def model_registry_uri(self) -> str:
        """The model registry's URI: ``registry_uri``, else the tracking server's."""
        return self.registry_uri or self.tracking_uri

    @classmethod
    def local(cls, directory: Path, **overrides: Unpack[_Overrides]) -> RegistryConfig:
        """The embedded store in ``directory``: ``mlflow.db`` and ``artifacts/`` beside it."""
        directory = Path(directory).resolve()
        return cls(
            tracking_uri=f"sqlite:///{directory / 'mlflow.db'}",
            artifact_uri=(directory / "artifacts").as_uri(),
            **own_keys(directory),
            **overrides,
        )

    @classmethod
    def from_env(cls, project_root: Path, environ: dict[str, str] | None = None) -> RegistryConfig:
        """Defaults, then ``<root>/artifacts_registry/registry.yaml``, then the environment.

        Environment: ``MLFLOW_TRACKING_URI``, ``MLFLOW_REGISTRY_URI``, ``QUANTGATE_ARTIFACT_URI``
        (e.g. ``s3://bucket/prefix``), ``MLFLOW_S3_ENDPOINT_URL`` (any S3-compatible endpoint;
        boto3 itself also honours ``AWS_ENDPOINT_URL_S3``), ``QUANTGATE_PULL_CACHE_MAX_GB``,
        ``QUANTGATE_TRANSFER_CONCURRENCY``, ``QUANTGATE_S3_MAX_ATTEMPTS``, ``QUANTGATE_PULL_VERIFY``,
        ``QUANTGATE_FLEET_PEERS``, ``QUANTGATE_FLEET_LISTEN``, ``QUANTGATE_FLEET_UPLOAD_MB_S``,
        ``QUANTGATE_RELEASE_TTL_HOURS`` (``ENV_SETTINGS``: each validated as its registry.yaml field is, a bad value is one line
        naming the variable, exit 2), ``QUANTGATE_SIGNING_KEY``, ``QUANTGATE_TRUSTED_KEYS``.
        Credentials are boto3's usual chain and are never read or stored here. The MLflow client's retries are MLflow's own
        ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` and
        ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (by default 7 retries over about 4 minutes, then exit 75).
        """
        env = os.environ if environ is None else environ
        root = Path(project_root).resolve()
        path = root / SETTINGS_FILE
        settings = load_model(path, RegistrySettings) if path.exists() else RegistrySettings()
        settings = overridden(settings, ENV_SETTINGS, env, str(path))
        tracking = env.get("MLFLOW_TRACKING_URI") or settings.tracking_uri
        artifact = env.get("QUANTGATE_ARTIFACT_URI") or settings.artifact_uri
        common: _Overrides = {
            "registry_uri": env.get("MLFLOW_REGISTRY_URI") or None,
            "s3_endpoint_url": env.get("MLFLOW_S3_ENDPOINT_URL") or settings.s3_endpoint_url,
            "transfer": settings.transfer,
            "cache_max_bytes": max(1, round(settings.pull_cache_max_gb * GB)),
            "pull_verify": settings.pull_verify,
            "fleet": settings.fleet,
            "release_ttl_hours": settings.release_ttl_hours,
        }
        keys = _configured_keys(root, settings, env)
        if tracking is None:  # the embedded registry; an explicit artifact URI still wins
            embedded = cls.local(root / "artifacts_registry", **common).model_copy(update=keys)
            return embedded.model_copy(update={"artifact_uri": artifact}) if artifact else embedded
        if tracking.startswith("sqlite:///"):
            database_dir = Path(tracking.removeprefix("sqlite:///")).resolve().parent
            # MLflow would put a database's artifacts in ./mlruns of whatever the working directory is
            artifact = artifact or (database_dir / "artifacts").as_uri()
            keys = {**own_keys(database_dir), **keys}
        return cls(tracking_uri=tracking, artifact_uri=artifact, **common, **keys)


def own_keys(directory: Path) -> dict:
    """A SQLite registry's own key pair in ``directory/keys``: made on first publish, trusted."""
    keys = Path(directory) / KEYS_DIR
    return {
        "signing_key": keys / PRIVATE_KEY,
        "trusted_keys": (keys / PUBLIC_KEY,),
        "generate_signing_key": True,
    }


def _configured_keys(root: Path, settings: RegistrySettings, env) -> dict:
    """The keys the settings file or the environment name (the environment wins), as overrides."""
    keys: dict = {}
    signing = path_setting("QUANTGATE_SIGNING_KEY", env)
    if signing is None and settings.signing_key is not None:
        signing = expanded(str(settings.signing_key), "signing_key")
    if signing is not None:
        keys["signing_key"] = root / signing
        keys["generate_signing_key"] = False  # a named key must exist: never silently made
    listed = setting("QUANTGATE_TRUSTED_KEYS", env)
    trusted: list[Path] | None = None
    if listed:
        trusted = [expanded(p, "QUANTGATE_TRUSTED_KEYS") for p in listed.split(os.pathsep) if p]
    elif settings.trusted_keys is not None:
        trusted = [expanded(str(p), "trusted_keys") for p in settings.trusted_keys]
    if trusted is not None:
        keys["trusted_keys"] = tuple(root / p for p in trusted)
    return keys
