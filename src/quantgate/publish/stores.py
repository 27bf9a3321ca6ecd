"""Which store a URI names (``open_store``), and whether the fleet can read ranges from it.

Apart from the interface (``store``), which the stores import: the choice imports the stores.
"""

from __future__ import annotations

from urllib.parse import urlparse

from quantgate.fleet import RangeReader
from quantgate.publish.config import RegistryConfig
from quantgate.publish.store import ArtifactStore


def open_store(uri: str, cfg: RegistryConfig) -> ArtifactStore:
    """The store for ``uri``'s scheme: ``s3://``, a local path or ``file://``, else MLflow's."""
    scheme = urlparse(uri).scheme
    if scheme == "s3":
        from quantgate.publish.s3_store import S3Store

        return S3Store(uri, cfg)
    if scheme in ("", "file"):
        from quantgate.publish.local_store import LocalStore

        return LocalStore(uri)
    from quantgate.publish.mlflow_store import MlflowStore

    return MlflowStore(uri, cfg)


def range_reader(store: ArtifactStore) -> RangeReader | None:
    """The store's reader of byte ranges, which the fleet's origin reads pieces with; None for a
    store that cannot read ranges (MLflow's artifact repository: its versions pull whole files)."""
    from quantgate.publish.local_store import LocalStore
    from quantgate.publish.s3_store import S3Store

    return store.read_range if isinstance(store, S3Store | LocalStore) else None
