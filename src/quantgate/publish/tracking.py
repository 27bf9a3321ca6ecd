"""The MLflow tracking and registry client, and the few calls publish and pull share.

MLflow reports "not found", "already exists" and "cannot connect" all as ``MlflowException``
(or a requests error inside it); these helpers turn the first two into return values and the
last into ``RegistryUnavailableError``, so the callers read as the protocol they implement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from quantgate.publish.config import RegistryConfig
from quantgate.publish.store import join
from quantgate.runtime.errors import RegistryRefusedError, RegistryUnavailableError


def client(cfg: RegistryConfig):
    """An ``MlflowClient`` for the config's tracking and registry URIs (an SQLite file's directory created)."""
    from mlflow import MlflowClient

    for uri in {cfg.tracking_uri, cfg.model_registry_uri}:
        if uri.startswith("sqlite:///"):  # SQLite creates the file, not its directory
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.model_registry_uri)


def _code(exc: Exception) -> str:
    return getattr(exc, "error_code", "") or ""


@contextlib.contextmanager
def registry_errors(cfg: RegistryConfig) -> Iterator[None]:
    """MLflow failures as typed errors: "not found" and friends stay MLflow's (callers turn
    them into answers), a refusal is a configuration error, anything else (connection
    refused after MLflow's own retries, a server error) is transient."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        code = _code(exc)
        if code in ("RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE"):
            raise
        first = str(exc).splitlines()[0][:300]
        if code in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
            raise RegistryRefusedError(
                cfg.tracking_uri,
                f"the MLflow registry refused: {first}",
                "check MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN; publishing and moving "
                "approved-* aliases needs the pipeline's identity (MANAGE on the registered model)",
            ) from exc
        raise RegistryUnavailableError(
            cfg.tracking_uri,
            f"the MLflow registry failed: {first}",
            "check MLFLOW_TRACKING_URI (is the server up?) and retry, or pull with --offline",
        ) from exc


def not_found(exc: Exception) -> bool:
    """Whether an ``MlflowException`` means "no such resource"."""
    return _code(exc) == "RESOURCE_DOES_NOT_EXIST"


def experiment_id(mlflow_client, cfg: RegistryConfig, name: str, subdir: str) -> str:
    """The experiment ``name``, created on first use under ``<artifact_uri>/<subdir>``."""
    from mlflow.exceptions import MlflowException

    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = join(cfg.artifact_uri, subdir) if cfg.artifact_uri else None
    try:
        return mlflow_client.create_experiment(name, artifact_location=location)
    except MlflowException as exc:  # created meanwhile by a concurrent publish
        if _code(exc) != "RESOURCE_ALREADY_EXISTS":
            raise
        return mlflow_client.get_experiment_by_name(name).experiment_id


def ensure_registered_model(mlflow_client, name: str, tags: dict[str, str]) -> None:
    """Create the registered model ``name`` unless it exists (tags only on creation)."""
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client.create_registered_model(name, tags=tags)
    except MlflowException as exc:
        if _code(exc) != "RESOURCE_ALREADY_EXISTS":
            raise


def quote(value: str) -> str:
    """A value inside a single-quoted MLflow search filter."""
    return value.replace("\\", "\\\\").replace("'", "\\'")
