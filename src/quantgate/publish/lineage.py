"""What a published artifact records about itself: run params, metrics, and version tags.

Functions of the manifest, the report and their hashes (and the installed quantgate's version),
so the record is the same whichever store or server receives it, and testable without MLflow.
"""

from __future__ import annotations

import math
from importlib import metadata

from quantgate.contracts.artifact import Manifest
from quantgate.contracts.report_schema import Report
from quantgate.publish import naming


def quantgate_version() -> str:
    """The installed quantgate's version, recorded on every version it publishes."""
    try:
        return metadata.version("quantgate")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_params(manifest: Manifest) -> dict[str, str]:
    """Build inputs: target, recipe, source and calibration hashes, tool versions."""
    calibration = manifest.calibration
    params = {
        "target": manifest.target,
        "hardware": manifest.hardware,
        "format": manifest.format,
        "kv_cache": manifest.kv_cache,
        "recipe": manifest.recipe.name,
        "recipe_sha256": manifest.recipe.sha256,
        "recipe_engine": manifest.recipe.engine,
        "source_hash": manifest.source.content_hash,
        "calibration": calibration.name if calibration else "none",
        "calibration_sha256": calibration.sha256 if calibration else "none",
        "build_key": manifest.build_key,
    }
    params.update({f"tools.{name}": version for name, version in manifest.tools.items()})
    return {k: str(v) for k, v in params.items()}


def run_metrics(report: Report, artifact: str) -> dict[str, float]:
    """Every finite numeric suite metric of this artifact, as ``<suite>.<metric>``."""
    found = {}
    for suite, metrics in report.metrics.get(artifact, {}).items():
        for name, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                found[f"{suite}.{name}"] = float(value)
    return found


def lineage_tags(
    manifest: Manifest, content_hash: str, manifest_sha256: str, report_sha256: str
) -> dict[str, str]:
    """Version tags that say where the bytes came from and which gate report approved them; a
    repaired variant's also say what it kept one precision up and which uniform build it repairs."""
    return {
        **repair_tags(manifest),
        naming.CONTENT_HASH: content_hash,
        naming.MANIFEST_SHA256: manifest_sha256,
        naming.TARGET: manifest.target,
        naming.SOURCE_HASH: manifest.source.content_hash,
        naming.BUILD_KEY: manifest.build_key,
        naming.RECIPE_SHA256: manifest.recipe.sha256,
        naming.CALIBRATION_SHA256: manifest.calibration.sha256 if manifest.calibration else "none",
        naming.QUANTGATE_VERSION: quantgate_version(),
        naming.REPORT_SHA256: report_sha256,
    }


# MLflow keeps a tag value up to 5000 characters (8000 in newer servers): the list is cut there,
# the manifest (in the store, signed) names every module
_MAX_TAG = 4000


def repair_tags(manifest: Manifest) -> dict[str, str]:
    """The repair's tags (none for a uniform artifact)."""
    repair = manifest.repair
    if repair is None:
        return {}
    units = ",".join(repair.kept_units)
    if len(units) > _MAX_TAG:
        units = units[: units.rfind(",", 0, _MAX_TAG)] + ",..."
    return {
        naming.REPAIR_UPGRADE: repair.upgrade,
        naming.REPAIR_KEPT: f"{len(repair.kept_units)} of {repair.units_total}",
        naming.REPAIR_KEPT_UNITS: units,
        naming.REPAIR_PARENT_BUILD_KEY: repair.parent_build_key,
        naming.REPAIR_BYTES: str(manifest.total_bytes),
    }
