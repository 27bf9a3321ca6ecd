"""Builds from a catalog's current files, as the tests make them: ``quantize.plan`` then
``quantize.build_planned``, the two steps the product takes with a plan in between (issue 26
item 8: this shortcut was in the product, used by tests only)."""

from __future__ import annotations

from pathlib import Path

from quantgate.calibration import CalibrationSet
from quantgate.config import Catalog, KVCache
from quantgate.intake import SourceRecord
from quantgate.quantize import build_planned, plan
from quantgate.runtime.progress import SILENT, Progress


def build_targets(
    source: SourceRecord,
    target_names: list[str],
    out: Path,
    catalog: Catalog,
    calibration: CalibrationSet | None,
    progress: Progress = SILENT,
    kv_cache: dict[str, KVCache] | None = None,
    device: str = "cpu",
    cache: Path | None = None,
):
    """Build ``target_names`` from the catalog's current files (see ``build_planned``); ``kv_cache``
    as in ``plan`` (each target's own when None)."""
    return build_planned(
        source, plan(catalog, target_names, kv_cache), out, calibration, progress, device, cache
    )
