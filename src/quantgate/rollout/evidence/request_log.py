"""Per-request logs (JSONL in the artifact store): errors and aborts per version, and the prompts
that replay samples.

One JSON object a line: ``{"id", "version", "class", "prompt", "status"}``, ``status`` one of
``ok``, ``error``, ``abort`` (other keys are kept out of the way, not refused: a fleet logs more
than quantgate reads). Logs live under the store's base URI and are read through the publish
stage's store interface (local directory, ``s3://``), so a log needs no second credential.

Sampling follows the traffic mix as calibration defines it (a class -> share mapping, quotas by
``largest_remainder`` so they sum to the size exactly), drawn with ``random.Random(seed)``.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from random import Random
from typing import TYPE_CHECKING

from quantgate.calibration import largest_remainder
from quantgate.rollout.evidence.errors import EvidenceFormatError

if TYPE_CHECKING:
    from quantgate.publish import ArtifactStore

STATUSES = ("ok", "error", "abort")
FIX = 'write one JSON object per line: {"id": "...", "version": "3", "class": "chat", "prompt": "...", "status": "ok"}'


@dataclass(frozen=True)
class LoggedRequest:
    """One logged request: what replay samples (prompt, class) and what counts as an error."""

    id: str
    version: str
    class_: str
    prompt: str
    status: str


def parse_log(where: str, data: bytes) -> list[LoggedRequest]:
    """A request log's records; a malformed line is an error naming the file and line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EvidenceFormatError(where, "not valid UTF-8", "write the log as UTF-8") from None
    records: list[LoggedRequest] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        at = f"{where}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvidenceFormatError(at, f"not valid JSON ({exc.msg})", FIX) from None
        if not isinstance(obj, dict):
            raise EvidenceFormatError(at, "expected a JSON object", FIX)
        for key in ("id", "version", "class", "prompt", "status"):
            if not isinstance(obj.get(key), str):
                raise EvidenceFormatError(at, f"'{key}' is missing or not a string", FIX)
        if obj["status"] not in STATUSES:
            raise EvidenceFormatError(
                at, f"status '{obj['status']}' is not one of {', '.join(STATUSES)}", FIX
            )
        records.append(LoggedRequest(obj["id"], obj["version"], obj["class"], obj["prompt"], obj["status"]))
    return records


def read_logs(store: ArtifactStore, rels: Iterable[str]) -> list[LoggedRequest]:
    """The records of the logs at ``rels`` under the store's base URI (local directory, S3)."""
    records: list[LoggedRequest] = []
    rels = list(rels)
    sizes: dict[str, int] = {}
    for rel in rels:
        size = store.size(rel)
        if size is None:
            raise EvidenceFormatError(
                f"{store.uri}/{rel}", "request log not found", "check the log's path in the store"
            )
        sizes[rel] = size
    with tempfile.TemporaryDirectory(prefix="quantgate-request-logs-") as tmp:
        store.download(sizes, Path(tmp), lambda rel, path: None, lambda n: None)
        for rel in rels:
            records.extend(parse_log(f"{store.uri}/{rel}", (Path(tmp) / rel).read_bytes()))
    return records


def errors_by_version(records: Iterable[LoggedRequest]) -> dict[str, int]:
    """Errors and aborts per version: what ``VersionTelemetry.errors`` adds to the engine's count."""
    counts: Counter[str] = Counter(r.version for r in records if r.status != "ok")
    return dict(counts)


def sample_prompts(
    records: Iterable[LoggedRequest], mix: Mapping[str, float], size: int, seed: int
) -> list[LoggedRequest]:
    """``size`` logged requests drawn by the traffic mix (class -> share), seeded; a class with
    fewer records than its quota gives all it has. Duplicated prompts count once."""
    by_class: dict[str, list[LoggedRequest]] = {c: [] for c in mix}
    seen: set[str] = set()
    for rec in records:
        if rec.class_ in by_class and rec.prompt not in seen:
            seen.add(rec.prompt)
            by_class[rec.class_].append(rec)
    quotas = largest_remainder(size, [Fraction(str(mix[c])) for c in mix])
    rng = Random(seed)
    chosen: list[LoggedRequest] = []
    for cls, quota in zip(mix, quotas, strict=True):
        chosen.extend(rng.sample(by_class[cls], min(quota, len(by_class[cls]))))
    rng.shuffle(chosen)
    return chosen
