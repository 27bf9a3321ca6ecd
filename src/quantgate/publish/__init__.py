"""Publish gated artifacts to the MLflow registry, and pull them onto serving nodes.

The registry is the contract between the pipeline and the fleet (names and aliases in
``artifacts_registry/README.md``): ``publish_report`` turns a gate report into one model
version per artifact and an ``approved-<tenant>`` alias per tenant it passed, only after the
store's copy was verified; ``pull`` resolves an alias and installs a verified copy into a
local content-addressed cache.

Named ``publish`` because ``quantgate.registry`` is the plugin registry of extension points.
"""

from quantgate.publish.config import RegistryConfig
from quantgate.publish.publish import PublishedArtifact, PublishOutcome, publish_report, withdraw_failed
from quantgate.publish.pull import pull

__all__ = [
    "PublishOutcome",
    "PublishedArtifact",
    "RegistryConfig",
    "publish_report",
    "pull",
    "withdraw_failed",
]
