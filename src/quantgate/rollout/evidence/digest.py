"""The digest that names a piece of evidence in a release record: sha256 over canonical JSON.

Canonical: sorted keys, no spaces, UTF-8 kept, and infinite bucket bounds written as the string
``"+Inf"`` (Prometheus's own spelling), since JSON has no infinity. The ``digest`` field itself is
left out, so a record can carry the digest of the rest of it."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, is_dataclass
from typing import Any


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def canonical_json(fields: dict[str, Any]) -> str:
    """``fields`` as canonical JSON, without a top-level ``digest``."""
    rest = {k: v for k, v in fields.items() if k != "digest"}
    return json.dumps(
        _plain(rest), ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
    )


def evidence_digest(record: Any) -> str:
    """The sha256 of a dataclass record's (or a dict's) canonical JSON, its ``digest`` left out."""
    fields = asdict(record) if is_dataclass(record) and not isinstance(record, type) else dict(record)
    return hashlib.sha256(canonical_json(fields).encode("utf-8")).hexdigest()


def as_json(record: Any) -> dict[str, Any]:
    """A dataclass record as JSON-ready data, infinities spelled ``"+Inf"``."""
    return _plain(asdict(record))
