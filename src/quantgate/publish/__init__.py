"""Publish gated artifacts to the MLflow registry, and pull them onto serving nodes.

The registry is the contract between the pipeline and the fleet (names and aliases in
``artifacts_registry/README.md``): ``publish_report`` turns a gate report into one model
version per artifact and an ``approved-<tenant>`` alias per tenant it passed, only after the
store's copy was verified; ``pull`` resolves an alias and installs a verified copy into a
local content-addressed cache.

Named ``publish`` because ``quantgate.runtime.registry`` is the plugin registry of extension points.
"""

from typing import TYPE_CHECKING

from quantgate.publish.config import RegistryConfig
from quantgate.publish.publish import PublishedArtifact, PublishOutcome, publish_report, withdraw_failed
from quantgate.publish.pull import pull
from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.publish.cache import ENTRY, PullCache
    from quantgate.publish.local_store import LocalStore
    from quantgate.publish.naming import alias_for, canary_alias_for, registered_model_name
    from quantgate.publish.operator import renew, roll_back
    from quantgate.publish.pull import pull as pull_artifact
    from quantgate.publish.release import Ledger as ReleaseLedger
    from quantgate.publish.release import read as read_release
    from quantgate.publish.resolve import approved_versions
    from quantgate.publish.rollout_moves import (
        RolloutView,
        issue_once,
        point_alias,
        read_view,
        state_tag,
        write_state,
    )
    from quantgate.publish.s3_store import S3Store, s3_errors
    from quantgate.publish.store import ArtifactStore
    from quantgate.publish.tracking import client as registry_client
    from quantgate.publish.tracking import registry_errors

__all__ = [
    "ENTRY",
    "ArtifactStore",
    "LocalStore",
    "PublishOutcome",
    "PublishedArtifact",
    "PullCache",
    "RegistryConfig",
    "ReleaseLedger",
    "RolloutView",
    "S3Store",
    "alias_for",
    "approved_versions",
    "canary_alias_for",
    "issue_once",
    "point_alias",
    "publish_report",
    "pull",
    "pull_artifact",
    "read_release",
    "read_view",
    "registered_model_name",
    "registry_client",
    "registry_errors",
    "renew",
    "roll_back",
    "s3_errors",
    "state_tag",
    "withdraw_failed",
    "write_state",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "pull_artifact": "pull:pull",
        "registered_model_name": "naming",
        "alias_for": "naming",
        "renew": "operator",
        "roll_back": "operator",
        "registry_client": "tracking:client",
        "registry_errors": "tracking",
        "ArtifactStore": "store",
        "ENTRY": "cache",
        "LocalStore": "local_store",
        "PullCache": "cache",
        "S3Store": "s3_store",
        "approved_versions": "resolve",
        "RolloutView": "rollout_moves",
        "issue_once": "rollout_moves",
        "point_alias": "rollout_moves",
        "read_view": "rollout_moves",
        "state_tag": "rollout_moves",
        "write_state": "rollout_moves",
        "canary_alias_for": "naming",
        "read_release": "release:read",
        "ReleaseLedger": "release:Ledger",
        "s3_errors": "s3_store",
    },
)
