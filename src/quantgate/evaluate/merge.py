"""Merge per-artifact evaluation directories into one, as if a single ``evaluate`` had run.

An orchestrator evaluates artifacts in parallel, each into its own directory (a shared
``summary.json`` written by concurrent processes would lose entries). The gate reads one
directory, so the parts are merged afterwards: model directories are copied, ``summary.json``
and ``run.json`` are unioned. Every part must come from the same source, profile and suites,
else pairing them would compare different things; that is checked, not assumed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from quantgate.atomic import install_dir, staged_dir, write_json
from quantgate.errors import InputError

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
        run_json = Path(part) / "run.json"
        if not run_json.exists():
            raise InputError(
                run_json, "missing: not a finished evaluation", "re-run quantgate eval into this directory"
            )
        runs.append(json.loads(run_json.read_text()))
    first = runs[0]
    for part, run in zip(parts[1:], runs[1:], strict=True):
        for key in _SAME:
            if run.get(key) != first.get(key):
                raise InputError(
                    Path(part) / "run.json",
                    f"'{key}' differs from {parts[0]}'s ({run.get(key)!r} vs {first.get(key)!r})",
                    "evaluate every artifact with the same source, profile, suites and numerics switches "
                    "(environment: QUANTGATE_COMPILE, threads, CPU kernels)",
                )
    out = Path(out)
    with staged_dir(out) as tmp:
        summary: dict[str, Any] = {}
        for part in parts:
            part_summary = json.loads((Path(part) / "summary.json").read_text())
            for model, metrics in part_summary.items():
                if model not in summary:  # the source appears in every part, with identical results
                    shutil.copytree(Path(part) / model, tmp / model)
                    summary[model] = metrics
        write_json(tmp / "summary.json", summary)
        merged = {key: first.get(key) for key in _SAME}
        merged |= {
            "bytes": _union(r.get("bytes") for r in runs),
            "numerics": _union(r.get("numerics") for r in runs),
            "reference_cache": {
                "hits": [h for r in runs for h in r.get("reference_cache", {}).get("hits", [])],
                "computed": [c for r in runs for c in r.get("reference_cache", {}).get("computed", [])],
            },
            "source_forward_passes": sum(r.get("source_forward_passes", 0) for r in runs),
            "design": "sequential" if any(r.get("design") == "sequential" for r in runs) else "fixed",
            "sequential": _union(r.get("sequential") for r in runs),
            "skipped": _union(r.get("skipped") for r in runs),
            "merged_from": [str(p) for p in parts],
        }
        write_json(tmp / "run.json", merged)
        install_dir(tmp, out)
    return out


def _union(dicts) -> dict:
    merged: dict = {}
    for d in dicts:
        merged.update(d or {})
    return merged
