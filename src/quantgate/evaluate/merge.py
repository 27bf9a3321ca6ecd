"""Merge per-artifact evaluation directories into one, as if a single ``evaluate`` had run.

An orchestrator evaluates artifacts in parallel, each into its own directory (a shared
``summary.json`` written by concurrent processes would lose entries). The gate reads one
directory, so the parts are merged afterwards: model directories are copied, ``summary.json``
and ``run.json`` are unioned. Every part must come from the same source, profile and suites,
else pairing them would compare different things; that is checked, not assumed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from quantgate.contracts.results import (
    RUN_JSON,
    SUMMARY_JSON,
    ReferenceCache,
    read_run_info,
    read_summary,
    write_run_info,
)
from quantgate.runtime.atomic import install_dir, staged_dir, write_json
from quantgate.runtime.errors import InputError

_SAME = ("model", "model_class", "profile", "source_hash", "suites", "environment")


def merge_evaluations(parts: list[Path], out: Path) -> Path:
    """Merge ``parts`` (each a ``quantgate eval --out`` directory) into ``out``; returns ``out``.

    ``out`` is built whole beside itself and swapped in, so a re-run never keeps a stale
    artifact's results and a reader never sees a half-merged directory.
    """
    if not parts:
        raise InputError(None, "no evaluation directories to merge", "evaluate at least the source first")
    runs = []
    for part in parts:
        run_json = Path(part) / RUN_JSON
        if not run_json.exists():
            raise InputError(
                run_json, "missing: not a finished evaluation", "re-run quantgate eval into this directory"
            )
        runs.append(read_run_info(run_json))
    first = runs[0]
    for part, run in zip(parts[1:], runs[1:], strict=True):
        for key in _SAME:
            if getattr(run, key) != getattr(first, key):
                raise InputError(
                    Path(part) / RUN_JSON,
                    f"'{key}' differs from {parts[0]}'s ({getattr(run, key)!r} vs {getattr(first, key)!r})",
                    "evaluate every artifact with the same source, profile, suites and numerics switches "
                    "(environment: QUANTGATE_COMPILE, threads, CPU kernels)",
                )
    out = Path(out)
    with staged_dir(out) as tmp:
        summary: dict[str, Any] = {}
        for part in parts:
            for model, metrics in read_summary(Path(part)).items():
                if model not in summary:  # the source appears in every part, with identical results
                    shutil.copytree(Path(part) / model, tmp / model)
                    summary[model] = metrics
        write_json(tmp / SUMMARY_JSON, summary)
        merged = first.model_copy(
            update={
                "bytes": _union(r.bytes for r in runs),
                "numerics": _union(r.numerics for r in runs),
                "reference_cache": ReferenceCache(
                    hits=[h for r in runs for h in r.reference_cache.hits],
                    computed=[c for r in runs for c in r.reference_cache.computed],
                ),
                "source_forward_passes": sum(r.source_forward_passes for r in runs),
                "design": "sequential" if any(r.design == "sequential" for r in runs) else "fixed",
                "sequential": _union(r.sequential for r in runs),
                "skipped": _union(r.skipped for r in runs),
                "merged_from": [str(p) for p in parts],
                "seconds": _summed(r.seconds for r in runs),
            }
        )
        write_run_info(tmp, merged)
        install_dir(tmp, out)
    return out


def _union(dicts) -> dict:
    merged: dict = {}
    for d in dicts:
        merged.update(d or {})
    return merged


def _summed(timings) -> dict[str, dict[str, float]]:
    """Each model's phases summed over the parts (``RunInfo.seconds``)."""
    total: dict[str, dict[str, float]] = {}
    for part in timings:
        for model, phases in part.items():
            into = total.setdefault(model, {})
            for phase, seconds in phases.items():
                into[phase] = round(into.get(phase, 0.0) + seconds, 3)
    return total
