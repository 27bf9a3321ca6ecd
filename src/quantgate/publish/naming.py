"""The names the serving fleet relies on: registered models, aliases, tags, artifact paths.

These are a contract (documented in ``artifacts_registry/README.md``); changing one strands
every fleet node that resolves it, so they live in one place.
"""

from __future__ import annotations

import re

from quantgate.runtime.errors import UsageError

ALIAS_PREFIX = "approved-"
CANARY_PREFIX = "canary-"  # a version the gate passed, on a share of the tenant's traffic (rollout)
ROLLOUT_STATE = "quantgate.rollout"  # + ".<tenant>": the canary watcher's state between looks
ARTIFACT_PATH = "artifact"  # the artifact directory inside the run's artifacts
REPORTS_PATH = "reports"  # report.json / .md / .html inside the run's artifacts
MAX_RECORDS_BYTES = 256 * 10**6  # a version's records are read whole: a full profile's are ~10 MB
EXPERIMENT_PREFIX = "quantgate/"

# Tags. Model versions carry all but REGISTERED_MODEL and the gate's (APPROVED_TENANTS, GATE) are
# set on versions only; the run carries the lineage tags, the upload state and REGISTERED_MODEL
# (so an interrupted publish is found and completed from the run, before any version exists).
CONTENT_HASH = "quantgate.content_hash"  # hashing.content_hash over the manifest's file table
MANIFEST_SHA256 = "quantgate.manifest_sha256"  # sha256 of manifest.json's bytes as uploaded
UPLOAD = "quantgate.upload"  # "complete" only once the store's copy was verified
UPLOAD_COMPLETE = "complete"
REGISTERED_MODEL = "quantgate.registered_model"
TARGET = "quantgate.target"
SOURCE_HASH = "quantgate.source_hash"
BUILD_KEY = "quantgate.build_key"
# a repaired variant (quantgate.repair): what it kept one precision up, and the uniform artifact it repairs
REPAIR_UPGRADE = "quantgate.repair.upgrade"  # the kept precision (FP8, bf16)
REPAIR_KEPT = "quantgate.repair.kept"  # "<k> of <n>" layer groups
REPAIR_KEPT_UNITS = (
    "quantgate.repair.kept_units"  # comma-separated, most sensitive first (the manifest has all)
)
REPAIR_PARENT_BUILD_KEY = "quantgate.repair.parent_build_key"
REPAIR_PARENT_VERSION = "quantgate.repair.parent_version"  # the uniform artifact's version, when registered
REPAIR_BYTES = "quantgate.repair.bytes"
RECIPE_SHA256 = "quantgate.recipe_sha256"
CALIBRATION_SHA256 = "quantgate.calibration_sha256"
QUANTGATE_VERSION = "quantgate.version"
REPORT_SHA256 = "quantgate.report_sha256"
APPROVED_TENANTS = "quantgate.approved_tenants"  # comma-separated, as of the latest publish
GATE = "quantgate.gate"  # "approved" or "failed" (recorded for audit, never aliased)
SIGNED_BY = "quantgate.signed_by"  # key id (signing.key_id) of the key that signed manifest.json
# the gate's signed approval of the version (publish.approval): the statement and its signature
APPROVAL = "quantgate.approval"
APPROVAL_SIGNATURE = "quantgate.approval_sig"
# the v2 info-hash of the version's torrent (manifest.torrent); trusted only as the signed approval names it
TORRENT = "quantgate.torrent"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_ALIAS = re.compile(r"^[\w\-]*$")  # MLflow's own rule for alias names


def _check(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise UsageError(
            None,
            f"{kind} '{value}' is not a valid registry name",
            "use letters, digits, '.', '_' and '-' only, starting with a letter or digit",
        )
    return value


def registered_model_name(model: str, target: str) -> str:
    """One registered model per (model, target): ``<model>.<target>``."""
    return f"{_check('model', model)}.{_check('target', target)}"


def alias_for(tenant: str) -> str:
    """The alias that approves a version for one tenant: ``approved-<tenant>``."""
    alias = f"{ALIAS_PREFIX}{tenant}"
    if not _ALIAS.match(alias) or not tenant:
        raise UsageError(
            None, f"tenant '{tenant}' cannot be an alias", "tenant names may use letters, digits, '_' and '-'"
        )
    return alias


def canary_alias_for(tenant: str) -> str:
    """The alias of a tenant's canary: ``canary-<tenant>`` (checked as ``alias_for``)."""
    alias_for(tenant)
    return f"{CANARY_PREFIX}{tenant}"


def channel_alias(tenant: str, channel: str) -> str:
    """The alias a node on ``channel`` (stable, canary) follows for ``tenant``."""
    return canary_alias_for(tenant) if channel == "canary" else alias_for(tenant)


def experiment_name(model: str) -> str:
    """Runs are grouped per source model, one run per published artifact."""
    return f"{EXPERIMENT_PREFIX}{model}"
